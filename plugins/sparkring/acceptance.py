"""The acceptance gates (docs/acceptance.md): the one catalog of gate IDs and what each decides.

`playbooks/acceptance.yml` collects (node modules, API requests, the nested `site.yml --check`);
the functions here decide, from what was collected, whether a gate passed and which rank failed
it, and write the one-page summary. Pure functions of plain data, driven by tests/unit/acceptance.

Every gate result has the same shape (``SCHEMA``): ``id``, ``status`` (pass, fail, skip),
``rank`` (the first rank that failed it; null when the failure belongs to the ring as a whole or
to the API on rank 0 only), ``summary`` (one line), ``problems`` (one line each), ``fix`` and the
gate's own ``evidence``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

SCHEMA = "sparkring.acceptance.gate/1"


class AcceptanceError(ValueError):
    """A request the acceptance cannot run (unknown gate, impossible cell), naming the fix."""


@dataclass(frozen=True)
class Gate:
    id: str
    proves: str
    touches: str


GATES = (
    Gate(
        "AC-LOCK",
        "every input the deployment runs is the pinned one, on every rank (image, source "
        "trees, NCCL, model files), and the running containers are the attested launch",
        "reads only",
    ),
    Gate(
        "AC-IDEMPOTENT",
        "site.yml in check mode reports no change on any rank",
        "reads only (site.yml --check)",
    ),
    Gate(
        "AC-RING-BURN",
        "every collective of the ring transport, small and large buffers, byte-identical "
        "to the reference on every rank over the real fabric, with the model down (the qualify stage's burn)",
        "stops the deployment for the burn; launching it again is the four-process replacement",
    ),
    Gate(
        "AC-DETERMINISM",
        "greedy completions of a fixed prompt set are identical across two launches",
        "the four-process replacement (the burn's relaunch, or a forced launch without the burn)",
    ),
    Gate(
        "AC-SPARKCACHE",
        "after the four-process replacement every rank restores the long prompts from "
        "SparkCache and the outputs equal the cold run",
        "the same replacement",
    ),
    Gate(
        "AC-NCCL-IDENTITY",
        "every vLLM process maps exactly the attested NCCL library (or proves a second "
        "copy unused by symbol resolution)",
        "reads only (/proc of the serving processes)",
    ),
    Gate(
        "AC-CELLS",
        "benchmark cells through the OpenAI API: zero request errors, tokens/s and time to "
        "first token, and the ring carried the collectives on every rank",
        "sends requests only",
    ),
)
GATE_IDS = tuple(gate.id for gate in GATES)


def plan(selected: list[str] | None, profile: dict[str, Any]) -> list[dict[str, Any]]:
    """The gates in their fixed order, each marked run or skip (with the reason)."""
    chosen = list(GATE_IDS) if selected is None else [str(g).strip().upper() for g in selected]
    unknown = [g for g in chosen if g not in GATE_IDS]
    if unknown:
        raise AcceptanceError(
            f"acceptance_gates: unknown gate(s) {unknown}; the gates are {', '.join(GATE_IDS)}"
        )
    if not chosen:
        raise AcceptanceError("acceptance_gates: empty; name at least one gate (or leave it unset for all)")
    out = []
    for gate in GATES:
        entry = {"id": gate.id, "proves": gate.proves, "touches": gate.touches, "run": gate.id in chosen}
        if gate.id not in chosen:
            entry["note"] = "not selected (acceptance_gates)"
        elif gate.id == "AC-SPARKCACHE" and not profile.get("sparkcache_enabled", True):
            entry.update(run=False, note="SPARKCACHE_ENABLED=0 in the launch profile: nothing to restore")
        out.append(entry)
    return out


def result(
    gate_id: str,
    problems_by_rank: dict[int | None, list[str]],
    summary: str,
    fix: str,
    evidence: dict[str, Any],
) -> dict[str, Any]:
    """A gate's result: failed when any rank (or the ring, key None) has a problem; the rank named
    is the lowest failing one."""
    failing = [rank for rank, problems in problems_by_rank.items() if problems]
    ranks = sorted(r for r in failing if r is not None)
    lines = [
        p for rank in sorted(failing, key=lambda r: -1 if r is None else r) for p in problems_by_rank[rank]
    ]
    return {
        "schema": SCHEMA,
        "id": gate_id,
        "status": "fail" if failing else "pass",
        "rank": ranks[0] if ranks else None,
        "failing_ranks": ranks,
        "summary": summary,
        "problems": lines,
        "fix": fix if failing else "",
        "evidence": evidence,
    }


def skipped(entry: dict[str, Any]) -> dict[str, Any]:
    """A planned gate without a result: skipped by the plan, or not reached (an earlier gate failed)."""
    reached = not entry["run"]
    return {
        "schema": SCHEMA,
        "id": entry["id"],
        "status": "skip" if reached else "not-run",
        "rank": None,
        "failing_ranks": [],
        "summary": entry.get("note", "skipped") if reached else "not run: the run stopped at an earlier gate",
        "problems": [],
        "fix": "",
        "evidence": {},
    }


def failure_line(gate: dict[str, Any]) -> str:
    """The one line that ends a failed run: the gate, the rank, the first problem and the fix."""
    where = f"rank {gate['rank']}" if gate.get("rank") is not None else "the ring (no single rank)"
    first = gate["problems"][0] if gate.get("problems") else gate.get("summary", "")
    return f"{gate['id']} failed on {where}: {first}" + (f"; fix: {gate['fix']}" if gate.get("fix") else "")


# -- AC-LOCK ---------------------------------------------------------------------------------------


def pinned_model_files(pins: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Every file of the models the profile serves, as a path on a rank with the lock's sha256.

    ``pins`` is the launch role's ``launch_models``: the one join of profile, lock and inventory
    (sparkring.models.model_pins), which already refuses a revision the lock does not pin."""
    return [
        {"model": pin["name"], "path": f"{pin['path'].rstrip('/')}/{f['path']}", "sha256": f["sha256"]}
        for pin in pins
        for f in pin["files"]
    ]


def lock_verdict(
    lock: dict[str, Any],
    lock_sha256: str,
    profile: dict[str, Any],
    identity: dict[str, Any],
    ranks: list[dict[str, Any]],
) -> dict[str, Any]:
    """Each rank: the running container is the attested launch of this profile, its image is the
    image stage's (built from this lock), and every pinned input on the rank has the lock's hash.

    The source trees are checked through the running container's own build record
    (/opt/sparkring/image.json): the build wrote the lock's sha256 and tree hashes into it and
    the image's entrypoint refuses to start unless every installed source file still has the
    sha256 the record names, so a running container whose record names this lock runs its trees.
    (The installed package in site-packages is pip's copy, not the checkout's tree: its hash is
    compared across ranks by the launch, not against the lock.)

    ``ranks[i]``: rank, up_to_date (the launch module in check mode), container (docker inspect:
    Id, Image, Running), record (the rank's latest attestation), image_json (the running
    container's build record or None), spec_argv, model_files (the results of a stat loop over
    ``pinned_model_files``: item and stat), nccl (the NCCL stage's attestation.json or None)."""
    problems: dict[int | None, list[str]] = {}
    checks = []

    def check(rank: int | None, name: str, ok: bool, detail: str) -> None:
        checks.append({"rank": rank, "check": name, "status": "pass" if ok else "fail", "detail": detail})
        problems.setdefault(rank, [])
        if not ok:
            problems[rank].append(f"{name}: {detail}")

    locked_image = identity.get("lock") == lock
    check(
        None,
        "image-built-from-lock",
        locked_image,
        "the image stage's identity records this lock"
        if locked_image
        else "the image on rank 0 was built from another images/lock.json than the checkout's",
    )
    nccl_release = (
        (lock.get("nccl") or {}).get("releases", {}).get((lock.get("nccl") or {}).get("default_version"))
    )
    for r in sorted(ranks, key=lambda r: r["rank"]):
        rank, record, container = r["rank"], r.get("record") or {}, r.get("container") or {}
        running = bool(container.get("Running"))
        check(rank, "container-running", running, f"{container.get('Name', '?')} running={running}")
        check(
            rank,
            "attested-launch",
            bool(r.get("up_to_date")),
            "the running container is the one the launch started, with this profile's exact argv"
            if r.get("up_to_date")
            else "the running container is not the launch of this profile",
        )
        same_argv = record.get("argv") == r.get("spec_argv")
        check(
            rank,
            "record-argv",
            same_argv,
            "the latest attestation record holds this argv"
            if same_argv
            else "the latest attestation record was made for another argv",
        )
        image = (record.get("image") or {}).get("id")
        check(
            rank,
            "image",
            image == container.get("Image") == identity.get("image_id"),
            f"record {image}, running {container.get('Image')}, image stage {identity.get('image_id')}",
        )
        built = r.get("image_json") or {}
        check(
            rank,
            "image-lock",
            built.get("lock_sha256") == lock_sha256,
            f"the running image's build record names lock sha256 {built.get('lock_sha256')}, "
            f"the checkout's images/lock.json is {lock_sha256}",
        )
        for name, tree in sorted(lock.get("source_trees", {}).items()):
            found = (built.get("sources_sha256") or {}).get(name)
            check(
                rank,
                f"source-{name}",
                found == tree["sha256"],
                f"the running image was built from {found}, locked {tree['sha256']}",
            )
        nccl_found = ((record.get("image_files") or {}).get("nccl") or {}).get("sha256")
        if profile.get("nccl_mode") == "none":
            check(
                rank,
                "nccl",
                nccl_found is None,
                "no NCCL library in this deployment (NCCL_MODE=none)"
                if nccl_found is None
                else f"NCCL_MODE=none but the image carries a library ({nccl_found})",
            )
        else:
            built = r.get("nccl") or {}
            want_patches = [p["sha256"] for p in (nccl_release or {}).get("patches", [])]
            got_patches = [p.get("sha256") for p in built.get("patches", [])]
            # The source as pinned: the archive's sha256 and the unpacked tree's digest, each or null.
            built_source = [(built.get("source") or {}).get(k) for k in ("sha256", "tree_sha256")]
            locked_source = [(nccl_release or {}).get(k) for k in ("source_sha256", "source_tree_sha256")]
            check(
                rank,
                "nccl-source",
                bool(built) and built_source == locked_source and got_patches == want_patches,
                f"built from source {built_source} with patches {got_patches}; "
                f"locked {locked_source} with {want_patches}",
            )
            library = (built.get("output") or {}).get("sha256")
            check(
                rank,
                "nccl-library",
                library is not None and library == nccl_found,
                f"built {library}, in the image {nccl_found}",
            )
        for f in r.get("model_files", []):  # the stat loop's results: item (the pin) and stat
            want, stat = f["item"], f.get("stat") or {}
            found = stat.get("checksum") if stat.get("exists") else None
            check(
                rank,
                f"model-{want['model']}",
                found == want["sha256"],
                f"{want['path']}: {found or 'missing'}, locked {want['sha256']}",
            )
    failed = sum(1 for c in checks if c["status"] == "fail")
    return result(
        "AC-LOCK",
        problems,
        f"{len(checks) - failed} of {len(checks)} pin checks passed on {len(ranks)} ranks",
        "put the pinned input back on that rank: the model stage or launch for model files, the image "
        "stage (playbooks/image.yml) for the image, the build stage for NCCL; then launch again",
        {"checks": checks},
    )


# -- AC-IDEMPOTENT ---------------------------------------------------------------------------------

RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TASK = re.compile(r"^TASK \[(.*)\] \*+$")
CHANGED = re.compile(r"^changed: \[([^\]\s]+)(?: -> [^\]]+)?\]")


def site_check_verdict(output: str, rc: int, host_ranks: dict[str, int]) -> dict[str, Any]:
    """`ansible-playbook site.yml --check` must end with changed=0, failed=0, unreachable=0 on every rank."""
    recap = {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in RECAP.finditer(output)
    }
    changed_tasks: dict[str, list[str]] = {}
    task = "?"
    for line in output.splitlines():
        if m := TASK.match(line):
            task = m[1]
        elif m := CHANGED.match(line):
            changed_tasks.setdefault(m[1], []).append(task)
    problems: dict[int | None, list[str]] = {None: []}
    if not recap:
        errors = [line.strip() for line in output.splitlines() if "ERROR" in line or "error:" in line]
        problems[None].append(
            f"site.yml --check exited {rc} before its play recap: {' '.join(errors[-3:]) or 'no error line'}"
        )
    for host, rank in host_ranks.items():
        counts = recap.get(host)
        problems[rank] = []
        if counts is None:
            if recap:
                problems[rank].append(f"{host} is missing from the play recap (rc {rc})")
            continue
        for key in ("unreachable", "failed", "changed"):
            if counts[key]:
                tasks = f": {', '.join(changed_tasks.get(host, []))}" if key == "changed" else ""
                problems[rank].append(f"{host} {key}={counts[key]}{tasks}")
    if rc != 0 and not any(problems.values()):
        problems[None].append(f"ansible-playbook site.yml --check exited {rc}")
    return result(
        "AC-IDEMPOTENT",
        problems,
        "site.yml --check: " + ", ".join(f"{h} changed={c['changed']}" for h, c in sorted(recap.items())),
        "run `ansible-playbook site.yml` and look at what it changes on that rank (or what drifted there)",
        {"rc": rc, "recap": recap, "changed_tasks": changed_tasks},
    )


# -- AC-RING-BURN ----------------------------------------------------------------------------------


def burn_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """The qualify stage's four-rank burn report (roles/qualify, burn.json) as a gate: every rank
    ran every collective at every size with no mismatch and no error."""
    problems: dict[int | None, list[str]] = {None: []}
    for r in report.get("ranks", []):
        mismatched = [b for b in r.get("burns", []) if b.get("mismatches")]
        problems[r["rank"]] = [f for f in report.get("failures", []) if f.startswith(f"rank {r['rank']} ")]
        if not problems[r["rank"]] and (mismatched or r.get("error") or not r.get("ok")):
            problems[r["rank"]].append(f"rank {r['rank']}: {r.get('error') or 'the burn did not pass'}")
    if not report.get("ranks"):
        problems[None].append(f"the burn produced no result ({report.get('summary', 'no report')})")
    return result(
        "AC-RING-BURN",
        problems,
        report.get("summary", ""),
        "a mismatch is data corrupted between that rank and a neighbour (cable, NIC, host memory): "
        "re-run playbooks/qualify.yml; the deployment stays stopped until the fabric is fixed "
        "(then playbooks/launch.yml)",
        {"report": report},
    )


# -- AC-NCCL-IDENTITY ------------------------------------------------------------------------------


def nccl_identity_verdict(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """``ranks[i]``: rank, attested_sha256, and the sparkring_nccl_identity module's result."""
    problems = {r["rank"]: [f"rank {r['rank']}: {p}" for p in r["verdict"]["problems"]] for r in ranks}
    modes = {r["rank"]: r["verdict"]["mode"] for r in ranks}
    mapped = sorted(
        {lib["path"] + " " + lib["sha256"] for r in ranks for p in r["processes"] for lib in p["libraries"]}
    )
    return result(
        "AC-NCCL-IDENTITY",
        problems,
        f"{sum(len(r['processes']) for r in ranks)} vLLM processes on {len(ranks)} ranks; modes {modes}",
        "the rank's container maps another NCCL than the attested one: find what puts it there "
        "(LD_PRELOAD, LD_LIBRARY_PATH, the image) and launch again through playbooks/launch.yml",
        {
            "modes": modes,
            "mapped": mapped,
            "attested": {r["rank"]: r.get("attested_sha256") or None for r in ranks},
        },
    )


# -- AC-DETERMINISM --------------------------------------------------------------------------------


def determinism_requests(prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    """The fixed prompt set as API requests: greedy, end-of-sequence honoured."""
    return [
        {"id": f"p{i}", "prompt": p, "max_tokens": max_tokens, "ignore_eos": False}
        for i, p in enumerate(prompts)
    ]


def determinism_verdict(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> dict[str, Any]:
    """The same prompts, greedy, before and after a replacement: every text identical."""
    problems: dict[int | None, list[str]] = {None: []}
    for a, b in zip(first, second, strict=True):
        for run in (a, b):
            if run.get("error"):
                problems[None].append(f"prompt {run['id']}: request failed: {run['error']}")
        if not (a.get("error") or b.get("error")) and a["text"] != b["text"]:
            at = next(
                (i for i, (x, y) in enumerate(zip(a["text"], b["text"], strict=False)) if x != y),
                min(len(a["text"]), len(b["text"])),
            )
            problems[None].append(
                f"prompt {a['id']}: outputs differ from character {at}: {a['text'][at : at + 40]!r} "
                f"before, {b['text'][at : at + 40]!r} after the replacement"
            )
    return result(
        "AC-DETERMINISM",
        problems,
        f"{len(first)} greedy completions compared across two launches",
        "greedy decoding is not reproducible on this deployment: look for a rank whose collectives "
        "left the ring (AC-CELLS flight recorders) or a nondeterministic kernel setting",
        {"before": first, "after": second},
    )


# -- AC-SPARKCACHE ---------------------------------------------------------------------------------

LOADED = re.compile(r"SparkCache: loaded (\d+) tokens \((\d+) page\(s\) verified\)")
RECOMPUTED = re.compile(r"SparkCache: request \S+: (.*); (\d+) block\(s\) will be recomputed")
PUBLISHED = re.compile(r"SparkCache: snapshot [0-9a-f]+ \((\d+) tokens\) (\w+)(?:: (.*))?")


def publications(log: str) -> list[dict[str, Any]]:
    return [{"tokens": int(m[1]), "status": m[2], "reason": m[3]} for m in PUBLISHED.finditer(log)]


def sparkcache_verdict(
    cold: list[dict[str, Any]], warm: list[dict[str, Any]], logs: dict[int, str], expected_tokens: list[int]
) -> dict[str, Any]:
    """Every rank restored every long prompt in full (its log says so), the outputs equal the
    cold run, and time to first token is reported against the recompute (the cold run)."""
    problems: dict[int | None, list[str]] = {None: []}
    for a, b in zip(cold, warm, strict=True):
        for run in (a, b):
            if run.get("error"):
                problems[None].append(f"long prompt {run['id']}: request failed: {run['error']}")
        if not (a.get("error") or b.get("error")) and a["text"] != b["text"]:
            problems[None].append(
                f"long prompt {a['id']}: the restored run's output differs from the cold run's"
            )
    restored = {}
    for rank, log in sorted(logs.items()):
        loaded = [int(m[1]) for m in LOADED.finditer(log)]
        recomputed = [m[1] for m in RECOMPUTED.finditer(log)]
        restored[rank] = {"loaded_tokens": loaded, "recomputed": recomputed}
        missing = Counter(expected_tokens) - Counter(loaded)
        problems[rank] = []
        if missing or recomputed:
            why = f": {recomputed[0]}" if recomputed else ""
            problems[rank].append(
                f"rank {rank} did not restore every long prompt (loaded {loaded} tokens, expected "
                f"{expected_tokens}){why}; vLLM recomputed instead"
            )
    ttft = [
        {
            "id": a["id"],
            "recompute_s": a.get("ttft_s"),
            "restore_s": b.get("ttft_s"),
            "ratio": round(b["ttft_s"] / a["ttft_s"], 3) if a.get("ttft_s") and b.get("ttft_s") else None,
        }
        for a, b in zip(cold, warm, strict=True)
    ]
    outputs_equal = all(a.get("text") == b.get("text") for a, b in zip(cold, warm, strict=True))
    return result(
        "AC-SPARKCACHE",
        problems,
        f"{len(warm)} long prompts after a four-process replacement; outputs equal: {outputs_equal}; "
        "time to first token restore/recompute: " + ", ".join(str(t["ratio"]) for t in ttft),
        "look at that rank's SparkCache store and log (a page failed verification, was missing, or the "
        "store could not publish: disk, limits)",
        {
            "outputs_equal": outputs_equal,
            "ttft": ttft,
            "restored": restored,
            "expected_tokens": expected_tokens,
        },
    )


# -- the one-page summary --------------------------------------------------------------------------


def _cell_rows(cells: list[dict[str, Any]]) -> list[str]:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    rows = [
        f"{'CELL':<18} {'METRIC':<24} {'P50':>8} {'MIN':>8} {'MAX':>8} {'TARGET':>7} "
        f"{'TTFT P50 (MIN-MAX) s':>22} {'REQ':>4} {'ERR':>4}  RING SHARE PER RANK"
    ]
    for c in cells:
        h, t = c["headline"], c["ttft_s"]
        ring = " ".join(
            "n/a"
            if a.get("off_ring_share", None) is None and a["status"] == "not applicable"
            else (f"{1 - a['off_ring_share']:.0%}" if a.get("off_ring_share") is not None else a["status"])
            for _rank, a in sorted(c.get("ring_audit", {}).items(), key=lambda kv: int(kv[0]))
        )
        ttft = f"{num(t['p50'])} ({num(t['min'])}-{num(t['max'])})"
        rows.append(
            f"{c['cell']['id']:<18} {h['metric'].replace('_', ' '):<24} {num(h['p50']):>8} {num(h['min']):>8} "
            f"{num(h['max']):>8} {num(c['cell'].get('target_tok_s')):>7} {ttft:>22} {c['requests']:>4} "
            f"{len(c['errors']):>4}  {ring}"
        )
    return rows


def summary_text(run: dict[str, Any], gates: list[dict[str, Any]]) -> str:
    """The page printed at the end of every run (and written as summary.txt)."""
    failed = next((g for g in gates if g["status"] == "fail"), None)
    lines = [
        f"SparkRing acceptance: cluster {run['cluster']}, {run['started_utc']}, commit {run['commit']}",
        f"evidence: {run['evidence_dir']}",
        f"profile sha256 {run.get('profile_sha256') or '-'}; image {run.get('image_id') or '-'}",
        "",
        f"{'GATE':<18} {'STATUS':<7} {'RANK':<5} {'SECONDS':>8}  RESULT",
    ]
    for g in gates:
        rank = "-" if g.get("rank") is None else str(g["rank"])
        seconds = "-" if g.get("seconds") is None else f"{g['seconds']:.1f}"
        lines.append(f"{g['id']:<18} {g['status'].upper():<7} {rank:<5} {seconds:>8}  {g['summary']}")
    cells = next(
        (g["evidence"].get("cells") for g in gates if g["id"] == "AC-CELLS" and g.get("evidence")), None
    )
    if cells:
        lines += ["", *_cell_rows(cells)]
    lines.append("")
    if failed:
        lines.append("RESULT: FAILED. " + failure_line(failed))
    else:
        ran = sum(1 for g in gates if g["status"] == "pass")
        lines.append(
            f"RESULT: PASSED ({ran} gates passed, {sum(1 for g in gates if g['status'] == 'skip')} skipped)"
        )
    return "\n".join(lines) + "\n"
