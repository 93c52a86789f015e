"""What the microburst rule reads through fewer RTT-excess buckets: the exporter's layout
(exporter/bpf/tcp.yaml, 8 per power of two) against 4 per power of two, which would halve
the bucket series `fabric-tcp.rules` selects every 10 s (docs/scale.md, "Rule cost on its
own").

    .venv/bin/python bench/rtt_bucket_layout.py

The model is rules/tests/generate_microburst.py's (log-normal RTTs, sigma 0.3, bucket
counts from the distribution's CDF at each layout's own bounds, Prometheus'
histogram_quantile interpolation as the exporter computes it: window_quantile.py): a burst whose true p99 is `ratio` x the baseline's,
with the baseline at --positions points across one power of two. Printed: the ratio each
layout reads (least..most), and how many cases it puts on the wrong side of the rule's
multiplier (3x), which is what the rule's detections and false positives at the boundary
turn on. The committed promtool sweep samples 4 of those positions.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "rules" / "tests"))

import generate_microburst as model  # noqa: E402
from fabricscope.exporter.bpf_loader.declarations import load_declarations  # noqa: E402
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds  # noqa: E402
from fabricscope.exporter.bpf_loader.window_quantile import bucket_quantile  # noqa: E402


def read_ratio(bounds: list[float], baseline_p99: float, ratio: float) -> float:
    """The p99 / baseline-p99 ratio the rule computes from these bucket bounds."""
    base = model.cdf_counts(baseline_p99, bounds)
    burst = model.cdf_counts(baseline_p99 * ratio, bounds)
    total = [model.SAMPLES_PER_STEP]
    return bucket_quantile(0.99, bounds, burst + total) / bucket_quantile(0.99, bounds, base + total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=64, help="baselines across one power of two")
    parser.add_argument("--multiplier", type=float, default=3.0)
    parser.add_argument("--ratios", type=float, nargs="+", default=[2.8, 2.9, 2.95, 3.05, 3.1, 3.2])
    args = parser.parse_args()
    metric = next(m for d in load_declarations() for m in d.metrics if m.name == model.METRIC)
    print(f"{model.METRIC}: log-normal RTTs (sigma {model.SIGMA}), baseline p99 at {args.positions} points "
          f"across 1-2 ms; rule multiplier {args.multiplier:g}x\n")
    print("| buckets per power of two | finite buckets (series a node with +Inf, _sum, _count) | "
          + " | ".join(f"true {r:g}x reads" for r in args.ratios) + " | judged the wrong side of the multiplier |")
    print("|---:|---:|" + "---:|" * len(args.ratios) + "---:|")
    for sub_bits in sorted({metric.layout.sub_bits, metric.layout.sub_bits - 1}, reverse=True):
        layout = dataclasses.replace(metric.layout, sub_bits=sub_bits)
        bounds = [float(le) for le in bucket_bounds(layout, metric.unit_seconds)]
        cells, wrong = [], 0
        for ratio in args.ratios:
            seen = [read_ratio(bounds, 0.001 * 2 ** (k / args.positions), ratio) for k in range(args.positions)]
            wrong += sum((r > args.multiplier) != (ratio > args.multiplier) for r in seen)
            cells.append(f"{min(seen):.3f}-{max(seen):.3f}x")
        cases = len(args.ratios) * args.positions
        print(f"| {1 << sub_bits} | {len(bounds)} ({len(bounds) + 3}) | " + " | ".join(cells)
              + f" | {wrong} of {cases} ({100 * wrong / cases:.1f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
