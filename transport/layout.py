"""Every ctypes mirror of a native struct is checked against the library it mirrors, as it loads.

Each native library exports its layout (csrc/sr_layout.h): struct sizes, every field's offset in
declaration order, and the constants the mirrors size their arrays with. A mirror whose size,
field count or any offset differs from the compiled C is refused, naming the struct and the
field, so a change on the C side can never be read through a stale Python struct.
"""

from __future__ import annotations

import ctypes


class LayoutError(RuntimeError):
    """A Python mirror does not match the compiled C it mirrors."""


class LayoutEntry(ctypes.Structure):
    """Mirror of sr_layout_entry (csrc/sr_layout.h); its own layout is the one fixed point."""

    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_uint64)]


def exported_layout(lib: ctypes.CDLL, symbol: str) -> dict[str, int]:
    """The `{name: value}` table a library's `symbol()` returns (sizes, "T.field" offsets, constants)."""
    function = getattr(lib, symbol)
    function.argtypes, function.restype = [], ctypes.POINTER(LayoutEntry)
    entries, table, index = function(), {}, 0
    while entries[index].name is not None:
        table[entries[index].name.decode()] = entries[index].value
        index += 1
    return table


def layout_problems(
    layout: dict[str, int], mirrors: dict[str, type[ctypes.Structure]], constants: dict[str, int]
) -> list[str]:
    """What differs between the C layout and the mirrors (by C struct name) and constants (by C name)."""
    problems = []
    for cname, mirror in mirrors.items():
        if cname not in layout:
            problems.append(f"{cname} is not in the library's layout")
            continue
        if ctypes.sizeof(mirror) != layout[cname]:
            problems.append(
                f"sizeof({cname}) is {layout[cname]}, {mirror.__name__} has {ctypes.sizeof(mirror)}"
            )
        c_fields = [
            (key.split(".", 1)[1], value) for key, value in layout.items() if key.startswith(f"{cname}.")
        ]
        py_fields = [(field[0], getattr(mirror, field[0]).offset) for field in mirror._fields_]
        if len(c_fields) != len(py_fields):
            problems.append(f"{cname} has {len(c_fields)} fields, {mirror.__name__} {len(py_fields)}")
        for (c_name, c_offset), (py_name, py_offset) in zip(c_fields, py_fields, strict=False):
            if c_offset != py_offset:
                problems.append(
                    f"{cname}.{c_name} is at offset {c_offset}, {mirror.__name__}.{py_name} at {py_offset}"
                )
    for name, value in constants.items():
        if layout.get(name) != value:
            problems.append(f"{name} is {layout.get(name)} in C, {value} in Python")
    return problems


def check_layout(
    lib: ctypes.CDLL,
    symbol: str,
    mirrors: dict[str, type[ctypes.Structure]],
    constants: dict[str, int] | None = None,
) -> None:
    """Refuse a library whose exported layout its Python mirrors do not match."""
    problems = layout_problems(exported_layout(lib, symbol), mirrors, constants or {})
    if problems:
        raise LayoutError(
            f"{lib._name}: the Python mirrors do not match the compiled C ({'; '.join(problems)}); "
            "change the mirror with the C struct (transport/_native.py, transport/gpu.py)"
        )
