"""Raw BPF maps -> Prometheus metric families, per the declarations beside the programs.

One code path for the kernel and the demo: a MapSource hands over kernel-shaped bytes,
this module decodes keys to labels, histogram slots to second-based buckets, and keeps
counters monotonic across LRU eviction (counters.py).
"""
from __future__ import annotations

import logging
import struct
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from .counters import LabelCounters
from .declarations import MetricDecl, ObjectDecl
from .decoders import STATIC_DECODERS, Decoder, decode_key, peer_decoder
from .histogram import bucket_bounds, parse_hist, to_prometheus_buckets
from .source import MapSource
from .window_quantile import QuantileWindow

log = logging.getLogger("fabricscope.ebpf")

MAP_ERRORS_MAP = "fabric_ebpf_map_update_errors_total"


class MapConverter:
    def __init__(self, decls: list[ObjectDecl], peers: dict[str, str] | None = None,
                 window_seconds: dict[str, int] | None = None) -> None:
        self.decls = decls
        self._decoders = dict(STATIC_DECODERS)
        self._decoders["peer"] = peer_decoder(peers or {})
        self._counters: dict[str, LabelCounters] = {}
        self._windows: dict[str, QuantileWindow] = {}
        self._read_errors: dict[str, int] = {}
        self._logged: set[str] = set()
        for decl in decls:
            for metric in decl.metrics:
                for label in metric.labels:
                    if label.decoder not in self._decoders:
                        raise ValueError(f"{decl.object}: metric {metric.name}: unknown decoder {label.decoder!r}")
                if metric.window_quantile is not None:
                    bounds = [float(le) for le in bucket_bounds(metric.layout, metric.unit_seconds)]
                    seconds = (window_seconds or {}).get(metric.name, metric.window_quantile.window_seconds)
                    self._windows[metric.name] = QuantileWindow(metric.window_quantile.quantile, seconds, bounds)

    def families(self, source: MapSource) -> Iterable[Metric]:
        map_errors = CounterMetricFamily("fabric_ebpf_map_update_errors",
                                         "Kernel-side map updates that failed (map full): events lost.",
                                         labels=["map"])
        for decl in self.decls:
            for metric in decl.metrics:
                try:
                    items = source.read_map(decl.object, metric.name)
                except KeyError:
                    continue   # object not loaded: absent series, never a fake 0
                try:
                    yield from self._convert(metric, items, source, decl.object)
                except (ValueError, struct.error) as exc:
                    self._read_errors[metric.name] = self._read_errors.get(metric.name, 0) + 1
                    if metric.name not in self._logged:
                        self._logged.add(metric.name)
                        log.error("eBPF map %s could not be decoded: %s", metric.name, exc)
            self._map_errors(source, decl, map_errors)
        yield map_errors
        read_errors = CounterMetricFamily("fabric_ebpf_map_read_errors",
                                          "Scrapes on which a map's contents could not be decoded.",
                                          labels=["map"])
        for name, count in sorted(self._read_errors.items()):
            read_errors.add_metric([name], count)
        yield read_errors

    def _convert(self, metric: MetricDecl, items: list[tuple[bytes, bytes]], source: MapSource,
                 obj: str) -> list[Metric]:
        # Built whole before anything is yielded: a map that fails to decode yields nothing.
        if metric.type == "histogram":
            return self._histogram(metric, items)
        return [self._counter(metric, items, source, obj)]

    def _histogram(self, metric: MetricDecl, items: list[tuple[bytes, bytes]]) -> list[Metric]:
        family = HistogramMetricFamily(metric.name, metric.help, labels=[])
        families: list[Metric] = [family]
        for _key, value in items[:1]:   # one-slot per-CPU array (key 0)
            buckets, total = to_prometheus_buckets(parse_hist(value, metric.layout), metric.layout,
                                                   metric.unit_seconds)
            family.add_metric([], buckets, total)
            window = self._windows.get(metric.name)
            if window is not None:
                families.append(self._window_gauge(metric, window, [count for _le, count in buckets]))
        return families

    @staticmethod
    def _window_gauge(metric: MetricDecl, window: QuantileWindow, cumulative: list[int]) -> Metric:
        """The declared quantile of the histogram over its window; no sample (absent) while
        the window holds no observation or only this scrape's snapshot."""
        spec = metric.window_quantile
        gauge = GaugeMetricFamily(
            metric.window_gauge_name,
            f"The {spec.label} quantile of {metric.name} over the last {window.window_seconds:g} s, computed "
            f"by the exporter as histogram_quantile over the buckets' increase; absent while the window "
            f"holds no sample.", labels=["quantile"])
        value = window.observe(cumulative)
        if value is not None:
            gauge.add_metric([spec.label], value)
        return gauge

    def _counter(self, metric: MetricDecl, items: list[tuple[bytes, bytes]], source: MapSource,
                 obj: str) -> Metric:
        decoders: list[Decoder] = [self._decoders[label.decoder] for label in metric.labels]
        readings = []
        for key, value in items:
            if len(value) != 8:
                raise ValueError(f"counter value is {len(value)} bytes, expected 8")
            labels = decode_key(key, decoders) if decoders else ()
            readings.append((key, labels, struct.unpack("<Q", value)[0]))
        if metric.other_map:
            for key, value, labels in self._other(metric, decoders[1:], source, obj):
                readings.append((b"other:" + key, labels, value))
        totals = self._counters.setdefault(metric.name, LabelCounters()).update(readings)
        family = CounterMetricFamily(metric.name.removesuffix("_total"), metric.help,
                                     labels=[label.name for label in metric.labels])
        for labels, total in sorted(totals.items()):
            family.add_metric(list(labels), total)
        return family

    def _other(self, metric: MetricDecl, rest: list[Decoder], source: MapSource, obj: str):
        try:
            items = source.read_map(obj, metric.other_map)
        except KeyError:
            return
        for key, value in items:
            if len(value) != 8:
                raise ValueError(f"{metric.other_map}: value is {len(value)} bytes, expected 8")
            labels = ("other",) + (decode_key(key, rest) if rest else ())
            yield key, struct.unpack("<Q", value)[0], labels

    def _map_errors(self, source: MapSource, decl: ObjectDecl, family: CounterMetricFamily) -> None:
        try:
            items = source.read_map(decl.object, MAP_ERRORS_MAP)
        except KeyError:
            return
        for key, value in items:
            (index,) = struct.unpack("<I", key)
            (count,) = struct.unpack("<Q", value)
            if index < len(decl.map_errors):
                family.add_metric([decl.map_errors[index]], count)
