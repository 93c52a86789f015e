"""What the exporter's windowed p99 (exporter/bpf_loader/window_quantile.py) costs a
collection: QuantileWindow.observe on the RTT-excess layout (exporter/bpf/tcp.yaml, 123
cumulative buckets), with 15 s scrapes into its declared 60 s window, and
bucket_quantile alone.

    .venv/bin/python bench/window_quantile_cost.py [--scrapes 20000]
"""
from __future__ import annotations

import argparse
import random
import sys
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.exporter.bpf_loader.declarations import load_declarations  # noqa: E402
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds  # noqa: E402
from fabricscope.exporter.bpf_loader.window_quantile import QuantileWindow, bucket_quantile  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=20000)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    args = parser.parse_args()
    metric = next(m for d in load_declarations() for m in d.metrics if m.window_quantile)
    bounds = [float(le) for le in bucket_bounds(metric.layout, metric.unit_seconds)]
    rng, clock = random.Random(1), [0.0]
    # 400 RTT samples a scrape across the buckets (50 shapes, drawn at random), as
    # cumulative counts at every scrape, built before the timing.
    shapes = []
    for _ in range(50):
        slots = [0] * (len(bounds) + 1)
        for _ in range(400):
            slots[min(len(slots) - 1, int(rng.expovariate(1 / 20)))] += 1
        shapes.append([sum(slots[:i + 1]) for i in range(len(slots))])
    histories, counts = [], [0] * (len(bounds) + 1)
    for _ in range(args.scrapes):
        counts = [c + d for c, d in zip(counts, rng.choice(shapes))]
        histories.append(counts)
    window = QuantileWindow(metric.window_quantile.quantile, metric.window_quantile.window_seconds, bounds,
                            clock=lambda: clock[0])
    scrapes = iter(histories)

    def observe() -> None:
        clock[0] += args.scrape_interval
        window.observe(next(scrapes))

    per_observe = timeit.timeit(observe, number=args.scrapes) / args.scrapes
    per_quantile = timeit.timeit(lambda: bucket_quantile(0.99, bounds, histories[-1]), number=args.scrapes) / args.scrapes
    print(f"{metric.name}: {len(bounds) + 1} buckets, window {metric.window_quantile.window_seconds} s, "
          f"scrapes every {args.scrape_interval:g} s ({len(window)} snapshots kept)")
    print(f"QuantileWindow.observe per collection: {per_observe * 1e6:.1f} us")
    print(f"bucket_quantile alone:                 {per_quantile * 1e6:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
