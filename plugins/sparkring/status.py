"""The ring's status at a glance: per rank its container, attested image and model, cables, health;
the last burn, the last fault and the one command to run next.

`build_status` joins what `sparkring_rank_status` read on every rank with the controller's facts
(the last burn report, the recovery agent's state); `render_text` is the page a person reads.
The recovery agent (sparkring.heal) reads the same document, so what it acts on is what the
status page shows.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "sparkring.status/1"


def cable_name(rank: int, port: dict[str, Any]) -> str:
    """`r1 cage1 <-> r2 cage1`, lower rank first (as the transport's errors name a cable)."""
    ends = sorted(
        [(rank, port.get("cage")), (int(port["peer_rank"]), port.get("peer_cage"))], key=lambda end: end[0]
    )
    return " <-> ".join(f"r{r} cage{c}" for r, c in ends)


def cables(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every cable once, up only when both of its ends are up with a carrier; a down cable names the
    ends that are down."""
    found: dict[str, dict[str, Any]] = {}
    for entry in ranks:
        for port in entry.get("ports", []):
            if "peer_rank" not in port:
                continue
            name = cable_name(entry["rank"], port)
            cable = found.setdefault(name, {"cable": name, "edge": port.get("edge"), "ends": []})
            up = port.get("operstate") == "up" and port.get("carrier") is not False
            cable["ends"].append(
                {
                    "rank": entry["rank"],
                    "interface": port["interface"],
                    "operstate": port.get("operstate"),
                    "up": up,
                }
            )
    for cable in found.values():
        down = [end for end in cable["ends"] if not end["up"]]
        cable["state"] = "down" if down else "up"
        cable["down_at"] = [f"r{end['rank']} {end['interface']} ({end['operstate']})" for end in down]
    return sorted(found.values(), key=lambda c: c["cable"])


def fault(
    ranks: list[dict[str, Any]], cable_list: list[dict[str, Any]], health: dict[str, Any]
) -> dict | None:
    """What is wrong now, most fundamental first: a cable down, a rank's container not running,
    rank 0's /health not 200. None when the ring serves."""
    down = [c for c in cable_list if c["state"] == "down"]
    if down:
        names = "; ".join(f"cable {c['cable']} is down at {', '.join(c['down_at'])}" for c in down)
        return {"kind": "cable", "cables": [c["cable"] for c in down], "summary": names}
    stopped = [r for r in ranks if r["container"]["state"] != "running"]
    if stopped:
        parts = []
        for r in stopped:
            c = r["container"]
            said = f": {c['last_error']}" if c.get("last_error") else ""
            code = f" (exit {c['exit_code']})" if c.get("exit_code") is not None else ""
            parts.append(f"rank {r['rank']} container {c['state']}{code}{said}")
        return {"kind": "rank", "ranks": [r["rank"] for r in stopped], "summary": "; ".join(parts)}
    if health.get("status") != 200:
        said = health.get("error") or "no answer"
        return {"kind": "health", "summary": f"rank 0 /health answered {health.get('status')}: {said}"}
    return None


def next_command(doc: dict[str, Any], inventory: str) -> str:
    """The one thing to do now."""
    launch = f"ansible-playbook -i {inventory} playbooks/launch.yml"
    agent = doc.get("agent") or {}
    now = doc.get("fault")
    if agent.get("state") == "gave_up":
        return f"the recovery agent gave up ({agent.get('message', '')}); fix the cause, then: {launch}"
    if now and now["kind"] == "cable":
        return (
            f"bring {', '.join('cable ' + c for c in now['cables'])} up (link, cable, cage), then "
            f"ansible-playbook -i {inventory} playbooks/qualify.yml"
            + ("; the recovery agent relaunches after that" if agent.get("running") else f" and {launch}")
        )
    if now and agent.get("running"):
        due = agent.get("next_attempt_utc")
        return "nothing: the recovery agent relaunches" + (f" at {due}" if due else " now")
    if now:
        return launch
    return "nothing: the ring serves"


def build_status(
    ranks: list[dict[str, Any]],
    inventory: str,
    cluster: str,
    time_utc: str,
    burn: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status document from each rank's `sparkring_rank_status` result (with `rank`, `host`)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    head = next((r for r in ranks if r.get("health", {}).get("url")), {})
    health = head.get("health") or {"status": None, "error": "rank 0 was not asked"}
    cable_list = cables(ranks)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "cluster": cluster,
        "time_utc": time_utc,
        "health": health,
        "ranks": [
            {
                "rank": r["rank"],
                "host": r.get("host"),
                "container": r["container"],
                "image_id": (r.get("attestation") or {}).get("image_id"),
                "models": (r.get("attestation") or {}).get("models") or {},
                "profile_sha256": (r.get("attestation") or {}).get("profile_sha256"),
                "cables": [
                    {
                        "cable": cable_name(r["rank"], p),
                        "interface": p["interface"],
                        "operstate": p.get("operstate"),
                    }
                    for p in r.get("ports", [])
                    if "peer_rank" in p
                ],
            }
            for r in ranks
        ],
        "cables": cable_list,
        "last_burn": burn_summary(burn),
        "fault": fault(ranks, cable_list, health),
        "agent": agent_summary(agent),
    }
    doc["last_fault"] = doc["fault"] or (doc["agent"] or {}).get("last_fault")
    doc["next"] = next_command(doc, inventory)
    return doc


def burn_summary(burn: dict[str, Any] | None) -> dict[str, Any] | None:
    if not burn:
        return None
    return {
        "status": burn.get("status"),
        "time_utc": burn.get("time_utc") or burn.get("finished_utc"),
        "failures": len(burn.get("failures") or []),
        "path": burn.get("path"),
    }


def agent_summary(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recovery agent's state file, as much as the page shows."""
    if not state:
        return None
    attempts = state.get("attempts") or []
    return {
        "state": state.get("state"),
        "running": bool(state.get("running")),
        "message": state.get("message", ""),
        "next_attempt_utc": state.get("next_attempt_utc"),
        "attempt": state.get("attempt", 0),
        "max_attempts": state.get("max_attempts"),
        "recoveries": (state.get("counts") or {}).get("recovered", 0),
        "last_fault": state.get("last_fault"),
        "last_attempt": attempts[-1] if attempts else None,
    }


def render_text(doc: dict[str, Any]) -> str:
    """The page: one line per rank, one per cable, then the burn, the fault and the next command."""
    health = doc["health"]
    lines = [
        f"SparkRing {doc['cluster']} at {doc['time_utc']}: rank 0 /health {health.get('status')}",
        "",
        f"{'rank':<5} {'container':<22} {'image':<20} {'model':<20} cables",
    ]
    for r in doc["ranks"]:
        c = r["container"]
        state = c["state"] + (
            f" ({c['exit_code']})" if c["state"] != "running" and c.get("exit_code") is not None else ""
        )
        model = ", ".join(f"{d[:12]}" for d in r["models"].values()) or "-"
        cables_here = ", ".join(f"{x['interface']} {x['operstate']}" for x in r["cables"]) or "-"
        lines.append(
            f"{r['rank']:<5} {state:<22} {(r['image_id'] or '-')[:19]:<20} {model:<20} {cables_here}"
        )
    lines.append("")
    for cable in doc["cables"]:
        where = f" at {', '.join(cable['down_at'])}" if cable["down_at"] else ""
        lines.append(f"cable {cable['cable']}: {cable['state']}{where}")
    burn = doc["last_burn"]
    lines.append(
        f"last burn: {burn['status']} at {burn['time_utc']} ({burn['failures']} failures)"
        if burn
        else "last burn: none recorded"
    )
    agent = doc["agent"]
    if agent:
        lines.append(
            f"recovery agent: {agent['state']}{'' if agent['running'] else ' (not running)'}, "
            f"attempt {agent['attempt']} of {agent['max_attempts']}, {agent['recoveries']} recoveries"
            + (f"; {agent['message']}" if agent["message"] else "")
        )
    else:
        lines.append("recovery agent: not installed")
    last = doc["last_fault"]
    lines.append(f"last fault: {last['summary'] if last else 'none'}")
    lines.append(f"next: {doc['next']}")
    return "\n".join(lines) + "\n"
