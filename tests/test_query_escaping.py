"""The one escaping function and hostile input in every parameter position.

A value written through promql_string must decode back to itself (Go/PromQL string rules,
checked here with JSON's compatible subset and against a real Prometheus in
test_query_prometheus.py), and no parameter value may change a rendered query's structure.
"""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from fabricscope.queryapi.promql import UnencodableValue, escape_label_value, quote as promql_string
from fabricscope.queryapi.query.params import ParamError
from fabricscope.queryapi.query.registry import default_registry

no_surrogates = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)

HOSTILE = [
    '"', '\\', '\\"', '"}', '"} or vector(1) or {a="', '} or vector(1)', 'x" or vector(1) #',
    "gpu-node-1\"}[5m]) or on() vector(1) #", ".*", ".+|.*", "(?i)GPU.*", "[a-z]+", "$1", "{{ value window }}",
    "{{ match host }}", "1h] or vector(1) [5m", "0.99) or vector(1", "5 or vector(1)", "-1", "1e309",
    "x" * 5000, "\n", "a\nb", "\r\n", "\x00", "\x7f", "\u2028", "ünïcødé-nøde", "🔥", "\ud800", "", " ",
    "'", "`", "node=~\".*\"", "`rm -rf /`", "%s%s%n", "../../etc/passwd", "1; DROP TABLE",
]


@given(no_surrogates)
@settings(max_examples=500)
def test_escaped_literal_decodes_to_the_value(value):
    # PromQL string literals follow Go quoting; our escapes are the JSON-compatible subset.
    assert json.loads(promql_string(value)) == value


@given(no_surrogates)
@settings(max_examples=500)
def test_escaped_literal_has_no_unescaped_quote_or_line_break(value):
    body = escape_label_value(value)
    assert "\n" not in body and "\r" not in body
    # every quote is preceded by an odd number of backslashes: it cannot end the literal
    for match in re.finditer('"', body):
        backslashes = len(body[:match.start()]) - len(body[:match.start()].rstrip("\\"))
        assert backslashes % 2 == 1


def test_lone_surrogate_is_refused():
    with pytest.raises(UnencodableValue):
        promql_string("a\ud800b")


def _skeleton(promql: str) -> str:
    """The query with every string literal blanked: its structure."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)


def _cases():
    registry = default_registry()
    for spec in registry.queries.values():
        for pname in spec.params:
            yield spec.name, pname


@pytest.mark.parametrize("query_name,param", list(_cases()))
def test_hostile_values_never_change_query_structure(query_name, param):
    registry = default_registry()
    spec = registry.get(query_name)
    benign = {n: _benign(p.type) for n, p in spec.params.items()}
    base = registry.validate(query_name, benign)
    reference = _skeleton(registry.render(query_name, base)) if spec.promql else None
    for hostile in HOSTILE:
        try:
            values = registry.validate(query_name, {**benign, param: hostile})
        except ParamError as exc:
            assert exc.param == param and exc.message       # refused, with the parameter named
            continue
        if spec.promql:
            assert _skeleton(registry.render(query_name, values)) == reference, hostile
        if spec.params[param].type != "text":
            # Typed values that pass are canonical and carry no PromQL syntax of their own.
            assert not re.search(r'[{}()"\\\n\[\]]', str(values[param])), (hostile, values[param])


@pytest.mark.parametrize("hostile", HOSTILE)
def test_free_text_parameter_is_written_only_inside_its_literal(hostile):
    """`text` accepts almost anything; its rendering must still keep the structure."""
    registry = default_registry()
    reference = _skeleton(registry.render("all_devices", registry.validate("all_devices", {"field": "role", "value": "x"})))
    try:
        values = registry.validate("all_devices", {"field": "role", "value": hostile})
    except ParamError as exc:
        assert exc.param == "value"
        return
    rendered = registry.render("all_devices", values)
    assert _skeleton(rendered) == reference
    assert json.loads(rendered[rendered.index('role=') + 5:].rstrip("} ").strip()) == values["value"]


def test_unknown_and_extra_parameters_are_refused():
    registry = default_registry()
    with pytest.raises(ParamError, match="no such parameter"):
        registry.validate("firing_alerts", {"severity": "critical", "promql": "vector(1)"})
    with pytest.raises(LookupError, match="no registered query"):
        registry.validate("vector(1)", {})


def _benign(type_name: str):
    return {"host": "gpu-node-1", "device": "mlx5_0", "gpu": 1, "rank": 3, "port": 1, "limit": 5,
            "comm": "0123456789abcdef", "duration": "5m", "quantile": 0.99, "severity": "critical",
            "event_severity": "fatal", "port_state": "down", "failure_type": "device_failure",
            "device_field": "role", "name": "chat-api", "text": "compute", "ip": "10.0.0.1",
            "threshold": 3.0, "xid": 79, "nccl_op": "allreduce", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}[type_name]
