"""The NL answer contract (contract.py): out-of-scope questions abstain, actions are refused
as actions, unknown names are named, every constraint is honoured or refused, and the
questions that used to pick the wrong query pick the right one. Questions in this file's
own wording (neither the evaluation sets' nor the issue's)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fabricscope.queryapi.query.extract import Vocabulary
from fabricscope.queryapi.query.nl import Interpreter
from fabricscope.queryapi.query.registry import QuerySpec, Registry, RegistryError
from fabricscope.queryapi.query.contract import abstention_answer

VOCAB = Vocabulary(["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"],
                   ["mlx5_0", "mlx5_1", "leaf-01", "spine-01"], racks=["rack-a"], clusters=["eu-north"],
                   jobs={"slurm:5150": "0123456789abcdef", "k8s-pod:bert-ft-3": "fedcba9876543210"})
INTERPRETER = Interpreter()


def ask(question: str, previous: dict | None = None):
    return INTERPRETER.interpret(question, VOCAB, previous).match


@pytest.mark.parametrize("question,unexplained", [
    ("what's the hottest gpu temperature on gpu-node-1", "temperature"),
    ("watts drawn by gpu-node-2", "watts"),
    ("vram in use on gpu 3 of gpu-node-0", "vram"),
    ("are any pods pending", "pods"),
    ("free disk on gpu-node-3", "disk"),
    ("nccl busbw of the last allreduce", "busbw"),
    ("is the queue long before my job gets scheduled", "scheduled"),
    ("say something funny, a joke about nvlink", "joke"),
])
def test_out_of_scope_abstains_and_names_what_it_does_not_measure(question, unexplained):
    match = ask(question)
    assert match.query_name is None and match.abstained
    assert unexplained in match.unexplained
    answer = abstention_answer(match)
    assert "nothing was run" in answer and unexplained in answer


@pytest.mark.parametrize("question,verb", [
    ("silence the nvlink alerts until tomorrow", "silence"),
    ("please drain gpu-node-1", "drain"),
    ("could you restart the exporters", "restart"),
    ("delete every span older than a day", "delete"),
])
def test_actions_are_refused_as_actions(question, verb):
    match = ask(question)
    assert match.query_name is None and match.actions == [verb]
    assert "only reads" in abstention_answer(match)


@pytest.mark.parametrize("question", ["how many pod restarts on gpu-node-1", "why did gpu-node-2 reboot"])
def test_a_question_about_an_action_is_out_of_scope_not_a_request(question):
    match = ask(question)
    assert match.query_name is None and not match.actions and match.unexplained
    assert "only reads" not in abstention_answer(match)


def test_an_action_is_not_read_as_a_follow_up():
    previous = {"query_name": "firing_alerts", "params": {}}
    assert ask("and silence them", previous).query_name is None


@pytest.mark.parametrize("question,name,close", [
    ("p99 rtt on gpu-node-7", "gpu-node-7", "gpu-node-"),
    ("neighbours of spine-02", "spine-02", "spine-01"),
    ("stragglers in job 8086", "8086", None),
    ("hang count on node 9", "node 9", "gpu-node-"),
])
def test_unknown_names_are_named_never_dropped_or_guessed(question, name, close):
    match = ask(question)
    assert match.query_name is None and name in match.unknown_names
    if close:
        assert match.unknown_names[name] and match.unknown_names[name][0].startswith(close)
    assert repr(name) in abstention_answer(match)


def test_a_host_that_is_also_a_topology_device_is_not_an_hca_filter():
    both = Vocabulary(["gpu-node-0"], ["mlx5_0", "gpu-node-0", "leaf-01"])
    links = INTERPRETER.interpret("links down on gpu-node-0", both).match
    assert (links.query_name, links.params) == ("links_by_state", {"host": "gpu-node-0", "state": "DOWN"})
    blast = INTERPRETER.interpret("blast radius of gpu-node-0", both).match
    assert (blast.query_name, blast.params["device"]) == ("blast_radius_device", "gpu-node-0")


def test_a_typo_in_letters_is_read_but_other_digits_are_another_machine():
    assert ask("p99 rtt on gpu-nod-2").params["host"] == "gpu-node-2"
    assert "spine-07" in ask("what is attached to spine-07").unknown_names


@pytest.mark.parametrize("question,query,params", [
    # window: the windowed variant of an instant query
    ("ranks that hung during the last 40 minutes", "nccl_ranks_hung_in_window", {"window": "40m"}),
    ("laggiest ranks over the past 6 hours", "slowest_ranks_over_window", {"window": "6h"}),
    ("alerts that fired in the last 8 hours", "event_history", {"window": "8h"}),
    ("did rank 6 hang at any point in the last 3 hours", "nccl_ranks_hung_in_window", {"rank": 6, "window": "3h"}),
    # time words are windows, never dropped
    ("xid errors overnight", "gpu_xid_errors", {"window": "12h"}),
    ("retransmits this afternoon", "tcp_retransmits", {"window": "6h"}),
    # job: through its communicator, or the rank_info job_id
    ("slowest ranks of job 5150", "slowest_ranks", {"comm": "0123456789abcdef"}),
    ("which nodes is job bert-ft-3 running on", "job_ranks", {"job": "k8s-pod:bert-ft-3"}),
    # rank, communicator, operation, trace, cluster, device, port, gpu
    ("how late is rank 11 to its collectives", "slowest_ranks", {"rank": 11}),
    ("hung ranks in comm fedcba9876543210", "nccl_hanging_ranks", {"comm": "fedcba9876543210"}),
    ("is anything stuck in reduce-scatter", "nccl_hanging_ranks", {"op": "ReduceScatter"}),
    ("network correlation of trace 0af7651916cd43dd8448eb211c80319c", "network_correlations",
     {"trace": "0af7651916cd43dd8448eb211c80319c"}),
    ("retransmits in eu-north", "tcp_retransmits", {"cluster": "eu-north"}),
    ("error counters of mlx5_1 port 1", "worst_ib_ports", {"device": "mlx5_1", "port": 1}),
    ("nvlink errors on gpu 2 of gpu-node-3", "nvlink_errors", {"gpu": 2, "host": "gpu-node-3"}),
])
def test_every_named_constraint_filters_the_answer(question, query, params):
    match = ask(question)
    assert match.query_name == query, match
    assert {k: match.params.get(k) for k in params} == params


@pytest.mark.parametrize("question,constraint", [
    ("nvlinks down over the past 3 hours", "window"),
    ("gpu inventory of job 5150", "job"),
    ("link flaps in rack-a", "rack"),
    ("run queue latency for rank 4", "rank"),
])
def test_a_constraint_no_query_takes_is_refused_and_the_closest_offered(question, constraint):
    match = ask(question)
    assert match.query_name is None and constraint in match.unsupported
    assert match.alternatives and match.alternatives[0]["description"]
    assert f"filter by {constraint}" in abstention_answer(match)


def test_a_follow_up_window_moves_an_instant_query_to_its_variant():
    first = ask("which ranks are hanging now")
    previous = {"query_name": first.query_name, "params": first.params}
    follow = ask("what about the past 2 hours?", previous)
    assert (follow.query_name, follow.params["window"]) == ("nccl_ranks_hung_in_window", "2h")


def test_a_window_past_the_longest_is_refused_not_replaced_by_the_default():
    match = ask("tcp retransmits over the last 90 days")
    assert match.query_name is None and "window" in match.invalid


def test_an_operation_the_answer_cannot_split_by_is_said():
    match = ask("late ranks in the all-gather of comm fedcba9876543210")
    assert match.query_name == "slowest_ranks" and match.covered == {"op": "allgather"}


@pytest.mark.parametrize("question,query,params", [
    ("tcp microbursts on gpu-node-2", "tcp_microbursts", {"host": "gpu-node-2"}),
    ("bursty rtt spikes anywhere in the last hour", "tcp_microbursts", {"window": "1h"}),
    ("which rank drags the whole job down", "slowest_ranks", {}),
    ("show the warnings that are active", "firing_alerts", {"severity": "warning"}),
    ("is a job deadlocked inside nccl", "nccl_hanging_ranks", {}),
    ("ioctl pressure on the gpu driver of gpu-node-0", "gpu_driver_ioctls", {"host": "gpu-node-0"}),
])
def test_questions_that_picked_the_wrong_query(question, query, params):
    match = ask(question)
    assert match.query_name == query, match
    assert {k: match.params.get(k) for k in params} == params


def test_variants_must_be_other_registered_queries():
    spec = QuerySpec(name="a_query", category="x", description="d", promql="up", variants=["nowhere"])
    with pytest.raises(RegistryError, match="nowhere"):
        Registry([spec])


def _bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "query_accuracy.py"
    spec = importlib.util.spec_from_file_location("query_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_counts_a_constraint_an_answer_drops():
    bench = _bench()
    item = {"q": "slowest ranks of job 5150", "query": "slowest_ranks", "params": {"comm": "0123456789abcdef"}}
    expected = ("slowest_ranks", {"comm": "0123456789abcdef", "limit": 5})
    unfiltered = ask("slowest ranks")
    assert bench.dropped_constraints(item, unfiltered, expected) == ["comm"]
    assert bench.dropped_constraints(item, ask(item["q"]), expected) == []
    refused = {"q": "link flaps in rack-a", "refuse": ["rack"]}
    assert bench.dropped_constraints(refused, ask("link flaps"), None) == ["rack"]
    assert bench.decided_right(refused, ask(refused["q"]), None)


def test_fresh_batch_is_frozen_apart_and_scores_at_target():
    """The batch written before tuning: its own file and freeze time, never a catalog example;
    exact >= 90 % and no constraint dropped on both endpoints."""
    import yaml

    from fabricscope.queryapi.query.registry import default_registry
    bench = _bench()
    data = yaml.safe_load(bench.FRESH.read_text())
    assert data["frozen"] and len(data["questions"]) >= 40
    assert sum(1 for item in data["questions"] if item.get("abstain")) >= 10
    examples = {e.lower().strip(" ?") for q in default_registry().queries.values() for e in q.examples}
    assert not examples & {item["q"].lower().strip(" ?") for item in data["questions"]}
    for endpoint, result in bench.evaluate("questions", bench.FRESH).items():
        assert result["exact"] >= 0.9 and result["constraints dropped"] == 0, endpoint


def test_typos_and_runbook_forms():
    """A typo of an action is still an action; a number nothing took is named, not dropped;
    two swapped letters in a short word are read; a step number is no part of the question."""
    assert ask("restrat the exporter on gpu-node-0").actions == ["restrat"]
    assert "79" in ask("xdi 79 on gpu-node-1").unexplained
    assert ask("ib prot errors on gpu-node-1").query_name == "worst_ib_ports"
    stepped = ask("Step 2: list the ranks stuck in AllGather")
    assert (stepped.query_name, stepped.params) == ("nccl_hanging_ranks", {"op": "AllGather"})
    # "services broke their SLO" names no service called "broke"
    assert "service" not in ask("which services broke their slo").params


def test_an_alert_name_is_read_as_the_words_it_is_made_of():
    paged = ask("paged for FabricNvlinkLinkDown on gpu-node-3")
    assert (paged.query_name, paged.params) == ("nvlink_links_down", {"host": "gpu-node-3"})
