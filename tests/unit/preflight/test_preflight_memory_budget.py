"""PF-MEMORY-BUDGET and the launch's budget refusal, run by ansible-playbook with the roles' own tasks.

Preflight: the role's controller-side budget (`memory_budget_plan.yml`, its defaults, the filter)
against the checked-in inventories, fed the memory facts a rank's `cat /proc/meminfo
/proc/sys/kernel/random/boot_id` prints (a GB10's 124,546 MiB, distinct boot ids; the sim's ranks
one boot id on a 24 GiB machine); no node is contacted. Launch: the launch role's spec tasks in
`--check` with a local connection, so the budget reads this machine's own memory, where the sim
runs, and refuses a profile too large for it before anything is rendered or touched.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from tests.project_code import run_json_play

ROOT = Path(__file__).resolve().parents[3]
GB10_MEMINFO = "MemTotal:       127535104 kB\nMemFree:        120000000 kB\n"
SIM_MEMINFO = "MemTotal:       25165824 kB\nMemFree:        20000000 kB\n"
PREFLIGHT_PLAY = """\
- name: Budget every rank's memory with the preflight role's own tasks (no node contacted)
  hosts: sparkring
  gather_facts: false
  tasks:
    - name: What cat /proc/meminfo /proc/sys/kernel/random/boot_id printed on the rank
      ansible.builtin.set_fact:
        preflight_memory_node:
          rank: "{{ sparkring_rank }}"
          host: "{{ inventory_hostname }}"
          meminfo: "{{ lookup('ansible.builtin.file', meminfo_dir ~ '/' ~ inventory_hostname) }}"
    - name: The role's budget
      ansible.builtin.include_role:
        name: preflight
        tasks_from: memory_budget_plan.yml
    - name: Show the results
      ansible.builtin.debug:
        var: preflight_results
"""
LAUNCH_PLAY = """\
- name: The launch role's plan, up to its memory budget
  hosts: sparkring
  gather_facts: false
  tasks:
    - name: The launch role's spec tasks
      ansible.builtin.include_role:
        name: launch
        tasks_from: spec.yml
"""


def playbook(play: str, inventory: Path, tmp_path: Path, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    """Run `play` against `inventory`: (rc, the play's tasks as the JSON callback reports them)."""
    return run_json_play(play, inventory, tmp_path, *extra)


def memory_facts(tmp_path: Path, hosts: list[str], meminfo: str, shared_kernel: bool) -> Path:
    """One file per host: what `cat` prints there, with one boot id for all or one each."""
    directory = tmp_path / "meminfo"
    directory.mkdir()
    for index, host in enumerate(hosts):
        boot_id = "6b8f3a2e-0000-4000-8000-00000000000" + ("0" if shared_kernel else str(index))
        (directory / host).write_text(meminfo + boot_id + "\n")
    return directory


def results(tasks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    (shown,) = [t for t in tasks if t["task"]["name"] == "Show the results"]
    return {host: outcome["preflight_results"] for host, outcome in shown["hosts"].items()}


def budget_lines(tasks: list[dict[str, Any]], name: str) -> list[str]:
    (shown,) = [t for t in tasks if t["task"]["name"].endswith(name)]  # "<role> : <task>"
    (outcome,) = shown["hosts"].values()  # run_once: printed once
    return outcome["msg"]


def test_preflight_prints_the_example_ring4_budget_per_rank(tmp_path):
    hosts = ["spark0", "spark1", "spark2", "spark3"]
    facts = memory_facts(tmp_path, hosts, GB10_MEMINFO, shared_kernel=False)
    rc, tasks = playbook(
        PREFLIGHT_PLAY, ROOT / "inventories/example/ring4", tmp_path, "-e", f"meminfo_dir={facts}"
    )
    assert rc == 0, tasks
    lines = budget_lines(tasks, "Show the memory budget (per rank, per host)")
    assert lines[0].startswith("per rank: weights 0.00 GiB (no model pinned")
    assert lines[1:] == [
        f"r{r} (spark{r}): weights 0.00 + KV cache 30.00 + vLLM 6.00 + draft 0.00 + SparkCache staging 0.31 "
        "+ OS and page-cache reserve 9.73 = 46.04 GiB of MemTotal 121.63 GiB: fits, 75.58 GiB spare "
        "(weights not counted)"
        for r in range(4)
    ]
    for rank, host in enumerate(hosts):
        (check,) = results(tasks)[host]
        assert (check["id"], check["status"], check["subject"]) == ("PF-MEMORY-BUDGET", "pass", f"r{rank}")
        assert "weights not counted (no model pinned" in check["detail"]


def test_preflight_refuses_a_too_large_profile_on_the_sim_naming_every_term(tmp_path):
    """The sim profile itself passes (tests/unit/launch/test_memory_budget.py); 8 GiB of KV per rank does not."""
    facts = memory_facts(tmp_path, ["r0", "r1", "r2", "r3"], SIM_MEMINFO, shared_kernel=True)
    inventory = tmp_path / "sim"
    shutil.copytree(ROOT / "inventories" / "sim", inventory)
    profile = inventory / "launch.env"
    profile.write_text(profile.read_text().replace("KV_CACHE_GIB=1", "KV_CACHE_GIB=8"))
    rc, tasks = playbook(PREFLIGHT_PLAY, inventory, tmp_path, "-e", f"meminfo_dir={facts}")
    assert rc == 0, tasks  # the role's last block fails the play on a failed check; here: the check itself
    for host, (check,) in results(tasks).items():
        assert check["status"] == "fail", host
        for term in ("weights 0.00", "KV cache 8.00", "vLLM 2.35", "draft 0.00", "SparkCache staging 0.31"):
            assert term in check["detail"]
        assert check["detail"].startswith("r0 (r0), r1 (r1), r2 (r2), r3 (r3) share one host: 4 ranks x (")
        assert "does NOT fit, 20.57 GiB short" in check["detail"]
        assert check["fix"].startswith("lower KV_CACHE_GIB to 2 or less (now 8)")


def test_an_inventory_without_a_launch_profile_skips_the_budget(tmp_path):
    facts = memory_facts(tmp_path, ["spark0", "spark1"], GB10_MEMINFO, shared_kernel=False)
    rc, tasks = playbook(
        PREFLIGHT_PLAY, ROOT / "inventories/example/pair", tmp_path, "-e", f"meminfo_dir={facts}"
    )
    assert rc == 0, tasks
    for checks in results(tasks).values():
        (check,) = checks
        assert check["status"] == "skip" and "no launch profile" in check["detail"]


def test_the_launch_plan_refuses_in_check_mode_before_anything_is_touched(tmp_path):
    """KV_CACHE_GIB=64 on four co-located ranks: more than any machine the sim runs on holds."""
    inventory = tmp_path / "sim"
    shutil.copytree(ROOT / "inventories" / "sim", inventory)
    profile = inventory / "launch.env"
    profile.write_text(profile.read_text().replace("KV_CACHE_GIB=1", "KV_CACHE_GIB=64"))
    rc, tasks = playbook(
        LAUNCH_PLAY,
        inventory,
        tmp_path,
        "--check",
        "-e",
        "ansible_connection=local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    )
    assert rc != 0
    (refused,) = [t for t in tasks if "Refuse a profile whose ranks do not fit" in t["task"]["name"]]
    assert sorted(refused["hosts"]) == ["r0", "r1", "r2", "r3"]
    for outcome in refused["hosts"].values():
        assert outcome["failed"]
        message = outcome["msg"]
        assert message.startswith(
            "launch refused before anything was touched: memory budget of r0 (r0), r1 (r1)"
        )
        for term in (
            "weights 0.00 GiB",
            "KV cache 64.00 GiB (KV_CACHE_GIB=64)",
            "vLLM 2.35 GiB",
            "draft 0.00 GiB",
        ):
            assert term in message
        assert "SparkCache staging 0.31 GiB" in message and "OS and page-cache reserve" in message
        assert "No container was started, stopped or replaced on any rank." in message
    names = [t["task"]["name"] for t in tasks]
    assert not any("Render the spec" in name for name in names)
