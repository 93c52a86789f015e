"""The table of docs/ebpf.md "What the microburst alert sees": application RTT against the
exporter's p99 per case, from a run of tests/test_e2e_rtt_microburst.py.

    sudo FABRIC_RTT_REPORT=/tmp/rtt.json .venv/bin/python -m pytest -p no:xdist \\
        tests/test_e2e_rtt_microburst.py
    .venv/bin/python bench/rtt_microburst_table.py /tmp/rtt.json            # print it
    .venv/bin/python bench/rtt_microburst_table.py /tmp/rtt.json --write    # into docs/ebpf.md

--write replaces the lines between the two markers in docs/ebpf.md.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from measure import replace_between_markers

DOC = Path(__file__).resolve().parent.parent / "docs" / "ebpf.md"
BEGIN, END = "<!-- rtt-microburst-table: begin -->", "<!-- rtt-microburst-table: end -->"
CASES = {  # report key -> what the case is, as the test sets it up
    "burst10x": "bulk burst filling the 80 ms queue",
    "burst2x": "600 B messages, 100/s, one-packet bucket",
    "steady": "bulk flow from start to end",
    "baseline": "request/response alone, 10 min",
    "control": "the baseline again, judged by nothing: tells the host's latency from a case's",
    "paced2x": "bulk paced to 30 kB/s, one-packet bucket; recorded, not asserted",
    "steady_bbr": "the steady flow under bbr; recorded, not asserted",
}


def ms(seconds: float) -> str:
    return "—" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.2f}"


def ratio(after: float, before: float) -> str:
    if any(v is None or math.isnan(v) for v in (after, before)) or before <= 0:
        return "—"
    return f"{after / before:.1f}×"


def table(report: dict) -> str:
    lines = ["| case | phase | app p50 (ms) | app p99 (ms) | excess p99, max of p99_1m (ms) "
             "| smoothed-RTT p99, max (ms) | alert (s after start) |",
             "|---|---|---|---|---|---|---|"]
    for name, what in CASES.items():
        if name not in report["cases"]:         # steady_bbr: only where the host has bbr; older reports lack paced2x
            continue
        case = report["cases"][name]
        fired = report["first_fired"].get(name)
        for phase in ("baseline", "burst"):
            f = case[phase]
            label = {"baseline": "1:00–6:00", "burst": "6:00–7:30"}[phase]
            lines.append(f"| `{name}` ({what}) | {label} | {ms(f['app_p50_s'])} | {ms(f['app_p99_s'])} "
                         f"| {ms(f['excess_p99_max_s'])} | {ms(f['srtt_p99_max_s'])} "
                         f"| {'' if phase == 'baseline' else ('none' if fired is None else f'{fired:.0f}')} |")
        b, u = case["baseline"], case["burst"]
        lines.append(f"| | burst / baseline | {ratio(u['app_p50_s'], b['app_p50_s'])} "
                     f"| {ratio(u['app_p99_s'], b['app_p99_s'])} | {ratio(u['excess_p99_max_s'], b['excess_p99_max_s'])} "
                     f"| {ratio(u['srtt_p99_max_s'], b['srtt_p99_max_s'])} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the JSON the test wrote (FABRIC_RTT_REPORT)")
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    args = parser.parse_args()
    text = table(json.loads(args.report.read_text()))
    if not args.write:
        print(text)
        return
    replace_between_markers(DOC, BEGIN, END, text)
    print(f"{DOC}: table rewritten")


if __name__ == "__main__":
    main()
