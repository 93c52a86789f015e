"""The tables of docs/nccl.md ("Across nodes, measured") from a run of nccl_multinode.py.

    python3 bench/device/nccl_multinode_table.py bench/device/results/2026-11-26/nccl_multinode-2xH200-short.json

Per fault and clock skew: when the condition became true (the alert pending) p50/p90 over
the repeats, the alert time under the production `for:` (that plus the mixin's `for:`, the
condition holding), which rank and node were named, wrong-node attributions; then false
flags in the no-fault time and the rules' clock offset estimate against the skew applied.
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


def tables(results: dict) -> str:
    lines = [f"{results['nodes'][-1]}'s clock shifted by the skew; {len(results['nodes'])} nodes x "
             f"{results['ranks_per_node']} rank(s), {results['backend']}, faults {results['delay_ms']:g} ms, "
             f"scrape {results['scrape']}, plan `{results['plan']}`.", "",
             "| fault | skew (ms) | condition true p50 / p90 (missed/runs) | alert under production `for:` p90 "
             "| named | wrong node |", "|---|---|---|---|---|---|"]
    for kind, per_skew in results["summary"]["faults"].items():
        hold = production_for(ALERT_FOR[kind])
        for skew, s in sorted(per_skew.items(), key=lambda kv: float(kv[0])):
            p90 = s["pending_s_p90"]
            runs = len(s["pending_s"])
            culprits = "; ".join(sorted(set(s["culprits"])))
            lines.append(f"| {kind} | {float(skew):+g} | {seconds(s['pending_s_p50'])} / {seconds(p90)} "
                         f"({s['pending_s_missed']}/{runs}) | {seconds(None if p90 is None else p90 + hold)} "
                         f"| {named(s['named'])}{' (culprit: ' + culprits + ')' if culprits else ''} "
                         f"| {len(s['wrong'])} |")
    lines += ["", "| skew (ms) | false flags without a fault | clock offset estimated (ms) | error (ms) |",
              "|---|---|---|---|"]
    flags = results["summary"]["false_flags"]
    for skew, estimate in sorted(results.get("clock_estimates", {}).items(), key=lambda kv: float(kv[0])):
        lines.append(f"| {float(skew):+g} | {len(flags.get(skew, []))} | {estimate['estimated_ms']:+.3f} "
                     f"| {estimate['error_ms']:+.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables(json.loads(Path(sys.argv[1]).read_text())))
