"""Building blocks every fabricscope dashboard shares.

The conventions of the monitoring mixins, applied once here so no dashboard re-invents
them: a `datasource` variable (no hard-coded Prometheus), chained `label_values`
variables, `$__rate_interval` in every rate, a unit on every panel, a uid derived from the
module's file name, firing alerts as annotations, and links between the dashboards that
keep the selected variables and time range (fleet → node → device).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import attr
from grafanalib import core as g

TAG = "fabricscope"
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
# The Infinity datasource (JSON over HTTP) pointed at the sidecar; see docs/dashboards.md.
INFINITY_TYPE = "yesoreyeram-infinity-datasource"
SIDECAR = {"type": INFINITY_TYPE, "uid": "${sidecar}"}

# Rate window for every rate()/increase() on a panel: Grafana widens it to at least four
# scrape intervals, so a panel never goes blank when zoomed in.
RATE = "$__rate_interval"

GRID_WIDTH = 24


def uid_for(module_file: str) -> str:
    """Stable uid from the dashboard's source file name (dashboards/node_network.py →
    fabricscope-node-network): links between dashboards can rely on it."""
    return f"{TAG}-{Path(module_file).stem.replace('_', '-')}"


# ---------------------------------------------------------------------------- variables

def matchers(*names: str, **fixed: str) -> str:
    """Label matchers for the dashboard variables `names` (regex matches, so "All" and
    multi-value selections work) plus fixed equality matchers."""
    parts = [f'{name}=~"${name}"' for name in names]
    parts += [f'{label}="{value}"' for label, value in fixed.items()]
    return ", ".join(parts)


def alert_matchers(*names: str) -> str:
    """Matchers for ALERTS scoped by dashboard variables that also keep the alerts lacking
    the label: FabricNcclHang has no `node` (a hang spans nodes), and `node=~"$node"`
    would drop it from every node-scoped view. `|` adds the empty value to the regex."""
    return ", ".join(f'{name}=~"${name}|"' for name in names)


def datasource_variable() -> g.Template:
    return g.Template(name="datasource", label="Prometheus", query="prometheus", type="datasource",
                      default="Prometheus")


def sidecar_variable() -> g.Template:
    return g.Template(name="sidecar", label="Sidecar", query=INFINITY_TYPE, type="datasource",
                      default="fabricscope sidecar")


def label_variable(name: str, metric: str, chained_on: Sequence[str] = (), label: str | None = None,
                   multi: bool = True, include_all: bool = True, title: str | None = None) -> g.Template:
    """A `label_values` variable whose choices are filtered by the variables before it."""
    selector = f"{{{matchers(*chained_on)}}}" if chained_on else ""
    return g.Template(
        name=name, label=title or name.capitalize(), dataSource=PROMETHEUS,
        query=f"label_values({metric}{selector}, {label or name})",
        multi=multi, includeAll=include_all, refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=g.SORT_NUMERIC_ASC if name in ("gpu", "rank", "port", "link") else g.SORT_ALPHA_ASC,
        default="$__all" if include_all else None)


def fleet_variables(*extra: g.Template) -> list[g.Template]:
    """datasource → cluster → job: what every dashboard starts with."""
    return [
        datasource_variable(),
        label_variable("cluster", "fabric_exporter_build_info", multi=False, include_all=True),
        label_variable("job", "fabric_exporter_build_info", ["cluster"], title="Scrape job"),
        *extra,
    ]


def node_variable() -> g.Template:
    return label_variable("node", "fabric_exporter_build_info", ["cluster", "job"])


# ---------------------------------------------------------------------------- targets

def prom(expr: str, legend: str = "", instant: bool = False, table: bool = False,
         heatmap: bool = False, ref: str = "") -> g.Target:
    fmt = "table" if table else "heatmap" if heatmap else "time_series"
    return g.Target(expr=" ".join(expr.split()), legendFormat=legend, instant=instant, format=fmt,
                    refId=ref, datasource=PROMETHEUS, intervalFactor=1)


@attr.s
class InfinityTarget:
    """A query of the Infinity datasource: JSON from the sidecar's HTTP API, with the
    response fields the panel shows mapped to typed columns. The request is exactly what
    Infinity sends (URL relative to the datasource's base URL, method, JSON body), so a
    test can replay it against a running sidecar."""
    url = attr.ib()
    columns = attr.ib()                      # [(selector in each row, display name, type)]
    root_selector = attr.ib(default="")
    method = attr.ib(default="GET")
    body = attr.ib(default=None)
    params = attr.ib(factory=list)           # [(key, value)] URL query parameters
    refId = attr.ib(default="")
    format = attr.ib(default="table")

    def to_json_data(self) -> dict:
        url_options: dict = {"method": self.method, "data": "", "params": [
            {"key": key, "value": value} for key, value in self.params]}
        if self.body is not None:
            url_options.update({"body_type": "raw", "body_content_type": "application/json",
                                "data": self.body})
        return {
            "refId": self.refId, "datasource": SIDECAR, "type": "json", "source": "url",
            "parser": "backend", "format": self.format, "url": self.url, "url_options": url_options,
            "root_selector": self.root_selector,
            "columns": [{"selector": sel, "text": text, "type": kind} for sel, text, kind in self.columns],
            "filters": [],
        }


# ---------------------------------------------------------------------------- panels

@dataclass
class Size:
    w: int = 12
    h: int = 8


def _with_refs(targets: Iterable) -> list:
    targets = list(targets)
    for index, target in enumerate(targets):
        if not target.refId:
            target.refId = chr(ord("A") + index)
    return targets


def _threshold_steps(steps: Sequence[tuple[float | None, str]]) -> list:
    # Grafana's field-config steps: the first (base) step has value null.
    return [{"color": color, "value": value} for value, color in steps]


DEFAULT_STEPS = [(None, "green")]


def _links(links: Sequence[tuple[str, str]]) -> list[dict]:
    return [{"title": title, "url": url} for title, url in links]


def _data_links(links: Sequence[tuple[str, str]]) -> dict:
    return {"fieldConfig": {"defaults": {"links": _links(links)}}} if links else {}


def _merge(*parts: dict) -> dict:
    merged: dict = {}
    for part in parts:
        g._deep_update(merged, part)
    return merged


def timeseries(title: str, targets: Sequence, unit: str, description: str, size: Size = Size(),
               thresholds: Sequence[tuple[float | None, str]] = (), stacked: bool = False,
               links: Sequence[tuple[str, str]] = (), bars: bool = False, log_scale: bool = False) -> g.TimeSeries:
    """`log_scale`: a log10 y axis, for a panel whose threshold line and incident values
    lie orders of magnitude apart (a 120/hour line under a storm of thousands, a hang
    line of milliseconds under a hang of a minute): both stay visible."""
    steps = list(thresholds) or DEFAULT_STEPS
    return g.TimeSeries(
        scaleDistributionType="log" if log_scale else "linear", scaleDistributionLog=10 if log_scale else 2,
        title=title, description=description, dataSource=PROMETHEUS, targets=_with_refs(targets),
        unit=unit, gridPos=size, lineWidth=1, fillOpacity=40 if stacked or bars else 10,
        drawStyle="bars" if bars else "line", stacking={"mode": "normal"} if stacked else {},
        thresholds=_threshold_steps(steps), thresholdsStyleMode="line" if thresholds else "off",
        legendDisplayMode="table", legendPlacement="right", legendCalcs=["max", "lastNotNull"],
        tooltipMode="multi", extraJson=_data_links(links))


def stat(title: str, targets: Sequence, unit: str, description: str, size: Size = Size(4, 4),
         thresholds: Sequence[tuple[float | None, str]] = (), links: Sequence[tuple[str, str]] = (),
         mappings: Sequence[dict] = (), datasource: dict = PROMETHEUS, fields: str = "") -> g.Stat:
    return g.Stat(
        title=title, description=description, dataSource=datasource, fields=fields, targets=_with_refs(targets),
        format=unit, gridPos=size, reduceCalc="lastNotNull", graphMode="area", colorMode="background",
        thresholds=_threshold_steps(list(thresholds) or DEFAULT_STEPS), mappings=list(mappings),
        extraJson=_data_links(links))


def table(title: str, targets: Sequence, unit: str, description: str, size: Size = Size(),
          links: Sequence[tuple[str, str]] = (), hidden: Sequence[str] = ("Time",),
          renames: dict[str, str] | None = None, datasource: dict = PROMETHEUS,
          column_units: dict[str, str] | None = None) -> g.Table:
    """`unit` is the value columns' unit; `column_units` gives a column (by its shown name)
    another one, for tables whose queries measure different things."""
    transformations = [{"id": "merge", "options": {}}] if len(targets) > 1 else []
    transformations.append({"id": "organize", "options": {
        "excludeByName": {name: True for name in hidden}, "renameByName": renames or {}}})
    return g.Table(
        title=title, description=description, dataSource=datasource, targets=_with_refs(targets),
        unit=unit, gridPos=size, transformations=transformations, filterable=True,
        overrides=[{"matcher": {"id": "byName", "options": column},
                    "properties": [{"id": "unit", "value": column_unit}]}
                   for column, column_unit in (column_units or {}).items()],
        extraJson=_data_links(links))


def heatmap(title: str, target: g.Target, unit: str, description: str, size: Size = Size()) -> g.Heatmap:
    # Buckets come from the histogram (`le`), not computed by Grafana.
    return g.Heatmap(
        title=title, description=description, dataSource=PROMETHEUS, targets=_with_refs([target]),
        dataFormat="tsbuckets", gridPos=size, hideZeroBuckets=True, yBucketBound="upper",
        extraJson={"fieldConfig": {"defaults": {"unit": unit}},
                   "options": {"calculate": False, "yAxis": {"unit": unit},
                               "color": {"mode": "scheme", "scheme": "Oranges"}}})


def timeline(title: str, targets: Sequence, description: str, mappings: Sequence[tuple[int, str, str]],
             size: Size = Size(24, 8), unit: str = "none",
             links: Sequence[tuple[str, str]] = ()) -> g.StateTimeline:
    """A state timeline whose numeric states map to names and colours (value, text, colour)."""
    value_mappings = [{"type": "value", "options": {
        str(value): {"text": text, "color": color, "index": index}
        for index, (value, text, color) in enumerate(mappings)}}]
    return g.StateTimeline(
        title=title, description=description, dataSource=PROMETHEUS, targets=_with_refs(targets),
        gridPos=size, mappings=value_mappings, colorMode="fixed", showValue="never",
        extraJson=_merge({"fieldConfig": {"defaults": {"unit": unit, "color": {"mode": "thresholds"}}}},
                         _data_links(links)))


def bargauge(title: str, targets: Sequence, unit: str, description: str, size: Size = Size(8, 8),
             links: Sequence[tuple[str, str]] = ()) -> g.BarGauge:
    return g.BarGauge(
        title=title, description=description, dataSource=PROMETHEUS, targets=_with_refs(targets),
        format=unit, gridPos=size, calc="lastNotNull", orientation=g.ORIENTATION_HORIZONTAL,
        displayMode=g.GAUGE_DISPLAY_MODE_GRADIENT, min=0, max=None, allValues=False,
        extraJson=_merge({"fieldConfig": {"defaults": {"unit": unit, "min": 0}}}, _data_links(links)))


@attr.s
class NodeGraph(g.Panel):
    """Grafana's node graph: one frame of nodes (field `id`, `title`, `mainstat`) and one
    of edges (`id`, `source`, `target`, `mainstat`)."""
    unit = attr.ib(default="none")

    def to_json_data(self) -> dict:
        return self.panel_json({"type": "nodeGraph", "fieldConfig": {"defaults": {"unit": self.unit}},
                                "options": {"nodes": {}, "edges": {}}})


def node_graph(title: str, nodes: g.Target, edges: g.Target, description: str, unit: str,
               size: Size = Size(12, 12)) -> NodeGraph:
    return NodeGraph(title=title, description=description, dataSource=PROMETHEUS,
                     targets=[nodes, edges], gridPos=size, unit=unit)


def text(title: str, content: str, size: Size = Size(24, 3)) -> g.Text:
    return g.Text(title=title, content=content, mode="markdown", gridPos=size,
                  extraJson={"fieldConfig": {"defaults": {"unit": "none"}}})


def row(title: str) -> g.RowPanel:
    return g.RowPanel(title=title, gridPos=Size(GRID_WIDTH, 1))


# ---------------------------------------------------------------------------- layout

def layout(panels: Sequence[g.Panel]) -> list[g.Panel]:
    """Place panels left to right, wrapping at 24 columns, a row header on its own line;
    give every panel a unique id. Panels carry a Size in gridPos until placed here."""
    x = y = row_height = 0
    placed = []
    for panel_id, panel in enumerate(panels, start=1):
        size: Size = panel.gridPos
        if isinstance(panel, g.RowPanel) or x + size.w > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        panel.gridPos = g.GridPos(h=size.h, w=size.w, x=x, y=y)
        panel.id = panel_id
        x += size.w
        row_height = max(row_height, size.h)
        if isinstance(panel, g.RowPanel):
            x, y, row_height = 0, y + size.h, 0
        placed.append(panel)
    return placed


# ---------------------------------------------------------------------------- dashboard

def alert_annotations(scope: Sequence[str]) -> g.Annotations:
    """Firing alerts of the selected scope (dashboard variables), critical in red and
    warning in orange."""
    return g.Annotations(list=[{
        "datasource": PROMETHEUS, "enable": True, "hide": False, "iconColor": color,
        "name": f"{severity.capitalize()} alerts",
        "expr": "ALERTS{" + ", ".join(['alertstate="firing"', f'severity="{severity}"', *(
            [alert_matchers(*scope)] if scope else [])]) + "}",
        "step": "30s", "titleFormat": "{{alertname}}", "textFormat": "{{node}} {{device}} {{gpu}} {{comm}} {{rank}}",
        "tagKeys": "severity,node", "useValueForTime": False,
    } for severity, color in (("critical", "red"), ("warning", "orange"))])


def dashboard_link(uid: str, title: str, **variables: str) -> tuple[str, str]:
    """A data link to another fabricscope dashboard, keeping time range and datasource."""
    query = "&".join(["${__url_time_range}", "var-datasource=${datasource}",
                      *(f"var-{name}={value}" for name, value in variables.items())])
    return title, f"/d/{uid}?{query}"


def dashboard(module_file: str, title: str, description: str, variables: Sequence[g.Template],
              panels: Sequence[g.Panel], annotation_scope: Sequence[str] = ("cluster",)) -> g.Dashboard:
    return g.Dashboard(
        title=title, uid=uid_for(module_file), description=description, tags=[TAG],
        timezone="utc", refresh="30s", time=g.Time("now-1h", "now"), editable=True,
        templating=g.Templating(list=list(variables)), annotations=alert_annotations(annotation_scope),
        links=[g.DashboardLink(title="fabricscope", type="dashboards", tags=[TAG], asDropdown=True,
                               includeVars=True, keepTime=True)],
        panels=layout(panels))
