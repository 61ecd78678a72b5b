"""Run a library module as Ansible runs it on a node: arguments from a JSON file, the project's
module_utils importable as ansible.module_utils.<name>; the module prints its JSON result.

    python run_module.py library/sparkring_model.py args.json
"""

import runpy
import sys
from pathlib import Path

import ansible.module_utils

ansible.module_utils.__path__.append(str(Path(__file__).resolve().parents[3] / "module_utils"))
module, args = sys.argv[1], sys.argv[2]
sys.argv = [module, args]
runpy.run_path(module, run_name="__main__")
