"""The metric declarations beside each BPF program (exporter/bpf/<object>.yaml).

Each declaration names the object, its programs, and for every metric the map that feeds
it (map name == metric name), its type and how its key decodes into labels.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .histogram import BucketLayout
from .objects import SOURCE_DIR

METRIC_TYPES = {"histogram", "counter"}
LAYOUT_KEYS = {"sub_bits", "min_exp", "max_exp"}
METRIC_KEYS = {"name", "type", "help", "unit_seconds", "labels", "other_map", "buckets", "window_quantile"}
WINDOW_QUANTILE_KEYS = {"quantile", "window_seconds"}
# A window longer than this keeps more snapshots than a quantile gauge is worth; the
# mixin's rules write it as a whole number of seconds.
MAX_WINDOW_SECONDS = 3600


@dataclass(frozen=True)
class LabelDecl:
    name: str
    decoder: str


@dataclass(frozen=True)
class WindowQuantileDecl:
    """A histogram's quantile over a sliding window, exported as a gauge beside it
    (window_quantile.py): what a rule would compute with histogram_quantile(q, rate(..[w]))."""
    quantile: float
    window_seconds: int

    @property
    def label(self) -> str:
        """The gauge's `quantile` label: the shortest decimal (0.99)."""
        return repr(self.quantile)


@dataclass(frozen=True)
class MetricDecl:
    name: str
    type: str
    help: str
    unit_seconds: float = 1.0
    labels: tuple[LabelDecl, ...] = ()
    # A per-CPU array holding the "other" share of a labelled counter: its value goes to
    # the first label = "other", its key (if any) decodes through the remaining labels.
    other_map: str | None = None
    # Histograms: the slot layout, the same three numbers as the map's DECLARE_HIST().
    layout: BucketLayout | None = None
    # Histograms: a quantile over a sliding window, computed here and exported as a gauge.
    window_quantile: WindowQuantileDecl | None = None

    @property
    def window_gauge_name(self) -> str:
        """fabric_x_seconds -> fabric_x_window_seconds: beside the histogram's
        _bucket/_sum/_count, never one of them."""
        return self.name.removesuffix("_seconds") + "_window_seconds"


@dataclass(frozen=True)
class ObjectDecl:
    object: str
    programs: tuple[str, ...]
    tracefs_programs: tuple[str, ...]     # classic tracepoint/ programs: need tracefs
    map_errors: tuple[str, ...]
    metrics: tuple[MetricDecl, ...]


def parse_declaration(data: dict, origin: str = "<declaration>") -> ObjectDecl:
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: top level must be a mapping")
    try:
        metrics = []
        for m in data["metrics"]:
            unknown = set(m) - METRIC_KEYS
            if unknown:
                raise ValueError(f"{origin}: metric {m.get('name')}: unknown keys {sorted(unknown)}; "
                                 f"expected some of {sorted(METRIC_KEYS)}")
            if m["type"] not in METRIC_TYPES:
                raise ValueError(f"{origin}: metric {m['name']}: type {m['type']!r} not in {sorted(METRIC_TYPES)}")
            labels = tuple(LabelDecl(str(lab["name"]), str(lab["decoder"])) for lab in m.get("labels") or ())
            other = m.get("other_map")
            if other and not labels:
                raise ValueError(f"{origin}: metric {m['name']}: other_map needs at least one label")
            metrics.append(MetricDecl(name=str(m["name"]), type=m["type"], help=str(m.get("help", "")),
                                      unit_seconds=float(m.get("unit_seconds", 1.0)), labels=labels,
                                      other_map=str(other) if other else None,
                                      layout=_layout(m, origin) if m["type"] == "histogram" else None,
                                      window_quantile=_window_quantile(m, origin)))
        programs = tuple(map(str, data["programs"]))
        tracefs = tuple(map(str, data.get("tracefs_programs") or ()))
        if not set(tracefs) <= set(programs):
            raise ValueError(f"{origin}: tracefs_programs {sorted(set(tracefs) - set(programs))} are not in programs")
        return ObjectDecl(object=str(data["object"]), programs=programs, tracefs_programs=tracefs,
                          map_errors=tuple(map(str, data.get("map_errors") or ())), metrics=tuple(metrics))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{origin}: malformed declaration ({exc!r})") from exc


def _layout(metric: dict, origin: str) -> BucketLayout:
    buckets = metric.get("buckets")
    if not isinstance(buckets, dict) or set(buckets) != LAYOUT_KEYS \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in buckets.values()):
        raise ValueError(f"{origin}: metric {metric['name']}: a histogram needs buckets: "
                         f"{{sub_bits, min_exp, max_exp}} (integers, as in its DECLARE_HIST), got {buckets!r}")
    try:
        return BucketLayout(**buckets)
    except ValueError as exc:
        raise ValueError(f"{origin}: metric {metric['name']}: {exc}") from None


def _window_quantile(metric: dict, origin: str) -> WindowQuantileDecl | None:
    spec = metric.get("window_quantile")
    if spec is None:
        return None
    where = f"{origin}: metric {metric['name']}: window_quantile"
    if metric["type"] != "histogram" or not str(metric["name"]).endswith("_seconds"):
        raise ValueError(f"{where}: only a histogram in seconds (name ending _seconds) has one")
    if not isinstance(spec, dict) or set(spec) != WINDOW_QUANTILE_KEYS:
        raise ValueError(f"{where}: needs exactly {{quantile, window_seconds}}, got {spec!r}")
    quantile, window = spec["quantile"], spec["window_seconds"]
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile < 1:
        raise ValueError(f"{where}: quantile must be a number between 0 and 1 (exclusive), got {quantile!r}")
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW_SECONDS:
        raise ValueError(f"{where}: window_seconds must be a whole number of seconds, 1..{MAX_WINDOW_SECONDS}, "
                         f"got {window!r}")
    return WindowQuantileDecl(quantile=float(quantile), window_seconds=window)


def load_declarations(directory: Path = SOURCE_DIR) -> list[ObjectDecl]:
    """Every <name>.yaml in `directory`, parsed in a short-lived child where one can be
    forked (exporter/isolated.py): PyYAML does not stay resident in the serving exporter.
    A bad declaration is a ValueError naming its file. The sources need not be there: an
    installed package carries the declarations and the compiled objects, not the .bpf.c
    (a declaration whose object is absent is reported by the collector as object_missing)."""
    from ..isolated import IsolatedStepError, in_child

    try:
        return in_child(_parse_declaration_files, directory)
    except IsolatedStepError as exc:
        raise ValueError(str(exc).split("\n", 1)[0]) from None


def _parse_declaration_files(directory: Path) -> list[ObjectDecl]:
    import yaml   # here, not at the top: only this step needs it

    decls = []
    for path in sorted(directory.glob("*.yaml")):
        decls.append(parse_declaration(yaml.safe_load(path.read_text()), str(path)))
    return decls
