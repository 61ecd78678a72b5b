"""The acceptance unit tests import module_utils as Ansible does (ansible.module_utils.<name>)."""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
