"""Record the demo cluster's real exposition, round by round, for bench/rule_cost_isolated.py.

    .venv/bin/python bench/rule_cost_record.py --minutes 24 --out var/rule-cost/recording.jsonl.gz

The default scenario's nodes (docs/demo.md: 45 healthy seconds, then its faults one after
another) run in full, exactly as `fabricscope demo` runs them, and every --interval each
node's exporter renders its exposition as a scrape would see it. Each round is one JSON
line: {"t": wall-clock seconds, "nodes": {node: exposition text}}. The simulation runs in
real time (its NVLink sampler and NCCL clock read the wall clock), so a recording takes
as long as the time it covers; bench/rule_cost_isolated.py then expands it to a fleet of
any size (the fleet mode's copies of node 0, demo/fleet.py) and shifts it to end now.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.cluster import DemoCluster  # noqa: E402
from fabricscope.demo.scenario import default_scenario_path, load_scenario  # noqa: E402


def record(minutes: float, interval: float, out: Path, scenario_path: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    rounds = int(minutes * 60 // interval)
    with tempfile.TemporaryDirectory(prefix="rule-cost-record-") as tmp, \
            DemoCluster(load_scenario(scenario_path), Path(tmp) / "demo") as cluster, \
            gzip.open(out, "wt") as sink:
        started = time.monotonic()
        for index in range(rounds):
            time.sleep(max(0.0, started + (index + 1) * interval - time.monotonic()))
            nodes = {node: exporter.render_metrics().decode()
                     for (node, _), exporter in zip(cluster.targets, cluster.exporters)}
            sink.write(json.dumps({"t": time.time(), "scenario_seconds": cluster.now(), "nodes": nodes}) + "\n")
            sink.flush()
            print(f"round {index + 1}/{rounds} at scenario {cluster.now():.0f}s", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=24.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between rounds (the scrape interval)")
    parser.add_argument("--scenario", type=Path, default=default_scenario_path())
    parser.add_argument("--out", type=Path, default=REPO / "var" / "rule-cost" / "recording.jsonl.gz")
    args = parser.parse_args()
    return record(args.minutes, args.interval, args.out, args.scenario)


if __name__ == "__main__":
    sys.exit(main())
