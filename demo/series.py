"""The series one simulated GPU node exports, per collector: the node's series budget.

A fleet's Prometheus holds nodes x series per node, so a node has a budget
(docs/metrics.md#series-per-collector): at most SERIES_BUDGET series with every collector
on at its defaults, on an 8-GPU node with 8 compute HCAs and a storage NIC, healthy or
under faults. `measure_node_series` builds such a node from the demo (the collectors a
real node runs, fed by the simulation), steps the scenario clock as fast as it computes
(no waiting for wall-clock ticks), scrapes the node's exporter over HTTP along the way,
and counts the last scrape's series; each collector's share comes from its own collect().

    .venv/bin/python -m fabricscope.demo.series              # print the table
    .venv/bin/python -m fabricscope.demo.series --write-docs  # rewrite the table in docs/metrics.md
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fabricscope.atomicfile import write_atomically
from fabricscope.exporter.framework import COLLECTORS, load_collector_modules
from fabricscope.exporter.main import start_exporter

from .cluster import DemoEngine
from .scenario import load_scenario

SERIES_BUDGET = 1500

# Faults on the one node at once, each adding the series it makes appear: per-link NVLink
# error counters (precursor CRC errors, then the link down), latched InfiniBand breaches
# and anomalies, a microburst's RTT tail, a straggling rank.
FAULTS = [
    {"kind": "nvlink_down", "node": 0, "at": "20s", "target": {"gpu": 3, "link": 7},
     "params": {"precursor_seconds": 30}},
    {"kind": "symbol_error_storm", "node": 0, "at": "10s", "target": {"device": "mlx5_3", "port": 1}},
    {"kind": "link_flap", "node": 0, "at": "10s", "target": {"device": "mlx5_5", "port": 1},
     "params": {"count": 3, "period_seconds": 10}},
    {"kind": "link_down", "node": 0, "at": "30s", "target": {"device": "mlx5_1", "port": 1}},
    {"kind": "microburst", "node": 0, "at": "40s"},
    {"kind": "straggler_rank", "node": 0, "at": "10s", "target": {"rank": 5}},
]

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
BEGIN, END = "<!-- series-per-collector: begin -->", "<!-- series-per-collector: end -->"


@dataclass
class NodeSeries:
    total: int                       # series in the scraped exposition
    by_collector: dict[str, int]     # each collector's own; "framework": self-metrics, build info
    exposition: str                  # the scrape counted


def scenario(faults: list[dict], gpus: int = 8, hcas: int = 8) -> dict:
    return {"seed": 20261126, "tick_seconds": 1, "faults": faults,
            "cluster": {"name": "budget", "nodes": 1, "gpus_per_node": gpus, "hcas_per_node": hcas}}


def count_series(exposition: str) -> int:
    return sum(1 for line in exposition.splitlines() if line and not line.startswith("#"))


def measure_node_series(workdir: Path, faults: list[dict] | None = None, seconds: int = 90,
                        gpus: int = 8, hcas: int = 8, scrape_every: int = 10) -> NodeSeries:
    """Series of the demo's node 0 after `seconds` of scenario time under `faults`."""
    load_collector_modules()
    enabled = sorted(name for name, cls in COLLECTORS.items() if cls.enabled_by_default)
    with DemoEngine(load_scenario(scenario(faults or [], gpus, hcas)), workdir) as engine:
        exporter = start_exporter(engine.context(0), enabled, "127.0.0.1:0")
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            body = ""
            for tick in range(1, seconds + 1):
                engine.step()
                if tick % scrape_every == 0 or tick == seconds:
                    for collector in exporter.collectors:
                        if collector.name == "nvlink":
                            collector.refresh()          # the sampler's round sees this tick
                    with urllib.request.urlopen(url, timeout=30) as answer:
                        body = answer.read().decode()
            total = count_series(body)
            by_collector = {c.name: sum(len(family.samples) for family in c.collect()) for c in exporter.collectors}
        finally:
            exporter.stop()
    by_collector["framework"] = total - sum(by_collector.values())
    return NodeSeries(total, by_collector, body)


def table(quiet: NodeSeries, faulted: NodeSeries) -> str:
    rows = ["| collector | healthy | under faults |", "|---|---:|---:|"]
    for name in sorted(quiet.by_collector, key=lambda n: (n == "framework", -quiet.by_collector[n], n)):
        rows.append(f"| `{name}` | {quiet.by_collector[name]:,} | {faulted.by_collector.get(name, 0):,} |")
    rows.append(f"| **total** | **{quiet.total:,}** | **{faulted.total:,}** |")
    return "\n".join(rows)


def write_docs(text: str) -> None:
    doc = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block to replace")
    write_atomically(DOC, pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=90, help="scenario seconds before the counted scrape")
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {DOC}")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fabricscope-series-") as tmp:
        quiet = measure_node_series(Path(tmp) / "quiet", seconds=args.seconds)
        faulted = measure_node_series(Path(tmp) / "faulted", FAULTS, seconds=args.seconds)
    text = (f"{table(quiet, faulted)}\n\nAn 8-GPU demo node (8 compute HCAs, one storage NIC, every collector "
            f"on at its defaults), after {args.seconds} s of scenario time, healthy and under "
            f"{', '.join(sorted({f['kind'] for f in FAULTS}))} at once; budget {SERIES_BUDGET:,}. "
            f"Written by `python -m fabricscope.demo.series --write-docs`.")
    print(text)
    if args.write_docs:
        write_docs(text)
    over = max(quiet.total, faulted.total) > SERIES_BUDGET
    if over:
        print(f"over the budget of {SERIES_BUDGET:,} series", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
