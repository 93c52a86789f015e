"""Token-path correlation end to end, on real components: the demo cluster with a
microburst on one node → real Prometheus with the repository's rules (rendered with
short windows) → the sidecar, which correlates SLO-violating spans with the anomalies on
their network path. The same checks run with Debian's VictoriaMetrics (fed by
Prometheus' remote_write) as the sidecar's Prometheus-API backend. Spans also arrive
through the real OpenTelemetry SDK and its OTLP/HTTP exporter."""
from __future__ import annotations

import time
import uuid

import pytest
import requests

from fabricscope.demo import stack
from fabricscope.demo.main import write_targets_file
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys, seed_span

pytestmark = pytest.mark.slow

CLUSTER = "corr"
BURST_NODE = "gpu-node-1"
STRAGGLER_RANK = 3
HEALTHY_SECONDS = 30            # the microburst baseline (40s average, 10s back) must have data first
SCENARIO = {"seed": 5, "cluster": {"name": CLUSTER, "nodes": 3, "gpus_per_node": 2, "hcas_per_node": 1},
            "tick_seconds": 0.5,
            "faults": [{"kind": "microburst", "node": 1, "at": HEALTHY_SECONDS, "duration": 900},
                       # Rank 3 (gpu-node-1, GPU 1) enters every collective 80 ms late.
                       {"kind": "straggler_rank", "at": 1, "duration": 900, "target": {"rank": STRAGGLER_RANK},
                        "params": {"lag_seconds": 0.08}}]}
# The e2e test's shortened windows (every key exists in rules/mixin/config.libsonnet).
RULE_OVERRIDES = {
    "intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
    "windows": {"tcpBaseline": "40s"},
}
# The exporters' p99 window shortened like the rules' windows (rendered with the same config).
EXPORTER_CONFIG = {"ebpf": {"window_seconds": {"fabric_tcp_rtt_excess_seconds": 10}}}
BACKENDS = ["prometheus", "victoriametrics"]


class Sidecar:
    def __init__(self, process, keys) -> None:
        self.process = process
        self.url = process.url
        self.keys = keys
        self.ca = str(process.certs.ca)

    def get(self, path: str, **params):
        response = requests.get(self.url + path, params=params, headers=bearer(self.keys["reader"]),
                                verify=self.ca, timeout=15)
        response.raise_for_status()
        return response.json()

    def post_spans(self, spans: list[dict]) -> dict:
        response = requests.post(self.url + "/tracing/spans", json={"spans": spans},
                                 headers=bearer(self.keys["writer"]), verify=self.ca, timeout=15)
        response.raise_for_status()
        return response.json()

    def correlations_of(self, trace_id: str) -> list[dict]:
        """The trace's correlations once every violation has been evaluated."""
        def settled():
            answer = self.get("/tracing/correlations", trace_id=trace_id)
            return answer if answer["pending"] == 0 else None
        return procs.wait_for(settled, 30, f"correlation of {trace_id}")["correlations"]


@pytest.fixture(scope="module")
def cluster_and_backends(tmp_path_factory):
    from fabricscope.demo import cluster as cluster_mod, scenario as scenario_mod

    work = tmp_path_factory.mktemp("correlation")
    rules = stack.render_rules(RULE_OVERRIDES, work / "rules", EXPORTER_CONFIG)
    scenario = scenario_mod.load_scenario(SCENARIO)
    with procs.victoria_metrics(work / "vm") as vm, \
            cluster_mod.DemoCluster(scenario, work / "cluster", exporter_config=EXPORTER_CONFIG) as cluster:
        t0 = time.time() - cluster.now()
        targets = write_targets_file(work / "targets.json", cluster.targets, CLUSTER)
        # No Alertmanager here: ALERTS series are written by Prometheus' rule evaluation.
        config = stack.prometheus_config(CLUSTER, targets, f"127.0.0.1:{stack.free_port()}", rules,
                                         scrape_interval="1s", evaluation_interval="1s")
        config["remote_write"] = [{"url": f"{vm.url}/api/v1/write",
                                   "queue_config": {"batch_send_deadline": "1s"}}]
        with procs.prometheus(config, work / "prom") as prom:
            backends = {"prometheus": prom.url, "victoriametrics": vm.url}

            def burst_firing(url: str):
                result = requests.post(f"{url}/api/v1/query", data={
                    "query": f'ALERTS{{alertname="FabricTcpMicroburst",alertstate="firing",node="{BURST_NODE}"}}'},
                    timeout=5).json()
                return result["data"]["result"]

            time.sleep(max(0.0, t0 + HEALTHY_SECONDS - time.time()))
            for name, url in backends.items():
                procs.wait_for(lambda: burst_firing(url), 150, f"FabricTcpMicroburst on {BURST_NODE} in {name}")
            yield work, backends


@pytest.fixture(scope="module")
def sidecars(cluster_and_backends):
    work, backends = cluster_and_backends
    started = {}
    try:
        for name, url in backends.items():
            workdir = work / f"sidecar-{name}"
            workdir.mkdir()
            keys = make_keys(workdir / "keys.yaml")
            process = start_sidecar(workdir, "127.0.0.1", stack.free_port(), url, workdir / "keys.yaml",
                                    extra_args=["--prometheus-timeout", "5"])
            started[name] = Sidecar(process, keys)
        yield started
    finally:
        for sidecar in started.values():
            sidecar.process.stop()


def trace() -> str:
    return uuid.uuid4().hex


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_span_across_the_microburst_is_correlated_with_the_right_confidence(sidecars, backend):
    sidecar = sidecars[backend]
    cases = {  # path -> expected confidence (None: below 0.25, not kept)
        (BURST_NODE,): 1.0,
        (BURST_NODE, "ib-sw-01"): 0.5,
        ("gpu-node-0", "ib-sw-01", "ib-sw-02", BURST_NODE): 0.25,
        ("gpu-node-0", "ib-sw-01", "ib-sw-02", "ib-sw-03", BURST_NODE): None,
    }
    trace_ids = {path: trace() for path in cases}
    answer = sidecar.post_spans([seed_span(trace_ids[path], "s1", 2600, list(path)) for path in cases])
    assert answer["violations"] == len(cases) and answer["rejected"] == []
    for path, confidence in cases.items():
        found = sidecar.correlations_of(trace_ids[path])
        if confidence is None:
            assert found == [], f"{path}: 1/{len(path)} is below the 0.25 threshold"
            continue
        (correlation,) = found
        assert correlation["confidence"] == confidence
        assert correlation["matched_anomaly_count"] == 1 and correlation["path_length"] == len(path)
        kinds = {(a["device"], a["kind"]) for a in correlation["anomalies"]}
        assert (BURST_NODE, "FabricTcpMicroburst") in kinds
        assert {a["device"] for a in correlation["anomalies"]} == {BURST_NODE}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_healthy_path_gets_no_correlation(sidecars, backend):
    sidecar = sidecars[backend]
    slow_on_healthy, fast_on_burst = trace(), trace()
    sidecar.post_spans([seed_span(slow_on_healthy, "s1", 5000, ["gpu-node-0", "ib-sw-01", "gpu-node-2"]),
                        seed_span(fast_on_burst, "s1", 40, [BURST_NODE])])
    assert sidecar.correlations_of(slow_on_healthy) == []
    # Within its SLO: not a violation, so nothing to correlate even on the bad path.
    assert sidecar.correlations_of(fast_on_burst) == []
    violations = sidecar.get("/tracing/slo-violations")["violations"]
    assert slow_on_healthy in {v["trace_id"] for v in violations}
    assert fast_on_burst not in {v["trace_id"] for v in violations}


def test_violation_and_correlation_counts_are_exported(sidecars):
    sidecar = sidecars["prometheus"]
    sidecar.post_spans([seed_span(trace(), "m1", 3000, [BURST_NODE])])
    procs.wait_for(lambda: sidecar.get("/tracing/correlations")["pending"] == 0, 30, "correlations settled")
    text = requests.get(sidecar.url + "/metrics", verify=sidecar.ca, timeout=10).text
    assert 'fabric_sidecar_slo_violations_total{operation="generate",service="llm-inference"}' in text
    assert 'fabric_sidecar_correlations_total{operation="generate",service="llm-inference"}' in text
    assert "fabric_sidecar_spans_evaluated_total" in text


def test_the_opentelemetry_sdk_exporter_delivers_spans_that_are_stored_and_correlated(sidecars, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    sidecar = sidecars["prometheus"]
    # The exporter sets requests' session.verify to certificate_file, which these
    # variables (set on this machine) would override with the system bundle.
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    exporter = OTLPSpanExporter(endpoint=f"{sidecar.url}/v1/traces", certificate_file=sidecar.ca,
                                headers={"Authorization": f"Bearer {sidecar.keys['writer']}"})
    provider = TracerProvider(resource=Resource.create({"service.name": "llm-inference"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    start = time.time_ns() - 2_500_000_000
    slow = tracer.start_span("generate", start_time=start,
                             attributes={"network_path": [BURST_NODE, "ib-sw-01"], "model": "llama-3-70b"})
    slow.end(end_time=time.time_ns())
    fast = tracer.start_span("generate", attributes={"network_path": "gpu-node-0,ib-sw-01"})
    fast.end()
    provider.shutdown()
    trace_id = format(slow.get_span_context().trace_id, "032x")
    (correlation,) = sidecar.correlations_of(trace_id)
    assert correlation["confidence"] == 0.5 and correlation["service"] == "llm-inference"
    (violation,) = [v for v in sidecar.get("/tracing/slo-violations")["violations"] if v["trace_id"] == trace_id]
    assert violation["ingest_format"] == "otlp" and violation["attributes"]["model"] == "llama-3-70b"
    assert 2400 < violation["duration_ms"] < 2700
    fast_id = format(fast.get_span_context().trace_id, "032x")
    assert fast_id not in {v["trace_id"] for v in sidecar.get("/tracing/slo-violations")["violations"]}


def test_seed_read_api_views_the_same_cluster(sidecars):
    sidecar = sidecars["prometheus"]
    metrics = {m["host"]: m for m in sidecar.get("/ebpf/metrics")["metrics"]}
    assert set(metrics) == {"gpu-node-0", "gpu-node-1", "gpu-node-2"}
    assert metrics[BURST_NODE]["p99_us"] > 3 * metrics["gpu-node-0"]["p99_us"] > 0
    assert metrics["gpu-node-0"]["p50_us"] <= metrics["gpu-node-0"]["p99_us"]
    (only,) = sidecar.get("/ebpf/metrics", device="gpu-node-2")["metrics"]
    assert only["host"] == "gpu-node-2"
    events = sidecar.get("/ebpf/events")["events"]
    assert {(e["host"], e["type"]) for e in events} == {(BURST_NODE, "microburst")}
    edges = sidecar.get("/nvlink/edges")["edges"]
    assert edges and {e["source_device"] for e in edges} == set(metrics)
    assert all(e["link_state"] == "active" for e in edges)
    topology = sidecar.get("/nccl/topology/full")
    assert topology["nvlink_edges"] == edges
    assert {p["device"] for p in topology["infiniband_ports"]} == set(metrics)
    active = sidecar.get("/nccl/operations/active")
    assert active["culprits"] == [] and all(not o["hanging"] for o in active["operations"])


def test_the_demo_straggler_is_the_outlier_rank_through_the_nccl_rules(sidecars):
    # The cross-node join needs a minute of clock-offset history (the least offset over
    # 1m, docs/nccl.md) before the lag it corrects settles: up to about 75 s on this demo.
    sidecar = sidecars["prometheus"]
    answer = procs.wait_for(lambda: (lambda a: a if a["outliers"] else None)(
        sidecar.get("/api/v1/cluster/outlier-ranks")), 150, "an outlier rank from the demo's arrival lag")
    slowest = answer["outliers"][0]
    assert (slowest["rank"], slowest["node"], slowest["cluster"]) == (str(STRAGGLER_RANK), BURST_NODE, CLUSTER)
    assert [o["rank"] for o in answer["outliers"]] == [str(STRAGGLER_RANK)]
    assert slowest["excess_seconds"] > 0.02
    cost = sidecar.get("/api/v1/cluster/cost", window_seconds=60)
    (rank,) = cost["ranks"]
    assert rank["rank"] == str(STRAGGLER_RANK) and rank["collectives_per_second"] > 0
    assert cost["dollars_per_hour"] > 0
