"""Run a library module as Ansible runs it on a node: arguments from a JSON file, the project's
module_utils importable as ansible.module_utils.<name>; the module prints its JSON result.

    python run_module.py library/sparkring_model.py args.json

It runs as a script, outside pytest: it puts the repository root on sys.path itself, so that
`tests.project_code` exposes module_utils the one way every test does.
"""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.project_code import expose_module_utils

expose_module_utils()
module, args = sys.argv[1], sys.argv[2]
sys.argv = [module, args]
runpy.run_path(module, run_name="__main__")
