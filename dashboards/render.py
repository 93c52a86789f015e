"""Drawing one dashboard panel to a PNG with matplotlib (Agg: no display needed).

Each function takes the panel's JSON and the query results already fetched (Prometheus
`matrix` series: {"metric": labels, "values": [[t, "v"], ...]} per target) and writes the
image. The look follows Grafana's panel types closely enough to read a post-mortem from:
time series, heatmap, stat, table, state timeline, bar gauge and node graph.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # before pyplot: headless, whatever $DISPLAY says

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from .units import format_value

DPI = 100
PIXELS_PER_GRID_COLUMN = 50
PIXELS_PER_GRID_ROW = 36
MAX_SERIES = 12
MAX_TABLE_ROWS = 14
MAX_TIMELINE_ROWS = 24
MAX_HEATMAP_LABELS = 10
MAX_LEGEND_CHARS = 40
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
COLOURS = {"green": "#3d9a4a", "orange": "#e88b1d", "red": "#d63b3b", "yellow": "#e3c21b",
           "blue": "#3c7fd1", "purple": "#8e58c7"}
LEGEND_TEMPLATE = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")

Series = dict[str, Any]
Pair = tuple[dict, Series]                 # (the panel's target, one series it returned)
Results = list[tuple[dict, list[Series]]]  # per target, the series it returned
PLUMBING_LABELS = ("__name__", "job", "instance")


@dataclass
class Annotation:
    """A firing alert over part of the range (from the dashboard's annotation queries)."""
    start: float
    end: float
    text: str
    colour: str


@dataclass
class Drawn:
    """What a panel's image shows, for report.json and the HTML: the series' legends or
    the table's rows, out of how many, and the sentence announcing a cut."""
    shown: list = field(default_factory=list)
    total: int = 0
    note: str | None = None


def unit_of(panel: dict) -> str:
    return panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "none"


def column_units(panel: dict) -> dict[str, str]:
    """Per-column units from the panel's byName overrides (what Grafana applies)."""
    units = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        matcher = override.get("matcher", {})
        for prop in override.get("properties", []):
            if matcher.get("id") == "byName" and prop.get("id") == "unit":
                units[matcher.get("options")] = prop.get("value")
    return units


def legend(target: dict, labels: dict[str, str]) -> str:
    template = target.get("legendFormat") or ""
    if template:
        return LEGEND_TEMPLATE.sub(lambda m: labels.get(m[1], ""), template).strip()
    shown = {k: v for k, v in labels.items() if k not in (*PLUMBING_LABELS, "cluster")}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or target.get("refId", "")


def _static_words(target: dict) -> list[str]:
    return LEGEND_TEMPLATE.sub(" ", target.get("legendFormat") or "").split()


def legends(pairs: list[Pair]) -> list[str]:
    """One legend per series that tells it apart from the others. The panel's legendFormat
    when its texts are distinct and short; otherwise the labels whose values differ
    between the series (a comm id shared by every rank says nothing), plus the words of
    the target's format that other targets lack ("hang line")."""
    rendered = [legend(target, series["metric"]) for target, series in pairs]
    if len(set(rendered)) == len(rendered) and all(len(text) <= MAX_LEGEND_CHARS for text in rendered):
        return rendered
    keys = sorted({k for _, s in pairs for k in s["metric"] if k not in PLUMBING_LABELS})
    varying = [k for k in keys if len({s["metric"].get(k) for _, s in pairs}) > 1]
    targets = {id(t): t for t, _ in pairs}
    common = set.intersection(*(set(_static_words(t)) for t in targets.values())) if len(targets) > 1 else set()
    out = []
    for target, series in pairs:
        parts = [f"{k}={series['metric'][k]}" for k in varying if k in series["metric"]]
        if len(targets) > 1:
            parts += [word for word in _static_words(target) if word not in common]
        out.append(" ".join(parts) or legend(target, series["metric"]))
    return out


def _values(series: Series) -> list[float]:
    return [float(v) for _, v in series["values"]]


def points(series: Series, step: float | None = None) -> tuple[list[datetime], list[float]]:
    """The series' samples; where Prometheus returned none for more than one step (the
    series was absent), a NaN breaks the line: a gap stays a gap."""
    times, values = [], []
    previous = None
    for t, v in series["values"]:
        t = float(t)
        if step and previous is not None and t - previous > 1.5 * step:
            times.append(datetime.fromtimestamp(previous + step, tz=timezone.utc))
            values.append(math.nan)
        times.append(datetime.fromtimestamp(t, tz=timezone.utc))
        values.append(float(v))
        previous = t
    return times, values


def _severity(series: Series) -> int:
    return SEVERITY_ORDER.get(series["metric"].get("severity", ""), len(SEVERITY_ORDER))


def _deviations(pairs: list[Pair]) -> list[float]:
    """Each series' largest distance from the median of all series at the same instant:
    the failed link among healthy ones, the late rank among punctual ones."""
    at: dict[float, list[float]] = {}
    for _, series in pairs:
        for t, v in series["values"]:
            if not math.isnan(float(v)):
                at.setdefault(float(t), []).append(float(v))
    medians = {t: statistics.median(vs) for t, vs in at.items()}
    return [max((abs(float(v) - medians[float(t)]) for t, v in series["values"] if not math.isnan(float(v))),
                default=0.0) for _, series in pairs]


def select_series(pairs: list[Pair], limit: int = MAX_SERIES) -> list[Pair]:
    """At most `limit` series, the most anomalous first: by severity (critical alerts
    before warnings), then by deviation from the cross-series median, then by peak. Each
    target keeps a share, so a second query (the hang line, a reference) is never crowded
    out by the first one's many series. The result keeps the panel's order."""
    if len(pairs) <= limit:
        return pairs
    deviation = dict(zip(map(id, (s for _, s in pairs)), _deviations(pairs)))

    def rank(pair: Pair):
        peak = max((abs(v) for v in _values(pair[1]) if not math.isnan(v)), default=0.0)
        return (_severity(pair[1]), -deviation[id(pair[1])], -peak)

    by_target: dict[int, list[Pair]] = {}
    for pair in pairs:
        by_target.setdefault(id(pair[0]), []).append(pair)
    share = max(1, limit // len(by_target))
    chosen = [pair for group in by_target.values() for pair in sorted(group, key=rank)[:share]]
    rest = sorted((p for p in pairs if not any(p is c for c in chosen)), key=rank)
    chosen += rest[:max(0, limit - len(chosen))]
    keep = {id(s) for _, s in chosen[:limit]}
    return [pair for pair in pairs if id(pair[1]) in keep]


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
    # tight: a legend right of the axes is part of the image, never clipped at the edge.
    fig.savefig(path, dpi=DPI, facecolor="white", bbox_inches="tight")
    plt.close(fig)
    return path


def message(panel: dict, text: str, path: Path) -> Path:
    fig = figure(panel)
    fig.text(0.5, 0.45, text, ha="center", va="center", fontsize=10, color="#666666", wrap=True)
    return save(fig, path)


TICK_STEPS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _time_locator(span: float, most: int):
    """Round time ticks (10 s ... 1 day apart), the closest that give at most `most` labels."""
    step = next((t for t in TICK_STEPS if span / t <= most), None)
    if step is None:
        return mdates.AutoDateLocator(tz=timezone.utc)
    if step < 60:
        return mdates.SecondLocator(bysecond=range(0, 60, step), tz=timezone.utc)
    if step < 3600:
        return mdates.MinuteLocator(byminute=range(0, 60, step // 60), tz=timezone.utc)
    if step < 86400:
        return mdates.HourLocator(byhour=range(0, 24, step // 3600), tz=timezone.utc)
    return mdates.DayLocator(tz=timezone.utc)


def _time_axis(ax, start: float, end: float) -> None:
    ax.set_xlim(datetime.fromtimestamp(start, tz=timezone.utc), datetime.fromtimestamp(end, tz=timezone.utc))
    # About one time label per 0.7 inch of axis: a narrow panel's labels never run together.
    width = ax.get_position().width * ax.figure.get_figwidth()
    locator = _time_locator(end - start, max(3, int(width / 0.7)))
    ax.xaxis.set_major_locator(locator)
    # The page header gives the date and range; the axis only needs times.
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc, show_offset=False))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


MAX_ANNOTATION_LINES = 8


def _annotate(ax, annotations: list[Annotation]) -> None:
    """Alert bands behind the lines. Their names are not written on the plot (alerts
    that fire together would print over one another); `annotation_table` lists them
    below it, as Grafana shows them on hover."""
    for note in annotations:
        left = datetime.fromtimestamp(note.start, tz=timezone.utc)
        right = datetime.fromtimestamp(max(note.end, note.start + 1), tz=timezone.utc)
        ax.axvspan(left, right, color=note.colour, alpha=0.12, linewidth=0, zorder=0)
        ax.axvline(left, color=note.colour, linewidth=0.8, alpha=0.7, zorder=0)


def annotation_lines(annotations: list[Annotation]) -> list[tuple[str, str]]:
    """One line per alert (its bands merged): "HH:MM:SS–HH:MM:SS name", earliest first,
    with its colour; past MAX_ANNOTATION_LINES, a last line counts the rest."""
    spans: dict[tuple[str, str], list[float]] = {}
    for note in annotations:
        span = spans.setdefault((note.text, note.colour), [note.start, note.end])
        span[0], span[1] = min(span[0], note.start), max(span[1], note.end)

    def clock(t: float) -> str:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M:%S")

    ordered = sorted(spans.items(), key=lambda item: (item[1][0], item[0][0]))
    lines = [(f"{clock(a)}–{clock(b)}  {text}", colour) for (text, colour), (a, b) in ordered]
    if len(lines) > MAX_ANNOTATION_LINES:
        rest = len(lines) - (MAX_ANNOTATION_LINES - 1)
        lines = lines[:MAX_ANNOTATION_LINES - 1] + [(f"… and {rest} more alerts", "#666666")]
    return lines


def annotation_table(fig, ax, annotations: list[Annotation]) -> None:
    """The alerts of the range as a list under the plot, each in its band's colour, in
    two columns (the saved image grows to hold it: bbox_inches="tight")."""
    lines = annotation_lines(annotations)
    if not lines:
        return
    fig.canvas.draw()
    bottom = min(ax.get_tightbbox(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted()).y0, 0.0)
    columns = 2 if fig.get_figwidth() >= 5.5 else 1      # a narrow panel lists them in one column
    per_column = math.ceil(len(lines) / columns)
    height = 6.5 * 1.5 / (fig.get_figheight() * 72)     # one line of 6.5 pt text, in figure units
    fig.text(0.01, bottom - 0.02, "Alerts (bands on the plot):", fontsize=6.5, color="#444444", va="top")
    for index, (text, colour_) in enumerate(lines):
        column, row = divmod(index, per_column)
        fig.text(0.01 + 0.5 * column, bottom - 0.02 - height * (row + 1), "■ " + text, fontsize=6.5,
                 color=colour_, va="top")


def _cut_note(shown: int, total: int, what: str, how: str) -> str | None:
    return f"{shown} of {total} {what} ({how})" if total > shown else None


def timeseries(panel: dict, results: Results, start: float, end: float, path: Path,
               step: float | None = None, annotations: list[Annotation] = ()) -> Drawn:
    unit = unit_of(panel)
    pairs = [(target, series) for target, found in results for series in found]
    chosen = select_series(pairs)
    names = legends(chosen)
    fig = figure(panel)
    ax = fig.add_axes([0.12, 0.14, 0.57, 0.74])
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    bars = custom.get("drawStyle") == "bars"
    _annotate(ax, list(annotations))
    for (target, series), name in zip(chosen, names):
        times, values = points(series, step)
        if bars:
            ax.bar(times, values, width=(end - start) / 86400 / 200, label=name)
        else:
            ax.plot(times, values, linewidth=1.2, label=name)
    log = custom.get("scaleDistribution", {}).get("type") == "log"
    if log and any(v > 0 for _, series in chosen for v in _values(series)):
        ax.set_yscale("log", base=custom["scaleDistribution"].get("log", 10))
    if custom.get("thresholdsStyle", {}).get("mode") == "line":
        for limit, step_colour in threshold_steps(panel)[1:]:
            if limit is not None:
                ax.axhline(limit, color=step_colour, linestyle="--", linewidth=1)
                _keep_in_view(ax, limit)
    if ax.get_yscale() != "log":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit) if v > 0 else ""))
    _time_axis(ax, start, end)
    if any(names):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6.5, frameon=False)
    drawn = Drawn(names, len(pairs), _cut_note(len(chosen), len(pairs), "series",
                                                "the most anomalous: severity, then distance from the median"))
    if drawn.note:
        fig.text(0.01, 0.0, drawn.note, fontsize=7, color="#666666")
    annotation_table(fig, ax, [a for a in annotations if a.end >= start and a.start <= end])
    save(fig, path)
    return drawn


def _keep_in_view(ax, value: float) -> None:
    """A threshold line outside the data's range still shows: the axis grows to hold it
    (with a margin), as Grafana keeps a threshold line on the panel."""
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        if value > 0 and not low <= value <= high:
            ax.set_ylim(min(low, value / 2), max(high, value * 2))
    elif not low <= value <= high:
        margin = 0.05 * (max(high, value) - min(low, value) or 1)
        ax.set_ylim(min(low, value - margin), max(high, value + margin))


def heatmap(panel: dict, results: Results, start: float, end: float, path: Path) -> Drawn:
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
        # Every bucket is drawn; every k-th is named, so the labels stay readable.
        every = max(1, math.ceil(len(labels) / MAX_HEATMAP_LABELS))
        ax.set_yticks(range(0, len(labels), every))
        ax.set_yticklabels(labels[::every], fontsize=6)
        fig.colorbar(mesh, ax=ax, pad=0.01).ax.tick_params(labelsize=6)
    _time_axis(ax, start, end)
    save(fig, path)
    return Drawn([f"le={b:g}" for b in bounds], len(bounds))


def stat(panel: dict, results: Results, path: Path) -> Drawn:
    values = [last_value(s) for _, found in results for s in found]
    value = values[0] if values else math.nan
    fig = figure(panel)
    fig.patch.set_facecolor(colour_for(panel, value) if values else "#dddddd")
    fig.text(0.5, 0.42, format_value(value, unit_of(panel)) if values else "no data", ha="center", va="center",
             fontsize=22, color="white", fontweight="bold")
    fig.savefig(path, dpi=DPI, facecolor=fig.get_facecolor())
    plt.close(fig)
    return Drawn([value] if values else [], len(values))


def table(panel: dict, results: Results, path: Path) -> Drawn:
    """Rows as Grafana's merge + organize transformations make them (one row per label
    set, a value column per query), worst first: sorted by the first value column,
    largest on top. Each value column in its own unit (panel overrides)."""
    options = panel.get("transformations", [{}])[-1].get("options", {})
    hidden = {name for name, on in options.get("excludeByName", {}).items() if on}
    renames = options.get("renameByName", {})
    rows: dict[tuple, dict[str, Any]] = {}
    value_columns: list[str] = []
    multi = len(results) > 1
    for target, found in results:
        value_column = f"Value #{target['refId']}" if multi else "Value"
        if value_column not in hidden:
            value_columns.append(renames.get(value_column, value_column))
        for series in found:
            labels = {renames.get(k, k): v for k, v in series["metric"].items() if k not in hidden and k != "__name__"}
            row = rows.setdefault(tuple(sorted(labels.items())), dict(labels))
            if value_column not in hidden:
                row[renames.get(value_column, value_column)] = last_value(series)
    if not rows:
        message(panel, "no rows at the end of the range", path)
        return Drawn([], 0)
    label_columns = sorted({k for row in rows.values() for k in row} - set(value_columns))
    columns = label_columns + value_columns
    ordered = sorted(rows.values(), key=lambda row: -_sortable(row.get(value_columns[0]))) if value_columns \
        else list(rows.values())
    shown = ordered[:MAX_TABLE_ROWS]
    units = {column: unit_of(panel) for column in value_columns} | column_units(panel)
    cells = [[format_value(row[c], units[c]) if c in units and c in row else row.get(c, "") for c in columns]
             for row in shown]
    drawn = Drawn(shown, len(rows), _cut_note(len(shown), len(rows), "rows", "the largest first"))
    draw_table(panel, cells, columns, drawn.note, path, fontsize=7)
    return drawn


def _sortable(value: Any) -> float:
    return value if isinstance(value, float) and not math.isnan(value) else -math.inf


MAX_CELL_CHARS = 28


def _wrap(text: Any, width: int = MAX_CELL_CHARS) -> str:
    """A long cell over several lines (at separators where it has them) instead of a
    column cut off at the image's edge."""
    import textwrap

    text = str(text)
    if len(text) <= width:
        return text
    return "\n".join(textwrap.wrap(re.sub(r"([,;:/|])(?=\S)", r"\1 ", text), width, break_long_words=True,
                                    break_on_hyphens=False)[:6])


def draw_table(panel: dict, cells: list[list], labels: list[str], note: str | None, path, fontsize: float) -> Path:
    """Cells wrap (each row as tall as its tallest cell), columns are as wide as their
    text, and the footer note goes below the last row: never over it."""
    fig = figure(panel)
    ax = fig.add_axes([0.01, 0.02, 0.98, 0.86])
    ax.axis("off")
    wrapped = [[_wrap(cell) for cell in row] for row in cells]
    drawn = ax.table(cellText=wrapped, colLabels=[_wrap(label, 18) for label in labels], loc="upper center",
                     cellLoc="left")
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(fontsize)
    drawn.auto_set_column_width(list(range(len(labels))))
    line_height = fontsize * 1.3 / 72 / fig.get_figheight() / ax.get_position().height
    grid = drawn.get_celld()
    for row in range(len(wrapped) + 1):
        texts = [grid[row, col].get_text().get_text() for col in range(len(labels)) if (row, col) in grid]
        lines = max((text.count("\n") + 1 for text in texts), default=1)
        for col in range(len(labels)):
            if (row, col) in grid:
                grid[row, col].set_height(line_height * lines + line_height * 0.4)
    if note:
        fig.canvas.draw()
        box = drawn.get_window_extent(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted())
        fig.text(0.01, box.y0 - 0.02, note, fontsize=7, color="#666666", va="top")
    return save(fig, path)


def state_timeline(panel: dict, results: Results, start: float, end: float, path: Path) -> Drawn:
    """One row per series. Past MAX_TIMELINE_ROWS, the rows kept are those most often away
    from the panel's usual state (the flapping port, not the 30 that stayed up), and the
    image says so."""
    mapping = {}
    for entry in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []) or panel.get("mappings", []):
        for value, option in entry.get("options", {}).items():
            mapping[float(value)] = (option.get("text", value), colour(option.get("color")))
    pairs = [(t, s) for t, found in results for s in found]
    names = legends(pairs) if pairs else []
    rows = list(zip(names, (s for _, s in pairs)))
    counts: dict[float, int] = {}
    for _, series in rows:
        for v in _values(series):
            counts[v] = counts.get(v, 0) + 1
    usual = max(counts, key=counts.get) if counts else None

    def unusual(series: Series) -> float:
        values = _values(series)
        return sum(v != usual for v in values) / max(1, len(values))

    kept = sorted(rows, key=lambda row: (-unusual(row[1]), row[0]))[:MAX_TIMELINE_ROWS]
    kept.sort(key=lambda row: row[0])
    fig = figure(panel)
    ax = fig.add_axes([0.2, 0.12, 0.78, 0.76])
    seen = {}
    for row, (name, series) in enumerate(kept):
        times = [float(t) for t, _ in series["values"]]
        values = _values(series)
        for i, (t, v) in enumerate(zip(times, values)):
            width = (times[i + 1] - t) if i + 1 < len(times) else (end - start) / max(1, len(times))
            text, fill = mapping.get(v, (format_value(v, unit_of(panel)), "#999999"))
            seen[text] = fill
            ax.barh(row, width / 86400, left=mdates.date2num(datetime.fromtimestamp(t, tz=timezone.utc)),
                    color=fill, height=0.85, linewidth=0)
    ax.set_yticks(range(len(kept)))
    ax.set_yticklabels([name for name, _ in kept], fontsize=6.5)
    ax.invert_yaxis()
    _time_axis(ax, start, end)
    handles = [plt.Rectangle((0, 0), 1, 1, color=fill) for fill in seen.values()]
    if handles:
        ax.legend(handles, list(seen), loc="lower right", fontsize=6.5, ncol=len(handles), frameon=False,
                  bbox_to_anchor=(1.0, 1.0))
    usual_text = mapping.get(usual, (format_value(usual, unit_of(panel)),))[0] if usual is not None else ""
    drawn = Drawn([name for name, _ in kept], len(rows),
                  _cut_note(len(kept), len(rows), "rows", f"those most often not {usual_text}"))
    if drawn.note:
        fig.text(0.01, 0.0, drawn.note, fontsize=7, color="#666666")
    save(fig, path)
    return drawn


def bargauge(panel: dict, results: Results, path: Path) -> Drawn:
    """Bars largest first; past MAX_TABLE_ROWS the smallest are left out, and said so."""
    pairs = [(t, s) for t, found in results for s in found]
    bars = sorted(zip(legends(pairs) if pairs else [], (last_value(s) for _, s in pairs)),
                  key=lambda bar: -_sortable(bar[1]))
    shown = bars[:MAX_TABLE_ROWS]
    fig = figure(panel)
    ax = fig.add_axes([0.3, 0.1, 0.65, 0.78])
    ax.barh([name for name, _ in shown], [value for _, value in shown],
            color=[colour_for(panel, value) for _, value in shown])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit_of(panel))))
    ax.tick_params(labelsize=7)
    drawn = Drawn([name for name, _ in shown], len(bars), _cut_note(len(shown), len(bars), "bars", "the largest"))
    if drawn.note:
        fig.text(0.01, 0.0, drawn.note, fontsize=7, color="#666666")
    save(fig, path)
    return drawn


def node_graph(panel: dict, results: Results, path: Path) -> Drawn:
    """Nodes in two columns (GPUs left, what their links reach right), edges between."""
    frames = {target["refId"]: found for target, found in results}
    nodes = {s["metric"].get("id"): s["metric"].get("title", s["metric"].get("id")) for s in frames.get("nodes", [])}
    edges = [(s["metric"].get("source"), s["metric"].get("target"), last_value(s)) for s in frames.get("edges", [])]
    if not nodes:
        message(panel, "no topology at the end of the range", path)
        return Drawn([], 0)
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
    save(fig, path)
    return Drawn(sorted(nodes.values()), len(nodes))


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "timestamp_epoch" and isinstance(value, (int, float)):
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).strftime("%H:%M:%S")
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and value and all(isinstance(item, dict) and "device" in item for item in value):
        # Anomalies on a span's path: "device kind" each, what a reader scans for.
        return "; ".join(f"{item['device']} {item.get('kind', '')}".strip() for item in value)
    if isinstance(value, (list, dict)):
        import json

        # Whole where it fits the wrapped cell (draw_table wraps at MAX_CELL_CHARS, 6 lines).
        text = json.dumps(value, separators=(",", ":"))
        limit = MAX_CELL_CHARS * 6
        return text if len(text) <= limit else text[:limit - 1] + "…"
    return str(value)


def sidecar_table(panel: dict, columns: list[dict], rows: list[dict], path: Path) -> Drawn:
    """Rows of a sidecar response with the columns the panel maps (Infinity's table)."""
    if not rows:
        message(panel, "no rows in the time range", path)
        return Drawn([], 0)
    shown = rows[:MAX_TABLE_ROWS]
    cells = [[_cell(row.get(c["selector"]), c["type"]) for c in columns] for row in shown]
    drawn = Drawn(shown, len(rows), _cut_note(len(cells), len(rows), "rows", "as the sidecar ordered them"))
    draw_table(panel, cells, [c["text"] for c in columns], drawn.note, path, fontsize=6.5)
    return drawn
