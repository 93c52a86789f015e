"""Cluster questions over a real Prometheus: outlier ranks by median absolute deviation of
NCCL arrival lag, their dollar cost, and alert history.

Prometheus scrapes a small text exposition served over HTTP, with series
of the shape the NCCL rules record: `comm_rank:fabric_nccl_arrival_lag_seconds:mean5m` and
`comm_rank:fabric_nccl_collectives:rate1m` {cluster, node, comm, rank}, and evaluates two
test alerts on them for the event history. The same question on the demo cluster's real
straggler, through the NCCL rules themselves, is in test_sidecar_correlation.py."""
from __future__ import annotations

import time

import pytest
import requests

from fabricscope.demo import stack
from fabricscope.demo.main import write_targets_file
from fabricscope.httpserver import HttpServer, respond
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys

pytestmark = pytest.mark.slow

CLUSTER = "c1"
# comm "job-a": rank 5 is 80 ms late into every collective, rank 2 a milder 12 ms.
LAGS = {"job-a": [0.001, 0.002, 0.012, 0.0015, 0.002, 0.080, 0.001, 0.0025],
        "job-b": [0.001, 0.0012, 0.0011, 0.0013]}
CALLS_PER_SECOND = 10.0
JOBS = {"job-a": "pretrain-70b", "job-b": "finetune-8b"}
WINDOW = 10          # seconds: the cost window the tests ask for
RULES = {"groups": [{"name": "test", "interval": "1s", "rules": [
    {"alert": "TestSlowRank", "expr": "comm_rank:fabric_nccl_arrival_lag_seconds:mean5m > 0.05",
     "labels": {"severity": "warning"}},
    {"alert": "TestOpAlert", "expr": 'comm_rank:fabric_nccl_arrival_lag_seconds:mean5m{rank="0",comm="job-b"} > 0',
     "labels": {"severity": "info", "op": "AllReduce"}}]}]}


def nccl_shaped_series(environ, start_response):
    """Text exposition of the recording rules' series. Served
    by hand: prometheus_client rewrites the colons of a recording-rule name."""
    lines = ["# TYPE comm_rank:fabric_nccl_arrival_lag_seconds:mean5m gauge",
             "# TYPE comm_rank:fabric_nccl_collectives:rate1m gauge", "# TYPE fabric_nccl_rank_info gauge"]
    for comm, lags in LAGS.items():
        for rank, value in enumerate(lags):
            labels = f'cluster="{CLUSTER}",node="gpu-node-{rank // 2}",comm="{comm}",rank="{rank}"'
            lines.append(f"comm_rank:fabric_nccl_arrival_lag_seconds:mean5m{{{labels}}} {value}")
            lines.append(f"comm_rank:fabric_nccl_collectives:rate1m{{{labels}}} {CALLS_PER_SECOND}")
            lines.append(f'fabric_nccl_rank_info{{{labels},nranks="{len(lags)}",gpu="{rank % 2}",'
                         f'job_id="{JOBS[comm]}"}} 1')
    return respond(start_response, 200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    server = HttpServer(nccl_shaped_series, name="nccl-shaped-series").start()
    port = server.port
    try:
        targets = write_targets_file(work / "targets.json", [("gpu-node-0", f"127.0.0.1:{port}")], CLUSTER)
        rules = stack.write_yaml(work / "rules.yml", RULES)
        config = stack.prometheus_config(CLUSTER, targets, f"127.0.0.1:{stack.free_port()}", [rules],
                                         scrape_interval="1s", evaluation_interval="1s")
        with procs.prometheus(config, work / "prom") as prom:
            procs.wait_for(lambda: prom.get("/api/v1/query", query='ALERTS{alertname="TestSlowRank"}')
                           ["data"]["result"], 60, "scraped series and firing test alerts")
            keys = make_keys(work / "keys.yaml")
            process = start_sidecar(work, "127.0.0.1", stack.free_port(), prom.url, work / "keys.yaml",
                                    extra_args=["--gpu-hour-rates", "default=2,h100=4"])
            try:
                def get(path, expect=200, **params):
                    response = requests.get(process.url + path, params=params, headers=bearer(keys["reader"]),
                                            verify=str(process.certs.ca), timeout=15)
                    assert response.status_code == expect, response.text
                    return response.json()
                get.prom_url, get.exposition_url = prom.url, f"http://127.0.0.1:{port}"
                yield get
            finally:
                process.stop()
    finally:
        server.stop()


def test_outlier_ranks_are_the_mad_outliers_slowest_first(sidecar):
    answer = sidecar("/api/v1/cluster/outlier-ranks")
    assert answer["signal"] == "comm_rank:fabric_nccl_arrival_lag_seconds:mean5m"
    found = [(o["comm"], o["rank"]) for o in answer["outliers"]]
    assert found == [("job-a", "5"), ("job-a", "2")]          # job-b's ranks arrive together
    slowest = answer["outliers"][0]
    assert slowest["node"] == "gpu-node-2" and slowest["nranks"] == 8
    assert slowest["median_lag_seconds"] == pytest.approx(0.002)
    assert slowest["mad_seconds"] == pytest.approx(0.00075)
    assert slowest["score"] == pytest.approx(0.078 / (1.4826 * 0.00075), rel=1e-6)


def test_the_threshold_and_filters_narrow_the_answer(sidecar):
    strict = sidecar("/api/v1/cluster/outlier-ranks", threshold=20)
    assert [o["rank"] for o in strict["outliers"]] == ["5"]
    assert sidecar("/api/v1/cluster/outlier-ranks", comm="job-b")["outliers"] == []
    assert sidecar("/api/v1/cluster/outlier-ranks", cluster="elsewhere")["outliers"] == []
    # By job: the communicators with a rank of that job (fabric_nccl_rank_info).
    assert [o["rank"] for o in sidecar("/api/v1/cluster/outlier-ranks", job="pretrain-70b")["outliers"]] == ["5", "2"]
    assert sidecar("/api/v1/cluster/outlier-ranks", job="finetune-8b")["outliers"] == []
    # A hostile label value is a matcher value, never query text.
    assert sidecar("/api/v1/cluster/outlier-ranks", comm='job-a"} or vector(1) #')["outliers"] == []


def test_cost_is_lag_times_collective_rate_times_idle_gpus_times_the_rate_table(sidecar):
    answer = sidecar("/api/v1/cluster/cost", rate_class="h100", window_seconds=WINDOW)
    assert answer["dollars_per_gpu_hour"] == 4.0
    by_rank = {r["rank"]: r for r in answer["ranks"]}
    slow = by_rank["5"]
    assert slow["collectives_per_second"] == pytest.approx(CALLS_PER_SECOND)
    # 78 ms late x ~10 collectives/s: the 7 other GPUs wait ~78% of the time.
    expected_per_hour = 7 * min(1.0, 0.078 * slow["collectives_per_second"]) * 4.0
    assert slow["dollars_per_hour"] == pytest.approx(expected_per_hour, rel=1e-6)
    assert slow["dollars_in_window"] == pytest.approx(expected_per_hour * WINDOW / 3600, rel=1e-6)
    assert answer["dollars_per_hour"] == pytest.approx(sum(r["dollars_per_hour"] for r in answer["ranks"]))
    default = sidecar("/api/v1/cluster/cost", window_seconds=WINDOW)
    assert default["dollars_per_hour"] == pytest.approx(answer["dollars_per_hour"] / 2)
    error = sidecar("/api/v1/cluster/cost", expect=422, rate_class="tpu")["error"]
    assert error["code"] == "unknown_rate_class" and error["detail"]["known"] == ["default", "h100"]


def test_event_history_filters_by_rank_node_op_and_window(sidecar):
    events = sidecar("/api/v1/cluster/events", rank="5")["events"]
    assert [(e["alertname"], e["labels"]["node"], e["end"]) for e in events] == [("TestSlowRank", "gpu-node-2", None)]
    assert sidecar("/api/v1/cluster/events", rank="1")["events"] == []
    assert [e["alertname"] for e in sidecar("/api/v1/cluster/events", op="AllReduce")["events"]] == ["TestOpAlert"]
    assert {e["alertname"] for e in sidecar("/api/v1/cluster/events", node="gpu-node-0")["events"]} == {"TestOpAlert"}
    long_ago = time.time() - 7 * 86400
    assert sidecar("/api/v1/cluster/events", start=long_ago, end=long_ago + 3600)["events"] == []
    assert sidecar("/api/v1/cluster/events", expect=422, start=10, end=5)["error"]["code"] == "bad_time_window"


def test_the_prometheus_client_speaks_the_whole_http_api(sidecar):
    from fabricscope.queryapi.prom import PrometheusClient, PrometheusError

    prom = PrometheusClient(sidecar.prom_url, timeout=5)
    series = prom.series(['comm_rank:fabric_nccl_arrival_lag_seconds:mean5m{comm="job-b"}'])
    assert sorted(s["rank"] for s in series) == ["0", "1", "2", "3"]
    assert prom.label_values("comm", ["comm_rank:fabric_nccl_arrival_lag_seconds:mean5m"]) == ["job-a", "job-b"]
    now = time.time()
    (matrix,) = prom.query_range('comm_rank:fabric_nccl_arrival_lag_seconds:mean5m{comm="job-a",rank="5"}',
                                 now - 5, now, 1)
    assert matrix["values"] and all(v == 0.08 for _, v in matrix["values"])
    with pytest.raises(PrometheusError) as refused:
        prom.query("sum(")
    assert refused.value.reason == "query_error"
    # Something that is not a Prometheus API answers HTTP but not its JSON.
    with pytest.raises(PrometheusError) as garbage:
        PrometheusClient(sidecar.exposition_url, timeout=5).query("up")
    assert garbage.value.reason == "bad_response"
