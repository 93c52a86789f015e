"""The exporter's windowed histogram quantile (exporter/bpf_loader/window_quantile.py):
its interpolation against Prometheus' own histogram_quantile (a real promtool run), the
window of snapshots, the declaration that asks for it, and the gauge beside the histogram."""
from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import bpf as sim_bpf
from fabricscope.demo import stack
from fabricscope.exporter.bpf_loader.declarations import load_declarations, parse_declaration
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds
from fabricscope.exporter.bpf_loader.window_quantile import (MIN_SNAPSHOT_SPACING_SECONDS, QuantileWindow,
                                                             bucket_quantile)
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import COLLECTORS, load_collector_modules

load_collector_modules()

EXCESS = next(m for d in load_declarations() for m in d.metrics if m.name == "fabric_tcp_rtt_excess_seconds")
LES = bucket_bounds(EXCESS.layout, EXCESS.unit_seconds)
BOUNDS = [float(le) for le in LES]


def _cumulative(slots):
    out, running = [], 0
    for count in slots:
        running += count
        out.append(running)
    return out


def _cases():
    """(name, cumulative counts over every bucket and +Inf) on the exporter's real layout."""
    rng = random.Random(36)
    n = len(BOUNDS) + 1
    cases = {"first_bucket_only": _cumulative([50] + [0] * (n - 1)),
             "all_in_inf": _cumulative([0] * (n - 1) + [7]),
             "tail_in_inf": _cumulative([0] * 20 + [990] + [0] * (n - 22) + [10]),
             "one_sample": _cumulative([0] * 40 + [1] + [0] * (n - 41))}
    for index in range(8):
        slots = [0] * n
        for _ in range(rng.randint(50, 5000)):
            slots[min(n - 1, int(rng.expovariate(1 / rng.uniform(3, 60))))] += 1
        cases[f"random_{index}"] = _cumulative(slots)
    return cases


def test_the_quantile_is_prometheus_histogram_quantile_on_the_same_buckets(tmp_path):
    """promtool evaluates histogram_quantile over the very counts the exporter interpolates:
    its answer must be the exporter's, for every quantile asked of each case."""
    cases = _cases()
    series, expected = [], []
    for name, counts in cases.items():
        for le, count in zip([*LES, "+Inf"], counts):
            series.append({"series": f'h_bucket{{case="{name}",le="{le}"}}', "values": f"{count}x2"})
    for q in (0.5, 0.9, 0.99, 0.999):
        samples = [{"labels": f'{{case="{name}"}}', "value": bucket_quantile(q, BOUNDS, counts)}
                   for name, counts in cases.items()]
        expected.append({"expr": f"histogram_quantile({q}, h_bucket)", "eval_time": "1m", "exp_samples": samples})
    test = tmp_path / "quantile.yaml"
    test.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m",
                                    "tests": [{"interval": "1m", "input_series": series,
                                               "promql_expr_test": expected}]}))
    result = subprocess.run([stack.find_binary("promtool"), "test", "rules", str(test)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_observations_is_no_value_and_bad_input_is_refused():
    assert bucket_quantile(0.99, [1.0, 2.0], [0, 0, 0]) is None
    with pytest.raises(ValueError, match="one count per finite bound"):
        bucket_quantile(0.99, [1.0, 2.0], [1, 2])
    with pytest.raises(ValueError, match="within 0..1"):
        bucket_quantile(1.5, [1.0], [1, 1])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _window(seconds=60):
    clock = Clock()
    return clock, QuantileWindow(0.5, seconds, [1.0, 2.0, 4.0], clock=clock)


def test_the_first_collection_has_no_start_and_emits_nothing():
    clock, window = _window()
    assert window.observe([5, 5, 5, 5]) is None
    clock.now += 10
    # 10 more samples, all in (1, 2]: the median of the increase interpolates inside it.
    assert window.observe([5, 15, 15, 15]) == pytest.approx(1.5)


def test_the_start_is_the_newest_snapshot_at_least_a_window_old():
    clock, window = _window(60)
    history = {}
    for t in range(0, 200, 10):
        clock.now = 1000.0 + t
        counts = [t, 2 * t, 3 * t, 3 * t]      # grows by (t, t, t, 0) per bucket
        history[t] = counts
        window.observe(counts)
    clock.now = 1000.0 + 200
    now = [500, 2 * 500, 3 * 500, 3 * 500]     # a different shape, to tell starts apart
    got = window.observe(now)
    start = history[140]                       # newest at least 60 s before 200
    increase = [c - s for c, s in zip(now, start)]
    assert got == bucket_quantile(0.5, [1.0, 2.0, 4.0], increase)
    # Nothing older than the start is kept: bounded in time and in count.
    assert len(window) == (200 - 140) // 10 + 1


def test_a_window_that_saw_no_samples_is_absent():
    clock, window = _window()
    window.observe([3, 3, 3, 3])
    clock.now += 30
    assert window.observe([3, 3, 3, 3]) is None


def test_collections_within_a_second_share_one_snapshot():
    """Two Prometheus replicas scraping the same exporter: the second scrape of a pair
    answers over the same window but keeps no snapshot of its own."""
    clock, window = _window()
    for second in range(120):
        clock.now = 1000.0 + second
        window.observe([second, second, second, second])
        clock.now += MIN_SNAPSHOT_SPACING_SECONDS / 4
        window.observe([second, second, second, second])
    assert len(window) <= 62


def test_a_histogram_reset_starts_a_new_window():
    """The kernel's counts went backwards (the program was reloaded): the snapshots of the
    old histogram are dropped, and the next answer comes from the new one alone."""
    clock, window = _window()
    window.observe([100, 100, 100, 100])
    clock.now += 10
    assert window.observe([200, 200, 200, 200]) == pytest.approx(0.5)
    clock.now += 10
    assert window.observe([0, 4, 4, 4]) is None
    clock.now += 10
    assert window.observe([0, 4, 14, 14]) == pytest.approx(3.0)


def _decl(**spec):
    metric = {"name": "fabric_x_seconds", "type": "histogram", "buckets": {"sub_bits": 3, "min_exp": 4, "max_exp": 19},
              "window_quantile": spec}
    return {"object": "x", "programs": ["p"], "metrics": [metric]}


def test_the_declaration_names_a_quantile_and_a_window():
    metric = parse_declaration(_decl(quantile=0.99, window_seconds=60)).metrics[0]
    assert metric.window_quantile.quantile == 0.99 and metric.window_quantile.window_seconds == 60
    assert metric.window_gauge_name == "fabric_x_window_seconds"
    assert EXCESS.window_quantile is not None


@pytest.mark.parametrize("spec, match", [
    ({"quantile": 0.99}, r"needs exactly \{quantile, window_seconds\}"),
    ({"quantile": 0.99, "window_seconds": 60, "every": 5}, r"needs exactly"),
    ({"quantile": 1.0, "window_seconds": 60}, "quantile must be a number between 0 and 1"),
    ({"quantile": "0.99", "window_seconds": 60}, "quantile must be a number"),
    ({"quantile": 0.99, "window_seconds": 0}, "window_seconds must be a whole number of seconds"),
    ({"quantile": 0.99, "window_seconds": 60.5}, "window_seconds must be a whole number"),
    ({"quantile": 0.99, "window_seconds": 86400}, "window_seconds must be a whole number"),
])
def test_a_bad_window_quantile_is_a_clear_error(spec, match):
    with pytest.raises(ValueError, match="x.yaml: metric fabric_x_seconds: window_quantile: " + match):
        parse_declaration(_decl(**spec), "x.yaml")


def test_only_a_histogram_in_seconds_has_a_window_quantile_and_unknown_keys_are_refused():
    decl = _decl(quantile=0.99, window_seconds=60)
    decl["metrics"][0]["name"] = "fabric_x_bytes"
    with pytest.raises(ValueError, match="only a histogram in seconds"):
        parse_declaration(decl, "x.yaml")
    decl = _decl(quantile=0.99, window_seconds=60)
    decl["metrics"][0]["window_quantil"] = {}
    with pytest.raises(ValueError, match=r"unknown keys \['window_quantil'\]"):
        parse_declaration(decl, "x.yaml")


def test_the_exporter_exposes_the_gauge_beside_the_histogram():
    """The demo's simulated maps through the real collector: no gauge on the first
    collection, then the p99 of the histogram's increase, which a microburst raises."""
    specs = tuple(NodeSpec(f"gpu-node-{i}", i, 8, 4, Path("/nonexistent")) for i in range(3))
    cluster = ClusterSpec("test", specs, seed=7)
    source = sim_bpf.make_source(cluster.nodes[1], cluster, random.Random(3))
    registry = CollectorRegistry()
    registry.register(COLLECTORS["ebpf"](Context(node="gpu-node-1", sources={"bpf": source})))
    gauge, labels = "fabric_tcp_rtt_excess_window_seconds", {"quantile": "0.99"}
    source.step(1.0, [])
    assert registry.get_sample_value(gauge, labels) is None
    assert registry.get_sample_value("fabric_tcp_rtt_excess_seconds_count") > 0
    for t in range(2, 30):
        source.step(float(t), [])
    healthy = registry.get_sample_value(gauge, labels)
    assert healthy is not None and 10e-6 < healthy < 200e-6
    burst = Fault("microburst", "gpu-node-1", start=30.0, end=60.0)
    for t in range(30, 40):
        source.step(float(t), [burst])
    assert registry.get_sample_value(gauge, labels) > 3 * healthy
    exposed = {family.name for family in registry.collect()}
    assert {"fabric_tcp_rtt_excess_seconds", gauge} <= exposed


# ---- one home for the window: the rules read the exporter's --------------------------

def _tcp_rules(paths):
    rules = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.update({rule.get("record"): rule["expr"] for rule in group["rules"] if "record" in rule})
    return rules


def _seconds(text):
    from fabricscope.demo.scenario import parse_duration
    return parse_duration(text, "offset")


def test_the_rules_select_the_exporters_gauge_and_offset_their_baseline_by_its_window(tmp_path):
    """The p99 window is declared once (exporter/bpf/tcp.yaml): the rendered rules read the
    gauge by its declared name and quantile, and their baseline's offset is the declared
    window; an exporter config that shortens the window moves the offset with it."""
    import re

    from fabricscope.rules import render as render_module

    for config, seconds in ((None, EXCESS.window_quantile.window_seconds),
                            ({"ebpf": {"window_seconds": {EXCESS.name: 10}}}, 10)):
        rules = _tcp_rules(render_module.render({}, tmp_path / str(seconds), config))
        p99 = rules["node:fabric_tcp_rtt_excess_seconds:p99_1m"]
        assert f'{EXCESS.window_gauge_name}{{quantile="{EXCESS.window_quantile.label}"}}' in p99
        assert "_bucket" not in p99
        offset = re.search(r"offset (\w+)", rules["node:fabric_tcp_rtt_excess_seconds_p99:avg5m"]).group(1)
        assert _seconds(offset) == seconds


def test_the_mixin_has_no_window_of_its_own_and_a_bad_exporter_window_is_refused(tmp_path):
    from fabricscope.rules import render as render_module

    with pytest.raises(render_module.RenderError, match="unknown config key: windows.tcpRate"):
        render_module.render({"windows": {"tcpRate": "1m"}}, tmp_path / "a")
    with pytest.raises(render_module.RenderError, match="declares no window_quantile"):
        render_module.render({}, tmp_path / "b", {"ebpf": {"window_seconds": {"fabric_tcp_rtt_seconds": 10}}})
    with pytest.raises(render_module.RenderError, match="window_seconds"):
        render_module.render({}, tmp_path / "c", {"ebpf": {"window_seconds": {EXCESS.name: 0}}})


def test_a_compressed_demo_clock_shortens_the_exporters_window_and_the_rules_alike():
    from fabricscope.demo.stack.timescale import scale_exporter_config

    assert scale_exporter_config(10) == {"ebpf": {"window_seconds": {EXCESS.name: 6}}}
    assert scale_exporter_config(1000)["ebpf"]["window_seconds"][EXCESS.name] == 3
