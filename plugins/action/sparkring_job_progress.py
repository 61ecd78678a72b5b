# Copyright: SparkRing contributors. Apache-2.0.
"""Follow one rank's async job and print one progress line per interval (action plugin).

The fan-outs (image and model) start their transfer with ``async``/``poll: 0`` on every rank at
once; this task then waits for that rank's job, and every ``interval`` seconds prints one line
read from the progress file the transfer agent keeps (module_utils/sparkring_fanout.py). One task
header for the whole wait, one line per rank per interval, then the job's own result: a failed
transfer fails this task with the transfer's message. Documented in
library/sparkring_job_progress.py (ansible-doc reads it there).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

ARGUMENT_SPEC: dict[str, Any] = {
    "jid": {"type": "str", "required": True},
    "progress_path": {"type": "path", "required": True},
    "label": {"type": "str", "default": ""},
    "interval": {"type": "float", "default": 2.0},
    "timeout": {"type": "int", "default": 3600},
}
MIB = 1024 * 1024


def progress_line(label: str, state: dict | None) -> str:
    """One line from the agent's progress JSON: the phase when it is not the transfer (rank 0
    obtaining, docker load), and the transfer's counts whenever the file has them."""
    if not state:
        return f"{label}: starting"
    phase = state.get("phase", "transfer")
    prefix = f"{label}: " if phase == "transfer" else f"{label}: {phase}; "
    if "chunks_total" not in state:
        return prefix.rstrip("; ")
    line = (
        f"{prefix}{state.get('chunks_verified', 0)}/{state['chunks_total']} chunks verified "
        f"({state.get('percent', 0)} %), {state.get('received_bytes', 0) / MIB:.1f} MiB received "
        f"in {state.get('elapsed_s', 0)} s"
    )
    extras = [
        f"{state[key]} {word}"
        for key, word in (("resumed_chunks", "resumed"), ("rejected_chunks", "rejected"))
        if state.get(key)
    ]
    return line + (f" ({', '.join(extras)})" if extras else "")


class ActionModule(ActionBase):
    """Poll async_status and the progress file until the job ends; return the job's result."""

    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        label = args["label"] or task_vars.get("inventory_hostname", "?")
        # The same job directory the async wrapper wrote to (what the async_status action passes).
        job = {
            "jid": args["jid"],
            "_async_dir": self._remote_expand_user(
                self.get_shell_option("async_dir", default="~/.ansible_async")
            ),
        }
        deadline = time.monotonic() + args["timeout"]
        host = task_vars.get("inventory_hostname", "?")
        while True:
            status = self._execute_module(
                module_name="ansible.legacy.async_status", module_args=job, task_vars=task_vars
            )
            if status.get("failed") and not status.get("finished"):  # no job file: nothing to wait for
                return {**result, **status}
            # One line per interval while it runs, and one with the final state when it ends.
            display.display(f"{host} | {progress_line(label, self._read(args, task_vars))}")
            if status.get("finished"):
                self._execute_module(
                    module_name="ansible.legacy.async_status",
                    module_args={**job, "mode": "cleanup"},
                    task_vars=task_vars,
                )
                return self._job_result(result, status)
            if time.monotonic() > deadline:
                raise AnsibleActionFail(
                    f"{label}: job {args['jid']} still running after {args['timeout']} s; "
                    "raise the timeout or look at the transfer's progress file "
                    f"{args['progress_path']}"
                )
            time.sleep(args["interval"])

    def _read(self, args: dict, task_vars: dict) -> dict | None:
        """The progress file's JSON, or None while the agent has not written one."""
        got = self._execute_module(
            module_name="ansible.legacy.slurp",
            module_args={"src": args["progress_path"]},
            task_vars=task_vars,
        )
        if got.get("failed") or "content" not in got:
            return None
        try:
            return json.loads(base64.b64decode(got["content"]))
        except ValueError:
            return None

    @staticmethod
    def _job_result(result: dict, status: dict) -> dict:
        """The finished job's result as if the module had run in the foreground."""
        job = {
            key: value
            for key, value in status.items()
            if key not in ("ansible_job_id", "started", "finished", "results_file", "stdout", "stderr")
        }
        return {**result, **job}
