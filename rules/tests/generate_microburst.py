"""Write rules/tests/tcp_microburst.yaml: FabricTcpMicroburst cases built from the bucket
layout the exporter really exposes, so they cannot drift from it.

    .venv/bin/python rules/tests/generate_microburst.py          # rewrite the file
    .venv/bin/python rules/tests/generate_microburst.py --check  # exit 1 if it is stale

Every node sends RTT samples from a log-normal distribution (sigma 0.3, the shape of the
demo's healthy RTT) whose *true* p99 is a chosen value: a baseline for 10 minutes, then a
burst whose true p99 is `ratio` x the baseline's. Bucket counts are that distribution's
CDF at the exporter's own `le` bounds (exporter/bpf/tcp.yaml through
exporter/bpf_loader/histogram.py), so the rule sees what it would see from a real node: the
interpolated p99 of the real buckets, not the true p99.

Thresholds, windows and annotation texts come from the rendered mixin (`_config` and
rules/fabricscope-alerts.yaml), so changing a threshold changes the expectations here,
never silently the other way round. Whether an alert is expected follows from the *true*
ratio and p99 (the seed's definition), so buckets too coarse to tell 2.9x from 3.1x fail
the test; only the value printed in the description is computed, with Prometheus' own
histogram_quantile interpolation.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent
OUTPUT = HERE / "tcp_microburst.yaml"
sys.path.insert(0, str(RULES.parent))

from fabricscope.exporter.bpf_loader.declarations import load_declarations  # noqa: E402
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds  # noqa: E402

METRIC = "fabric_tcp_rtt_excess_seconds"
SIGMA = 0.3
SAMPLES_PER_STEP = 20000      # RTT samples per 30 s scrape
STEP_SECONDS = 30
BASELINE_STEPS = 20           # 0..10m: 21 samples
BURST_STEPS = 9               # 10m30s..15m
SWEEP = 12                    # baselines across one power of two
CHECK = "11m"                 # the first evaluation whose 1m window holds only burst samples
Z99 = NormalDist().inv_cdf(0.99)


@dataclass(frozen=True)
class Case:
    node: str
    baseline_p99: float | None    # seconds; None: no samples before the burst
    ratio: float                  # true burst p99 / true baseline p99
    why: str


def cases(floor: float) -> list[Case]:
    # 12 baselines across a power of two: enough that buckets twice as wide as the
    # exporter's (4 per power of two) read a true 3.1x under 3x at one and a true 2.9x
    # over it at another (bench/rtt_bucket_layout.py); 4 baselines missed both.
    sweep = [Case(f"sweep-{k}-{tag}", 0.001 * 2 ** (k / SWEEP), ratio, f"baseline 2^({k}/{SWEEP}) ms, true {ratio}x")
             for k in range(SWEEP) for ratio, tag in ((2.9, "quiet"), (3.1, "fires"))]
    return sweep + [
        Case("dc-burst", 150e-6, 6.4, "150 us -> 960 us, a data-centre burst the floor must not mute"),
        Case("issue-3x2", 1.1e-3, 3.2, "1.1 ms -> 3.5 ms, true 3.2x"),
        Case("issue-2x1", 2.0e-3, 2.1, "2.0 ms -> 4.2 ms, true 2.1x"),
        Case("under-floor", 40e-6, floor * 0.8 / 40e-6, f"40 us -> {floor * 0.8 * 1e6:.0f} us: far above 3x but under the floor"),
        Case("no-baseline", None, 1.0, "no samples before a 3 ms p99: nothing to compare with"),
    ]


def cdf_counts(p99: float, bounds: list[float]) -> list[int]:
    """Cumulative samples per step at each finite bound, for a log-normal with this p99."""
    dist = NormalDist(math.log(p99) - Z99 * SIGMA, SIGMA)
    return [round(SAMPLES_PER_STEP * dist.cdf(math.log(le))) for le in bounds]


def histogram_quantile(q: float, bounds: list[float], cumulative: list[float], total: float) -> float:
    """Prometheus' histogram_quantile over one series set (finite bounds + the +Inf total)."""
    rank = q * total
    for i, count in enumerate(cumulative):
        if count >= rank:
            start, below = (0.0, 0.0) if i == 0 else (bounds[i - 1], cumulative[i - 1])
            return start + (bounds[i] - start) * (rank - below) / (count - below)
    return bounds[-1]


def series_values(before: int, after: int) -> str:
    """promtool expanding notation: `before` per step for BASELINE_STEPS, then `after`."""
    at_switch = before * BASELINE_STEPS + after
    return f"0+{before}x{BASELINE_STEPS} {at_switch}+{after}x{BURST_STEPS - 1}"


def mixin_config() -> dict:
    out = subprocess.run(["jsonnet", "-e", "(import 'mixin/mixin.libsonnet')._config"], cwd=RULES,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def alert_template() -> dict[str, dict]:
    groups = yaml.safe_load((RULES / "fabricscope-alerts.yaml").read_text())["groups"]
    return {rule["labels"]["severity"]: rule for group in groups for rule in group["rules"]
            if rule.get("alert") == "FabricTcpMicroburst"}


def recording_first() -> list[str]:
    names = {}
    for name in ("fabricscope-recording.yaml", "fabricscope-alerts.yaml"):
        names[name] = [group["name"] for group in yaml.safe_load((RULES / name).read_text())["groups"]]
    return names["fabricscope-recording.yaml"] + names["fabricscope-alerts.yaml"]


def expand(template: str, node: str, value: float) -> str:
    text = template.replace("{{ $labels.node }}", node).replace('{{ printf "%.2f" $value }}', f"{value:.2f}")
    if "{{" in text:
        raise SystemExit(f"generate_microburst.py: unknown template action left in {text!r}")
    return text


def build() -> str:
    config = mixin_config()
    th = config["thresholds"]
    floor = th["microburstMinP99Seconds"]
    tiers = {config["severities"]["microburst"]: th["microburstMultiplier"],
             config["severities"]["microburstCritical"]: th["microburstCriticalMultiplier"]}
    rules = alert_template()
    layout = next(m for d in load_declarations() for m in d.metrics if m.name == METRIC)
    labels_le = list(bucket_bounds(layout.layout, layout.unit_seconds))
    bounds = [float(le) for le in labels_le]

    input_series, expected, comments = [], [], []
    for case in cases(floor):
        burst_p99 = (case.baseline_p99 or 3e-3) * case.ratio
        base = cdf_counts(case.baseline_p99, bounds) if case.baseline_p99 else [0] * len(bounds)
        base_total = SAMPLES_PER_STEP if case.baseline_p99 else 0
        burst = cdf_counts(burst_p99, bounds)
        for le, before, after in zip(labels_le + ["+Inf"], base + [base_total], burst + [SAMPLES_PER_STEP]):
            input_series.append({"series": f'{METRIC}_bucket{{cluster="test", node="{case.node}", le="{le}"}}',
                                 "values": series_values(before, after)})
        input_series.append({"series": f'{METRIC}_count{{cluster="test", node="{case.node}"}}',
                             "values": series_values(base_total, SAMPLES_PER_STEP)})
        ratio_seen = None
        if case.baseline_p99:
            p99_base = histogram_quantile(0.99, bounds, base, base_total)
            p99_burst = histogram_quantile(0.99, bounds, burst, SAMPLES_PER_STEP)
            ratio_seen = p99_burst / p99_base
            for severity, multiplier in tiers.items():
                # Expected from the TRUE ratio and p99: buckets too coarse to tell 2.9x
                # from 3.1x make promtool fail here, whatever they read.
                if case.ratio > multiplier and burst_p99 > floor:
                    rule = rules[severity]
                    expected.append({
                        "exp_labels": {"severity": severity, "cluster": "test", "node": case.node},
                        "exp_annotations": {key: expand(text, case.node, ratio_seen)
                                            for key, text in rule["annotations"].items()},
                    })
        seen = f"reads {ratio_seen:.3f}x" if ratio_seen else "no baseline"
        comments.append(f"#   {case.node:<16} {case.why}; the buckets {seen}")

    test = {
        "interval": f"{STEP_SECONDS}s",
        "external_labels": {"cluster": "test"},
        "input_series": input_series,
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "FabricTcpMicroburst", "exp_alerts": []},
            {"eval_time": CHECK, "alertname": "FabricTcpMicroburst", "exp_alerts": expected},
        ],
    }
    header = [
        "# GENERATED by rules/tests/generate_microburst.py from the exporter's bucket layout",
        f"# ({METRIC}: {len(bounds)} finite buckets, {1 << layout.layout.sub_bits} per power of two).",
        "# Do not edit: change the generator and rerun it (tests/test_rules.py checks it is current).",
        "#",
        f"# Log-normal RTT (sigma {SIGMA}), {SAMPLES_PER_STEP} samples per {STEP_SECONDS}s, true p99 = baseline for",
        f"# 10 minutes, then the burst. At {CHECK} the 1m rate window holds only burst samples and the",
        "# 5m baseline only baseline samples; the alert compares the interpolated p99s:",
        *comments,
    ]
    document = {
        "rule_files": ["../fabricscope-recording.yaml", "../fabricscope-alerts.yaml"],
        "evaluation_interval": f"{STEP_SECONDS}s",
        # Recording groups first, so an alert reads the p99 recorded at the same instant
        # (in Prometheus the groups run independently: at most one interval later).
        "group_eval_order": recording_first(),
        "tests": [test],
    }
    return "\n".join(header) + "\n" + yaml.safe_dump(document, sort_keys=False, width=200)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args()
    text = build()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).relative_to(RULES.parent)}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
