"""The tables of docs/nccl.md ("Across nodes, measured") from a run of nccl_multinode.py.

    python3 bench/device/nccl_multinode_table.py bench/device/results/2026-11-26/nccl_multinode-2xH200-short.json

Per fault and clock skew: when the condition became true (the alert pending) p50/p90 over
the repeats, when the alert fired under the run's rules (the demo's fast alerts), the alert
time under the production `for:` (condition true plus the mixin's `for:`, the condition
holding), which rank and node were named, wrong-node attributions; then false flags in the
no-fault time (of them, in the job's start-up) and of those the pages (firing), clock alerts (right only for a drifting
clock), and the rules' clock offset estimate against the skew applied.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALERT_FOR = {"rank": "straggler", "node": "straggler", "hang": "ncclHang"}


def production_for(key: str, config: Path = ROOT / "rules" / "mixin" / "config.libsonnet") -> float:
    """The production `for:` of an alert, in seconds, from the mixin's one home for it."""
    block = config.read_text().split("'for': {", 1)[1].split("}", 1)[0]
    value = re.search(rf"^\s*{key}: '(\d+)([smh])'", block, re.M)
    return float(value.group(1)) * {"s": 1, "m": 60, "h": 3600}[value.group(2)]


def seconds(value) -> str:
    return "—" if value is None else f"{value:g} s"


def named(whos: list[dict]) -> str:
    return ", ".join(sorted({f"{w['alert'].removeprefix('FabricNccl')} {w['node'] or ''}"
                             + (f" rank {w['rank']}" if w["rank"] else "") for w in whos})).strip() or "none"


def skew_order(key: str) -> tuple:
    """Constant skews by value, then drifting clocks ("drift100ppm")."""
    try:
        return (0, float(key))
    except ValueError:
        return (1, float(key.removeprefix("drift").removesuffix("ppm")))


def skew_name(key: str) -> str:
    try:
        return f"{float(key):+g}"
    except ValueError:
        return key.replace("drift", "drifting ").replace("ppm", " ppm")


def tables(results: dict) -> str:
    commit = f" at commit `{results['commit']}`" if results.get("commit") else ""
    lines = [f"{results['nodes'][-1]}'s clock shifted by the skew; {len(results['nodes'])} nodes x "
             f"{results['ranks_per_node']} rank(s), {results['backend']}, faults {results['delay_ms']:g} ms, "
             f"scrape {results['scrape']}, plan `{results['plan']}`{commit}.", "",
             "| fault | skew (ms) | condition true p50 / p90 (missed/runs) | fired under the run's `for:` p50 / p90 "
             "| under production `for:` p90 | named | wrong node |", "|---|---|---|---|---|---|---|"]
    # Runs that kept the alerts' activeAt also have the evaluation that found the condition
    # true (exact; the poll above is to 1 s): a column of its own.
    exact = any(v is not None for per_skew in results["summary"]["faults"].values()
                for s in per_skew.values() for v in s.get("condition_s", []))
    if exact:
        lines[-2] = lines[-2].replace(" (missed/runs) |", " (missed/runs), polled | at its evaluation p50 / p90 |")
        lines[-1] += "---|"
    for kind, per_skew in results["summary"]["faults"].items():
        hold = production_for(ALERT_FOR[kind])
        for skew, s in sorted(per_skew.items(), key=lambda kv: skew_order(kv[0])):
            p90 = s["pending_s_p90"]
            runs = len(s["pending_s"])
            culprits = "; ".join(sorted(set(s["culprits"])))
            evaluated = (f" {seconds(s.get('condition_s_p50'))} / {seconds(s.get('condition_s_p90'))} |"
                         if exact else "")
            lines.append(f"| {kind} | {skew_name(skew)} | {seconds(s['pending_s_p50'])} / {seconds(p90)} "
                         f"({s['pending_s_missed']}/{runs}) |{evaluated} {seconds(s['firing_s_p50'])} / {seconds(s['firing_s_p90'])} "
                         f"({s['firing_s_missed']}/{runs}) | {seconds(None if p90 is None else p90 + hold)} "
                         f"| {named(s['named'])}{' (culprit: ' + culprits + ')' if culprits else ''} "
                         f"| {len(s['wrong'])} |")
    summary = results["summary"]
    lines += ["", "| skew (ms) | false flags without a fault (start-up) | of them pages, firing (start-up) "
              "| clock alerts | clock offset estimated / applied (ms) | error (ms) |", "|---|---|---|---|---|---|"]
    flags, startup = summary["false_flags"], summary.get("startup_flags", {})
    pages, startup_pages = summary.get("false_pages"), summary.get("startup_pages", {})
    clock = summary.get("clock_alerts", {})
    for skew, estimate in sorted(results.get("clock_estimates", {}).items(), key=lambda kv: skew_order(kv[0])):
        applied = estimate.get("applied_ms", float(skew) if skew_order(skew)[0] == 0 else None)
        paged = "—" if pages is None else f"{len(pages.get(skew, []))} ({len(startup_pages.get(skew, []))})"
        lines.append(f"| {skew_name(skew)} | {len(flags.get(skew, []))} ({len(startup.get(skew, []))}) | {paged} "
                     f"| {named(clock.get(skew, []))} | {estimate['estimated_ms']:+.3f} / {applied:+.3f} "
                     f"| {estimate['error_ms']:+.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables(json.loads(Path(sys.argv[1]).read_text())))
