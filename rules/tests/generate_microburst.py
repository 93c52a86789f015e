"""Write rules/tests/tcp_microburst.yaml and tcp_microburst_tiers.yaml: FabricTcpMicroburst
cases built from the bucket layout and the windowed quantile the exporter really exposes,
so they cannot drift from it.

    .venv/bin/python rules/tests/generate_microburst.py          # rewrite both files
    .venv/bin/python rules/tests/generate_microburst.py --check  # exit 1 if one is stale

Every node sends RTT samples from a log-normal distribution (sigma 0.3, the shape of the
demo's healthy RTT) whose *true* p99 is a chosen value: a baseline for 10 minutes, then a
burst whose true p99 is `ratio` x the baseline's. Bucket counts are that distribution's
CDF at the exporter's own `le` bounds (exporter/bpf/tcp.yaml through
exporter/bpf_loader/histogram.py). The rule reads the exporter's gauge
fabric_tcp_rtt_excess_window_seconds{quantile="0.99"}: its values here are the exporter's
own windowed quantile of those counts (exporter/bpf_loader/window_quantile.py, over the
window its declaration names), scrape by scrape, as a real node exports it: the
interpolated p99 of the real buckets, not the true p99.

Thresholds, windows and annotation texts come from the rendered mixin (`_config` and
rules/fabricscope-alerts.yaml), so changing a threshold changes the expectations here,
never silently the other way round. Whether an alert is expected follows from the *true*
ratio and p99 (the seed's definition), so buckets too coarse to tell 2.9x from 3.1x fail
the test; only the value printed in the description is computed, from the gauge's values.
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
TIERS_OUTPUT = HERE / "tcp_microburst_tiers.yaml"
sys.path.insert(0, str(RULES.parent))

from fabricscope.exporter.bpf_loader.declarations import load_declarations  # noqa: E402
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds  # noqa: E402
from fabricscope.exporter.bpf_loader.window_quantile import QuantileWindow  # noqa: E402
from fabricscope.rules.render import exporter_windows  # noqa: E402

METRIC = "fabric_tcp_rtt_excess_seconds"
SIGMA = 0.3
SAMPLES_PER_STEP = 20000      # RTT samples per 30 s scrape
STEP_SECONDS = 30
BASELINE_STEPS = 20           # 0..10m: 21 samples
BURST_STEPS = 9               # 10m30s..15m
SWEEP = 12                    # baselines across one power of two
CHECK_STEP = 22               # 11m: the first evaluation whose window holds only burst samples
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


def excess_metric():
    return next(m for d in load_declarations() for m in d.metrics if m.name == METRIC)


def step_counts(before: list[int], after: list[int]) -> list[list[int]]:
    """Cumulative counts (+Inf last) at each scrape: `before` per step for BASELINE_STEPS,
    then `after` per step."""
    return [[b * k for b in before] if k <= BASELINE_STEPS
            else [b * BASELINE_STEPS + a * (k - BASELINE_STEPS) for b, a in zip(before, after)]
            for k in range(BASELINE_STEPS + BURST_STEPS + 1)]


class Exporter:
    """The exporter's p99 gauge of one node's histogram, scrape by scrape, through the
    exporter's own QuantileWindow over its declared window."""

    def __init__(self, bounds: list[float]) -> None:
        metric = excess_metric()
        self.gauge = metric.window_gauge_name
        self.quantile = metric.window_quantile.label
        self.window_seconds = exporter_windows()["tcpRttExcess"]["seconds"]
        self.bounds = bounds

    def values(self, steps: list[list[int]]) -> list[float | None]:
        clock = [0.0]
        window = QuantileWindow(float(self.quantile), self.window_seconds, self.bounds, clock=lambda: clock[0])
        out = []
        for index, counts in enumerate(steps):
            clock[0] = float(index * STEP_SECONDS)
            out.append(window.observe(counts))
        return out

    def series(self, labels: str, values: list[float | None]) -> dict:
        """A promtool input series; `_` where the exporter exports no sample."""
        text = " ".join("_" if v is None else repr(v) for v in values)
        return {"series": f'{self.gauge}{{{labels}, quantile="{self.quantile}"}}', "values": text}


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
    layout = excess_metric()
    bounds = [float(le) for le in bucket_bounds(layout.layout, layout.unit_seconds)]
    exporter = Exporter(bounds)
    check = f"{CHECK_STEP * STEP_SECONDS // 60}m"   # 11m

    input_series, expected, comments = [], [], []
    for case in cases(floor):
        burst_p99 = (case.baseline_p99 or 3e-3) * case.ratio
        base = cdf_counts(case.baseline_p99, bounds) if case.baseline_p99 else [0] * len(bounds)
        base_total = SAMPLES_PER_STEP if case.baseline_p99 else 0
        burst = cdf_counts(burst_p99, bounds)
        values = exporter.values(step_counts(base + [base_total], burst + [SAMPLES_PER_STEP]))
        input_series.append(exporter.series(f'cluster="test", node="{case.node}"', values))
        ratio_seen = None
        if case.baseline_p99:
            # Every baseline scrape reads the same p99: the last one's, against the burst's.
            ratio_seen = values[CHECK_STEP] / values[BASELINE_STEPS]
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
            {"eval_time": check, "alertname": "FabricTcpMicroburst", "exp_alerts": expected},
        ],
    }
    header = [
        "# GENERATED by rules/tests/generate_microburst.py from the exporter's bucket layout",
        f"# ({METRIC}: {len(bounds)} finite buckets, {1 << layout.layout.sub_bits} per power of two)",
        f"# and its windowed quantile ({exporter.gauge}, {exporter.window_seconds}s).",
        "# Do not edit: change the generator and rerun it (tests/test_rules.py checks it is current).",
        "#",
        f"# Log-normal RTT (sigma {SIGMA}), {SAMPLES_PER_STEP} samples per {STEP_SECONDS}s, true p99 = baseline for",
        "# 10 minutes, then the burst; the input is the p99 gauge the exporter computes from those",
        f"# buckets. At {check} its window holds only burst samples and the 5m baseline only",
        "# baseline samples; the alert compares the interpolated p99s:",
        *comments,
    ]
    return document(header, test)


def document(header: list[str], test: dict) -> str:
    return "\n".join(header) + "\n" + yaml.safe_dump({
        "rule_files": ["../fabricscope-recording.yaml", "../fabricscope-alerts.yaml"],
        "evaluation_interval": f"{STEP_SECONDS}s",
        # Recording groups first, so an alert reads the p99 recorded at the same instant
        # (in Prometheus the groups run independently: at most one interval later).
        "group_eval_order": recording_first(),
        "tests": [test],
    }, sort_keys=False, width=200)


# The tiers case: 100 RTT samples a scrape, in one of these buckets (illustrative bounds).
TIER_BOUNDS = [0.002, 0.006, 0.008, 0.012, 0.014]
# (scrapes, the bucket index of their samples; None: no samples), from 30 s on.
TIER_PHASES = [(20, 0), (3, 4), (3, 2), (1, None), (20, 0)]


def build_tiers() -> str:
    exporter = Exporter(TIER_BOUNDS)
    steps, counts = [[0] * (len(TIER_BOUNDS) + 1)], [0] * (len(TIER_BOUNDS) + 1)
    for scrapes, bucket in TIER_PHASES:
        for _ in range(scrapes):
            if bucket is not None:
                counts = [c + (100 if i >= bucket else 0) for i, c in enumerate(counts)]
            steps.append(list(counts))
    firing = 'ALERTS{alertname="FabricTcpMicroburst", alertstate="firing"}'
    labels = '{alertname="FabricTcpMicroburst", alertstate="firing", cluster="test", node="n", severity="%s"}'
    test = {
        "interval": f"{STEP_SECONDS}s",
        "external_labels": {"cluster": "test"},
        "input_series": [exporter.series('cluster="test", node="n"', exporter.values(steps))],
        "promql_expr_test": [
            # Both tiers fire at 10m30s (630 s)...
            {"expr": f"min_over_time(timestamp({firing})[30m:30s])", "eval_time": "25m",
             "exp_samples": [{"labels": labels % "critical", "value": 630}, {"labels": labels % "warning", "value": 630}]},
            # ...and the warning's last firing evaluation (12m30s) comes before the
            # critical's (13m): the 3-4x tail to 13m, held 2m, would otherwise keep it
            # raised to 15m, past the critical alert that inhibits it in Alertmanager.
            {"expr": f"max_over_time(timestamp({firing})[30m:30s])", "eval_time": "25m",
             "exp_samples": [{"labels": labels % "critical", "value": 780}, {"labels": labels % "warning", "value": 750}]},
        ],
    }
    header = [
        "# GENERATED by rules/tests/generate_microburst.py (build_tiers). Do not edit.",
        "#",
        "# FabricTcpMicroburst tiers: the warning tier stands down while the critical tier is",
        "# raised, so a burst that crossed 6x never leaves a warning behind it after the critical",
        "# alert (held 2m by keep_firing_for) has resolved.",
        "#",
        "# 100 RTT samples per 30s in (0, 2ms] (p99 1.98ms) for 10 minutes; from 10m30s to 11m30s",
        "# in (12ms, 14ms] (7x: both tiers); from 12m to 13m in (6ms, 8ms] (a 3-4x tail: the",
        "# warning condition alone); none at 13m30s; then back in (0, 2ms]. The input is the p99",
        f"# gauge the exporter computes from those buckets over its {exporter.window_seconds}s window. (Bounds",
        "# here are illustrative; tcp_microburst.yaml uses the exporter's real ones.)",
    ]
    return document(header, test)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = parser.parse_args()
    stale = 0
    for path, text in ((OUTPUT, build()), (TIERS_OUTPUT, build_tiers())):
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is stale: run {Path(__file__).relative_to(RULES.parent)}", file=sys.stderr)
                stale = 1
            continue
        path.write_text(text)
        print(path)
    return stale


if __name__ == "__main__":
    sys.exit(main())
