"""What a running process really linked: its mapped libraries, its link map, where its GOT points.

Standard library only: this file travels to every rank with the NCCL identity module. Everything
is read from /proc of the live process (root, or the process's own user with ptrace access):

- ``/proc/<pid>/maps`` names every mapped file; ``/proc/<pid>/map_files/`` opens the exact inode
  that is mapped, even when the path now holds another file;
- the link map (``r_debug`` found through the executable's ``DT_DEBUG``) is the dynamic linker's
  load order: ``dlopen("libnccl.so.2")`` returns the first loaded object with that soname, and
  an LD_PRELOAD library precedes every dependency in the global lookup scope;
- the GOT of every object that needs a library holds, per imported symbol, the address the
  linker bound it to (or, before a lazy symbol's first call, an address inside the object itself).

So "which libnccl does this process use" is answered from the process, not from its environment.
ELF64 little-endian only (x86_64 and aarch64, the two machines SparkRing runs on).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from ansible.module_utils.sparkring_integrity import sha256_file

# auxv, program headers, dynamic tags (elf.h)
AT_PHDR, AT_PHENT, AT_PHNUM = 3, 4, 5
PT_DYNAMIC, PT_PHDR = 2, 6
DT_NULL, DT_NEEDED, DT_SONAME, DT_DEBUG = 0, 1, 14, 21
SHT_RELA, SHT_DYNAMIC, SHT_DYNSYM = 4, 6, 11
EM_X86_64, EM_AARCH64 = 62, 183
# Relocations that store a symbol's address in a slot: (GLOB_DAT, JUMP_SLOT, 64-bit absolute).
BINDING_RELOCATIONS = {EM_X86_64: (6, 7, 1), EM_AARCH64: (1025, 1026, 257)}
MAX_LINK_MAP = 8192  # bound on the walk: a corrupt or changing list never loops forever


class LinkageError(Exception):
    """The process or one of its files cannot be read the way this module needs."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    inode: int
    path: str


@dataclass
class LoadedObject:
    """One ELF object of the process: where it is mapped and what the linker knows it as."""

    path: str
    inode: int
    base: int  # the mapping at file offset 0
    mappings: list[Mapping] = field(default_factory=list)
    link_map_index: int | None = None

    def contains(self, address: int) -> bool:
        return any(m.start <= address < m.end for m in self.mappings)


def read_maps(pid: int) -> list[Mapping]:
    """File-backed mappings of the process (anonymous and pseudo ones such as [heap] left out)."""
    out = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n").removesuffix(" (deleted)")
            out.append(Mapping(start, end, int(parts[2], 16), int(parts[4]), path))
    return out


def loaded_objects(maps: list[Mapping]) -> list[LoadedObject]:
    """Group the mappings by file; each object's base is its lowest mapping at file offset 0."""
    objects: dict[tuple[str, int], LoadedObject] = {}
    for m in sorted(maps, key=lambda m: m.start):
        key = (m.path, m.inode)
        if key not in objects:
            objects[key] = LoadedObject(m.path, m.inode, m.start if m.offset == 0 else -1)
        obj = objects[key]
        obj.mappings.append(m)
        if obj.base < 0 and m.offset == 0:
            obj.base = m.start
    return list(objects.values())


class ProcessMemory:
    """Reads of another process's memory through /proc/<pid>/mem."""

    def __init__(self, pid: int) -> None:
        try:
            self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError as exc:
            raise LinkageError(
                f"/proc/{pid}/mem: {exc.strerror} (reading another process needs root)"
            ) from exc

    def read(self, address: int, size: int) -> bytes:
        try:
            data = os.pread(self.fd, size, address)
        except OSError as exc:
            raise LinkageError(f"reading {size} bytes at {address:#x}: {exc.strerror}") from exc
        if len(data) != size:
            raise LinkageError(f"reading {size} bytes at {address:#x}: short read")
        return data

    def u64(self, address: int) -> int:
        return struct.unpack("<Q", self.read(address, 8))[0]

    def cstring(self, address: int, limit: int = 4096) -> str:
        data = b""
        while b"\0" not in data and len(data) < limit:
            data += os.pread(self.fd, 256, address + len(data)) or b"\0"
        return data.split(b"\0", 1)[0].decode(errors="replace")

    def close(self) -> None:
        os.close(self.fd)


def auxv(pid: int) -> dict[int, int]:
    with open(f"/proc/{pid}/auxv", "rb") as handle:
        raw = handle.read()
    pairs = struct.iter_unpack("<QQ", raw[: len(raw) // 16 * 16])
    return dict(pairs)


def link_map(pid: int, mem: ProcessMemory) -> list[tuple[int, str]]:
    """The base namespace's link map in load order: (l_addr, l_name) per object."""
    aux = auxv(pid)
    if aux.get(AT_PHENT) != 56:
        raise LinkageError(f"pid {pid}: not a 64-bit process (program header size {aux.get(AT_PHENT)})")
    headers = [struct.unpack("<IIQQQQQQ", mem.read(aux[AT_PHDR] + i * 56, 56)) for i in range(aux[AT_PHNUM])]
    bias = next((aux[AT_PHDR] - h[3] for h in headers if h[0] == PT_PHDR), None)
    dynamic = next((h for h in headers if h[0] == PT_DYNAMIC), None)
    if bias is None or dynamic is None:
        raise LinkageError(f"pid {pid}: the executable has no PT_PHDR/PT_DYNAMIC (statically linked?)")
    address, r_debug = dynamic[3] + bias, 0
    for _ in range(4096):
        tag, value = struct.unpack("<qQ", mem.read(address, 16))
        if tag == DT_NULL:
            break
        if tag == DT_DEBUG:
            r_debug = value
        address += 16
    if not r_debug:
        raise LinkageError(f"pid {pid}: DT_DEBUG is not set, the dynamic linker's list cannot be found")
    entries, node = [], mem.u64(r_debug + 8)  # struct r_debug { int r_version; struct link_map *r_map; ...}
    while node and len(entries) < MAX_LINK_MAP:
        l_addr, l_name = mem.u64(node), mem.u64(node + 8)
        entries.append((l_addr, mem.cstring(l_name) if l_name else ""))
        node = mem.u64(node + 24)  # l_next, after l_addr, l_name, l_ld
    return entries


@dataclass
class ElfImports:
    """What an ELF file needs from other objects: sonames, its own soname, and symbol slots."""

    machine: int
    soname: str | None
    needed: list[str]
    slots: list[tuple[str, int]]  # (symbol, slot address relative to the load base)


def _sections(handle, path: str) -> tuple[int, list[tuple]]:
    head = handle.read(64)
    if head[:4] != b"\x7fELF":
        raise LinkageError(f"{path}: not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise LinkageError(f"{path}: not a 64-bit little-endian ELF file")
    machine = struct.unpack_from("<H", head, 18)[0]
    shoff, shentsize, shnum = (struct.unpack_from("<Q", head, 40)[0], *struct.unpack_from("<HH", head, 58))
    if not shoff or shentsize != 64:
        raise LinkageError(f"{path}: no section headers, its imports cannot be read")
    handle.seek(shoff)
    raw = handle.read(shnum * 64)
    return machine, [struct.unpack_from("<IIQQQQIIQQ", raw, i * 64) for i in range(shnum)]


def _read(handle, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


def _string(table: bytes, offset: int) -> str:
    return table[offset : table.index(b"\0", offset)].decode(errors="replace")


def read_imports(handle, path: str, wanted=lambda name: True) -> ElfImports:
    """Parse the dynamic section, the dynamic symbols and their RELA relocations of one ELF file.

    ``wanted`` filters the slots kept (by symbol name): a 1 GB library's tables are read once, but
    only the slots of interest are returned."""
    machine, sections = _sections(handle, path)
    needed, soname, slots = [], None, []
    for sh in sections:
        if sh[1] != SHT_DYNAMIC:
            continue
        strtab = _read(handle, sections[sh[6]][4], sections[sh[6]][5])
        for tag, value in struct.iter_unpack("<qQ", _read(handle, sh[4], sh[5])):
            if tag == DT_NEEDED:
                needed.append(_string(strtab, value))
            elif tag == DT_SONAME:
                soname = _string(strtab, value)
            elif tag == DT_NULL:
                break
    kinds = BINDING_RELOCATIONS.get(machine, ())
    for sh in sections:
        if sh[1] != SHT_RELA or sh[6] >= len(sections) or sections[sh[6]][1] != SHT_DYNSYM:
            continue
        symtab_header = sections[sh[6]]
        symtab = _read(handle, symtab_header[4], symtab_header[5])
        strtab = _read(handle, sections[symtab_header[6]][4], sections[symtab_header[6]][5])
        for r_offset, r_info, _addend in struct.iter_unpack("<QQq", _read(handle, sh[4], sh[5])):
            index, kind = r_info >> 32, r_info & 0xFFFFFFFF
            if kind not in kinds or not index:
                continue
            name = _string(strtab, struct.unpack_from("<I", symtab, index * 24)[0])
            if wanted(name):
                slots.append((name, r_offset))
    return ElfImports(machine, soname, needed, slots)


def object_file(pid: int, obj: LoadedObject) -> str:
    """A path that opens exactly the mapped inode: map_files when readable, else the process's root."""
    first = obj.mappings[0]
    exact = f"/proc/{pid}/map_files/{first.start:x}-{first.end:x}"
    if os.access(exact, os.R_OK):
        return exact
    return f"/proc/{pid}/root{obj.path}"


class LibraryUse:
    """Which copies of one library family (e.g. ``libnccl``) a process maps, and which it uses.

    Files are parsed and hashed once per (path, inode) for all the processes inspected."""

    def __init__(self, family: str, symbol_prefix: str) -> None:
        self.family = family
        self.symbol_prefix = symbol_prefix
        self._hashes: dict[tuple[str, int], str] = {}
        self._imports: dict[tuple[str, int, bool], ElfImports | None] = {}

    def is_family(self, path: str) -> bool:
        return os.path.basename(path).startswith(self.family)

    def _imports_of(self, pid: int, obj: LoadedObject, slots: bool) -> ElfImports | None:
        key = (obj.path, obj.inode, slots)
        if key not in self._imports:
            wanted = (lambda n: n.startswith(self.symbol_prefix)) if slots else (lambda n: False)
            try:
                with open(object_file(pid, obj), "rb") as handle:
                    self._imports[key] = read_imports(handle, obj.path, wanted)
            except (
                OSError,
                LinkageError,
                struct.error,
                ValueError,
            ):  # data files mapped from disk (locale archive, ...)
                self._imports[key] = None
        return self._imports[key]

    def _describe(self, pid: int, obj: LoadedObject) -> dict:
        key = (obj.path, obj.inode)
        if key not in self._hashes:
            self._hashes[key] = sha256_file(object_file(pid, obj))
        imports = self._imports_of(pid, obj, slots=False)
        return {
            "path": obj.path,
            "inode": obj.inode,
            "sha256": self._hashes[key],
            "soname": imports.soname if imports else None,
        }

    def inspect(self, pid: int) -> dict:
        """The family's mapped copies, and when there is more than one, the proof of which is used:
        the link map order (what dlopen by soname and the global scope find first) and every
        imported family symbol's GOT slot in the objects that need the family."""
        objects = loaded_objects(read_maps(pid))
        family = [obj for obj in objects if self.is_family(obj.path)]
        report: dict = {"pid": pid, "libraries": [self._describe(pid, obj) for obj in family]}
        if len(family) < 2:
            return report
        mem = ProcessMemory(pid)
        try:
            by_base = {obj.base: obj for obj in objects if obj.base >= 0}
            by_path = {obj.path: obj for obj in objects}
            order = []
            for index, (l_addr, l_name) in enumerate(link_map(pid, mem)):
                obj = by_base.get(l_addr) if l_addr else by_path.get(l_name)
                if obj is None and l_name in by_path:
                    obj = by_path[l_name]
                if obj is not None and obj.link_map_index is None:
                    obj.link_map_index = index
                    order.append(obj)
            described = {(d["path"], d["inode"]): d for d in report["libraries"]}
            for obj in family:
                described[(obj.path, obj.inode)]["link_map_index"] = obj.link_map_index
            first: dict[str, str] = {}
            for obj in order:
                soname = described.get((obj.path, obj.inode), {}).get("soname")
                if self.is_family(obj.path) and soname and soname not in first:
                    first[soname] = obj.path
            report["first_by_soname"] = first
            report["bindings"] = self._bindings(pid, mem, objects, family)
        finally:
            mem.close()
        return report

    def _bindings(self, pid: int, mem: ProcessMemory, objects: list[LoadedObject], family) -> list[dict]:
        sonames = {self._imports_of(pid, obj, slots=False).soname for obj in family} - {None}
        bindings = []
        for obj in objects:
            if obj in family or obj.base < 0:
                continue
            imports = self._imports_of(pid, obj, slots=False)
            if imports is None or not (sonames & set(imports.needed)):
                continue
            imports = self._imports_of(pid, obj, slots=True)
            for symbol, offset in imports.slots:
                target = mem.u64(obj.base + offset)
                owner = next((o for o in objects if o.contains(target)), None)
                state = "unbound" if owner is obj else "bound"
                bindings.append(
                    {
                        "object": obj.path,
                        "symbol": symbol,
                        "state": state,
                        "target": owner.path if owner and owner is not obj else None,
                    }
                )
        return bindings


def identity_verdict(processes: list[dict], attested_sha256: str | None) -> dict:
    """pass/fail for "every process uses exactly the attested library" and how it was shown.

    mode: ``none`` (nothing of the family mapped, and none attested), ``single`` (only the
    attested copy mapped), ``second-proven-unused`` (another copy is mapped too, but the attested
    one comes first in the link map for every soname and every bound slot points into it)."""
    problems, modes = [], set()
    for proc in processes:
        who = f"pid {proc['pid']} ({proc.get('title') or '?'})"
        libs = proc["libraries"]
        if not attested_sha256:
            if libs:
                shown = ", ".join(f"{lib['path']} (sha256 {lib['sha256']})" for lib in libs)
                problems.append(f"{who} maps {shown}, but this deployment attests no NCCL library")
            modes.add("none")
            continue
        attested = {lib["path"] for lib in libs if lib["sha256"] == attested_sha256}
        others = [lib for lib in libs if lib["sha256"] != attested_sha256]
        if not attested:
            shown = ", ".join(f"{lib['path']} (sha256 {lib['sha256']})" for lib in libs) or "nothing"
            problems.append(
                f"{who} does not map the attested library (sha256 {attested_sha256}); it maps {shown}"
            )
            continue
        if not others:
            modes.add("single")
            continue
        wrong_first = {s: p for s, p in proc.get("first_by_soname", {}).items() if p not in attested}
        wrong_bound = [
            b for b in proc.get("bindings", []) if b["state"] == "bound" and b["target"] not in attested
        ]
        for soname, path in sorted(wrong_first.items()):
            problems.append(
                f"{who}: dlopen({soname!r}) and the global scope find {path} first, not the attested library"
            )
        for b in wrong_bound[:8]:
            problems.append(
                f"{who}: {b['object']} binds {b['symbol']} to {b['target']}, not the attested library"
            )
        if not (wrong_first or wrong_bound):
            modes.add("second-proven-unused")
    mode = next((m for m in ("second-proven-unused", "single", "none") if m in modes), "none")
    return {"status": "fail" if problems else "pass", "mode": mode, "problems": problems}
