"""module_utils ship to the nodes, which have Python's standard library and Ansible, nothing more."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.project_code import MODULE_UTILS_DIRS, ROOT

SHIPPED = sorted(path for folder in MODULE_UTILS_DIRS for path in folder.glob("*.py"))
SIBLINGS = {path.stem for path in SHIPPED}


def module_level_imports(tree: ast.Module) -> Iterator[str]:
    """Top names imported when the file loads; imports inside functions run only where they are used."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module.split(".")[0]
        pending.extend(ast.iter_child_nodes(node))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(ROOT)))
def test_module_utils_import_only_the_standard_library_ansible_and_each_other(path: Path) -> None:
    names = set(module_level_imports(ast.parse(path.read_text())))
    foreign = names - {"__future__", "ansible"} - SIBLINGS - set(sys.stdlib_module_names)
    assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)} when it loads on a node"
