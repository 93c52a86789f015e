"""The scrape-path exposition writer produces exactly what prometheus_client would."""
from __future__ import annotations

import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, Metric)

from fabricscope.exporter.context import Context
from fabricscope.exporter.exposition import render
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "node"


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self):
        return self._families


def reference(families: list[Metric], node: str) -> bytes:
    """generate_latest over the same families with the node label added per sample."""
    for family in families:
        family.samples = [s._replace(labels={**s.labels, "node": node}) for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def tricky_families() -> list[Metric]:
    counter = CounterMetricFamily("fabric_x", 'Help with \\ backslash\nand newline.', labels=["a", "b"])
    counter.add_metric(['quote " here', "back\\slash"], 3)
    counter.add_metric(["new\nline", "ok"], 1e21, created=1700000000.5)
    gauge = GaugeMetricFamily("fabric_g", "Gauge.", labels=["z", "a"])
    gauge.add_metric(["1", "2"], float("nan"))
    gauge.add_metric(["3", "4"], float("-inf"))
    hist = HistogramMetricFamily("fabric_h_seconds", "Histogram.", labels=["op"])
    hist.add_metric(["AllReduce"], [("0.001", 1), ("0.01", 5), ("+Inf", 7)], sum_value=0.05)
    info = InfoMetricFamily("fabric_i", "Info.")
    info.add_metric([], {"version": "1.2"})
    plain = GaugeMetricFamily("fabric_plain", "No labels.", value=0.25)
    return [counter, gauge, hist, info, plain]


def test_tricky_values_match_generate_latest():
    assert render(tricky_families(), {"node": "n-1"}) == reference(tricky_families(), "n-1")


def test_without_extra_labels():
    families = tricky_families()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    assert render(tricky_families()) == generate_latest(registry)


def test_fixture_node_matches_generate_latest(tmp_path):
    tree = tmp_path / "node"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    ctx = Context(sysfs=tree / "sys", procfs=tree / "proc", rootfs=tree, kmsg=tree / "kmsg",
                  state_dir=tmp_path / "state", node="fixture")
    names = [n for n in sorted(load_collector_modules()) if n in ("infiniband", "netdev", "tcp", "kmsg")]
    assert names, "host collectors must be importable"
    # Two independent collector sets on two copies of the state, so both see a first scrape.
    ours = list(ScrapeCollector(build_collectors(ctx, names)).families())
    ctx2 = Context(sysfs=tree / "sys", procfs=tree / "proc", rootfs=tree, kmsg=tree / "kmsg",
                   state_dir=tmp_path / "state2", node="fixture")
    theirs = list(ScrapeCollector(build_collectors(ctx2, names)).families())
    # Durations differ between the two runs; everything else must agree byte for byte.
    for family_list in (ours, theirs):
        for family in family_list:
            if family.name == "fabric_scrape_collector_duration_seconds":
                family.samples = [s._replace(value=0.0) for s in family.samples]
    text = render(ours, {"node": "fixture"})
    assert text == reference(theirs, "fixture")
    assert len(text.splitlines()) > 300


def test_cached_renderer_matches_on_repeat_and_after_label_churn():
    from fabricscope.exporter.exposition import Renderer

    renderer = Renderer({"node": "n-1"}, max_series=3)
    first = renderer.render(tricky_families())
    assert first == reference(tricky_families(), "n-1")
    # Second scrape served from the cache; more series than max_series forces a reset.
    assert renderer.render(tricky_families()) == first
    changed = tricky_families()
    changed[1].samples[0] = changed[1].samples[0]._replace(labels={"z": "9", "a": 'x"y'})
    assert renderer.render(changed) == reference(tricky_families()[:1] + [changed[1]] + tricky_families()[2:], "n-1")


def test_samples_served_again_reuse_their_lines_and_new_ones_are_formatted():
    """A collector may serve the same Sample objects on the next scrape (nvlink between link
    rounds): their lines are reused; a new Sample, even beside reused ones, is formatted."""
    from fabricscope.exporter.exposition import Renderer

    renderer = Renderer({"node": "n-1"})
    families = tricky_families()
    first = renderer.render(families)
    again = tricky_families()
    for family, kept in zip(again, families):
        family.samples[:] = kept.samples            # the very same Sample objects
    assert renderer.render(again) == first == reference(tricky_families(), "n-1")
    moved = tricky_families()
    for family, kept in zip(moved, families):
        family.samples[:] = kept.samples
    moved[0].samples[0] = moved[0].samples[0]._replace(value=12345.5)
    expected = tricky_families()
    expected[0].samples[0] = expected[0].samples[0]._replace(value=12345.5)
    assert renderer.render(moved) == reference(expected, "n-1")


def test_value_formatting_matches_go_style_everywhere():
    from prometheus_client.utils import floatToGoString

    from fabricscope.exporter.exposition import _format_value

    for value in (0, 0.0, -0.0, 1, 3, 2.5, 999999.0, 999999.99, 1e6, 1234567.0, 1e21, 1.5e-7, -1e7,
                  -2.5, 2**53, float("inf"), float("-inf"), float("nan"), 1e308, -1e308):
        assert _format_value(value) == floatToGoString(value), value
