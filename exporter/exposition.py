"""Prometheus text exposition (format 0.0.4), written for the scrape path.

prometheus_client's generate_latest re-validates and re-escapes every label name of
every sample (a regex match per label): on a full GPU node (~1,000 series, 5-7 labels
each) that was two thirds of the scrape time. Our label names come from our own code and
are valid by construction, so this writer only escapes label *values*, and adds the
node label while formatting instead of rebuilding every sample. The output is byte-for-byte
what generate_latest produces (tests/test_exposition.py holds it to that).
"""
from __future__ import annotations

from typing import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TYPE_RENAMES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _sample_line(name: str, labels: dict[str, str], value: float, timestamp, extra: dict[str, str]) -> str:
    if extra:
        labels = {**labels, **extra}
    if labels:
        inner = ",".join([f'{key}="{_escape_value(labels[key])}"' for key in sorted(labels)])
        head = f"{name}{{{inner}}}"
    else:
        head = name
    tail = f" {int(float(timestamp) * 1000):d}" if timestamp is not None else ""
    return f"{head} {floatToGoString(value)}{tail}\n"


def render(families: Iterable[Metric], extra_labels: dict[str, str] | None = None) -> bytes:
    extra = extra_labels or {}
    out: list[str] = []
    for metric in families:
        name, mtype = metric.name, metric.type
        if mtype == "counter":
            name += "_total"
        elif mtype == "info":
            name += "_info"
        mtype = _TYPE_RENAMES.get(mtype, mtype)
        help_text = _escape_help(metric.documentation)
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {mtype}\n")
        deferred: dict[str, list[str]] = {}
        for sample in metric.samples:
            line = _sample_line(sample.name, sample.labels, sample.value, sample.timestamp, extra)
            suffix = sample.name[len(metric.name):] if sample.name.startswith(metric.name) else ""
            if suffix in _OPENMETRICS_ONLY:
                deferred.setdefault(suffix, []).append(line)
            else:
                out.append(line)
        for suffix, lines in sorted(deferred.items()):
            out.append(f"# HELP {metric.name}{suffix} {help_text}\n# TYPE {metric.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")
