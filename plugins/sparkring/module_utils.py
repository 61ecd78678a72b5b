"""The project's node-side `module_utils/` files, loaded on the controller by path.

Ansible ships these files only to the nodes (as `ansible.module_utils.<name>`). Controller code
that runs or measures the same code (the qualify filters, the benchmarks) loads a file under its
plain name, as a node-side script imports it; the file's own sibling imports
(`from sparkring_geometry import ...`) are loaded first, found in its source. No `sys.path`
edit: module_utils/ holds no package, only these stdlib files.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

MODULE_UTILS = Path(__file__).resolve().parents[2] / "module_utils"


def sibling_imports(path: Path) -> list[str]:
    """The module_utils files `path` imports by plain name (its script-mode fallback imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and (MODULE_UTILS / f"{node.module}.py").is_file()
    ]


def load_module_utils(*names: str) -> ModuleType:
    """Load each named file, its sibling imports first; return the last named.

    A name already loaded is reused, so every caller in one process sees the same module.
    """
    if not names:
        raise ValueError("load_module_utils needs at least one module_utils name")
    for name in names:
        if name in sys.modules:
            continue
        path = MODULE_UTILS / f"{name}.py"
        if not path.is_file():
            raise ModuleNotFoundError(
                f"{path} does not exist: name a file of module_utils/, and run from a checkout "
                "installed editable (`make venv`)",
                name=name,
            )
        siblings = sibling_imports(path)
        if siblings:
            load_module_utils(*siblings)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[names[-1]]
