"""library/sparkring_preflight: each judgement (facts in, result out) and the module's own readers."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

# Rank 1's port on cable r1-r2 in the sim (cage 1 on both ends).
PORT = {
    "cage": 1,
    "interface": "ring1",
    "edge": "r1-r2",
    "address": "198.19.1.1",
    "prefix": 24,
    "peer_rank": 2,
    "peer_address": "198.19.1.2",
    "peer_cage": 1,
    "rdma_device": "rocep1s0f1",
    "rdma_port": 1,
    "gid_index": "auto",
}
EDGE = "r1 cage1 <-> r2 cage1"


def _by_id(results):
    return {result.id: result for result in results}


def _assert_fail_names(result, check_id, subject=EDGE):
    assert (result.id, result.status, result.subject) == (check_id, "fail", subject)
    assert result.fix, "a failed check must say how to fix it"


def test_healthy_link_passes(preflight, link_facts):
    link = link_facts.Link("ring1", True, "up", True, 9000, 10000)
    results = _by_id(preflight.judge_link(1, PORT, link, 9000, 10000))
    assert {r.status for r in results.values()} == {"pass"}
    assert results["PF-LINK-MTU"].subject == EDGE


def test_mtu_1500_fails_naming_the_edge(preflight, link_facts):
    link = link_facts.Link("ring1", True, "up", True, 1500, 10000)
    result = _by_id(preflight.judge_link(1, PORT, link, 9000, 10000))["PF-LINK-MTU"]
    _assert_fail_names(result, "PF-LINK-MTU")
    assert "MTU 1500; expected 9000" in result.detail and "r1-r2" in result.detail


def test_down_link_fails_up_but_still_reports_mtu(preflight, link_facts):
    link = link_facts.Link("ring1", True, "lowerlayerdown", False, 9000, None)
    results = _by_id(preflight.judge_link(1, PORT, link, 9000, 10000))
    _assert_fail_names(results["PF-LINK-UP"], "PF-LINK-UP")
    assert results["PF-LINK-MTU"].status == "pass"
    _assert_fail_names(results["PF-LINK-SPEED"], "PF-LINK-SPEED")
    assert "unknown" in results["PF-LINK-SPEED"].detail


def test_missing_interface_fails_once_and_skips_the_rest(preflight, link_facts):
    results = preflight.judge_link(1, PORT, link_facts.Link("ring1", False), 9000, 10000)
    assert [(r.id, r.status) for r in results] == [
        ("PF-LINK-UP", "fail"),
        ("PF-LINK-MTU", "skip"),
        ("PF-LINK-SPEED", "skip"),
    ]


@pytest.mark.parametrize(
    ("speed", "wanted", "status"),
    [(200000, 200000, "pass"), (100000, 200000, "fail"), (10000, None, "skip")],
)
def test_link_speed(preflight, link_facts, speed, wanted, status):
    link = link_facts.Link("ring1", True, "up", True, 9000, speed)
    assert _by_id(preflight.judge_link(1, PORT, link, 9000, wanted))["PF-LINK-SPEED"].status == status


@pytest.mark.parametrize(
    ("configured", "status"),
    [
        (["198.19.1.1/24"], "pass"),
        (["198.19.1.99/24"], "fail"),  # wrong address
        (["198.19.1.1/16"], "fail"),  # wrong prefix
        (["198.19.1.1/24", "10.0.0.1/8"], "fail"),  # a stray extra address
        ([], "fail"),
    ],
)
def test_exact_address(preflight, configured, status):
    result = preflight.judge_address(1, PORT, [ipaddress.IPv4Interface(a) for a in configured])
    assert result.status == status
    if status == "fail":
        _assert_fail_names(result, "PF-LINK-ADDR")
        assert "expected exactly 198.19.1.1/24" in result.detail


def test_jumbo_ping(preflight, link_facts):
    ok = preflight.judge_jumbo(1, PORT, 9000, link_facts.PingResult(2, 2, None))
    assert ok.status == "pass" and "8972 B" in ok.detail
    lost = preflight.judge_jumbo(
        1, PORT, 9000, link_facts.PingResult(2, 0, "local error: message too long, mtu=1500")
    )
    _assert_fail_names(lost, "PF-JUMBO-PING")
    assert "message too long" in lost.detail


def test_non_neighbor(preflight):
    assert preflight.judge_non_neighbor(0, 2, "198.19.1.2", [], None).status == "pass"
    reached = preflight.judge_non_neighbor(0, 2, "198.19.1.2", ["ring0"], "ring0")
    _assert_fail_names(reached, "PF-NONNEIGHBOR-UNREACHABLE", "r0 -> r2 198.19.1.2")
    assert "ip_forward" in reached.fix


def test_management(preflight, link_facts):
    mgmt = {"interface": "mgmt0", "address": "198.19.254.11", "prefix": 24}
    up = link_facts.Link("mgmt0", True, "up", True, 1500, 10000)
    good = [ipaddress.IPv4Interface("198.19.254.11/24")]
    assert preflight.judge_management(1, mgmt, up, good).status == "pass"
    wrong = preflight.judge_management(1, mgmt, up, [ipaddress.IPv4Interface("198.19.254.12/24")])
    _assert_fail_names(wrong, "PF-MGMT-ADDR", "r1 mgmt0")
    down = link_facts.Link("mgmt0", True, "down", False, 1500, None)
    assert preflight.judge_management(1, mgmt, down, good).status == "fail"
    assert preflight.judge_management(1, mgmt, link_facts.Link("mgmt0", False), []).status == "fail"


def test_hostname(preflight):
    assert preflight.judge_hostname(1, "sim-r1", "sim-r1").status == "pass"
    _assert_fail_names(preflight.judge_hostname(1, "sim-r1", "sim-r2"), "PF-SSH", "r1")


def test_disk_and_ports(preflight):
    gib = preflight.GIB
    assert preflight.judge_disk("/var/lib/sparkring", "/var/lib", 30 * gib, 20).status == "pass"
    short = preflight.judge_disk("/var/lib/sparkring", "/var/lib", 5 * gib, 20)
    _assert_fail_names(short, "PF-DISK-FREE", "/var/lib/sparkring")
    assert "5.0 GiB free; expected at least 20 GiB" in short.detail
    assert preflight.judge_port_free(8000, "tcp", "vLLM API", None, []).status == "pass"
    stranger = preflight.judge_port_free(8000, "tcp", "vLLM API", ["nginx (pid 7)"], [])
    _assert_fail_names(stranger, "PF-PORTS-FREE", "8000/tcp (vLLM API)")
    assert "nginx (pid 7)" in stranger.detail
    ours = preflight.judge_port_free(8000, "tcp", "vLLM API", ["sparkring-r0"], ["sparkring-r0"])
    assert ours.status == "pass" and "sparkring-r0" in ours.detail
    # Holders the node cannot show (another PID namespace) fail closed.
    assert preflight.judge_port_free(8000, "tcp", "", [], []).status == "fail"


def test_rdma_skips_on_tcp_and_fails_without_device_on_verbs(preflight, link_facts, tmp_path):
    skip = preflight.judge_rdma_port(1, PORT, "tcp", [], None)
    assert skip.status == "skip" and "fabric tcp" in skip.detail
    missing = link_facts.read_rdma_port("rocep1s0f1", 1, str(tmp_path))
    _assert_fail_names(preflight.judge_rdma_port(1, PORT, "verbs", [], missing), "PF-RDMA-PORT")
    no_device = dict(PORT, rdma_device=None, rdma_port=None)
    _assert_fail_names(preflight.judge_rdma_port(1, no_device, "verbs", [], None), "PF-RDMA-PORT")
    assert preflight.judge_gid(1, PORT, "tcp", None, None).status == "skip"


def test_gpu(preflight):
    assert preflight.judge_gpu(0, False, None, None).status == "skip"
    assert preflight.judge_gpu(0, True, "0, NVIDIA GB10, GPU-1", None).status == "pass"
    _assert_fail_names(preflight.judge_gpu(0, True, None, "nvidia-smi not found"), "PF-GPU", "r0")


def _verbs_tree(tmp_path: Path, gid3: str, type3: str = "RoCE v2", state: str = "4: ACTIVE") -> str:
    port = tmp_path / "class" / "infiniband" / "rocep1s0f1" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    # As the kernel shows it: one entry per slot of an 8-entry table, the empty ones all zeros.
    entries = {1: ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"), 3: (gid3, type3)}
    for index in range(8):
        gid, kind = entries.get(index, (":".join(["0000"] * 8), None))
        (port / "gids" / str(index)).write_text(gid + "\n")
        if kind:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text("ring1\n")
    return str(tmp_path)


def _rdma_results(preflight, sysfs: str, gid_index):
    params = {"rank": 1, "fabric": "verbs", "ports": [dict(PORT, gid_index=gid_index)]}
    checker = preflight.Preflight(params, run=None, which=lambda name, required: name, sysfs=sysfs)
    return checker, _by_id(checker._rdma())


@pytest.mark.parametrize("gid_index", ["auto", 3])
def test_gid_auto_and_fixed_index(preflight, tmp_path, gid_index):
    sysfs = _verbs_tree(tmp_path, "0000:0000:0000:0000:0000:ffff:c613:0101")
    checker, results = _rdma_results(preflight, sysfs, gid_index)
    assert results["PF-RDMA-PORT"].status == "pass"
    assert results["PF-RDMA-GID"].status == "pass", results["PF-RDMA-GID"].detail
    assert checker.gid_indices == {"ring1": 3}


@pytest.mark.parametrize(
    ("gid3", "type3", "gid_index", "expect"),
    [
        ("0000:0000:0000:0000:0000:ffff:c613:0199", "RoCE v2", 3, "expected ::ffff:c613:101"),
        ("0000:0000:0000:0000:0000:ffff:c613:0101", "IB/RoCE v1", 3, "type IB/RoCE v1"),
        ("0000:0000:0000:0000:0000:ffff:c613:0101", "IB/RoCE v1", "auto", "no RoCE v2 entry"),
        ("0000:0000:0000:0000:0000:ffff:c613:0101", "RoCE v2", 5, "index 5 is empty"),
        (
            "0000:0000:0000:0000:0000:ffff:c613:0101",
            "RoCE v2",
            8,
            "gid_index 8 is past the end of its GID table (gid_tbl_len 8): expected 0-7 or auto",
        ),
    ],
)
def test_gid_mismatch_fails(preflight, tmp_path, gid3, type3, gid_index, expect):
    _checker, results = _rdma_results(preflight, _verbs_tree(tmp_path, gid3, type3), gid_index)
    _assert_fail_names(results["PF-RDMA-GID"], "PF-RDMA-GID")
    assert expect in results["PF-RDMA-GID"].detail


def test_inactive_rdma_port_fails(preflight, tmp_path):
    sysfs = _verbs_tree(tmp_path, "0000:0000:0000:0000:0000:ffff:c613:0101", state="1: DOWN")
    _checker, results = _rdma_results(preflight, sysfs, "auto")
    _assert_fail_names(results["PF-RDMA-PORT"], "PF-RDMA-PORT")
    assert "DOWN" in results["PF-RDMA-PORT"].detail


def test_listener_and_its_holder_are_found(preflight):
    """A real listening socket in this process: its port, its inode, and this PID as holder."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        inodes = preflight.listening_sockets("tcp")[port]
        assert os.getpid() in preflight.socket_holders(inodes)
    assert port not in preflight.listening_sockets("tcp")


def test_container_id_from_cgroup(preflight, tmp_path):
    cid = "4f" * 32
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/user.slice/session-3.scope\n")
    assert preflight.container_id(41, str(tmp_path)) == cid
    assert preflight.container_id(42, str(tmp_path)) is None
    assert preflight.container_id(43, str(tmp_path)) is None


def test_nearest_existing(preflight, tmp_path):
    assert preflight.nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    assert preflight.nearest_existing(str(tmp_path)) == str(tmp_path)


_DOCKER_REPLIES = {
    "/_ping": b"OK",
    "/version": json.dumps({"Version": "26.1.5", "ApiVersion": "1.45"}).encode(),
    "/containers/abc/json": json.dumps(
        {"Name": "/sparkring-r0", "Config": {"Labels": {"sparkring.cluster": "sim"}}}
    ).encode(),
}


class _DockerPing(BaseHTTPRequestHandler):
    """Answers the GETs preflight makes, the way dockerd does."""

    def do_GET(self):
        body = _DOCKER_REPLIES.get(self.path, b'{"message": "No such container"}')
        self.send_response(200 if self.path in _DOCKER_REPLIES else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _UnixHTTPServer(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self):
        self.socket.bind(self.server_address)

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("local", 0)


def test_docker_version_over_a_unix_socket(preflight, tmp_path):
    path = str(tmp_path / "docker.sock")
    server = _UnixHTTPServer(path, _DockerPing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert preflight.docker_version(f"unix://{path}") == "26.1.5 (API 1.45)"
        assert preflight.cluster_container(f"unix://{path}", "abc", "sim") == "sparkring-r0"
        assert preflight.cluster_container(f"unix://{path}", "abc", "other") is None
        assert preflight.cluster_container(f"unix://{path}", "gone", "sim") is None
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(OSError):
        preflight.docker_version(f"unix://{tmp_path}/absent.sock")
    with pytest.raises(ValueError, match="not a unix"):
        preflight.docker_version("tcp://127.0.0.1:2375")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ports": [dict(PORT, gid_index="three")]}, "gid_index: 'three' is neither a number nor 'auto'"),
        ({"ports": [dict(PORT, colour="blue")]}, "colour"),
        ({"disk": [{"path": "var/lib", "min_free_gib": 1}]}, "not absolute"),
        ({"fabric": "ib"}, "fabric"),
    ],
)
def test_module_refuses_bad_arguments(preflight, capsys, change, message):
    args = {
        "rank": 1,
        "hostname": "sim-r1",
        "fabric": "verbs",
        "mtu": 9000,
        "management": {"interface": "mgmt0", "address": "198.19.254.11", "prefix": 24},
        "ports": [PORT],
        **change,
    }
    with patch_module_args(args), pytest.raises(SystemExit):
        preflight.main()
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] and message in result["msg"]


def test_check_ids_are_documented(preflight):
    """docs/preflight.md's check table lists every check ID the module can emit."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "preflight.md").read_text()
    missing = [check for check in preflight.CHECK_IDS if f"| `{check}` |" not in page]
    assert not missing, f"docs/preflight.md lacks {missing}"
