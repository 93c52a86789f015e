"""Cost of one demo tick: the default 4-node cluster (8 GPUs, 8 NDR HCAs + 1 RoCE NIC a node).

Prints milliseconds per tick and files replaced per tick, with the node trees on tmpfs
(the default) and on the workdir's own filesystem (--no-tmpfs), over a healthy stretch
and over the fault sequence. Figures, not assertions: machines are noisy.

    .venv/bin/python bench/demo_tick.py [--ticks 120] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricscope.demo.cluster import DemoEngine
from fabricscope.demo.scenario import default_scenario_path, load_scenario


def measure(workdir: Path, use_tmpfs: bool, ticks: int, start_at: float, with_sources: bool = True) -> dict:
    scenario = load_scenario(default_scenario_path())
    engine = DemoEngine(scenario, workdir, use_tmpfs=use_tmpfs)
    began = time.perf_counter()
    if with_sources:
        engine.build()
    else:   # the node filesystems alone: what the scenario engine itself costs
        import fabricscope.demo.cluster as cluster_module

        original = cluster_module.discover_source_modules
        cluster_module.discover_source_modules = dict
        try:
            engine.build()
        finally:
            cluster_module.discover_source_modules = original
    build = time.perf_counter() - began
    try:
        # Jump the clock (no writes) to the stretch of the timeline to measure.
        while engine.now() + scenario.tick_seconds <= start_at:
            engine.step(write=False)
        writes_before = sum(node.writer.writes for node in engine.nodes)
        costs = []
        for _ in range(ticks):
            began = time.perf_counter()
            engine.step()
            costs.append(time.perf_counter() - began)
        writes = sum(node.writer.writes for node in engine.nodes) - writes_before
    finally:
        engine.close()
    costs.sort()
    return {"build_s": build, "median_ms": 1000 * statistics.median(costs),
            "p95_ms": 1000 * costs[int(0.95 * (len(costs) - 1))], "writes_per_tick": writes / ticks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=120)
    parser.add_argument("--workdir", default=None, help="on-disk directory for the --no-tmpfs run (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        print(f"default scenario, 4 nodes x 9 HCAs, {args.ticks} ticks each")
        runs = [("tmpfs trees", True, True), ("tmpfs, no sources", True, False), ("on-disk trees", False, True)]
        for label, use_tmpfs, with_sources in runs:
            for stretch, start in (("healthy", 0.0), ("faults (symbol storm)", 240.0)):
                r = measure(Path(tmp) / f"{label}-{stretch}".replace(" ", "_").replace(",", ""), use_tmpfs,
                            args.ticks, start, with_sources)
                print(f"  {label:<17} {stretch:<22} build {r['build_s']:.2f}s  tick median {r['median_ms']:.1f} ms"
                      f"  p95 {r['p95_ms']:.1f} ms  files replaced/tick {r['writes_per_tick']:.0f}")


if __name__ == "__main__":
    main()
