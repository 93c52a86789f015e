"""`fabricscope report`: the dashboards rendered to PNG images and one HTML page, from a
Prometheus server's data, for post-mortems and for people without Grafana at hand.

    fabricscope report --prometheus-url http://127.0.0.1:19090 --from now-30m --to now --out var/report

It reads the committed dashboard JSON (what Grafana provisions), resolves the template
variables against Prometheus as Grafana does ("All" unless --var pins one), runs every
panel's queries over the range and draws each panel with matplotlib (no display needed).
Tables, stats and other instant targets are instant queries at the end time (what the
panel shows "now" in Grafana, with the panel's own topk), not the last value of a range.
Time series keep their gaps, draw their reference lines and the dashboard's alert
annotations, and keep the most anomalous series when there are too many; every cut is
announced on the image and in the page. `report.json` beside the page holds, per panel,
what was drawn (legends or rows) out of how many, for tests and for tools.
Panels served by the sidecar through the Infinity datasource are drawn as tables when
--sidecar-url is given (GET requests only), and listed with their request otherwise.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import model

MAX_POINTS = 240
RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
DRAWN = ("timeseries", "heatmap", "stat", "table", "state-timeline", "bargauge", "nodeGraph")


class ReportError(Exception):
    """Something the user can fix: a bad time, an unreachable Prometheus, a bad --var."""


def parse_interval(text: str) -> float:
    """A Prometheus-style interval (15s, 1m, 500ms) or plain seconds, as seconds."""
    match = INTERVAL.match(text.strip())
    if not match or float(match[1]) <= 0:
        raise ReportError(f"--scrape-interval {text!r}: expected a positive interval such as 15s, 1m or 5")
    return float(match[1]) * SECONDS[match[2] or "s"]


def parse_time(text: str, now: float | None = None) -> float:
    """now, now-30m, a UNIX timestamp, or an ISO 8601 / RFC 3339 time (UTC unless it says)."""
    now = time.time() if now is None else now
    match = RELATIVE.match(text.strip())
    if match:
        return now - (int(match[1]) * SECONDS[match[2]] if match[1] else 0)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"bad time {text!r}: use now, now-30m, a UNIX timestamp or 2026-11-26T05:00:00Z") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


class Prometheus:
    """The few Prometheus HTTP API calls the report needs, with a timeout each."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict) -> object:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as response:  # noqa: S310 - operator-given http(s) URL
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise ReportError(f"Prometheus at {self.url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ReportError(f"Prometheus at {self.url} is unreachable: {getattr(exc, 'reason', exc)}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise QueryError(body.get("error", "unknown error") if isinstance(body, dict) else "not JSON")
        return body["data"]

    def label_values(self, label: str, selector: str | None, start: float, end: float) -> list[str]:
        params = {"start": start, "end": end}
        if selector:
            params["match[]"] = selector
        return self._get(f"/api/v1/label/{label}/values", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def query(self, expr: str, at: float) -> list[dict]:
        """An instant query, returned in the range form ({"metric", "values": [[t, v]]})
        the drawers take. A scalar result becomes one series without labels."""
        data = self._get("/api/v1/query", {"query": expr, "time": at})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "values": [data["result"]]}]
        return [{"metric": item["metric"], "values": [item["value"]]} for item in data["result"]]

    def run_target(self, target: dict, expr: str, start: float, end: float, step: float) -> list[dict]:
        """As Grafana runs a target: instant at the end of the range, or over the range."""
        if target.get("instant"):
            return self.query(expr, end)
        return self.query_range(expr, start, end, step)


class QueryError(Exception):
    """Prometheus or the sidecar refused one query (the panel shows the message; the
    report goes on)."""


class Sidecar:
    """The sidecar's HTTP API, read as the Infinity datasource reads it (bearer token,
    the sidecar's CA). Only GET requests are sent: the report never submits anything."""

    def __init__(self, url: str, token: str, ca_file: Path | None, timeout: float = 30.0) -> None:
        import ssl

        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    def fetch(self, request: model.InfinityRequest) -> object:
        query = urllib.parse.urlencode(request.params)
        http = urllib.request.Request(f"{request.url}?{query}" if query else request.url,  # noqa: S310 - operator-given http(s) URL
                                      headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(http, timeout=self.timeout, context=self.context) as response:  # noqa: S310 - operator-given http(s) URL
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise QueryError(f"sidecar answered HTTP {exc.code} for {request.url}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise QueryError(f"sidecar at {self.url}: {getattr(exc, 'reason', exc)}") from None


@dataclass
class PanelImage:
    title: str
    description: str
    image: str | None                  # path relative to the report directory
    queries: list[str] = field(default_factory=list)
    problem: str | None = None
    panel_id: int | None = None
    kind: str = ""
    drawn: object = None               # render.Drawn: what the image shows, out of how many


@dataclass
class DashboardSection:
    name: str
    title: str
    variables: dict[str, list[str]]
    panels: list[PanelImage] = field(default_factory=list)
    annotations: list = field(default_factory=list)     # render.Annotation bands drawn on its time series


def step_for(start: float, end: float, scrape_seconds: float) -> float:
    return max(scrape_seconds, (end - start) / MAX_POINTS)


def alert_annotations(board: dict, prometheus: Prometheus, variables: model.Variables, start: float, end: float,
                      step: float) -> list:
    """The dashboard's Prometheus annotation queries (firing alerts), as bands: one per
    contiguous run of samples of each series, named by the annotation's titleFormat."""
    from . import render

    bands = []
    for item in board.get("annotations", {}).get("list", []):
        if not item.get("enable", True) or not item.get("expr"):
            continue
        try:
            found = prometheus.query_range(variables.substitute(item["expr"]), start, end, step)
        except QueryError:
            continue      # an annotation that fails leaves the panels as they are
        for series in found:
            text = render.legend({"legendFormat": item.get("titleFormat", "")}, series["metric"])
            run_start = previous = None
            for t, _ in series["values"]:
                t = float(t)
                if previous is not None and t - previous > 1.5 * step:
                    bands.append(render.Annotation(run_start, previous, text, render.colour(item.get("iconColor"))))
                    run_start = None
                run_start = t if run_start is None else run_start
                previous = t
            if run_start is not None:
                bands.append(render.Annotation(run_start, previous, text, render.colour(item.get("iconColor"))))
    return bands


def render_dashboard(name: str, board: dict, prometheus: Prometheus, start: float, end: float,
                     out_dir: Path, scrape_seconds: float, chosen: dict[str, list[str]],
                     sidecar: Sidecar | None = None) -> DashboardSection:
    from . import render

    step = step_for(start, end, scrape_seconds)
    builtins = model.builtin_variables(start, end, step, scrape_seconds)
    variables = model.resolve_variables(
        board, lambda label, selector: prometheus.label_values(label, selector, start, end), builtins, chosen)
    section = DashboardSection(name, board["title"], {k: v for k, v in variables.values.items() if k != "datasource"})
    (out_dir / name).mkdir(parents=True, exist_ok=True)
    bands = section.annotations = alert_annotations(board, prometheus, variables, start, end, step)
    for panel in model.panels(board):
        kind = panel.get("type")
        entry = PanelImage(panel.get("title", ""), panel.get("description") or "", None,
                           panel_id=panel.get("id"), kind=kind or "")
        section.panels.append(entry)
        targets = [t for t in panel.get("targets", [])
                   if model.datasource_type(board, model.target_datasource(panel, t)) == "prometheus"]
        if not targets:
            render_sidecar_panel(board, panel, entry, variables, sidecar, out_dir / name / f"panel-{panel['id']}.png")
            if entry.image:
                entry.image = f"{name}/panel-{panel['id']}.png"
            continue
        if kind not in DRAWN:
            entry.problem = f"panel type {kind} is not drawn in the report"
            continue
        results, problems = [], []
        for target in targets:
            expr = variables.substitute(target["expr"])
            entry.queries.append(expr)
            try:
                results.append((target, prometheus.run_target(target, expr, start, end, step)))
            except QueryError as exc:
                problems.append(f"{target['refId']}: {exc}")
                results.append((target, []))
        path = out_dir / name / f"panel-{panel['id']}.png"
        if kind == "timeseries":
            entry.drawn = render.timeseries(panel, results, start, end, path, step, bands)
        elif kind == "heatmap":
            entry.drawn = render.heatmap(panel, results, start, end, path)
        elif kind == "state-timeline":
            entry.drawn = render.state_timeline(panel, results, start, end, path)
        elif kind == "stat":
            entry.drawn = render.stat(panel, results, path)
        elif kind == "table":
            entry.drawn = render.table(panel, results, path)
        elif kind == "bargauge":
            entry.drawn = render.bargauge(panel, results, path)
        elif kind == "nodeGraph":
            entry.drawn = render.node_graph(panel, results, path)
        entry.image = f"{name}/{path.name}"
        if problems:
            entry.problem = "; ".join(problems)
    return section


def render_sidecar_panel(board: dict, panel: dict, entry: PanelImage, variables: model.Variables,
                         sidecar: Sidecar | None, path: Path) -> None:
    """A table of what the sidecar answers to the panel's Infinity request, when the
    request is a GET whose variables all have values (the chaos submit panel POSTs a
    simulation and its result panels need a simulation id: listed, not run)."""
    from . import render

    targets = [t for t in panel.get("targets", [])
               if model.datasource_type(board, model.target_datasource(panel, t)) == "yesoreyeram-infinity-datasource"]
    base = sidecar.url if sidecar else ""
    requests = [model.infinity_request(t, variables, base) for t in targets]
    entry.queries = [f"{r.method} {r.url}" + (f"?{urllib.parse.urlencode(r.params)}" if r.params else "")
                     for r in requests]
    if sidecar is None:
        entry.problem = "served by the sidecar (Infinity datasource): give --sidecar-url to draw it"
        return
    if any(r.method != "GET" for r in requests):
        entry.problem = "not run: this request submits a simulation (POST)"
        return
    empty = sorted({name for t in targets for name in model.referenced_variables(t["url"]) if not variables.format(name)})
    if empty:
        entry.problem = f"not run: ${', $'.join(empty)} is empty (chosen in Grafana by a click on a submitted simulation)"
        return
    tables = []
    for request in requests:
        try:
            tables.append((request.columns, model.infinity_rows(sidecar.fetch(request), request.root_selector)))
        except (QueryError, model.DashboardModelError) as exc:
            entry.problem = str(exc)
            entry.image = str(render.message(panel, str(exc), path))
            return
    columns = [column for cols, _ in tables for column in cols]
    rows = [row for _, found in tables for row in found]
    entry.drawn = render.sidecar_table(panel, columns, rows, path)
    entry.image = str(path)


def write_html(sections: list[DashboardSection], out_dir: Path, prometheus_url: str, start: float, end: float) -> Path:
    def stamp(t: float) -> str:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    e = html.escape
    parts = [f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fabricscope report {e(stamp(start))} – {e(stamp(end))}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; color: #222; background: #f6f7f9; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }}
.panels {{ display: flex; flex-wrap: wrap; gap: 12px; }}
figure {{ margin: 0; background: white; padding: 6px; border: 1px solid #ddd; max-width: 100%; }}
figure img {{ display: block; max-width: 100%; }}
figcaption {{ font-size: 0.8em; color: #555; width: 0; min-width: 100%; }}
details {{ font-size: 0.75em; }} code {{ white-space: pre-wrap; word-break: break-all; }}
.problem {{ color: #a33; }} .cut {{ color: #666; font-style: italic; }} .vars {{ font-size: 0.8em; color: #555; }}
</style></head><body>
<h1>fabricscope report</h1>
<p>{e(stamp(start))} – {e(stamp(end))}, from Prometheus <code>{e(prometheus_url)}</code>.</p>
<ul>{''.join(f'<li><a href="#{e(s.name)}">{e(s.title)}</a></li>' for s in sections)}</ul>
"""]
    for section in sections:
        chosen = ", ".join(f"{k} = {' | '.join(v) if len(v) <= 6 else f'{len(v)} values'}"
                           for k, v in section.variables.items())
        parts.append(f'<h2 id="{e(section.name)}">{e(section.title)}</h2>\n<p class="vars">{e(chosen)}</p>\n'
                     '<div class="panels">')
        for panel in section.panels:
            image = f'<img src="{e(panel.image)}" alt="{e(panel.title)}">' if panel.image else \
                f"<p><strong>{e(panel.title)}</strong></p>"
            problem = f'<p class="problem">{e(panel.problem)}</p>' if panel.problem else ""
            if panel.drawn is not None and panel.drawn.note:
                problem += f'<p class="cut">{e(panel.drawn.note)}</p>'
            queries = "".join(f"<code>{e(q)}</code><br>" for q in panel.queries)
            parts.append(f"<figure>{image}<figcaption>{e(panel.description)}{problem}"
                         f"<details><summary>queries</summary>{queries}</details></figcaption></figure>")
        parts.append("</div>")
    parts.append("</body></html>\n")
    path = out_dir / "index.html"
    path.write_text("\n".join(parts))
    return path


def _plain(value: object) -> object:
    """JSON without NaN (not JSON) and with rows' numbers kept as numbers."""
    if isinstance(value, float):
        return None if value != value or value in (float("inf"), float("-inf")) else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_data(sections: list[DashboardSection], out_dir: Path, start: float, end: float) -> Path:
    """report.json: per dashboard and panel, its queries and what its image shows (legends
    drawn, or a table's rows as label and value columns), out of how many, and the cut."""
    data = {"start": start, "end": end, "dashboards": {section.name: {
        "title": section.title, "variables": section.variables,
        "annotations": [{"text": a.text, "start": a.start, "end": a.end} for a in section.annotations],
        "panels": [{"id": p.panel_id, "title": p.title, "type": p.kind, "image": p.image, "queries": p.queries,
                    "problem": p.problem,
                    **({"shown": _plain(p.drawn.shown), "total": p.drawn.total, "note": p.drawn.note}
                       if p.drawn is not None else {})}
                   for p in section.panels]} for section in sections}}
    path = out_dir / "report.json"
    path.write_text(json.dumps(data, indent=1, allow_nan=False))
    return path


def parse_vars(pairs: list[str]) -> dict[str, list[str]]:
    chosen: dict[str, list[str]] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ReportError(f"--var {pair!r}: expected NAME=VALUE, e.g. --var node=gpu-node-1")
        chosen.setdefault(name, []).append(value)
    return chosen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus-url", default="http://127.0.0.1:19090",
                        help="Prometheus to read (default http://127.0.0.1:19090, the demo stack's)")
    parser.add_argument("--from", dest="start", default="now-1h",
                        help="start: now-30m, a UNIX timestamp or an RFC 3339 time (default now-1h)")
    parser.add_argument("--to", dest="end", default="now", help="end, same forms (default now)")
    parser.add_argument("--out", type=Path, default=Path("var/report"), help="output directory (default var/report)")
    parser.add_argument("--dashboard", action="append", default=None,
                        help="only this dashboard (file stem: fleet, node_network, ...); repeatable")
    parser.add_argument("--var", action="append", default=[],
                        help="pin a template variable, e.g. --var node=gpu-node-1 (repeatable; default All)")
    parser.add_argument("--sidecar-url", default=None,
                        help="the query sidecar, to draw the panels it serves (GET requests only); default: list them only")
    parser.add_argument("--sidecar-ca", type=Path, default=None, help="CA certificate of the sidecar's TLS")
    parser.add_argument("--sidecar-token-file", type=Path, default=None,
                        help="file holding a sidecar API key with the read scope")
    parser.add_argument("--scrape-interval", default="15s",
                        help="the Prometheus scrape interval (15s, 1m, or seconds), for $__rate_interval "
                             "as Grafana computes it (default 15s)")


def run(args: argparse.Namespace) -> int:
    try:
        try:
            import matplotlib  # noqa: F401  (the one dependency beyond the core install)
        except ImportError:
            raise ReportError("drawing needs matplotlib: pip install 'fabricscope[dashboards]'") from None
        start, end = parse_time(args.start), parse_time(args.end)
        if end <= start:
            raise ReportError(f"--to ({args.end}) must be after --from ({args.start})")
        scrape_seconds = parse_interval(args.scrape_interval)
        boards = model.load_all()
        # The fleet overview first: what an on-call engineer reads before any drill-down.
        wanted = args.dashboard or sorted(boards, key=lambda name: name != "fleet")
        unknown = [name for name in wanted if name not in boards]
        if unknown:
            raise ReportError(f"unknown dashboard(s) {', '.join(unknown)}; known: {', '.join(boards)}")
        chosen = parse_vars(args.var)
        sidecar = None
        if args.sidecar_url:
            if not args.sidecar_token_file:
                raise ReportError("--sidecar-url needs --sidecar-token-file (an API key with the read scope)")
            try:
                token = args.sidecar_token_file.read_text().strip()
            except OSError as exc:
                raise ReportError(f"--sidecar-token-file {args.sidecar_token_file}: {exc.strerror}") from None
            if args.sidecar_ca is not None and not args.sidecar_ca.is_file():
                raise ReportError(f"--sidecar-ca {args.sidecar_ca}: no such file")
            sidecar = Sidecar(args.sidecar_url, token, args.sidecar_ca)
        prometheus = Prometheus(args.prometheus_url)
        prometheus.label_values("__name__", None, start, end)   # fail early and clearly if unreachable
        args.out.mkdir(parents=True, exist_ok=True)
        sections = [render_dashboard(name, boards[name], prometheus, start, end, args.out,
                                     scrape_seconds, chosen, sidecar) for name in wanted]
        page = write_html(sections, args.out, args.prometheus_url, start, end)
        write_data(sections, args.out, start, end)
    except (ReportError, model.DashboardModelError) as exc:
        print(f"fabricscope report: {exc}", file=sys.stderr)
        return 2
    except QueryError as exc:
        print(f"fabricscope report: Prometheus refused a variable query: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"fabricscope report: {exc}", file=sys.stderr)
        return 2
    images = sum(1 for s in sections for p in s.panels if p.image)
    problems = [f"{s.name}: {p.title}: {p.problem}" for s in sections for p in s.panels if p.problem and p.image]
    print(f"{page}  ({images} panel images, {len(sections)} dashboards)")
    for problem in problems:
        print(f"  query error in {problem}", file=sys.stderr)
    return 1 if problems else 0
