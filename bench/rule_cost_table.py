"""docs/scale.md's rule-cost table from bench/rule_cost_isolated.py --json runs.

    .venv/bin/python bench/rule_cost_table.py before=var/rule-cost/before-faults.json \
        after=var/rule-cost/after-faults.json --rules rules/fabricscope-*.yaml

Per group and run: the rule manager's evaluations (mean / worst, each against the
interval) where the run has them, and one cycle of the group's expressions through
Prometheus' query API (the sum of their evalTotalTime, and their samples).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rule_cost_isolated import group_intervals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=PATH of a --json output")
    parser.add_argument("--rules", type=Path, nargs="+", required=True, help="rule files (for the intervals)")
    args = parser.parse_args()
    intervals = group_intervals(args.rules, 30.0)
    columns = []
    for spec in args.runs:
        name, _, path = spec.partition("=")
        for row in json.loads(Path(path).read_text()):
            columns.append((f"{name}: {row['engine']}", row))
    print("| rule group | interval | " + " | ".join(f"{title} (rule manager: mean / worst) | {title} "
                                                   "(one cycle via the API; samples)" if row["rules"] else
                                                   f"{title} (mean / worst)" for title, row in columns) + " |")
    print("|---|---:|" + "".join("---:|---:|" if row["rules"] else "---:|" for _, row in columns))
    for group in sorted(intervals):
        interval = intervals[group]
        cells = []
        for _, row in columns:
            seen = row["durations"].get(group)
            mean = sum(seen) / len(seen) if seen else 0.0
            cells.append(f"{1000 * mean:,.0f} / {1000 * max(seen):,.0f} ms "
                         f"({100 * mean / interval:.1f}% / {100 * max(seen) / interval:.1f}%)" if seen else "-")
            if row["rules"]:
                mine = [r for r in row["rules"] if r["group"] == group]
                if mine:
                    spent = sum(r["seconds"] for r in mine)
                    cells.append(f"{1000 * spent:,.0f} ms ({100 * spent / interval:.1f}%); "
                                 f"{sum(r['samples'] for r in mine):,}")
                else:
                    cells.append("-")
        print(f"| {group} | {interval:g} s | " + " | ".join(cells) + " |")
    # What else ran on the cores while each run was measured: the figures move with it.
    loads = [f"{title} {sum(row['load_average']) / len(row['load_average']):.1f} (max {max(row['load_average']):.1f})"
             for title, row in columns if row.get("load_average")]
    if loads:
        print("\nLoad average while measuring: " + "; ".join(loads) + ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
