"""Reading the generated dashboard JSON the way Grafana does: panels, their queries, the
template variables (resolved against a Prometheus server, chained as Grafana chains them)
and variable substitution. The report and the tests use this; neither re-derives queries
from the Python source, so what they check and draw is exactly what Grafana gets."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

JSON_DIR = Path(__file__).resolve().parent / "json"

LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$", re.S)
VARIABLE = re.compile(r"\$\{(?P<braced>[a-zA-Z0-9_]+)(?::[a-z]+)?\}|\$(?P<plain>[a-zA-Z_][a-zA-Z0-9_]*)")
# Characters Grafana escapes in each value of a multi-value / "All" Prometheus variable,
# because the value lands inside a regex matcher (=~"(a|b)").
REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")


class DashboardModelError(Exception):
    """A dashboard JSON file is missing, unreadable, or refers to something undefined."""


def dashboard_files(json_dir: Path = JSON_DIR) -> list[Path]:
    return sorted(json_dir.glob("*.json"))


def load(path: Path | str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DashboardModelError(f"cannot read dashboard {path}: {exc}") from None


def load_all(json_dir: Path = JSON_DIR) -> dict[str, dict]:
    """Dashboards by file stem (fleet, node_network, ...)."""
    return {path.stem: load(path) for path in dashboard_files(json_dir)}


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, including those inside collapsed rows; row headers themselves excluded."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def datasource_type(dashboard: dict, datasource: Any) -> str | None:
    """The plugin type behind a target's datasource reference (`${var}` resolved through
    the dashboard's datasource variables)."""
    if isinstance(datasource, dict):
        return datasource.get("type")
    if isinstance(datasource, str) and datasource.startswith("$"):
        name = datasource.strip("${}")
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable["name"] == name and variable["type"] == "datasource":
                return variable["query"]
    return None


def target_datasource(panel: dict, target: dict) -> Any:
    return target.get("datasource") or panel.get("datasource")


@dataclass
class Query:
    """One PromQL expression of a dashboard and where it comes from."""
    dashboard: str
    where: str                     # "panel 7 'Port state' A", "annotation 'Critical alerts'"
    expr: str
    panel: dict | None = None
    target: dict | None = None


def prometheus_queries(name: str, dashboard: dict) -> list[Query]:
    """Every PromQL expression Grafana would run for this dashboard: panel targets,
    annotation queries and the variables' label_values selectors."""
    found = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if datasource_type(dashboard, target_datasource(panel, target)) == "prometheus":
                found.append(Query(name, f"panel {panel['id']} {panel['title']!r} {target['refId']}",
                                   target["expr"], panel, target))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append(Query(name, f"annotation {annotation['name']!r}", annotation["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        match = LABEL_VALUES.match(variable.get("query") or "") if variable["type"] == "query" else None
        if match and match["selector"]:
            found.append(Query(name, f"variable {variable['name']!r}", match["selector"]))
    return found


# ------------------------------------------------------------------ variables

@dataclass
class Variables:
    """Resolved variable values: name -> list of values, plus how each is formatted."""
    values: dict[str, list[str]] = field(default_factory=dict)
    regex_formatted: set[str] = field(default_factory=set)
    builtins: dict[str, str] = field(default_factory=dict)

    def format(self, name: str) -> str | None:
        if name in self.builtins:
            return self.builtins[name]
        if name not in self.values:
            return None
        values = self.values[name]
        if name not in self.regex_formatted:
            return values[0] if values else ""
        escaped = [REGEX_SPECIAL.sub(r"\\\1", value) for value in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    def substitute(self, text: str) -> str:
        def replace(match: re.Match) -> str:
            name = match["braced"] or match["plain"]
            value = self.format(name)
            if value is None:
                raise DashboardModelError(f"variable ${name} is not defined (in {text[:80]!r})")
            return value
        return VARIABLE.sub(replace, text)


def rate_interval(step_seconds: float, scrape_seconds: float) -> str:
    """Grafana's $__rate_interval: max(step + scrape interval, 4 × scrape interval)."""
    return f"{int(max(step_seconds + scrape_seconds, 4 * scrape_seconds))}s"


def builtin_variables(start: float, end: float, step: float, scrape_seconds: float) -> dict[str, str]:
    span = max(1, int(end - start))
    # __from / __to: the range in epoch milliseconds, as Grafana gives them.
    return {"__rate_interval": rate_interval(step, scrape_seconds), "__interval": f"{int(max(step, 1))}s",
            "__range": f"{span}s", "__range_s": str(span), "__from": str(int(start * 1000)),
            "__to": str(int(end * 1000))}


def resolve_variables(dashboard: dict, label_values: Callable[[str, str | None], list[str]],
                      builtins: dict[str, str], chosen: dict[str, list[str]] | None = None) -> Variables:
    """Resolve the dashboard's variables in order, as Grafana does on load: each
    `label_values` query is run with the variables before it already substituted; "All"
    (the default) selects every value; `chosen` pins some variables to given values.
    `label_values(label, selector)` asks the datasource (Prometheus' label values API)."""
    chosen = chosen or {}
    resolved = Variables(builtins=dict(builtins))
    for variable in dashboard.get("templating", {}).get("list", []):
        name, kind = variable["name"], variable["type"]
        if kind == "datasource":
            resolved.values[name] = [variable["query"]]
            continue
        if kind in ("textbox", "constant", "custom"):
            current = (variable.get("current") or {}).get("value")
            resolved.values[name] = [str(current if current is not None else variable.get("query", ""))]
            continue
        match = LABEL_VALUES.match(variable.get("query") or "")
        if not match:
            raise DashboardModelError(f"variable {name}: unsupported query {variable.get('query')!r}")
        selector = resolved.substitute(match["selector"]) if match["selector"] else None
        values = label_values(match["label"], selector)
        if name in chosen:
            values = [value for value in chosen[name] if value in values] or list(chosen[name])
        resolved.values[name] = values
        if variable.get("multi") or variable.get("includeAll"):
            resolved.regex_formatted.add(name)
    return resolved


def referenced_variables(text: str) -> set[str]:
    return {match["braced"] or match["plain"] for match in VARIABLE.finditer(text)}


# ------------------------------------------------------------------ Infinity (sidecar) panels

@dataclass
class InfinityRequest:
    """The HTTP request the Infinity datasource sends for one target: relative URL joined
    to the datasource's base URL, query parameters and JSON body with variables
    substituted; the datasource adds its own authentication."""
    method: str
    url: str
    params: list[tuple[str, str]]
    body: str | None
    root_selector: str
    columns: list[dict]


def infinity_targets(name: str, dashboard: dict) -> list[tuple[dict, dict]]:
    return [(panel, target) for panel in panels(dashboard) for target in panel.get("targets", [])
            if datasource_type(dashboard, target_datasource(panel, target)) == "yesoreyeram-infinity-datasource"]


def infinity_request(target: dict, variables: Variables, base_url: str) -> InfinityRequest:
    options = target.get("url_options") or {}
    body = options.get("data") or None
    return InfinityRequest(
        method=options.get("method", "GET"),
        url=base_url.rstrip("/") + variables.substitute(target["url"]),
        params=[(p["key"], variables.substitute(p["value"])) for p in options.get("params", [])],
        body=variables.substitute(body) if body else None,
        root_selector=target.get("root_selector", ""),
        columns=target.get("columns", []))


def infinity_rows(document: Any, root_selector: str) -> list[dict]:
    """The rows Infinity's backend parser makes of a JSON document: the value at the
    dotted root selector, a list of objects (one row each) or one object (one row)."""
    value = document
    for part in filter(None, root_selector.split(".")):
        if not isinstance(value, dict) or part not in value:
            raise DashboardModelError(f"root selector {root_selector!r}: no {part!r} in the response")
        value = value[part]
    rows = value if isinstance(value, list) else [value]
    if not all(isinstance(row, dict) for row in rows):
        raise DashboardModelError(f"root selector {root_selector!r} does not lead to objects")
    return rows
