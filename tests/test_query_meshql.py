"""MeshQL grammar: every form, case-insensitivity, error positions and expected tokens."""
from __future__ import annotations

import pytest

from fabricscope.queryapi.query.meshql import MeshQLError, parse

COMM = "3f2a9c1d0b7e6a55"
FORMS = [
    ('SHOW NEIGHBORS OF DEVICE "leaf-01"', "device_neighbors", {"device": "leaf-01"}),
    ('SHOW IMPACT IF DEVICE "leaf-01" DOWN', "blast_radius_device",
     {"device": "leaf-01", "failure_type": "device_failure"}),
    ("SHOW DEVICES", "all_devices", {"field": "node"}),
    ('SHOW DEVICES WHERE role = "compute"', "all_devices", {"field": "role", "value": "compute"}),
    ('SHOW DEVICES WHERE Node = "gpu-node-1"', "all_devices", {"field": "node", "value": "gpu-node-1"}),
    ("SHOW SUMMARY", "fleet_summary", {}),
    (f'SHOW STRAGGLERS IN JOB "{COMM}"', "slowest_ranks", {"comm": COMM, "limit": 5}),
    ("SHOW HANGS", "nccl_hangs_by_node", {"window": "1h"}),
    ('SHOW HANGS ON NODE "gpu-node-1"', "nccl_hangs_by_node", {"host": "gpu-node-1", "window": "1h"}),
    ("SHOW HANGS LAST 6h", "nccl_hangs_by_node", {"window": "6h"}),
    ('SHOW HANGS ON NODE "gpu-node-1" LAST 90m', "nccl_hangs_by_node", {"host": "gpu-node-1", "window": "90m"}),
    ('SHOW LATENCY OF HOST "gpu-node-2"', "host_latency", {"host": "gpu-node-2", "quantile": 0.99, "window": "5m"}),
    ('SHOW LINKS WHERE state = "down"', "links_by_state", {"state": "DOWN"}),
    ('SHOW LINKS WHERE state = "init"', "links_by_state", {"state": "INIT"}),
    (f'SHOW COST OF STRAGGLERS IN JOB "{COMM}"', "straggler_cost", {"comm": COMM, "window": "1h"}),
    ("SHOW ALERTS", "firing_alerts", {}),
    ('SHOW ALERTS SEVERITY "critical"', "firing_alerts", {"severity": "critical"}),
]


@pytest.mark.parametrize("text,name,params", FORMS)
def test_every_form(text, name, params):
    statement = parse(text)
    assert (statement.query_name, statement.params) == (name, params)


@pytest.mark.parametrize("text,name,params", FORMS)
def test_keywords_are_case_insensitive_and_whitespace_free(text, name, params):
    mangled = "  " + text.lower().replace(" ", " \n\t ") + "  "
    # string literals keep their case
    for value in params.values():
        if isinstance(value, str):
            mangled = mangled.replace(value.lower(), value)
    assert parse(mangled).query_name == name


def test_escaped_quotes_in_strings():
    statement = parse(r'SHOW DEVICES WHERE role = "a \"quoted\" \\ role"')
    assert statement.params["value"] == 'a "quoted" \\ role'


@pytest.mark.parametrize("text,position,line,column,expected", [
    ('SHOW NEIGHBOURS OF DEVICE "x"', 5, 1, 6, "NEIGHBORS"),
    ("SHOW NEIGHBORS OF DEVICE", 24, 1, 25, 'a "quoted string"'),
    ("SHOW", 4, 1, 5, "SUMMARY"),
    ("", 0, 1, 1, "SHOW"),
    ("SHOW HANGS LAST 2 hours", 16, 1, 17, "a duration (e.g. 1h, 30m)"),
    ("SHOW SUMMARY extra", 13, 1, 14, "end of statement"),
    ('SHOW LINKS WHERE state = "down"; DROP', 31, 1, 32, "end of statement"),
    ('SHOW IMPACT IF DEVICE "x"', 25, 1, 26, "DOWN"),
    ('SHOW\nLINKS WHERE colour = "red"', 17, 2, 13, "STATE"),
    ("SHOW DEVICES WHERE role = compute", 26, 1, 27, 'a "quoted string"'),
    ("SHOW ALERTS SEVERITY 'critical'", 21, 1, 22, 'a "quoted string"'),
])
def test_syntax_errors_name_position_and_expected_tokens(text, position, line, column, expected):
    with pytest.raises(MeshQLError) as info:
        parse(text)
    error = info.value
    assert (error.position, error.line, error.column) == (position, line, column)
    assert expected in error.expected
    body = error.to_dict()
    assert body["error"] == "meshql_syntax" and f"column {column}" in body["message"]


@pytest.mark.parametrize("text,param,position", [
    ('SHOW LATENCY OF HOST "bad host"', "host", 21),
    ('SHOW ALERTS SEVERITY "nope"', "severity", 21),
    ('SHOW DEVICES WHERE colour = "x"', "field", 19),
    ('SHOW STRAGGLERS IN JOB "x\\" or vector(1)"', "comm", 23),
    ('SHOW HANGS LAST 90d', "window", 16),
    ('SHOW LINKS WHERE state = "sideways"', "state", 25),
])
def test_refused_values_point_at_their_token(text, param, position):
    with pytest.raises(MeshQLError) as info:
        parse(text)
    assert info.value.param == param and info.value.position == position
    assert info.value.to_dict()["error"] == "meshql_invalid_value"


def test_non_string_and_oversized_statements():
    with pytest.raises(MeshQLError, match="must be a string"):
        parse({"query": "SHOW SUMMARY"})
    with pytest.raises(MeshQLError, match="longer than"):
        parse("SHOW DEVICES WHERE role = \"" + "x" * 5000 + "\"")
