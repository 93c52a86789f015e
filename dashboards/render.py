"""Drawing one dashboard panel to a PNG with matplotlib (Agg: no display needed).

Each function takes the panel's JSON and the query results already fetched (Prometheus
`matrix` series: {"metric": labels, "values": [[t, "v"], ...]} per target) and writes the
image. The look follows Grafana's panel types closely enough to read a post-mortem from:
time series, heatmap, stat, table, state timeline, bar gauge and node graph.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # before pyplot: headless, whatever $DISPLAY says

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .units import format_value  # noqa: E402

DPI = 100
PIXELS_PER_GRID_COLUMN = 50
PIXELS_PER_GRID_ROW = 36
MAX_SERIES = 12
MAX_TABLE_ROWS = 14
COLOURS = {"green": "#3d9a4a", "orange": "#e88b1d", "red": "#d63b3b", "yellow": "#e3c21b",
           "blue": "#3c7fd1", "purple": "#8e58c7"}
LEGEND_TEMPLATE = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")

Series = dict[str, Any]


def unit_of(panel: dict) -> str:
    return panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "none"


def legend(target: dict, labels: dict[str, str]) -> str:
    template = target.get("legendFormat") or ""
    if template:
        return LEGEND_TEMPLATE.sub(lambda m: labels.get(m[1], ""), template).strip()
    shown = {k: v for k, v in labels.items() if k not in ("__name__", "job", "instance", "cluster")}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or target.get("refId", "")


def points(series: Series) -> tuple[list[datetime], list[float]]:
    times = [datetime.fromtimestamp(float(t), tz=timezone.utc) for t, _ in series["values"]]
    values = [float(v) for _, v in series["values"]]
    return times, values


def last_value(series: Series) -> float:
    return float(series["values"][-1][1]) if series["values"] else math.nan


def colour(name: str | None) -> str:
    return COLOURS.get(name or "", name or "#888888")


def threshold_steps(panel: dict) -> list[tuple[float | None, str]]:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [(step.get("value"), colour(step.get("color"))) for step in steps]


def colour_for(panel: dict, value: float) -> str:
    chosen = COLOURS["green"]
    for limit, step_colour in threshold_steps(panel):
        if limit is None or (not math.isnan(value) and value >= limit):
            chosen = step_colour
    return chosen


def figure(panel: dict):
    pos = panel.get("gridPos", {})
    width = max(2.0, pos.get("w", 12) * PIXELS_PER_GRID_COLUMN / DPI)
    height = max(1.4, pos.get("h", 8) * PIXELS_PER_GRID_ROW / DPI)
    fig = plt.figure(figsize=(width, height), dpi=DPI)
    fig.suptitle(panel.get("title", ""), x=0.01, ha="left", fontsize=10, fontweight="bold")
    return fig


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, facecolor="white")
    plt.close(fig)
    return path


def message(panel: dict, text: str, path: Path) -> Path:
    fig = figure(panel)
    fig.text(0.5, 0.45, text, ha="center", va="center", fontsize=10, color="#666666", wrap=True)
    return save(fig, path)


def _time_axis(ax, start: float, end: float) -> None:
    ax.set_xlim(datetime.fromtimestamp(start, tz=timezone.utc), datetime.fromtimestamp(end, tz=timezone.utc))
    locator = mdates.AutoDateLocator(tz=timezone.utc)
    ax.xaxis.set_major_locator(locator)
    # The page header gives the date and range; the axis only needs times.
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc, show_offset=False))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _strongest(pairs: list[tuple[dict, Series]]) -> list[tuple[dict, Series]]:
    """The MAX_SERIES series with the largest peaks: a post-mortem wants the outliers."""
    def peak(pair):
        values = [abs(float(v)) for _, v in pair[1]["values"] if not math.isnan(float(v))]
        return max(values, default=0.0)
    return sorted(pairs, key=peak, reverse=True)[:MAX_SERIES]


def timeseries(panel: dict, results: list[tuple[dict, list[Series]]], start: float, end: float, path: Path) -> Path:
    unit = unit_of(panel)
    pairs = [(target, series) for target, found in results for series in found]
    fig = figure(panel)
    ax = fig.add_axes([0.12, 0.14, 0.57, 0.74])
    bars = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("drawStyle") == "bars"
    for target, series in _strongest(pairs):
        times, values = points(series)
        if bars:
            ax.bar(times, values, width=(end - start) / 86400 / 200, label=legend(target, series["metric"]))
        else:
            ax.plot(times, values, linewidth=1.2, label=legend(target, series["metric"]))
    for limit, step_colour in threshold_steps(panel)[1:]:
        if panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get(
                "thresholdsStyle", {}).get("mode") == "line" and limit is not None:
            ax.axhline(limit, color=step_colour, linestyle="--", linewidth=1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    _time_axis(ax, start, end)
    if pairs and any(legend(t, s["metric"]) for t, s in pairs):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6.5, frameon=False)
    if len(pairs) > MAX_SERIES:
        fig.text(0.7, 0.03, f"{MAX_SERIES} of {len(pairs)} series (largest peaks)", fontsize=7, color="#666666")
    return save(fig, path)


def heatmap(panel: dict, results: list[tuple[dict, list[Series]]], start: float, end: float, path: Path) -> Path:
    import numpy as np

    series = [s for _, found in results for s in found]
    buckets = sorted(series, key=lambda s: float(s["metric"].get("le", "inf")))
    bounds = [float(s["metric"].get("le", "inf")) for s in buckets]
    times = [float(t) for t, _ in buckets[0]["values"]] if buckets else []
    index = {t: i for i, t in enumerate(times)}
    # Cumulative bucket rates -> per-bucket rates (the histogram's `le` buckets nest).
    grid = np.zeros((len(buckets), len(times)))
    for row, bucket in enumerate(buckets):
        for t, v in bucket["values"]:
            if float(t) in index:
                grid[row, index[float(t)]] = float(v)
    grid = np.diff(np.vstack([np.zeros((1, len(times))), grid]), axis=0).clip(min=0)
    keep = grid.sum(axis=1) > 0
    fig = figure(panel)
    ax = fig.add_axes([0.1, 0.14, 0.78, 0.74])
    if keep.any():
        rows = np.where(keep)[0]
        shown = grid[rows[0]:rows[-1] + 1]
        labels = [format_value(b, unit_of(panel)) for b in bounds[rows[0]:rows[-1] + 1]]
        x = [datetime.fromtimestamp(t, tz=timezone.utc) for t in times]
        mesh = ax.pcolormesh(x, range(len(labels)), shown, cmap="Oranges", shading="nearest")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=6)
        fig.colorbar(mesh, ax=ax, pad=0.01).ax.tick_params(labelsize=6)
    _time_axis(ax, start, end)
    return save(fig, path)


def stat(panel: dict, results: list[tuple[dict, list[Series]]], path: Path) -> Path:
    values = [last_value(s) for _, found in results for s in found]
    value = values[0] if values else math.nan
    fig = figure(panel)
    fig.patch.set_facecolor(colour_for(panel, value) if values else "#dddddd")
    fig.text(0.5, 0.42, format_value(value, unit_of(panel)) if values else "no data", ha="center", va="center",
             fontsize=22, color="white", fontweight="bold")
    fig.savefig(path, dpi=DPI, facecolor=fig.get_facecolor())
    plt.close(fig)
    return path


def table(panel: dict, results: list[tuple[dict, list[Series]]], path: Path) -> Path:
    hidden = {name for name, on in (panel.get("transformations", [{}])[-1].get("options", {})
                                    .get("excludeByName", {}).items()) if on}
    renames = panel.get("transformations", [{}])[-1].get("options", {}).get("renameByName", {})
    rows: dict[tuple, dict[str, str]] = {}
    multi = len(results) > 1
    for target, found in results:
        value_column = f"Value #{target['refId']}" if multi else "Value"
        for series in found:
            labels = {k: v for k, v in series["metric"].items() if k not in hidden and k != "__name__"}
            row = rows.setdefault(tuple(sorted(labels.items())), dict(labels))
            if value_column not in hidden:
                row[renames.get(value_column, value_column)] = format_value(last_value(series), unit_of(panel))
    columns = sorted({k for row in rows.values() for k in row}, key=lambda k: (k[0].isupper() or " " in k, k))
    columns = [renames.get(col, col) for col in columns]
    if not rows:
        return message(panel, "no rows at the end of the range", path)
    ordered = list(rows.values())[:MAX_TABLE_ROWS]
    cells = [[row.get(col, "") for col in columns] for row in ordered]
    return draw_table(panel, cells, columns, len(rows), path, fontsize=7)


def draw_table(panel: dict, cells: list[list], labels: list[str], total: int, path, fontsize: float):
    """A table panel: the first MAX_TABLE_ROWS rows, saying how many there were in all."""
    fig = figure(panel)
    ax = fig.add_axes([0.01, 0.02, 0.98, 0.86])
    ax.axis("off")
    drawn = ax.table(cellText=cells, colLabels=labels, loc="upper center", cellLoc="left")
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(fontsize)
    drawn.scale(1, 1.15)
    if total > MAX_TABLE_ROWS:
        fig.text(0.01, 0.01, f"{MAX_TABLE_ROWS} of {total} rows", fontsize=7, color="#666666")
    return save(fig, path)


def state_timeline(panel: dict, results: list[tuple[dict, list[Series]]], start: float, end: float,
                   path: Path) -> Path:
    mapping = {}
    for entry in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []) or panel.get("mappings", []):
        for value, option in entry.get("options", {}).items():
            mapping[float(value)] = (option.get("text", value), colour(option.get("color")))
    pairs = sorted(((legend(t, s["metric"]), s) for t, found in results for s in found), key=lambda p: p[0])
    pairs = pairs[:24]
    fig = figure(panel)
    ax = fig.add_axes([0.2, 0.12, 0.78, 0.76])
    seen = {}
    for row, (name, series) in enumerate(pairs):
        times = [float(t) for t, _ in series["values"]]
        values = [float(v) for _, v in series["values"]]
        for i, (t, v) in enumerate(zip(times, values)):
            width = (times[i + 1] - t) if i + 1 < len(times) else (end - start) / max(1, len(times))
            text, fill = mapping.get(v, (format_value(v, unit_of(panel)), "#999999"))
            seen[text] = fill
            ax.barh(row, width / 86400, left=mdates.date2num(datetime.fromtimestamp(t, tz=timezone.utc)),
                    color=fill, height=0.85, linewidth=0)
    ax.set_yticks(range(len(pairs)))
    ax.set_yticklabels([name for name, _ in pairs], fontsize=6.5)
    ax.invert_yaxis()
    _time_axis(ax, start, end)
    handles = [plt.Rectangle((0, 0), 1, 1, color=fill) for fill in seen.values()]
    if handles:
        ax.legend(handles, list(seen), loc="lower right", fontsize=6.5, ncol=len(handles), frameon=False,
                  bbox_to_anchor=(1.0, 1.0))
    return save(fig, path)


def bargauge(panel: dict, results: list[tuple[dict, list[Series]]], path: Path) -> Path:
    pairs = [(legend(t, s["metric"]), last_value(s)) for t, found in results for s in found][:MAX_TABLE_ROWS]
    fig = figure(panel)
    ax = fig.add_axes([0.3, 0.1, 0.65, 0.78])
    ax.barh([name for name, _ in pairs], [value for _, value in pairs],
            color=[colour_for(panel, value) for _, value in pairs])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit_of(panel))))
    ax.tick_params(labelsize=7)
    return save(fig, path)


def node_graph(panel: dict, results: list[tuple[dict, list[Series]]], path: Path) -> Path:
    """Nodes in two columns (GPUs left, what their links reach right), edges between."""
    frames = {target["refId"]: found for target, found in results}
    nodes = {s["metric"].get("id"): s["metric"].get("title", s["metric"].get("id")) for s in frames.get("nodes", [])}
    edges = [(s["metric"].get("source"), s["metric"].get("target"), last_value(s)) for s in frames.get("edges", [])]
    if not nodes:
        return message(panel, "no topology at the end of the range", path)
    sources = sorted({a for a, _, _ in edges} | {n for n, t in nodes.items() if "GPU" in t.split()})
    targets = sorted(set(nodes) - set(sources))
    fig = figure(panel)
    ax = fig.add_axes([0.02, 0.02, 0.96, 0.86])
    ax.axis("off")
    place = {n: (0.2, 1 - (i + 0.5) / max(1, len(sources))) for i, n in enumerate(sources)}
    place.update({n: (0.8, 1 - (i + 0.5) / max(1, len(targets))) for i, n in enumerate(targets)})
    for source, target, value in edges:
        if source in place and target in place:
            (x1, y1), (x2, y2) = place[source], place[target]
            ax.plot([x1, x2], [y1, y2], color=COLOURS["red"] if value == 0 else "#7a9cc6",
                    linewidth=0.4 + 0.3 * max(0.0, value))
    for name, (x, y) in place.items():
        ax.scatter([x], [y], s=60, color="#3c7fd1" if name in sources else "#8e58c7", zorder=3)
        ax.text(x + (-0.02 if name in sources else 0.02), y, nodes.get(name, name), fontsize=6,
                ha="right" if name in sources else "left", va="center")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return save(fig, path)


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "timestamp_epoch" and isinstance(value, (int, float)):
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).strftime("%H:%M:%S")
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        import json

        text = json.dumps(value, separators=(",", ":"))
        return text if len(text) <= 40 else text[:39] + "…"
    return str(value)


def sidecar_table(panel: dict, columns: list[dict], rows: list[dict], path: Path) -> Path:
    """Rows of a sidecar response with the columns the panel maps (Infinity's table)."""
    if not rows:
        return message(panel, "no rows in the time range", path)
    cells = [[_cell(row.get(c["selector"]), c["type"]) for c in columns] for row in rows[:MAX_TABLE_ROWS]]
    return draw_table(panel, cells, [c["text"] for c in columns], len(rows), path, fontsize=6.5)
