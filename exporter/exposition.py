"""Prometheus text exposition (format 0.0.4), written for the scrape path.

prometheus_client's generate_latest re-validates and re-escapes every label name of
every sample (a regex match per label): on a full GPU node (~1,000 series, 5-7 labels
each) that was two thirds of the scrape time. Our label names come from our own code and
are valid by construction, so this writer only escapes label *values*, and adds the
node label while formatting instead of rebuilding every sample. The output is byte-for-byte
what generate_latest produces (tests/test_exposition.py holds it to that).
"""
from __future__ import annotations

import logging
from typing import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

log = logging.getLogger("fabricscope.exporter.exposition")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TYPE_RENAMES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _format_value(value) -> str:
    """floatToGoString, with the common case first: below 1e6 (and finite) Go and Python
    print a float the same way, so repr() is the answer."""
    number = float(value)
    if -1e308 < number < 1e6:
        return repr(number)
    return floatToGoString(number)


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Renderer:
    """Renders families to text, remembering each series' formatted name-and-labels.

    The same few hundred series come back on every scrape with the same labels, so the
    sort/escape/join for a series is done once; only the value is formatted per scrape.
    The cache is dropped when it outgrows `max_series` (label churn, e.g. a port's state
    label changing), so it stays bounded.
    """

    def __init__(self, extra_labels: dict[str, str] | None = None, max_series: int = 50_000) -> None:
        self.extra = dict(extra_labels or {})
        self.max_series = max_series
        self._heads: dict[tuple, str] = {}
        # (name, type, help) -> (its samples, their ids, its whole text, {id: (sample, its
        # line, deferred suffix)}) of the last render. A family whose samples are all the
        # ones served last time (most families of a quiet node, through the collectors'
        # SampleCache) is one tuple comparison and its text again; one that changed looks
        # up each sample among its own last lines (nvlink serves the same Sample objects
        # between link rounds), so a line is formatted only for a sample that is new.
        # Holding the samples keeps their ids from being reused by other objects.
        self._families: dict[tuple, tuple] = {}

    def _head(self, name: str, labels: dict[str, str]) -> str:
        key = (name, *labels.items())
        head = self._heads.get(key)
        if head is None:
            merged = {**labels, **self.extra} if self.extra else labels
            if merged:
                inner = ",".join([f'{k}="{_escape_value(merged[k])}"' for k in sorted(merged)])
                head = f"{name}{{{inner}}} "
            else:
                head = f"{name} "
            if len(self._heads) >= self.max_series:
                self._heads.clear()
            self._heads[key] = head
        return head

    def render(self, families: Iterable[Metric]) -> bytes:
        out: list[str] = []
        append = out.append
        head_of = self._head
        last_families, rendered = self._families, {}
        for metric in families:
            start = len(out)
            key = (metric.name, metric.type, metric.documentation)
            samples = tuple(metric.samples)
            ids = tuple(map(id, samples))
            kept = last_families.get(key)
            if kept is not None and kept[1] == ids:
                append(kept[2])
                rendered[key] = kept
                continue
            last = kept[3] if kept is not None else {}
            lines = {}
            try:
                name, mtype = metric.name, metric.type
                if mtype == "counter":
                    name += "_total"
                elif mtype == "info":
                    name += "_info"
                mtype = _TYPE_RENAMES.get(mtype, mtype)
                help_text = _escape_help(metric.documentation)
                append(f"# HELP {name} {help_text}\n# TYPE {name} {mtype}\n")
                deferred: dict[str, list[str]] = {}
                base = metric.name
                for sample in samples:
                    seen = last.get(id(sample))
                    if seen is None or seen[0] is not sample:
                        line = head_of(sample.name, sample.labels) + _format_value(sample.value)
                        if sample.timestamp is not None:
                            line += f" {int(float(sample.timestamp) * 1000):d}"
                        suffix = sample.name[len(base):] if sample.name.startswith(base) else ""
                        seen = (sample, line + "\n", suffix if suffix in _OPENMETRICS_ONLY else None)
                    lines[id(sample)] = seen
                    if seen[2] is None:
                        append(seen[1])
                    else:
                        deferred.setdefault(seen[2], []).append(seen[1])
                for suffix, suffixed in sorted(deferred.items()):
                    append(f"# HELP {base}{suffix} {help_text}\n# TYPE {base}{suffix} gauge\n")
                    out.extend(suffixed)
            except (OverflowError, ValueError, TypeError) as exc:
                # A value no float can hold (or not a number at all) costs its family,
                # never the rest of the scrape.
                del out[start:]
                log.error("family %s dropped from the exposition: %s", metric.name, exc)
                continue
            rendered[key] = (samples, ids, "".join(out[start:]), lines)
        self._families = rendered
        return "".join(out).encode("utf-8")


def render(families: Iterable[Metric], extra_labels: dict[str, str] | None = None) -> bytes:
    """One-off rendering (no cache kept between calls)."""
    return Renderer(extra_labels).render(families)
