"""The docs/scale.md tables of the sidecar at 1,000 nodes, printed from bench/sidecar_scale.py's
output files (one column per run, in the order given), so the table is the runs' figures.

    .venv/bin/python bench/sidecar_scale_table.py bench/results/2026-11-29/sidecar_scale-*.txt

Two tables: the live merge (first refresh, its runs, its queries, the next refresh, and the
per-link queries it replaced where the run timed them), and the questions (p50 / p99 of the
goal's questions, then the slowest others of each run).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEADER = re.compile(r"commit (\w+); .*load average ([\d.]+) before, ([\d.]+) after")
MERGE = re.compile(r"first refresh ([\d.]+) s \(runs: ([\d., ]+)\); its queries ([\d.]+) s; next refresh ([\d.]+) s")
QUESTION = re.compile(r"^\s+(\w+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
REPLACED = re.compile(r"^\s+(.+?)\s{2,}(\d+)\s+([\d.]+)\s+([\d.]+)$")
# The questions the 2 s goal was set for (the slowest before), in this order; others follow.
GOAL_QUESTIONS = ("fleet_summary", "nvlink_links_down", "worst_ib_ports")


@dataclass
class Run:
    label: str
    merge: tuple[str, str, str, str]                       # first, runs, queries, next
    questions: dict[str, tuple[str, str, str]] = field(default_factory=dict)   # name -> rows, p50, p99
    replaced: dict[str, str] = field(default_factory=dict)                     # query -> p50


def parse(path: Path) -> Run:
    text = path.read_text()
    header, merge = HEADER.search(text), MERGE.search(text)
    if not header or not merge:
        raise ValueError(f"{path}: not an output of bench/sidecar_scale.py (no commit/load header or merge line)")
    run = Run(f"{header.group(1)} (load {header.group(2)} / {header.group(3)})", merge.groups())
    section = ""
    for line in text.splitlines():
        if line.startswith("the ") and line.rstrip().endswith(":"):
            section = "replaced" if "replaced" in line else "questions" if "questions" in line else ""
        elif section == "questions" and (m := QUESTION.match(line)):
            run.questions[m.group(1)] = (m.group(2), m.group(3), m.group(4))
        elif section == "replaced" and (m := REPLACED.match(line)) and not line.strip().startswith("query"):
            run.replaced[m.group(1)] = m.group(3)
    return run


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def merge_table(runs: list[Run]) -> str:
    replaced = list(dict.fromkeys(q for run in runs for q in run.replaced))
    rows = [["**first refresh, median of 3** (the three)"] + [f"**{r.merge[0]} s** ({r.merge[1]})" for r in runs],
            ["its queries"] + [f"{r.merge[2]} s" for r in runs],
            ["next refresh, nothing changed"] + [f"{r.merge[3]} s" for r in runs]]
    rows += [[f"replaced, p50 at the same moment: {q}"] + [f"{r.replaced[q]} s" if q in r.replaced else "(not asked)"
                                                         for r in runs] for q in replaced]
    return table([""] + [r.label for r in runs], rows)


def question_table(runs: list[Run]) -> str:
    def cell(run: Run, name: str) -> str:
        if name not in run.questions:
            return "not among the slowest"
        _, p50, p99 = run.questions[name]
        return f"{p50} / " + (f"**{p99} s**" if float(p99) > 2.0 else f"{p99} s")
    rows = [[f"`{name}`"] + [cell(r, name) for r in runs] for name in GOAL_QUESTIONS]
    rows.append(["next slowest"] + [", ".join(f"`{n}` {p50} / {p99} s" for n, (_, p50, p99) in r.questions.items()
                                              if n not in GOAL_QUESTIONS) or "-" for r in runs])
    return table(["question, p50 / p99"] + [r.label for r in runs], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="bench/sidecar_scale.py output files, one column each")
    args = parser.parse_args()
    try:
        runs = [parse(path) for path in args.outputs]
    except (OSError, ValueError) as error:
        print(f"sidecar_scale_table: {error}", file=sys.stderr)
        return 2
    names = " ".join(f"`{p.name}`" for p in args.outputs)
    print(f"The live merge (printed by `bench/sidecar_scale_table.py` from {names}):\n")
    print(merge_table(runs))
    print("\nThe questions (the same runs):\n")
    print(question_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
