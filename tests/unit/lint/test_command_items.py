"""Every command a task runs is made of plain strings, as YAML reads them.

An unquoted argv item such as ``- --only-binary=:all:`` is a YAML mapping (``{'--only-binary=:all':
None}``): yamllint and ansible-lint accept it, Ansible turns it into the string
``"{'--only-binary=:all': None}"``, and pip refused it on a fresh machine (issue 18) while every
machine with a warm cache skipped the task. This loads every YAML file under roles/, playbooks/
and site.yml and refuses any argv/cmd/command item that is not a string.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
# Keys whose value is a command: the command/shell/raw modules (short and FQCN) and their options.
COMMAND_KEYS = frozenset(
    {
        "argv",
        "cmd",
        "command",
        "shell",
        "raw",
        "ansible.builtin.command",
        "ansible.builtin.shell",
        "ansible.builtin.raw",
    }
)


class _AnsibleYamlLoader(yaml.SafeLoader):
    """A safe loader that keeps Ansible's own tags (!unsafe, !vault) as their plain values."""


_AnsibleYamlLoader.add_multi_constructor(
    "!",
    lambda loader, _tag, node: loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None,
)


def yaml_files() -> list[Path]:
    """site.yml and every .yml/.yaml under roles/ and playbooks/ (molecule scenarios included)."""
    found = [ROOT / "site.yml"]
    for folder in ("roles", "playbooks"):
        found += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in {".yml", ".yaml"})
    return found


def bad_command_items(document: object, path: str = "") -> Iterator[str]:
    """Where, in one loaded YAML document, a command is not made of strings (path: what YAML read)."""
    if isinstance(document, dict):
        for key, value in document.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "cmd" and not isinstance(value, str):  # one command line, never a list
                yield f"{where} is {type(value).__name__} {value!r}, not a command string"
            elif key in COMMAND_KEYS:
                yield from _command_value(value, where)
            else:
                yield from bad_command_items(value, where)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from bad_command_items(item, f"{path}[{index}]")


def _command_value(value: object, where: str) -> Iterator[str]:
    if isinstance(value, str):
        return
    if isinstance(value, dict):  # command: {argv: [...], cmd: ..., creates: ...}
        yield from bad_command_items(value, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                yield f"{where}[{index}] is {type(item).__name__} {item!r}: quote it"
    else:
        yield f"{where} is {type(value).__name__} {value!r}, not a command string"


def test_the_check_refuses_the_item_that_broke_a_fresh_machine() -> None:
    # The task as it was before a41da38: the item unquoted.
    old = yaml.load(
        "- ansible.builtin.command:\n    argv:\n      - pip\n      - download\n      - --only-binary=:all:\n",
        Loader=_AnsibleYamlLoader,
    )
    assert list(bad_command_items(old)) == [
        "[0].ansible.builtin.command.argv[2] is dict {'--only-binary=:all': None}: quote it"
    ]
    quoted = yaml.load(
        '- ansible.builtin.command:\n    argv: [pip, "--only-binary=:all:"]\n', Loader=_AnsibleYamlLoader
    )
    assert list(bad_command_items(quoted)) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- ansible.builtin.command: {cmd: [ls]}\n", "[0].ansible.builtin.command.cmd is list"),
        ("- command:\n    argv: [ip, link, set, mtu, 9000]\n", "[0].command.argv[4] is int 9000"),
        ("- ansible.builtin.shell:\n", "[0].ansible.builtin.shell is NoneType"),
        ("- block:\n    - ansible.builtin.raw: [a: b]\n", "[0].block[0].ansible.builtin.raw[0] is dict"),
    ],
)
def test_the_check_names_where_a_command_is_not_strings(text: str, problem: str) -> None:
    found = list(bad_command_items(yaml.load(text, Loader=_AnsibleYamlLoader)))
    assert len(found) == 1 and found[0].startswith(problem), found


def test_every_command_in_the_playbooks_and_roles_is_plain_strings() -> None:
    files = yaml_files()
    assert len(files) > 50 and ROOT / "roles/image/tasks/sim_runtime.yml" in files
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in files
        for document in yaml.load_all(path.read_text(), Loader=_AnsibleYamlLoader)
        for problem in bad_command_items(document)
    ]
    assert not problems, "\n".join(problems)


# Keys whose value is a conditional, or a list of them: ansible-core 2.19 refuses any that is not a string
# (or a boolean) at run time, "Conditional expressions must be strings".
CONDITIONAL_KEYS = frozenset({"that", "when", "failed_when", "changed_when", "until"})


def bad_conditionals(document: object, path: str = "") -> Iterator[str]:
    """Where a conditional is not a string or a boolean as YAML read it (e.g. `- x is match('a: b')`)."""
    if isinstance(document, dict):
        for key, value in document.items():
            where = f"{path}.{key}" if path else str(key)
            if key in CONDITIONAL_KEYS:
                for index, item in enumerate(value if isinstance(value, list) else [value]):
                    if not isinstance(item, (str, bool)):
                        yield f"{where}[{index}] is {type(item).__name__} {item!r}: quote it"
            else:
                yield from bad_conditionals(value, where)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from bad_conditionals(item, f"{path}[{index}]")


def test_the_check_refuses_a_conditional_yaml_read_as_a_mapping() -> None:
    # The preflight molecule verify as CI ran it at 6e9d9be: ': ' in the match argument made a mapping.
    broken = yaml.load(
        "- assert:\n    that:\n      - x.detail is match('not applicable: tcp')\n", Loader=_AnsibleYamlLoader
    )
    assert [p.split(" is ")[0] for p in bad_conditionals(broken)] == ["[0].assert.that[0]"]
    quoted = yaml.load("- assert:\n    that:\n      - \"x is match('a: b')\"\n", Loader=_AnsibleYamlLoader)
    assert list(bad_conditionals(quoted)) == []


def test_every_conditional_in_the_playbooks_and_roles_is_a_string() -> None:
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in yaml_files()
        for document in yaml.load_all(path.read_text(), Loader=_AnsibleYamlLoader)
        for problem in bad_conditionals(document)
    ]
    assert not problems, "\n".join(problems)
