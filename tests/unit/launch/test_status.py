"""The status view: sparkring_rank_status reads a rank (a stand-in docker CLI in the real tool's
format, a real HTTP /health, the real /sys/class/net), and plugins/sparkring/status.py joins the
ranks into the document the page and the recovery agent read: four ranks, every cable once, the
last fault and the next command."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from ansible.module_utils.testing import patch_module_args
from launch_module import tool
from sparkring.status import build_status, render_text
from test_heal import CABLE, cable_down, rank, rank2_killed, serving

from tests.project_code import load_library_module

INSPECT = [
    {
        "State": {
            "Status": "exited",
            "ExitCode": 75,
            "StartedAt": "2026-12-06T20:00:00Z",
            "FinishedAt": "2026-12-06T20:05:00Z",
            "OOMKilled": False,
        }
    }
]
LAST_WORDS = "sparkring overlay: engine failed: rank 2 (198.19.1.2, r1 cage1 <-> r2 cage0) stopped answering"


def rank_status() -> object:
    return load_library_module("sparkring_rank_status")


@pytest.fixture
def health_server():
    """A real HTTP server answering /health with 503, as the overlay makes vLLM's after a fault."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"engine failed: rank 2 stopped answering")

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/health"
    server.shutdown()


def test_the_module_reads_container_attestation_ports_and_health(
    tmp_path, monkeypatch, capsys, health_server
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(
        bin_dir,
        "docker",
        f"""case "$1" in
container) echo '{json.dumps(INSPECT)}' ;;
logs) echo 'INFO serving'; echo '{LAST_WORDS}' >&2; echo 'INFO bye' ;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    record = tmp_path / "sparkring-rank2-latest.json"
    record.write_text(
        json.dumps(
            {
                "image": {"id": "sha256:" + "a" * 64},
                "profile_sha256": "b" * 64,
                "mounts": [
                    {"target": "/models/model", "read_only": True, "manifest_sha256": "c" * 64},
                    {"target": "/etc/sparkring/ring.json", "read_only": True, "manifest_sha256": "d" * 64},
                ],
            }
        )
    )
    args = {
        "container": "sparkring-rank2",
        "attestation": str(record),
        "ports": [{"interface": "lo", "peer_rank": 1}, {"interface": "sr-no-such-port", "peer_rank": 3}],
        "health_url": health_server,
    }
    with patch_module_args(args), pytest.raises(SystemExit):
        rank_status().main()
    result = json.loads(capsys.readouterr().out)
    assert result["container"]["state"] == "exited" and result["container"]["exit_code"] == 75
    assert result["container"]["last_error"] == LAST_WORDS
    assert result["attestation"]["image_id"] == "sha256:" + "a" * 64
    assert result["attestation"]["models"] == {"/models/model": "c" * 64}
    assert result["ports"][1]["operstate"] == "absent" and result["ports"][1]["carrier"] is None
    assert result["ports"][0]["operstate"] in ("unknown", "up")  # loopback has no carrier state machine
    assert result["health"]["status"] == 503 and "rank 2" in result["health"]["error"]
    assert not result["changed"]


def test_a_serving_ring_lists_four_ranks_four_cables_and_nothing_to_do() -> None:
    doc = serving()
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert len(doc["cables"]) == 4 and {c["state"] for c in doc["cables"]} == {"up"}
    assert doc["fault"] is None and doc["next"] == "nothing: the ring serves"
    page = render_text(doc)
    assert "rank 0 /health 200" in page and "last fault: none" in page and page.count("cable r") == 4


def test_a_killed_rank_is_the_fault_and_the_launch_is_the_next_command() -> None:
    doc = rank2_killed()
    assert doc["fault"]["kind"] == "rank" and doc["fault"]["ranks"] == [2]
    assert doc["next"] == "ansible-playbook -i inventories/sim playbooks/launch.yml"
    page = render_text(doc)
    assert "last fault: rank 2 container exited (exit 137)" in page
    assert "recovery agent: not installed" in page


def test_a_down_cable_is_named_with_its_down_end_before_anything_else() -> None:
    doc = cable_down()
    assert doc["fault"]["kind"] == "cable" and doc["fault"]["cables"] == [CABLE]
    assert f"cable {CABLE}: down at r1 ring1 (down)" in render_text(doc)
    assert doc["next"].startswith(f"bring cable {CABLE} up") and "playbooks/qualify.yml" in doc["next"]


def test_the_agent_state_shows_on_the_page_and_sets_the_next_command() -> None:
    agent = {
        "state": "backing_off",
        "running": True,
        "attempt": 1,
        "max_attempts": 4,
        "next_attempt_utc": "2026-12-06T20:01:00Z",
        "counts": {"recovered": 2},
        "last_fault": {"kind": "rank", "summary": "rank 2 container exited"},
    }
    ranks = [rank(0), rank(1), rank(2, "exited"), rank(3)]
    doc = build_status(ranks, "inventories/sim", "sim", "2026-12-06T20:00:30Z", agent=agent)
    assert doc["next"] == "nothing: the recovery agent relaunches at 2026-12-06T20:01:00Z"
    assert "recovery agent: backing_off, attempt 1 of 4, 2 recoveries" in render_text(doc)
    gave_up = {**agent, "state": "gave_up", "running": False, "message": "gave up after 4 attempts"}
    doc = build_status(ranks, "inventories/sim", "sim", "2026-12-06T20:00:30Z", agent=gave_up)
    assert doc["next"].startswith("the recovery agent gave up (gave up after 4 attempts)")
    assert doc["next"].endswith("ansible-playbook -i inventories/sim playbooks/launch.yml")
    serving_now = build_status([rank(n) for n in range(4)], "inventories/sim", "sim", "t", agent=agent)
    assert serving_now["last_fault"]["summary"] == "rank 2 container exited"  # the agent remembers
