#!/usr/bin/python
# Copyright: SparkRing contributors
# Apache-2.0
"""Start (or stop) one simulated rank's sshd and dockerd inside its private namespaces."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sim_ring_rank
short_description: Run one simulated rank's sshd and Docker daemon in their own namespaces
description:
  - Starts the rank's boot script in the rank's network namespace (entered with C(nsenter --net),
    not C(ip netns exec), which would remount /sys and break dockerd) under a new private mount
    and UTS namespace. The script sets the hostname, bind-mounts the rank's directories over the
    node paths, starts dockerd and finally becomes sshd.
  - The rank counts as running when both pid files name live processes inside the rank's network
    namespace and the fingerprint of the running configuration equals O(fingerprint); otherwise
    everything of the rank is stopped and started again.
  - V(absent) removes the rank's containers, then stops every process in the rank's network
    namespace or under its container cgroup parent (dockerd, containerd, shims, sshd, sessions).
options:
  host:
    description: Inventory hostname of the rank (used in messages).
    type: str
    required: true
  netns:
    description: Name of the rank's network namespace (under /run/netns).
    type: str
    required: true
  rank_dir:
    description: The rank's state directory; holds C(boot.sh), C(sshd.pid), C(dockerd.pid), C(run/), C(log/).
    type: path
    required: true
  ssh_port:
    description: Port sshd listens on; readiness waits for it.
    type: int
    default: 22
  cgroup_parent:
    description: The cgroup parent dockerd gives containers (how stray containers are found).
    type: str
    required: true
  fingerprint:
    description: Checksum of the rank's configuration; a running rank with another one is restarted.
    type: str
    required: true
  timeout:
    description: Seconds to wait for sshd and dockerd to answer.
    type: int
    default: 90
  state:
    description: V(present) runs the rank, V(absent) stops everything of it.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: Before/after of the rank's daemons (running with which fingerprint, or stopped).
  platform:
    platforms: linux
author: SparkRing contributors
"""

EXAMPLES = r"""
- name: Run rank r0
  sim_ring_rank:
    host: r0
    netns: sr-r0
    rank_dir: /var/lib/sparkring-sim/ranks/r0
    cgroup_parent: sparkring-sim-r0
    fingerprint: "{{ boot_script.checksum }}"
"""

RETURN = r"""
started:
  description: Whether the rank was (or would be) started.
  returned: always
  type: bool
stopped_pids:
  description: Processes that were stopped.
  returned: always
  type: list
  elements: int
sshd_pid:
  description: Pid of the rank's sshd.
  returned: when running
  type: int
dockerd_pid:
  description: Pid of the rank's dockerd.
  returned: when running
  type: int
"""

import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sim_ring_procs import (  # noqa: E402
    netns_inode,
    pid_alive_in,
    pids_of,
    read_pidfile,
    terminate,
)


class Rank:
    """One rank's daemons, identified by pid files and checked against the rank's namespace."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.dir = self.p["rank_dir"]
        self.netns = netns_inode(f"/run/netns/{self.p['netns']}")
        self.docker = module.get_bin_path("docker", required=True)
        self.socket = os.path.join(self.dir, "run", "docker.sock")
        self.fingerprint_file = os.path.join(self.dir, "running.fingerprint")

    def pid(self, name: str) -> int | None:
        pid = read_pidfile(os.path.join(self.dir, f"{name}.pid"))
        return pid if pid is not None and pid_alive_in(pid, self.netns) else None

    def running_fingerprint(self) -> str | None:
        if self.pid("sshd") is None or self.pid("dockerd") is None:
            return None
        try:
            with open(self.fingerprint_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            return None

    def stop(self) -> list[int]:
        """Containers through their daemon first (so dockerd cleans up), then every process left."""
        if self.pid("dockerd") is not None:
            rc, out, _ = self.module.run_command([self.docker, "-H", f"unix://{self.socket}", "ps", "-aq"])
            if rc == 0 and out.split():
                self.module.run_command(
                    [self.docker, "-H", f"unix://{self.socket}", "rm", "-f", *out.split()]
                )
            dockerd = self.pid("dockerd")
            if dockerd is not None:
                terminate([dockerd], grace_s=20.0)
        stopped = terminate(pids_of(self.netns, f"/{self.p['cgroup_parent']}/"), grace_s=10.0)
        if pids_of(self.netns, f"/{self.p['cgroup_parent']}/"):
            self.module.fail_json(
                msg=f"rank {self.p['host']}: processes survived SIGKILL in {self.p['netns']}"
            )
        for name in ("sshd.pid", "dockerd.pid", "running.fingerprint"):
            if os.path.exists(os.path.join(self.dir, name)):
                os.unlink(os.path.join(self.dir, name))
        return stopped

    def start(self) -> None:
        if self.netns is None:
            self.module.fail_json(
                msg=f"rank {self.p['host']}: network namespace {self.p['netns']} is missing (run sim_ring_fabric first)"
            )
        os.makedirs(os.path.join(self.dir, "log"), exist_ok=True)
        log = open(os.path.join(self.dir, "log", "boot.log"), "ab")  # noqa: SIM115 - handed to the daemon
        nsenter = self.module.get_bin_path("nsenter", required=True)
        unshare = self.module.get_bin_path("unshare", required=True)
        argv = [nsenter, f"--net=/run/netns/{self.p['netns']}", "--", unshare, "--mount", "--uts"]
        argv += ["--propagation", "private", "--", "/bin/sh", os.path.join(self.dir, "boot.sh")]
        # A new session and no inherited pipes: Ansible must not wait for the daemons.
        subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
        log.close()
        self.wait_ready()
        with open(self.fingerprint_file, "w", encoding="utf-8") as f:
            f.write(self.p["fingerprint"])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.p["timeout"]
        port = f":{self.p['ssh_port']:04X} "
        while time.monotonic() < deadline:
            sshd = self.pid("sshd")
            listening = False
            if sshd is not None:
                try:
                    with open(f"/proc/{sshd}/net/tcp", encoding="utf-8") as f:
                        listening = any(port in line and line.split()[3] == "0A" for line in f)
                except OSError:
                    listening = False
            if listening and self.pid("dockerd") is not None:
                rc, _, _ = self.module.run_command([self.docker, "-H", f"unix://{self.socket}", "version"])
                if rc == 0:
                    return
            time.sleep(0.25)
        tail = ""
        for name in ("boot.log", "dockerd.log", "sshd.log"):
            path = os.path.join(self.dir, "log", name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    tail += f"\n--- {name}\n" + "".join(f.readlines()[-15:])
        self.module.fail_json(
            msg=f"rank {self.p['host']}: sshd or dockerd not ready after {self.p['timeout']} s; logs under {self.dir}/log:{tail}"
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "netns": {"type": "str", "required": True},
            "rank_dir": {"type": "path", "required": True},
            "ssh_port": {"type": "int", "default": 22},
            "cgroup_parent": {"type": "str", "required": True},
            "fingerprint": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 90},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        supports_check_mode=True,
    )
    rank = Rank(module)
    before = rank.running_fingerprint()
    want = module.params["fingerprint"] if module.params["state"] == "present" else None
    leftovers = rank.netns is not None and bool(pids_of(rank.netns, f"/{module.params['cgroup_parent']}/"))
    changed = before != want or (want is None and leftovers)
    stopped: list[int] = []
    if changed and not module.check_mode:
        stopped = rank.stop()
        if want is not None:
            rank.start()
    result = {"changed": changed, "started": changed and want is not None, "stopped_pids": stopped}
    if want is not None and not module.check_mode:
        result.update(sshd_pid=rank.pid("sshd"), dockerd_pid=rank.pid("dockerd"))
    if module._diff:
        result["diff"] = {
            "before": f"{module.params['host']}: " + (f"running {before}" if before else "stopped") + "\n",
            "after": f"{module.params['host']}: " + (f"running {want}" if want else "stopped") + "\n",
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
