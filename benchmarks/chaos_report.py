"""What ``benchmarks/chaos.py`` makes of its phases: the invariants each broke (``verdict``), the results of a
partial run folded into the recorded ones (``merge``: each phase keeps the run it came from), and the
Markdown table (``report``)."""

from __future__ import annotations

from typing import Any

from omnistage.testing import chaos as ch


def verdict(p: dict[str, Any]) -> list[str]:
    """What broke an invariant in one phase (empty: none)."""
    bad = [f"{len(p['violations'])} request(s) broke an invariant"] if p["violations"] else []
    bad += [
        f"kill {k['server']}/{k['kind']}: {k['error'] or 'not replaced'}"
        for k in p["kills"]
        if k["error"] or not k["replaced"]
    ]
    bad += [f"{name} differs after the chaos" for name, same in p["equal_after"].items() if not same]
    bad += [f"{s}: {n} still in flight" for s, n in p["in_flight_after_load"].items() if n]
    bad += [f"{s}: left after SIGTERM: {procs}" for s, procs in p["left_after_sigterm"].items() if procs]
    bad += [f"{s}: not a clean exit after SIGTERM ({why})" for s, why in p.get("unclean_exit", {}).items()]
    return bad


def merge(recorded: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s phases replace the recorded ones of the same name; the others stay, each with its own run (a
    phase recorded before phases carried their run gets the run the file's top level describes)."""
    old_run = {
        "command": f"python benchmarks/chaos.py --rounds {recorded.get('rounds')} "
        f"--ray-rounds {recorded.get('ray_rounds')}",
        "load_avg": recorded.get("load_avg"),
    }
    phases = {name: {"run": old_run, **p} for name, p in recorded.get("phases", {}).items()}
    phases.update(new["phases"])
    return {"machine": new["machine"], "phases": dict(sorted(phases.items()))}


def _kill_rows(p: dict[str, Any]) -> list[str]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for k in p["kills"]:
        kinds.setdefault(f"{k['server']} / {k['kind']}", []).append(k)
    rows = []
    for kind, ks in kinds.items():
        recs = [k["recovery_s"] for k in ks]
        ended = (
            "; ".join(", ".join(f"{n} {what}" for what, n in k["spanning"].items()) or "none" for k in ks)
            if all("spanning" in k for k in ks)
            else "not counted in this run"
        )
        rows.append(
            f"| {kind} | {len(ks)} | {', '.join(str(k['in_flight']) for k in ks)} | {ended} | "
            f"{sum(k['saw_unhealthy'] for k in ks)}/{len(ks)} | {sum(k['replaced'] for k in ks)}/{len(ks)} "
            f"| {', '.join(f'{s:.1f}' for s in recs)} | {max(recs):.1f} |"
        )
    return rows


def report(result: dict[str, Any]) -> str:
    lines = [
        "# Chaos under load",
        "",
        f"On {result['machine']}; the machine was shared with other work, so latencies and recovery times are "
        "upper bounds of a quiet machine. Each phase says the run its rows come from (a run with `--update` "
        "replaces only the phases it ran).",
        "",
        f"Bounds: every request's deadline {ch.DEADLINE_S:.0f} s; recovery (`/health` 200 again) within "
        f"{ch.RECOVERY_BOUND_S:.0f} s of a kill.",
        "",
        f"**Verdict: {'PASS' if not result['broken'] else 'FAIL'}**",
    ]
    lines += [f"- {b}" for b in result["broken"]]
    for name, p in result["phases"].items():
        run = p["run"]
        when = f" on {run['date']}" if run.get("date") else ""
        lines += [
            "",
            f"## Phase {name}: servers {', '.join(p['servers'])}",
            "",
            f"- run: `{run['command']}`{when}, load average at the start {run['load_avg']}",
            f"- start-up {p['startup_s']} s, whole phase {p['duration_s']} s, {p['requests']} requests",
            "",
            "| killed (kill -9) | kills | in flight at the kill (/health) | requests running at each kill: "
            "how they ended | /health went 503 | replaced | recovery s (each) | max |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += _kill_rows(p)
        lines += ["", "| server call outcome | requests |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in p["by_outcome"].items()]
        lines += ["", "| server call | max latency s |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in p["max_latency_s"].items()]
        lines += ["", "| seeded request | same bytes after the chaos |", "|---|---|"]
        lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in p["equal_after"].items()]
        lines += ["", "| server | processes left 15 s after SIGTERM | exit |", "|---|---|---|"]
        lines += [
            f"| {k} | {len(v)} {v if v else ''} | {p.get('unclean_exit', {}).get(k, 'clean')} |"
            for k, v in p["left_after_sigterm"].items()
        ]
        if p["violations"]:
            lines += ["", "Violations (first 20):", ""]
            lines += [f"- {v['server']} {v['call']} at {v['t_s']} s: {v['result']}" for v in p["violations"][:20]]
    lines += [
        "",
        "Outcomes: `ok` 200 and complete; `unavailable` 503 `stage_unavailable` + `Retry-After` (a video "
        "job: failed `stage_unavailable`); `error_event` a 200 stream that ended with one `stage_unavailable` "
        "SSE error event; `broken_off` a raw PCM stream whose connection was cut before the end (the client "
        "sees an incomplete body); `abandoned` the client left after two events; `rejected` a bad request "
        "got its 4xx. A request running at a kill started before it and ended after it (the kill may have "
        "hit another replica or stage than the one serving it, so some still end `ok`).",
    ]
    return "\n".join(lines) + "\n"
