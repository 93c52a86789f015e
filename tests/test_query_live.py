"""The query layer on real components: the demo cluster -> a real Prometheus with the
committed rules -> `fabricscope sidecar` (TLS) -> HTTP and the real `mcp`
client SDK.

A link and an NVLink are down from the first second, so registered queries have live
answers to find. Checks: MeshQL execute:false <-> execute:true round trip for every form,
every PromQL template accepted by Prometheus, the escaping function round-tripped through
Prometheus' own parser, hostile input over HTTP, conversations with follow-ups, and MCP
listing and calling the same tools as HTTP with the same results and errors.
"""
from __future__ import annotations

import asyncio
import json
import re
import ssl
import time

import httpx2
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from fabricscope.demo import stack
from fabricscope.demo import cluster as cluster_mod, scenario as scenario_mod
from fabricscope.demo.main import write_targets_file
from fabricscope.demo.sources.nccl import job_comm
from fabricscope.queryapi.promql import quote
from fabricscope.queryapi.query.registry import default_registry
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys, seed_span

CLUSTER = "qtest"
SCENARIO = {"seed": 5, "cluster": {"name": CLUSTER, "nodes": 2, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 0.5,
            "faults": [{"kind": "link_down", "node": 1, "at": 0, "target": {"device": "mlx5_1", "port": 1}},
                       {"kind": "nvlink_down", "node": 0, "at": 0, "target": {"gpu": 1, "link": 0},
                        "params": {"precursor_seconds": 0}},
                       # rank 1 (gpu-node-0) stops entering the job's collectives
                       {"kind": "nccl_hang", "at": 8, "target": {"rank": 1}}]}


# A communicator of four ranks recorded by a rule of this test (cluster "synthetic", so it
# never mixes with the demo's series): rank 3 arrives 80 ms after the others, every rank
# runs 10 collectives a second (the recording rules' names, CONTRACTS.md and rules/). The outlier and cost tools must find exactly that.
SYNTHETIC_COMM = "5e5e5e5e5e5e5e5e"
SYNTHETIC_LAGS = {0: 0.001, 1: 0.0012, 2: 0.0009, 3: 0.08}


def _series(expr: str, **labels: str) -> str:
    for name, value in labels.items():
        expr = f'label_replace({expr}, "{name}", "{value}", "", "")'
    return expr


# The demo job under the id a scheduler gives it (the demo exports no job_id): the NL layer
# must resolve "job 777" to the demo's communicator from Prometheus alone.
JOB_ID = "slurm:777"


def synthetic_rules(demo_comm: str) -> dict:
    common = {"cluster": "synthetic", "comm": SYNTHETIC_COMM}
    lags = " or ".join(_series(f"vector({lag})", rank=str(rank), node=f"syn-{rank // 2}", **common)
                       for rank, lag in SYNTHETIC_LAGS.items())
    rates = " or ".join(_series("vector(10)", rank=str(rank), node=f"syn-{rank // 2}", **common)
                        for rank in SYNTHETIC_LAGS)
    return {"groups": [{"name": "query-test-synthetic", "interval": "1s", "rules": [
        {"record": "comm_rank:fabric_nccl_arrival_lag_seconds:mean5m", "expr": lags},
        {"record": "comm_rank:fabric_nccl_collectives:rate1m", "expr": rates},
        {"record": "fabric_nccl_rank_info", "expr": _series("vector(1)", comm=demo_comm, rank="0", job_id=JOB_ID,
                                                             cluster="synthetic")}]}]}


class Live:
    def __init__(self, sidecar, keys, prom, comm, workdir) -> None:
        self.url, self.keys, self.prom, self.comm, self.workdir = sidecar.url, keys, prom, comm, workdir
        self.ca = str(sidecar.certs.ca)
        self.session = requests.Session()

    def call(self, method: str, path: str, key: str | None = "reader", **kwargs) -> requests.Response:
        headers = {**(bearer(self.keys[key]) if key else {}), **kwargs.pop("headers", {})}
        return self.session.request(method, self.url + path, headers=headers, verify=self.ca, timeout=30, **kwargs)

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in (self.workdir / "sidecar-audit.log").read_text().splitlines()]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    procs.require_binary("prometheus")
    work = tmp_path_factory.mktemp("query")
    keys = make_keys(work / "keys.yaml", {"bulk": "read", "bulk-writer": "write", "limited": "read"})
    # The hostile-input sweep sends ~700 requests: a key with room for them.
    text = (work / "keys.yaml").read_text()
    for key_id in ("bulk", "bulk-writer"):
        text = text.replace(f"- id: {key_id}\n", f"- id: {key_id}\n  rate_limit: {{per_second: 5000, burst: 5000}}\n")
    text = text.replace("- id: limited\n", "- id: limited\n  rate_limit: {per_second: 0.2, burst: 2}\n")
    (work / "keys.yaml").write_text(text)
    scenario = scenario_mod.load_scenario(SCENARIO)
    with cluster_mod.DemoCluster(scenario, work / "cluster") as cluster:
        targets = write_targets_file(work / "targets.json", cluster.targets, CLUSTER)
        synthetic = stack.write_yaml(work / "synthetic-rules.yml", synthetic_rules(job_comm(cluster.engine.cluster)))
        config = stack.prometheus_config(CLUSTER, targets, "127.0.0.1:1", [*stack.rule_files(), synthetic],
                                         scrape_interval="1s", evaluation_interval="1s")
        with procs.prometheus(config, work / "prom") as prom:
            for fault in ('fabric_infiniband_port_state{state="DOWN"}', "fabric_nvlink_state == 0"):
                procs.wait_for(lambda: prom.get("/api/v1/query", query=fault)["data"]["result"], 60,
                               f"{fault} in Prometheus")
            # The chaos tools run on the sidecar's topology: the demo's two hosts in a fat tree.
            inventory = stack.write_yaml(work / "cluster.yaml", {
                "name": CLUSTER, "generate": {"hosts": 2, "gpus_per_host": 2, "rails": 2,
                                             "host_prefix": "gpu-node-"}})
            sidecar = start_sidecar(work, "127.0.0.1", stack.free_port(), prom.url, work / "keys.yaml",
                                    extra_args=["--chaos-topology", str(inventory), "--chaos-refresh-seconds", "0"],
                                    env={"FABRICSCOPE_SIDECAR_CHAOS_SIMULATIONS_PER_MINUTE": "30"})
            try:
                yield Live(sidecar, keys, prom, job_comm(cluster.engine.cluster), work)
            finally:
                sidecar.stop()


def _meshql_forms(comm: str, leaf: str) -> list[str]:
    return [f'SHOW NEIGHBORS OF DEVICE "{leaf}"', f'SHOW IMPACT IF DEVICE "{leaf}" DOWN', "SHOW DEVICES",
            'SHOW DEVICES WHERE node = "gpu-node-1"', "SHOW SUMMARY", f'SHOW STRAGGLERS IN JOB "{comm}"',
            'SHOW HANGS ON NODE "gpu-node-0" LAST 10m', 'SHOW LATENCY OF HOST "gpu-node-0"',
            'SHOW LINKS WHERE state = "down"', f'SHOW COST OF STRAGGLERS IN JOB "{comm}"',
            'SHOW ALERTS SEVERITY "critical"']


def _leaf(live) -> str:
    devices = live.call("GET", "/graph/chaos-devices", params={"kind": "leaf_switch"}).json()["devices"]
    return devices[0]["name"]


def test_meshql_execute_false_and_true_agree_for_every_form(live):
    for statement in _meshql_forms(live.comm, _leaf(live)):
        parsed = live.call("POST", "/queries/meshql", json={"query": statement, "execute": False})
        assert parsed.status_code == 200, (statement, parsed.text)
        assert set(parsed.json()) == {"query_name", "params"}
        ran = live.call("POST", "/queries/meshql", key="writer", json={"query": statement, "execute": True})
        spec = default_registry().get(parsed.json()["query_name"])
        if spec.tool is not None and ran.status_code == 503:
            # A tool whose module is not in this sidecar says so; it never pretends.
            assert ran.json()["error"]["code"] == "tool_unavailable"
            continue
        assert ran.status_code == 200, (statement, ran.text)
        body = ran.json()
        assert (body["query_name"], body["params"]) == (parsed.json()["query_name"], parsed.json()["params"])
        assert isinstance(body["results"], list)
        # the same registered query through the tool endpoint gives the same series
        again = live.call("POST", f"/api/v1/tools/{body['query_name']}", key="writer", json=body["params"]).json()
        assert sorted(json.dumps(r["labels"], sort_keys=True) for r in again["results"]) == \
            sorted(json.dumps(r["labels"], sort_keys=True) for r in body["results"])


def test_live_answers_name_the_faults(live):
    down = live.call("POST", "/queries/meshql", json={"query": 'SHOW LINKS WHERE state = "down"'}).json()
    assert [(r["labels"]["node"], r["labels"]["device"]) for r in down["results"]] == [("gpu-node-1", "mlx5_1")]
    summary = {r["labels"]["item"]: r["value"] for r in
               live.call("POST", "/queries/meshql", json={"query": "SHOW SUMMARY"}).json()["results"]}
    assert summary["nodes_up"] == 2 and summary["gpus"] == 4 and summary["ib_ports_not_active"] >= 1
    history = live.call("POST", "/api/v1/tools/event_history", json={"host": "gpu-node-1", "window": "1h"})
    assert history.status_code == 200 and isinstance(history.json()["results"], list)
    nvlinks = live.call("POST", "/api/v1/tools/nvlink_links_down", json={}).json()["results"]
    assert [(r["labels"]["node"], r["labels"]["gpu"], r["labels"]["link"]) for r in nvlinks] == [("gpu-node-0", "1", "0")]



def test_nvlink_questions_answer_what_every_links_state_answers(live):
    """nvlink_links_down and the summary's nvlinks_down read the exporter's per-GPU counts of
    inactive links instead of every link's state: the same rows and the same count as the
    per-link queries they replace, with a link down and where none is."""
    def asked_directly(promql: str) -> list[dict]:
        return live.prom.get("/api/v1/query", query=promql)["data"]["result"]

    def rows(results: list[dict]) -> list[str]:
        return sorted(json.dumps({k: v for k, v in r.items() if k != "__name__"}, sort_keys=True) for r in results)

    answered = []
    for params, selector in (({}, ""), ({"host": "gpu-node-0"}, 'node="gpu-node-0"'),
                             ({"host": "gpu-node-0", "gpu": 1}, 'node="gpu-node-0", gpu="1"'),
                             ({"gpu": 0}, 'gpu="0"'), ({"host": "gpu-node-1"}, 'node="gpu-node-1"'),
                             ({"cluster": CLUSTER}, f'cluster="{CLUSTER}"'), ({"cluster": "elsewhere"}, 'cluster="elsewhere"')):
        got = live.call("POST", "/api/v1/tools/nvlink_links_down", json=params).json()["results"]
        per_link = asked_directly(f"fabric_nvlink_state{{{selector}}} == 0")
        assert rows([r["labels"] for r in got]) == rows([r["metric"] for r in per_link]), params
        assert [r["value"] for r in got] == [0] * len(per_link)
        answered.append(len(got))
    assert answered == [1, 1, 1, 0, 0, 1, 0]
    summary = {r["labels"]["item"]: r["value"]
               for r in live.call("POST", "/api/v1/tools/fleet_summary", json={}).json()["results"]}
    assert summary["nvlinks_down"] == len(asked_directly("fabric_nvlink_state == 0")) == 1

def test_hang_questions_find_the_hang(live):
    def culprits():
        body = live.call("POST", "/ai/query/conversation", json={"message": "which rank is causing the nccl hang?"})
        return body.json()["results"] if body.status_code == 200 else None
    found = procs.wait_for(lambda: [r for r in culprits() or [] if r["labels"]["rank"] == "1"], 90,
                           "rank 1 named as the hang's culprit")
    assert found[0]["labels"]["comm"] == live.comm and found[0]["labels"]["node"] == "gpu-node-0"
    hangs = procs.wait_for(lambda: live.call("POST", "/queries/meshql", json={"query": "SHOW HANGS LAST 10m"})
                           .json()["results"], 60, "SHOW HANGS")
    assert {r["labels"]["node"] for r in hangs} <= {"gpu-node-0", "gpu-node-1"} and hangs[0]["value"] >= 1
    # A window turns the instant question into its windowed variant, which finds the same hang.
    def hung_in_window():
        body = live.call("POST", "/ai/query/conversation", json={"message": "which ranks hung in the last 10 minutes"})
        assert body.status_code == 200 and body.json()["query_name"] == "nccl_ranks_hung_in_window", body.text
        return body.json()["results"]
    hung = procs.wait_for(hung_in_window, 60, "ranks hung in the last 10 minutes")
    assert {r["labels"]["comm"] for r in hung} == {live.comm} and all(r["value"] > 0 for r in hung)


def test_topology_tools_use_the_chaos_engine(live):
    leaf = _leaf(live)
    neighbours = live.call("POST", "/queries/meshql", json={"query": f'SHOW NEIGHBORS OF DEVICE "{leaf}"'}).json()
    assert any(r["labels"]["kind"] == "hca" for r in neighbours["results"])
    # Blast radius needs `write`, like POST /graph/chaos-simulate.
    refused = live.call("POST", "/queries/meshql", json={"query": f'SHOW IMPACT IF DEVICE "{leaf}" DOWN'})
    assert refused.status_code == 403 and refused.json()["error"]["detail"]["needs"] == "write"
    impact = live.call("POST", "/api/v1/tools/blast_radius_device", key="writer",
                       json={"device": leaf, "failure_type": "switch_failure"}).json()
    submitted = live.call("POST", "/graph/chaos-simulate", key="writer",
                          json={"device": leaf, "failure_type": "switch_failure"}).json()
    simulated = procs.wait_for(lambda: (lambda r: r.status_code == 200 and r.json())(
        live.call("GET", f"/graph/chaos-results/{submitted['simulation_id']}")), 30, "the chaos simulation")
    assert impact["summary"]["impact_score"] == simulated["impact_score"] > 0
    assert sorted(r["labels"]["device"] for r in impact["results"]) == sorted(simulated["affected_devices"])
    # NL knows the topology's names (here one that no name-shaped pattern would catch)
    pdu = live.call("GET", "/graph/chaos-devices", params={"kind": "pdu"}).json()["devices"][0]["name"]
    preview = live.call("GET", "/ai/query/parameters", params={"message": f"blast radius of a power failure at {pdu}"})
    assert (preview.json()["query_name"], preview.json()["params"]) == \
        ("blast_radius_device", {"device": pdu, "failure_type": "power_failure"})
    unknown = live.call("POST", "/api/v1/tools/device_neighbors", json={"device": "no-such-switch"})
    assert unknown.status_code == 422 and unknown.json()["error"]["detail"]["param"] == "device"


def test_straggler_outliers_and_cost(live):
    outliers = procs.wait_for(lambda: live.call("POST", "/api/v1/tools/straggler_outliers",
                                                json={"comm": SYNTHETIC_COMM}).json()["results"], 30, "outliers")
    assert [(r["labels"]["rank"], r["labels"]["node"]) for r in outliers] == [("3", "syn-1")]
    assert outliers[0]["value"] == 0.08 and outliers[0]["median_lag_seconds"] == pytest.approx(0.0011)
    # The same answer as the sidecar's own endpoint for the cluster question.
    direct = live.call("GET", "/api/v1/cluster/outlier-ranks", params={"comm": SYNTHETIC_COMM}).json()
    assert [o["rank"] for o in direct["outliers"]] == ["3"]
    cost = live.call("POST", "/queries/meshql", json={
        "query": f'SHOW COST OF STRAGGLERS IN JOB "{SYNTHETIC_COMM}"'}).json()
    (row,) = cost["results"]
    excess = SYNTHETIC_LAGS[3] - 0.0011
    idle = (len(SYNTHETIC_LAGS) - 1) * min(1.0, excess * 10)       # the others wait, 10 collectives/s
    assert row["labels"]["rank"] == "3" and row["idle_gpus"] == pytest.approx(idle, rel=1e-3)
    assert row["value"] == pytest.approx(idle * 2.0, rel=1e-3)               # default $2/GPU-hour
    assert cost["summary"]["dollars_in_window"] == pytest.approx(idle * 2.0, rel=1e-3)   # window 1h
    stricter = live.call("POST", "/api/v1/tools/straggler_outliers",
                         json={"comm": SYNTHETIC_COMM, "threshold": 50}).json()["results"]
    assert [r["labels"]["rank"] for r in stricter] == ["3"]       # 532 robust z-scores off


def test_row_cap_and_prometheus_evaluation_timeout(live):
    from types import SimpleNamespace

    from fabricscope.queryapi.prom import PrometheusClient, PrometheusError
    from fabricscope.queryapi.query import executor
    registry = default_registry()
    state = SimpleNamespace(prom=PrometheusClient(live.prom.url, timeout=10),
                            config=SimpleNamespace(prometheus_timeout_seconds=10))
    whole = executor.run(state, registry, "gpu_inventory", {})
    capped = executor.run(state, registry, "gpu_inventory", {}, max_rows=2)
    assert len(whole["results"]) == 4 and not whole["truncated"]
    assert capped["results"] == whole["results"][:2] and capped["truncated"]
    # Prometheus itself stops a query at the sidecar's timeout (its `timeout` parameter).
    state.config.prometheus_timeout_seconds = 0.001
    with pytest.raises(PrometheusError, match="timed out|timeout"):
        executor.run(state, registry, "nccl_hangs_by_node", {"window": "30d"})


def test_slo_and_correlation_questions_read_the_sidecar_store(live):
    # Wait for the hang's culprit (rank 1 on gpu-node-0): the correlator's anomaly there.
    procs.wait_for(lambda: live.prom.get("/api/v1/query", query='fabric_nccl_hang_culprit{node="gpu-node-0"} > 0')
                   ["data"]["result"], 90, "the hang culprit")
    spans = [seed_span("q-trace-1", "s1", 4000, ["gpu-node-0", "leaf-x"], service="chat-api"),
             seed_span("q-trace-2", "s2", 5000, ["gpu-node-0"], service="chat-api"),
             seed_span("q-trace-3", "s3", 100, ["gpu-node-1"], service="chat-api"),
             seed_span("q-trace-4", "s4", 3000, ["gpu-node-1"], service="search", operation="rank")]
    stored = live.call("POST", "/tracing/spans", key="writer", json={"spans": spans})
    assert stored.status_code == 200, stored.text
    answer = live.call("POST", "/ai/query/conversation",
                       json={"message": "which services violated their SLO in the last hour?"}).json()
    assert answer["query_name"] == "slo_violations"
    counts = {(r["labels"]["service"], r["labels"]["operation"]): r["value"] for r in answer["results"]}
    assert counts == {("chat-api", "generate"): 2, ("search", "rank"): 1}
    correlated = procs.wait_for(lambda: live.call("POST", "/api/v1/tools/network_correlations",
                                                  json={"service": "chat-api"}).json()["results"], 30,
                                "the correlator to match the slow chat-api spans")
    assert correlated[0]["labels"]["device"] == "gpu-node-0" and "NcclHangCulprit" in correlated[0]["anomalies"]
    assert correlated[0]["traces"] == 2


def test_meshql_errors_are_422_with_position(live):
    response = live.call("POST", "/queries/meshql", json={"query": 'SHOW LINKS WHERE colour = "red"'})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "meshql_syntax" and error["detail"]["position"] == 17
    assert "STATE" in error["detail"]["expected"]
    response = live.call("POST", "/queries/meshql", json={"query": 'SHOW LATENCY OF HOST "a\\" or vector(1)"'})
    assert response.status_code == 422 and response.json()["error"]["detail"]["param"] == "host"


def test_every_promql_template_is_valid_on_prometheus(live):
    registry = default_registry()
    benign = {"host": "gpu-node-0", "gpu": 1, "comm": live.comm, "device": "mlx5_1", "severity": "critical",
              "ip": "127.0.0.1", "service": "chat-api", "field": "role", "value": "compute", "rank": 1, "port": 1,
              "op": "AllReduce", "job": JOB_ID, "cluster": CLUSTER, "window": "10m"}
    for name, spec in registry.queries.items():
        if spec.promql is None:
            continue
        for params in ({}, {k: v for k, v in benign.items() if k in spec.params}):
            if any(p.required and n not in params for n, p in spec.params.items()):
                continue
            response = live.call("POST", f"/api/v1/tools/{name}", json=params)
            assert response.status_code == 200, (name, params, response.text)


@pytest.mark.parametrize("value", ['"', "\\", '"} or vector(1) #', "a\nb", "\x01\x7f\u2028", "ünï🔥", "$1 .* (?i)",
                                   "x" * 1000])
def test_escaped_literal_round_trips_through_prometheus(live, value):
    """Prometheus' own parser reads back exactly the value the escaping function wrote:
    absent() returns the equality matchers of its selector as labels, as parsed."""
    result = live.prom.get("/api/v1/query", query=f"absent(fabric_query_escaping_probe{{v={quote(value)}}})")
    assert [r["metric"].get("v") for r in result["data"]["result"]] == [value]


HOSTILE = ['"} or vector(1) #', "x\"}[5m]) or on() vector(1)", ".*", "\u0000", "🔥" * 300, "1e309", "-1"]


def test_hostile_input_in_every_parameter_over_http_is_refused_cleanly(live):
    registry = default_registry()
    for name, spec in registry.queries.items():
        for pname, pspec in spec.params.items():
            if pspec.type == "text":
                continue      # free text: rendered only inside its literal (test_query_escaping)
            for value in HOSTILE:
                response = live.call("POST", f"/api/v1/tools/{name}", key="bulk-writer", json={pname: value})
                if response.status_code == 200:
                    # a legitimate value of its type ("1e309" is a valid host name)
                    assert not any(c in value for c in '"{}()\\\0'), (name, pname, value)
                    continue
                assert response.status_code in (422, 503), (name, pname, value, response.text)
                if response.status_code == 503:     # accepted, but the tool is not in this sidecar
                    assert response.json()["error"]["code"] == "tool_unavailable"
                    continue
                assert response.json()["error"]["code"] == "invalid_params"
                assert response.json()["error"]["detail"]["param"] in (pname, *spec.params)


def test_nl_conversation_with_follow_up(live):
    first = live.call("POST", "/ai/query/conversation", json={"message": "which links are down on node-1?"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["query_name"], body["params"]) == ("links_by_state", {"state": "DOWN", "host": "gpu-node-1"})
    assert [r["labels"]["device"] for r in body["results"]] == ["mlx5_1"]
    second = live.call("POST", "/ai/query/conversation",
                       json={"message": "and for gpu-node-0?", "session_id": body["session_id"]}).json()
    assert second["follow_up"] and second["params"]["host"] == "gpu-node-0" and second["results"] == []
    assert second["session_id"] == body["session_id"] and second["turns"] == 2
    preview = live.call("GET", "/ai/query/parameters", params={"message": "p999 latency of gpu-node-1"}).json()
    assert (preview["query_name"], preview["params"]["quantile"]) == ("host_latency", 0.999)
    assert "results" not in preview


def test_open_and_protected_endpoints(live):
    assert live.call("GET", "/ai/query/catalog", key=None).status_code == 200
    assert live.call("GET", "/chat/status", key=None).json()["active"] is False
    for method, path in (("GET", "/api/v1/tools/list"), ("POST", "/api/v1/tools/fleet_summary"),
                         ("POST", "/queries/meshql"), ("GET", "/ai/query/parameters"),
                         ("POST", "/ai/query/conversation"), ("POST", "/mcp")):
        assert live.call(method, path, key=None, json={}).status_code == 401, path
    versions = live.call("GET", "/api/versions", key=None).json()
    assert {"mcp", "tools_endpoint", "meshql"} <= set(versions["capabilities"])


async def _mcp_session(live, coroutine):
    context = ssl.create_default_context(cafile=live.ca)
    async with httpx2.AsyncClient(headers=bearer(live.keys["reader"]), verify=context, timeout=30) as http:
        async with Client(streamable_http_client(live.url + "/mcp", http_client=http)) as client:
            return await coroutine(client)


def test_mcp_client_lists_and_calls_the_same_tools_as_http(live):
    async def session(client):
        listed = await client.list_tools()
        summary = await client.call_tool("fleet_summary", {})
        down = await client.call_tool("meshql", {"query": 'SHOW LINKS WHERE state = "down"'})
        bad = await client.call_tool("host_latency", {"host": '"} or vector(1)'})
        missing = await client.call_tool("no_such_tool", {})
        return listed, summary, down, bad, missing

    listed, summary, down, bad, missing = asyncio.run(_mcp_session(live, session))
    http_tools = live.call("GET", "/api/v1/tools/list").json()["tools"]
    assert sorted(t.name for t in listed.tools) == sorted(t["name"] for t in http_tools)
    by_name = {t["name"]: t for t in http_tools}
    assert all(t.input_schema == by_name[t.name]["inputSchema"] for t in listed.tools)

    http_down = live.call("POST", "/api/v1/tools/meshql", json={"query": 'SHOW LINKS WHERE state = "down"'}).json()
    assert not down.is_error
    assert {k: v for k, v in down.structured_content.items() if k != "results"} == \
        {k: v for k, v in http_down.items() if k != "results"}
    assert [r["labels"] for r in down.structured_content["results"]] == [r["labels"] for r in http_down["results"]]
    assert not summary.is_error and summary.structured_content["query_name"] == "fleet_summary"

    http_bad = live.call("POST", "/api/v1/tools/host_latency", json={"host": '"} or vector(1)'})
    assert bad.is_error and bad.structured_content == http_bad.json() and http_bad.status_code == 422
    http_missing = live.call("POST", "/api/v1/tools/no_such_tool", json={})
    assert missing.is_error and missing.structured_content == http_missing.json()

    tool_calls = [r for r in live.audit() if r.get("event") == "tool_call"]
    assert {("mcp", "fleet_summary"), ("http", "host_latency"), ("mcp", "host_latency")} <= \
        {(r["transport"], r["tool"]) for r in tool_calls}


def test_one_rate_limit_for_both_transports(live):
    """The limited key's burst of 2 is spent over HTTP; MCP is then refused the same way
    (429 before the tool runs), and the audit log shows both."""
    statuses = [live.call("POST", "/api/v1/tools/fleet_summary", key="limited", json={}).status_code
                for _ in range(2)]
    mcp = live.call("POST", "/mcp", key="limited", headers={"Accept": "application/json, text/event-stream"},
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "fleet_summary", "arguments": {}}})
    assert statuses == [200, 200] and mcp.status_code == 429 and mcp.headers["Retry-After"]
    assert mcp.json()["error"]["code"] == "rate_limited"
    audited = [(r["path"], r["status"]) for r in live.audit() if r["event"] == "request" and r["key_id"] == "limited"]
    assert ("/mcp", 429) in audited and audited.count(("/api/v1/tools/fleet_summary", 200)) == 2


def test_mcp_has_no_stream_to_get_or_session_to_delete(live):
    for method in ("GET", "DELETE"):
        started = time.monotonic()
        response = live.call(method, "/mcp", headers={"Accept": "text/event-stream"})
        assert response.status_code == 405 and time.monotonic() - started < 5


def test_mcp_without_a_valid_key_is_refused(live):
    response = live.call("POST", "/mcp", key=None, headers={"Authorization": "Bearer nope"},
                         json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert response.status_code == 401


def _cli(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "fabricscope.cli", "query", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_cli_against_the_sidecar_and_directly_against_prometheus(live):
    env = {"FABRICSCOPE_SIDECAR_URL": live.url, "FABRICSCOPE_API_KEY": live.keys["reader"],
           "FABRICSCOPE_CACERT": live.ca}
    via_sidecar = _cli("which links are down?", env=env)
    assert via_sidecar.returncode == 0, via_sidecar.stderr
    assert "query: links_by_state(state=DOWN)" in via_sidecar.stdout
    assert "gpu-node-1" in via_sidecar.stdout and "mlx5_1" in via_sidecar.stdout and "DEVICE" in via_sidecar.stdout
    direct = _cli('SHOW LINKS WHERE state = "down"', "--prometheus", live.prom.url)
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.splitlines()[0] == via_sidecar.stdout.splitlines()[0]
    assert "mlx5_1" in direct.stdout
    bad = _cli('SHOW LINKS WHERE colour = "x"', env=env)
    assert bad.returncode == 2 and "at position 17" in bad.stderr and "STATE" in bad.stderr
    session = re.search(r"^session: (\S+)", via_sidecar.stdout, re.M).group(1)
    follow_up = _cli("and on gpu-node-0?", "--session", session, env=env)
    assert "query: links_by_state(host=gpu-node-0, state=DOWN)" in follow_up.stdout, follow_up.stdout
    assert "(no results)" in follow_up.stdout
    no_key = _cli("which links are down?", env={**env, "FABRICSCOPE_API_KEY": ""})
    assert no_key.returncode == 2 and "API key" in no_key.stderr


def test_nl_resolves_entities_from_the_live_cluster_and_abstains_when_nothing_fits(live):
    """Names come from what the cluster knows: a job id from Prometheus (to its
    communicator), a service from the span store, a rack from the topology; a question no
    registered query answers runs nothing and names the nearest queries."""
    def ask(message):
        return live.call("GET", "/ai/query/parameters", params={"message": message}).json()

    # The vocabulary is cached for a minute: wait for one that has seen the job's series.
    job = procs.wait_for(lambda: (lambda a: a if a["params"].get("comm") else None)(
        ask("which ranks are hanging in job 777")), 75, "the job id in the NL vocabulary")
    assert (job["query_name"], job["params"]) == ("nccl_hanging_ranks", {"comm": live.comm})
    # The job filter through fabric_nccl_rank_info's job_id, run on Prometheus.
    placed = live.call("POST", "/ai/query/conversation", json={"message": "which nodes is job 777 running on"}).json()
    assert (placed["query_name"], placed["params"]) == ("job_ranks", {"job": JOB_ID})
    assert [(r["labels"]["job_id"], r["labels"]["comm"]) for r in placed["results"]] == [(JOB_ID, live.comm)]
    # A job Prometheus has no ranks of is named, never dropped into an unfiltered answer.
    unknown_job = ask("which ranks are hanging in job 778")
    assert unknown_job["query_name"] is None and "778" in unknown_job["unknown_names"]
    racks = sorted({d["rack"] for d in live.call("GET", "/graph/chaos-devices").json()["devices"] if d["rack"]})
    assert racks
    blast = ask(f"what if {racks[0]} fails")
    assert (blast["query_name"], blast["params"]) == ("blast_radius_device",
                                                      {"device": racks[0], "failure_type": "rack_failure"})
    # "search" is a service only because spans of it were stored (test_slo_and_correlation_...).
    service = procs.wait_for(lambda: (lambda a: a if a["params"].get("service") else None)(
        ask("is search meeting its latency objective")), 75, "the span store's services in the NL vocabulary")
    assert (service["query_name"], service["params"]["service"]) == ("slo_violations", "search")
    abstained = live.call("POST", "/ai/query/conversation", json={"message": "GPU temperature on gpu-node-0"}).json()
    assert abstained["query_name"] is None and abstained["abstained"] and "results" not in abstained
    assert "can't answer" in abstained["answer"] and "temperature" in abstained["unexplained"]
    # A device the topology does not know: named with the closest known names, nothing run.
    unknown = live.call("POST", "/ai/query/conversation", json={"message": "what is connected to leaf-su0-r99"})
    assert unknown.status_code == 200, unknown.text
    body = unknown.json()
    assert body["query_name"] is None and "results" not in body and "leaf-su0-r99" in body["unknown_names"]
    assert "'leaf-su0-r99' is not a name the cluster knows" in body["answer"]
