"""Deterministic NL: extraction patterns, catalog matching, follow-ups, the evaluation set."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fabricscope.queryapi.query.extract import Vocabulary, extract
from fabricscope.queryapi.query.nl import Interpreter

VOCAB = Vocabulary(["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"], ["mlx5_3", "leaf-01", "spine-01"])


@pytest.mark.parametrize("message,expected", [
    ("in the last hour", {"window": "1h"}),
    ("over the past 30 minutes", {"window": "30m"}),
    ("last 2 days", {"window": "2d"}),
    ("during the previous week", {"window": "1w"}),
    ("1h30m", {"window": "1h30m"}),
    ("p999 on gpu-node-2", {"quantile": "0.999", "host": "gpu-node-2"}),
    ("99.9th percentile", {"quantile": "0.999"}),
    ("where is 10.1.2.3", {"ip": "10.1.2.3"}),
    ("owner of fe80::1", {"ip": "fe80::1"}),
    ("999.1.1.1", {}),
    ("comm 3F2A9C1D0B7E6A55", {"comm": "3f2a9c1d0b7e6a55"}),
    ("gpu 3 rank 12 port 1", {"gpu": 3, "rank": 12, "port": 1}),
    ("top 3", {"limit": 3}),
    ("five slowest", {"limit": 5}),
    ("critical", {"severity": "critical"}),
    ("non-fatal", {"severity": "non_fatal"}),
    ("node-3", {"host": "gpu-node-3"}),
    ("GPU-NODE-1", {"host": "gpu-node-1"}),
    ("gpu-nod-1", {"host": "gpu-node-1"}),
    ("mlx5_3", {"device": "mlx5_3"}),
    ("leaf-01 power", {"device": "leaf-01", "failure_type": "power_failure"}),
    ("for service chat-api", {"service": "chat-api"}),
    ("the chat-api service", {"service": "chat-api"}),
    ("role compute", {"field": "role", "value": "compute"}),
])
def test_extraction(message, expected):
    assert extract(message, VOCAB).slots == expected


def test_unknown_names_are_named_with_close_matches():
    """A name the cluster does not know is never dropped nor guessed: it is named, with the
    closest known names. With nothing to judge against (Prometheus not answering) it is
    offered as written."""
    found = extract("latency of gpu-node-9", VOCAB)
    assert "host" not in found.slots and found.unknown["gpu-node-9"][0].startswith("gpu-node-")
    assert extract("what hangs off leaf-07", VOCAB).unknown == {"leaf-07": ["leaf-01"]}
    blind = extract("latency of gpu-node-9", Vocabulary())
    assert blind.slots["host"] == "gpu-node-9" and not blind.unknown


def test_hostile_text_is_extracted_only_as_validated_values():
    interpreter = Interpreter()
    # PromQL pasted into a question is words nothing explains: nothing runs, and it says so.
    match = interpreter.interpret('p99 latency of gpu-node-1"} or vector(1) #', VOCAB).match
    assert match.query_name is None and "vector" in match.unexplained and match.params == {}
    match = interpreter.interpret('p99 latency of gpu-node-1"}', VOCAB).match
    assert match.query_name == "host_latency" and match.params["host"] == "gpu-node-1"
    match = interpreter.interpret('slo violations for service a"}|vector(1)', VOCAB).match
    assert "vector" not in str(match.params)


def test_nothing_matches_without_a_previous_turn():
    match = Interpreter().interpret("what's the weather in Paris?", VOCAB).match
    assert match.query_name is None


def test_missing_required_parameter_is_reported():
    match = Interpreter().interpret("what is the p99 latency?", VOCAB).match
    assert match.query_name == "host_latency" and match.missing == ["host"]


def test_follow_up_reuses_previous_query_and_parameters():
    interpreter = Interpreter()
    first = interpreter.interpret("p99 latency of gpu-node-1 over the last 15 minutes", VOCAB).match
    previous = {"query_name": first.query_name, "params": first.params}
    second = interpreter.interpret("and for node-3?", VOCAB, previous).match
    assert second.follow_up
    assert (second.query_name, second.params) == ("host_latency", {"host": "gpu-node-3", "quantile": 0.99,
                                                                   "window": "15m"})
    # a new question is not a follow-up, even with a previous turn
    third = interpreter.interpret("which links flapped today", VOCAB, previous).match
    assert third.query_name == "link_flaps" and not third.follow_up


def _accuracy_bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "query_accuracy.py"
    spec = importlib.util.spec_from_file_location("query_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuned_regression_set_keeps_its_accuracy():
    """bench/query_eval.yaml (tuned on, follow-up conversations): a regression guard."""
    result = _accuracy_bench().evaluate_tuned()
    assert result["questions"] >= 60 and result["accuracy"] >= 0.9


def test_operator_evaluation_has_the_documented_shape():
    """At least 200 questions, a development and a held-out part with their freeze times,
    questions with no answer in both, and no catalog example among them."""
    import yaml

    from fabricscope.queryapi.query.registry import default_registry
    bench = _accuracy_bench()
    data = yaml.safe_load(bench.OPERATORS.read_text())
    parts = {name: data[name] for name in ("dev", "heldout")}
    assert sum(len(items) for items in parts.values()) >= 200
    assert set(data["frozen"]) >= set(parts)
    for items in parts.values():
        assert sum(1 for item in items if item.get("abstain")) >= 10
    examples = {e.lower().strip(" ?") for q in default_registry().queries.values() for e in q.examples}
    asked = [item["q"].lower().strip(" ?") for items in parts.values() for item in items]
    assert not examples & set(asked)
    assert len(asked) == len(set(asked)), "a question is in the evaluation twice"


def test_development_part_scores_at_its_recorded_level():
    """The part tuned on stays where tuning left it (the held-out figure is the bench's)."""
    for endpoint, result in _accuracy_bench().evaluate("dev").items():
        assert result["right query and parameters"] >= 0.9, endpoint
        assert result["abstained"] >= 0.85 and result["abstention precision"] >= 0.9, endpoint
