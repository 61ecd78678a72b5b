"""libibverbs through ctypes: devices, ports, GIDs, PD, MR, CQ and RC queue pairs.

Setup runs here; the hot path (ibv_post_send / ibv_poll_cq, static inline in verbs.h)
runs in csrc/sr_verbs.c. The ctypes structs below are the one description of the layouts
Python relies on: on first use an offsetof probe is generated from them, compiled against
the installed infiniband/verbs.h and run, and any difference in a field offset or a size
refuses to load (VerbsLayoutError) instead of corrupting memory.

On a node without RDMA, ibv_get_device_list returns NULL (ENOSYS here): NoRdmaError.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import hashlib
import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from transport._native import VERBS, NativeBuildError, SrError, cache_root, compile_cached
from transport.errors import NoRdmaError, TransportError, VerbsLayoutError

c_int, c_u8, c_u16, c_u32, c_u64, c_void_p = (
    ctypes.c_int,
    ctypes.c_uint8,
    ctypes.c_uint16,
    ctypes.c_uint32,
    ctypes.c_uint64,
    ctypes.c_void_p,
)


class PortAttr(ctypes.Structure):
    _fields_ = [
        ("state", c_int),
        ("max_mtu", c_int),
        ("active_mtu", c_int),
        ("gid_tbl_len", c_int),
        ("port_cap_flags", c_u32),
        ("max_msg_sz", c_u32),
        ("bad_pkey_cntr", c_u32),
        ("qkey_viol_cntr", c_u32),
        ("pkey_tbl_len", c_u16),
        ("lid", c_u16),
        ("sm_lid", c_u16),
        ("lmc", c_u8),
        ("max_vl_num", c_u8),
        ("sm_sl", c_u8),
        ("subnet_timeout", c_u8),
        ("init_type_reply", c_u8),
        ("active_width", c_u8),
        ("active_speed", c_u8),
        ("phys_state", c_u8),
        ("link_layer", c_u8),
    ]


class QpCap(ctypes.Structure):
    _fields_ = [
        ("max_send_wr", c_u32),
        ("max_recv_wr", c_u32),
        ("max_send_sge", c_u32),
        ("max_recv_sge", c_u32),
        ("max_inline_data", c_u32),
    ]


class QpInitAttr(ctypes.Structure):
    _fields_ = [
        ("qp_context", c_void_p),
        ("send_cq", c_void_p),
        ("recv_cq", c_void_p),
        ("srq", c_void_p),
        ("cap", QpCap),
        ("qp_type", c_int),
        ("sq_sig_all", c_int),
    ]


class Gid(ctypes.Union):
    """union ibv_gid: 16 raw bytes, 8-byte aligned (it also holds two __be64)."""

    _fields_ = [("raw", c_u8 * 16), ("words", c_u64 * 2)]


class GlobalRoute(ctypes.Structure):
    _fields_ = [
        ("dgid", Gid),
        ("flow_label", c_u32),
        ("sgid_index", c_u8),
        ("hop_limit", c_u8),
        ("traffic_class", c_u8),
    ]


class AhAttr(ctypes.Structure):
    _fields_ = [
        ("grh", GlobalRoute),
        ("dlid", c_u16),
        ("sl", c_u8),
        ("src_path_bits", c_u8),
        ("static_rate", c_u8),
        ("is_global", c_u8),
        ("port_num", c_u8),
    ]


class QpAttr(ctypes.Structure):
    _fields_ = [
        ("qp_state", c_int),
        ("cur_qp_state", c_int),
        ("path_mtu", c_int),
        ("path_mig_state", c_int),
        ("qkey", c_u32),
        ("rq_psn", c_u32),
        ("sq_psn", c_u32),
        ("dest_qp_num", c_u32),
        ("qp_access_flags", c_u32),
        ("cap", QpCap),
        ("ah_attr", AhAttr),
        ("alt_ah_attr", AhAttr),
        ("pkey_index", c_u16),
        ("alt_pkey_index", c_u16),
        ("en_sqd_async_notify", c_u8),
        ("sq_draining", c_u8),
        ("max_rd_atomic", c_u8),
        ("max_dest_rd_atomic", c_u8),
        ("min_rnr_timer", c_u8),
        ("port_num", c_u8),
        ("timeout", c_u8),
        ("retry_cnt", c_u8),
        ("rnr_retry", c_u8),
        ("alt_port_num", c_u8),
        ("alt_timeout", c_u8),
        ("rate_limit", c_u32),
    ]


class Mr(ctypes.Structure):
    _fields_ = [
        ("context", c_void_p),
        ("pd", c_void_p),
        ("addr", c_void_p),
        ("length", ctypes.c_size_t),
        ("handle", c_u32),
        ("lkey", c_u32),
        ("rkey", c_u32),
    ]


class QpHead(ctypes.Structure):
    """The leading fields of struct ibv_qp (the rest holds a pthread mutex: never touched)."""

    _fields_ = [
        ("context", c_void_p),
        ("qp_context", c_void_p),
        ("pd", c_void_p),
        ("send_cq", c_void_p),
        ("recv_cq", c_void_p),
        ("srq", c_void_p),
        ("handle", c_u32),
        ("qp_num", c_u32),
    ]


# C name -> (ctypes struct, whether its whole size must match). PortAttr is filled by the
# library and grew in rdma-core 50: we read a prefix and pass a buffer of the C size.
LAYOUTS: dict[str, tuple[type[ctypes.Structure], bool]] = {
    "ibv_port_attr": (PortAttr, False),
    "ibv_qp_cap": (QpCap, True),
    "ibv_qp_init_attr": (QpInitAttr, True),
    "ibv_global_route": (GlobalRoute, True),
    "ibv_ah_attr": (AhAttr, True),
    "ibv_qp_attr": (QpAttr, True),
    "ibv_mr": (Mr, True),
    "ibv_qp": (QpHead, False),
}

# Constants from verbs.h (stable kernel ABI values).
QPT_RC = 2
QPS_INIT, QPS_RTR, QPS_RTS = 1, 2, 3
PORT_ACTIVE = 4
LINK_LAYER_ETHERNET = 2
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE = 1, 2
QP_STATE, QP_ACCESS_FLAGS, QP_PKEY_INDEX, QP_PORT = 1, 1 << 3, 1 << 4, 1 << 5
QP_AV, QP_PATH_MTU, QP_TIMEOUT, QP_RETRY_CNT, QP_RNR_RETRY = 1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11
QP_RQ_PSN, QP_MAX_QP_RD_ATOMIC, QP_MIN_RNR_TIMER, QP_SQ_PSN = 1 << 12, 1 << 13, 1 << 15, 1 << 16
QP_MAX_DEST_RD_ATOMIC, QP_DEST_QPN = 1 << 17, 1 << 20
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def probe_source() -> str:
    """C that prints every declared struct's size and field offsets as JSON."""
    lines = [
        "#include <infiniband/verbs.h>",
        "#include <stddef.h>",
        "#include <stdio.h>",
        "int main(void) {",
        '    printf("{");',
    ]
    for i, (cname, (cls, _)) in enumerate(LAYOUTS.items()):
        fields = ", ".join(f'\\"{name}\\": %zu' for name, *_ in cls._fields_)
        args = ", ".join(f"offsetof(struct {cname}, {name})" for name, *_ in cls._fields_)
        sep = ", " if i else ""
        lines.append(
            f'    printf("{sep}\\"{cname}\\": {{\\"size\\": %zu, \\"fields\\": {{{fields}}}}}", '
            f"sizeof(struct {cname}), {args});"
        )
    lines += ['    printf("}\\n");', "    return 0;", "}"]
    return "\n".join(lines) + "\n"


def check_layouts(measured: dict) -> None:
    """Refuse to run if a ctypes layout differs from the compiled header's."""
    problems = []
    for cname, (cls, whole) in LAYOUTS.items():
        got = measured[cname]
        if (whole and got["size"] != ctypes.sizeof(cls)) or got["size"] < ctypes.sizeof(cls):
            problems.append(f"sizeof(struct {cname}) is {got['size']}, ctypes has {ctypes.sizeof(cls)}")
        for name, *_ in cls._fields_:
            if got["fields"][name] != getattr(cls, name).offset:
                problems.append(
                    f"{cname}.{name} at {got['fields'][name]}, ctypes has {getattr(cls, name).offset}"
                )
    if problems:
        raise VerbsLayoutError(
            "verbs.h does not match transport/verbs.py; refusing to load: " + "; ".join(problems)
        )


@functools.cache
def measured_layouts() -> dict:
    """Compile and run the offsetof probe against the installed headers (cached by content)."""
    src = probe_source()
    src_dir = cache_root() / "probe-src"
    src_dir.mkdir(parents=True, exist_ok=True)
    path = src_dir / f"verbs_layout_{hashlib.sha256(src.encode()).hexdigest()[:16]}.c"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)
    exe = compile_cached("verbs_layout_probe", [path], [], executable=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@functools.cache
def libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libibverbs, our verbs engine), after the layout check."""
    try:
        engine_path = VERBS.build()
        check_layouts(measured_layouts())
    except NativeBuildError as exc:
        raise NoRdmaError(f"the verbs fabric cannot be built here (install libibverbs-dev): {exc}") from exc
    name = ctypes.util.find_library("ibverbs") or "libibverbs.so.1"
    ib = ctypes.CDLL(name, use_errno=True)
    vp = c_void_p
    sigs = {
        "ibv_get_device_list": ([ctypes.POINTER(c_int)], ctypes.POINTER(vp)),
        "ibv_free_device_list": ([ctypes.POINTER(vp)], None),
        "ibv_get_device_name": ([vp], ctypes.c_char_p),
        "ibv_open_device": ([vp], vp),
        "ibv_close_device": ([vp], c_int),
        "ibv_query_port": ([vp, c_u8, vp], c_int),
        "ibv_query_gid": ([vp, c_u8, c_int, vp], c_int),
        "ibv_alloc_pd": ([vp], vp),
        "ibv_dealloc_pd": ([vp], c_int),
        "ibv_reg_mr": ([vp, vp, ctypes.c_size_t, c_int], ctypes.POINTER(Mr)),
        "ibv_dereg_mr": ([ctypes.POINTER(Mr)], c_int),
        "ibv_create_comp_channel": ([vp], vp),
        "ibv_destroy_comp_channel": ([vp], c_int),
        "ibv_create_cq": ([vp, c_int, vp, vp, c_int], vp),
        "ibv_destroy_cq": ([vp], c_int),
        "ibv_create_qp": ([vp, ctypes.POINTER(QpInitAttr)], vp),
        "ibv_modify_qp": ([vp, ctypes.POINTER(QpAttr), c_int], c_int),
        "ibv_destroy_qp": ([vp], c_int),
    }
    for fn, (argtypes, restype) in sigs.items():
        getattr(ib, fn).argtypes = argtypes
        getattr(ib, fn).restype = restype
    eng = ctypes.CDLL(str(engine_path))
    eng.sr_vpeer_new.argtypes = [c_int, c_int, vp, vp, vp, vp, vp, c_u32, c_u64, c_u32, c_u32, c_u32, c_u32]
    eng.sr_vpeer_new.restype = vp
    eng.sr_vpeer_free.argtypes = [vp, c_int]
    eng.sr_vpeer_free.restype = None
    eng.sr_vpeer_stats.argtypes = [vp, ctypes.POINTER(c_u64 * 6)]
    eng.sr_vpeer_stats.restype = None
    eng.sr_vlink_new.argtypes = [ctypes.POINTER(vp), c_int]
    eng.sr_vlink_new.restype = vp
    eng.sr_vlink_free.argtypes = [vp, c_int]
    eng.sr_vlink_free.restype = None
    eng.sr_vlink_stats.argtypes = [vp, ctypes.POINTER(c_u64 * 6)]
    eng.sr_vlink_stats.restype = None
    eng.sr_vlink_keepalive.argtypes = [vp, c_int, c_int, ctypes.POINTER(SrError)]
    eng.sr_vlink_keepalive.restype = c_int
    return ib, eng


def _errno_text() -> str:
    e = ctypes.get_errno()
    return f"{os.strerror(e)} (errno {e})"


def list_devices() -> list[str]:
    """RDMA device names; NoRdmaError when the node has none."""
    ib, _ = libs()
    num = c_int(0)
    ctypes.set_errno(0)
    devs = ib.ibv_get_device_list(ctypes.byref(num))
    if not devs:
        e = ctypes.get_errno()
        hint = " (the kernel has no RDMA support)" if e == errno.ENOSYS else ""
        raise NoRdmaError(
            f"no RDMA on this node: ibv_get_device_list failed: {_errno_text()}{hint}; use --fabric tcp"
        )
    try:
        names = [ib.ibv_get_device_name(devs[i]).decode() for i in range(num.value)]
    finally:
        ib.ibv_free_device_list(devs)
    if not names:
        raise NoRdmaError("no RDMA on this node: no RDMA devices found (is the driver or rdma_rxe loaded?)")
    return names


LINK_LOCAL_PREFIX = bytes.fromhex("fe80000000000000")  # the fe80::/64 of a link-local GID


def ipv4_mapped_gid(address: str) -> bytes:
    """The RoCE v2 GID of an IPv4 address: ::ffff:a.b.c.d."""
    return bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(address).packed


@dataclass
class Device:
    """An open RDMA device: context, one port's attributes, the protection domain."""

    name: str
    port: int
    context: int
    pd: int
    port_attr: PortAttr

    @classmethod
    def open(cls, name: str, port: int) -> Device:
        ib, _ = libs()
        if name not in list_devices():
            raise NoRdmaError(f"RDMA device {name!r} not found; present: {', '.join(list_devices())}")
        num = c_int(0)
        devs = ib.ibv_get_device_list(ctypes.byref(num))
        try:
            dev = next(devs[i] for i in range(num.value) if ib.ibv_get_device_name(devs[i]).decode() == name)
            ctx = ib.ibv_open_device(dev)
        finally:
            ib.ibv_free_device_list(devs)
        if not ctx:
            raise TransportError(f"ibv_open_device({name}) failed: {_errno_text()}")
        raw = ctypes.create_string_buffer(measured_layouts()["ibv_port_attr"]["size"])
        if ib.ibv_query_port(ctx, port, raw) != 0:
            ib.ibv_close_device(ctx)
            raise TransportError(f"ibv_query_port({name}, {port}) failed: {_errno_text()}")
        attr = PortAttr.from_buffer_copy(raw.raw[: ctypes.sizeof(PortAttr)])
        if attr.state != PORT_ACTIVE:
            ib.ibv_close_device(ctx)
            raise TransportError(
                f"{name} port {port} is not active (state {attr.state}): check the cable and link"
            )
        pd = ib.ibv_alloc_pd(ctx)
        if not pd:
            ib.ibv_close_device(ctx)
            raise TransportError(f"ibv_alloc_pd({name}) failed: {_errno_text()}")
        return cls(name, port, ctx, pd, attr)

    def gid(self, index: int) -> bytes:
        ib, _ = libs()
        buf = (c_u8 * 16)()
        if ib.ibv_query_gid(self.context, self.port, index, buf) != 0:
            raise TransportError(
                f"ibv_query_gid({self.name}, port {self.port}, index {index}) failed: {_errno_text()}"
            )
        return bytes(buf)

    def gid_type(self, index: int) -> str:
        path = Path(f"/sys/class/infiniband/{self.name}/ports/{self.port}/gid_attrs/types/{index}")
        try:
            return path.read_text().strip()
        except OSError:
            return "unknown"

    def resolve_gid_index(self, wanted: int | str, address: str) -> tuple[int, bytes]:
        """``auto``: the RoCE v2 GID equal to ``address`` IPv4-mapped; an int is checked the same way."""
        target = ipv4_mapped_gid(address)
        indexes = range(self.port_attr.gid_tbl_len) if wanted == "auto" else [int(wanted)]
        for index in indexes:
            try:
                gid = self.gid(index)
            except TransportError:
                continue
            if gid == target and self.gid_type(index) in ("RoCE v2", "unknown"):
                return index, gid
        where = "any GID index" if wanted == "auto" else f"GID index {wanted}"
        raise TransportError(
            f"{self.name} port {self.port}: {where} is not the RoCE v2 GID of {address}; "
            f"is {address} configured on the interface of {self.name}? (see `show_gids` / `rdma link`)"
        )

    def resolve_link_local_gid_index(self, wanted: int | str) -> tuple[int, bytes]:
        """A twin without an address: ``auto`` is its first link-local (fe80::/64) RoCE v2 GID."""
        indexes = range(self.port_attr.gid_tbl_len) if wanted == "auto" else [int(wanted)]
        for index in indexes:
            try:
                gid = self.gid(index)
            except TransportError:
                continue
            if gid[:8] == LINK_LOCAL_PREFIX and self.gid_type(index) in ("RoCE v2", "unknown"):
                return index, gid
        where = "any GID index" if wanted == "auto" else f"GID index {wanted}"
        raise TransportError(
            f"{self.name} port {self.port}: {where} is not a link-local RoCE v2 GID; is the interface of "
            f"{self.name} up with IPv6 link-local addressing? (see `show_gids` / `rdma link`)"
        )

    @property
    def mtu_enum(self) -> int:
        return self.port_attr.active_mtu

    def close(self) -> None:
        ib, _ = libs()
        ib.ibv_dealloc_pd(self.pd)
        ib.ibv_close_device(self.context)


def create_rc_qp(dev: Device, cq: int, max_send: int, max_recv: int) -> tuple[int, int]:
    """(qp pointer, qp_num) of a new RC queue pair in INIT."""
    ib, _ = libs()
    init = QpInitAttr(
        send_cq=cq, recv_cq=cq, cap=QpCap(max_send, max_recv, 1, 1, 0), qp_type=QPT_RC, sq_sig_all=0
    )
    qp = ib.ibv_create_qp(dev.pd, ctypes.byref(init))
    if not qp:
        raise TransportError(f"ibv_create_qp on {dev.name} failed: {_errno_text()}")
    attr = QpAttr(
        qp_state=QPS_INIT,
        pkey_index=0,
        port_num=dev.port,
        qp_access_flags=ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
    )
    _modify(qp, attr, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, "INIT", dev.name)
    return qp, QpHead.from_address(qp).qp_num


def connect_rc_qp(
    dev: Device, qp: int, sgid_index: int, dgid: bytes, dest_qpn: int, rq_psn: int, sq_psn: int
) -> None:
    """INIT -> RTR -> RTS with RoCE's GRH, the port's active MTU, and bounded retries."""
    rtr = QpAttr(
        qp_state=QPS_RTR,
        path_mtu=dev.mtu_enum,
        dest_qp_num=dest_qpn,
        rq_psn=rq_psn,
        max_dest_rd_atomic=1,
        min_rnr_timer=12,
    )
    rtr.ah_attr.is_global = 1
    rtr.ah_attr.port_num = dev.port
    rtr.ah_attr.grh.dgid.raw[:] = list(dgid)
    rtr.ah_attr.grh.sgid_index = sgid_index
    rtr.ah_attr.grh.hop_limit = 64  # the IP TTL of RoCE v2 packets
    mask = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER
    _modify(qp, rtr, mask, "RTR", dev.name)
    # timeout 18 (~1.07 s) x retry 7: a dead peer surfaces within ~8 s (the collective bound
    # still applies), and a slow responder (a software RDMA stack) is not retried needlessly;
    # rnr_retry 7 (infinite) because the engine always reposts receives.
    rts = QpAttr(qp_state=QPS_RTS, sq_psn=sq_psn, timeout=18, retry_cnt=7, rnr_retry=7, max_rd_atomic=1)
    _modify(
        qp,
        rts,
        QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC,
        "RTS",
        dev.name,
    )


def _modify(qp: int, attr: QpAttr, mask: int, state: str, device: str) -> None:
    ib, _ = libs()
    rc = ib.ibv_modify_qp(qp, ctypes.byref(attr), mask)
    if rc != 0:
        raise TransportError(
            f"moving a queue pair on {device} to {state} failed: {os.strerror(rc)} (errno {rc})"
        )
