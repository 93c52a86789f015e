"""The rendered rules scoped to one cluster: every series selector gains `cluster="<name>"`.

    from fabricscope.rules.cluster import scope_expr, scope_rule_file
    scope_expr('sum by (cluster, node) (rate(x_total[1m]))', "cluster", "pod-b")
    # 'sum by (cluster, node) (rate(x_total{cluster="pod-b"}[1m]))'

Every fabricscope rule aggregates within the cluster label (utils.libsonnet `by`), so a
rule group evaluated over one cluster's series gives that cluster's results and nothing
else: rule evaluation shards by cluster, one evaluator (vmalert, a Prometheus ruler) per
shard, each reading one store that holds every cluster. The matcher is added where the
engine selects series (each vector selector, inside range and subquery brackets too), so
the engine reads only the shard's series rather than filtering afterwards.

The scoper knows PromQL's lexical shape, not its full grammar: strings and bracketed
durations are copied as they are, label lists after by/without/on/ignoring/group_left/
group_right are not selectors, a name followed by `(` is a function or aggregation, and
every other name is a metric. tests/test_rules_cluster.py holds it against every
rendered expression (promtool accepts the result, and each selector carries the matcher).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:[smhdwy]|ms)?)+")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "by", "without", "on", "ignoring",
             "group_left", "group_right", "start", "end"}
_LABEL_LIST_BEFORE = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The evaluator's own metrics (FabricRuleGroupIterationsMissed reads Prometheus') describe
# the shard's evaluator, not a cluster: they carry no cluster label and stay unscoped.
_EVALUATOR_PREFIXES = ("prometheus_", "vmalert_")
_APP_NAME = "fabricscope"   # the app.kubernetes.io/name of the PrometheusRule objects


class ScopeError(ValueError):
    """An expression the scoper cannot read (an unterminated string or bracket), or a bad cluster."""


def _matcher(label: str, value: str) -> str:
    return '%s="%s"' % (label, value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))


def _closing(text: str, start: int, opener: str, closer: str) -> int:
    """Index just past the bracket that closes text[start] (== opener), strings skipped."""
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char in "\"'`":
            i = _string_end(text, i)
            continue
        if char == opener:
            depth += 1
        elif char == closer:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ScopeError(f"unclosed {opener!r} at offset {start} in {text!r}")


def _string_end(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    raise ScopeError(f"unterminated string at offset {start} in {text!r}")


def scope_expr(expr: str, label: str, value: str) -> str:
    """`expr` with `label="value"` on every series selector."""
    if not _LABEL_NAME.match(label):
        raise ScopeError(f"cluster label {label!r} is not a label name")
    matcher = _matcher(label, value)
    out: list[str] = []
    i, previous_word = 0, ""
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            end = _string_end(expr, i)
            out.append(expr[i:end])
            i = end
        elif char == "[":                                  # a range or subquery's durations
            end = _closing(expr, i, "[", "]")
            out.append(expr[i:end])
            i = end
        elif char == "{" and previous_word.startswith(_EVALUATOR_PREFIXES):
            end = _closing(expr, i, "{", "}")
            out.append(expr[i:end])
            i = end
            previous_word = ""
        elif char == "{":                                  # a selector's matchers
            end = _closing(expr, i, "{", "}")
            inner = expr[i + 1:end - 1].strip()
            out.append("{" + matcher + ("," + inner if inner else "") + "}")
            i = end
            previous_word = ""
        elif char == "(" and previous_word in _LABEL_LIST_BEFORE:
            end = _closing(expr, i, "(", ")")              # by (cluster, node): label names
            out.append(expr[i:end])
            i = end
            previous_word = ""
        elif (number := _NUMBER.match(expr, i)) and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
            out.append(number.group(0))
            i = number.end()
            previous_word = ""
        elif name := _NAME.match(expr, i):
            word, i = name.group(0), name.end()
            following = expr[i:].lstrip()
            out.append(word)
            if word.lower() in _KEYWORDS:
                previous_word = word.lower()
                continue
            previous_word = word
            if following.startswith("(") or word.startswith(_EVALUATOR_PREFIXES):
                continue                                   # a function or aggregation
            if following.startswith("{"):
                continue                                   # its matchers come next
            if re.match(r"(by|without)\b", following) and _aggregation_follows(following):
                continue                                   # sum by (x) (...)
            out.append("{" + matcher + "}")
        else:
            if not char.isspace():
                previous_word = ""
            out.append(char)
            i += 1
    return "".join(out)


def _aggregation_follows(text: str) -> bool:
    """`by (labels) (` after a name: the name was an aggregation operator."""
    match = re.match(r"(by|without)\s*\(", text)
    if not match:
        return False
    end = _closing(text, match.end() - 1, "(", ")")
    return text[end:].lstrip().startswith("(")


def scope_groups(data: dict[str, Any], cluster: str, label: str = "cluster") -> dict[str, Any]:
    """A rule file's groups for one cluster, expressions scoped (names kept: each shard's
    evaluator loads its own files, and dashboards find the groups by their names)."""
    if not cluster:
        raise ScopeError("a cluster name is required")
    groups = []
    for group in data.get("groups") or []:
        rules = [{**rule, "expr": scope_expr(rule["expr"], label, cluster)} for rule in group.get("rules") or []]
        groups.append({**group, "rules": rules})
    return {"groups": groups}


def prometheus_rule(data: dict[str, Any], name: str, namespace: str = "monitoring",
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A prometheus-operator PrometheusRule object holding the groups (what kube-prometheus
    applies for kubernetes-mixin)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": _APP_NAME, **(labels or {})}},
            "spec": {"groups": data.get("groups") or []}}


def scope_rule_file(path: Path, cluster: str | None, label: str = "cluster") -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    return scope_groups(data, cluster, label) if cluster else data
