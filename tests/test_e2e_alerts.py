"""End to end, on real components: demo cluster → real Prometheus with the rules → real
Alertmanager → webhook.

One scenario runs once for the module: a healthy phase, then a link flap, a port that
stays down, a microburst, a straggler rank and an NCCL hang on different nodes and
targets. The rules are rendered
with shortened `for:` durations, windows and group intervals (so the run takes minutes,
not hours); Prometheus scrapes and evaluates every second; Alertmanager groups with 1s
waits and posts to a receiver in this process. Each test then checks one promise:

- nothing fires while the cluster is healthy (Prometheus ALERTS and the webhook log);
- each fault produces its alert at the webhook with the right labels;
- a down port's counter alert is inhibited by its port-down alert (real inhibition);
- no alert names a node, port or communicator that no fault touched.

Time-to-detect (fault start → notification received) is printed per fault and written to
<tmp>/time_to_detect.json (`pytest -s tests/test_e2e_alerts.py` shows it).
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fabricscope.demo import stack
from tests import procs

pytestmark = pytest.mark.slow

CLUSTER = "e2e"
NODES = 4
GPUS_PER_NODE = 2
HCAS_PER_NODE = 2
HEALTHY_SECONDS = 60          # long enough for rate windows and rolling averages to fill

# Faults on distinct nodes/targets. The straggler comes before the hang and ends before
# it, because a hang on the job's communicator (rightly) inhibits straggler alerts on it.
LINK_FLAP = {"kind": "link_flap", "node": 1, "at": HEALTHY_SECONDS, "target": {"device": "mlx5_1", "port": 1},
             "params": {"count": 3, "period_seconds": 6}}
MICROBURST = {"kind": "microburst", "node": 2, "at": HEALTHY_SECONDS, "duration": 40}
# Job-level faults (no node): every node's NCCL source sees them, as every rank of a real
# job would. Rank 7 lives on gpu-node-3, rank 1 on gpu-node-0.
STRAGGLER = {"kind": "straggler_rank", "at": HEALTHY_SECONDS, "duration": 60,
             "target": {"rank": 7}, "params": {"lag_seconds": 0.1}}
# A port that stays down: its link_downed counter breach (fatal) must be inhibited by the
# port-down alert while the port is down (alertmanager.yml), so `for:` below makes the
# port-down alert fire first.
LINK_DOWN = {"kind": "link_down", "node": 0, "at": HEALTHY_SECONDS, "duration": 60,
             "target": {"device": "mlx5_0", "port": 1}}
HANG = {"kind": "nccl_hang", "at": HEALTHY_SECONDS + 75, "duration": 60, "target": {"rank": 1}}
SCENARIO = {"seed": 11, "cluster": {"name": CLUSTER, "nodes": NODES, "gpus_per_node": GPUS_PER_NODE,
                                    "hcas_per_node": HCAS_PER_NODE},
            "tick_seconds": 0.5, "faults": [LINK_FLAP, LINK_DOWN, MICROBURST, STRAGGLER, HANG]}
END_SECONDS = HANG["at"] + HANG["duration"]
# After its fault starts, an alert has this long to reach the webhook.
DETECTION_DEADLINE = 90

# Production values shortened for a run of minutes; every key exists in
# rules/mixin/config.libsonnet (the renderer refuses unknown keys).
RULE_OVERRIDES = {
    "intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
    "windows": {"tcpBaseline": "40s", "ncclLag": "15s", "ncclNodeOffset": "30s", "ibFlap": "2m"},
    "for": {"ncclHang": "5s", "straggler": "10s", "ibPortDown": "5s", "ibFatalCounter": "20s",
            "exporterDown": "10s", "collectorFailing": "10s"},
}

# The exporters' p99 window shortened like the rules' windows (rendered with the same config).
EXPORTER_CONFIG = {"ebpf": {"window_seconds": {"fabric_tcp_rtt_excess_seconds": 10}}}


@dataclass
class Expected:
    fault: dict[str, Any]
    alertname: str
    labels: dict[str, str]                  # must be present with these values
    present: tuple[str, ...] = ()           # must be present, any value
    notes: str = ""


@dataclass
class Run:
    t0: float                               # wall time of scenario second 0
    comm: str                               # the simulated job's communicator label
    receiver: stack.WebhookReceiver
    prometheus: procs.Server
    alertmanager: procs.Server
    healthy_firing: list[dict] = field(default_factory=list)
    # Alertmanager's view of the down port's counter alert while the port was down.
    down_port_counter_alerts: list[dict] = field(default_factory=list)
    first_seen: dict[str, tuple[float, dict]] = field(default_factory=dict)
    report_path: Path | None = None

    def fault_time(self, fault: dict) -> float:
        return self.t0 + float(fault["at"])


def expectations(comm: str) -> list[Expected]:
    return [
        Expected(LINK_FLAP, "FabricInfinibandLinkFlap",
                 {"node": "gpu-node-1", "device": "mlx5_1", "port": "1", "cluster": CLUSTER}),
        Expected(LINK_DOWN, "FabricInfinibandPortDown",
                 {"node": "gpu-node-0", "device": "mlx5_0", "port": "1", "cluster": CLUSTER}),
        Expected(MICROBURST, "FabricTcpMicroburst", {"node": "gpu-node-2", "cluster": CLUSTER}),
        Expected(STRAGGLER, "FabricNcclStragglerRank",
                 {"rank": "7", "node": "gpu-node-3", "comm": comm, "cluster": CLUSTER}),
        # One alert for the communicator's culprit (on its node), however many ranks wait.
        Expected(HANG, "FabricNcclHang", {"comm": comm, "cluster": CLUSTER, "rank": str(HANG["target"]["rank"]),
                                          "node": f"gpu-node-{HANG['target']['rank'] // GPUS_PER_NODE}"}),
    ]


def fault_end(fault: dict, t0: float) -> float:
    return t0 + float(fault["at"]) + float(fault["duration"])


def on_port(labels: dict, fault: dict) -> bool:
    return (labels.get("node"), labels.get("device"), labels.get("port")) == \
        (f"gpu-node-{fault['node']}", fault["target"]["device"], str(fault["target"]["port"]))


def matches(alert: dict, expected: Expected) -> bool:
    labels = alert["labels"]
    return (labels.get("alertname") == expected.alertname
            and all(labels.get(k) == v for k, v in expected.labels.items())
            and all(labels.get(k) for k in expected.present))


# ----------------------------------------------------------------- the run

def render_fast_rules(out_dir: Path) -> list[Path]:
    """The committed mixin rendered with RULE_OVERRIDES by the rules' own helper
    (rules/render.py), then checked by promtool."""
    files = stack.render_rules(RULE_OVERRIDES, out_dir, EXPORTER_CONFIG)
    check = subprocess.run([procs.require_binary("promtool"), "check", "rules", *map(str, files)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"rules rendered with {RULE_OVERRIDES} do not pass promtool:\n{check.stdout}{check.stderr}"
    return files


def firing_alerts(prometheus: procs.Server) -> list[dict]:
    return [a for a in prometheus.get("/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    rules = render_fast_rules(work / "rules")
    with procs.demo_pipeline(SCENARIO, rules, work, CLUSTER, EXPORTER_CONFIG) as pipeline:
        receiver, am, prom, t0 = pipeline.receiver, pipeline.alertmanager, pipeline.prometheus, pipeline.t0
        cluster = pipeline.cluster
        result = Run(t0=t0, comm=job_comm(cluster.engine.cluster), receiver=receiver,
                     prometheus=prom, alertmanager=am)
        # Healthy phase: watch Prometheus itself, not only the webhook, so a
        # rule firing and a notification lost would both be caught.
        while time.time() < result.fault_time(LINK_FLAP) - 1:
            result.healthy_firing += firing_alerts(prom)
            time.sleep(1)
        wanted = expectations(result.comm)
        deadline = max(result.fault_time(e.fault) for e in wanted) + DETECTION_DEADLINE
        deadline = max(deadline, t0 + END_SECONDS)
        while time.time() < deadline:
            for expected in wanted:
                if expected.alertname not in result.first_seen:
                    for received_at, alert in receiver.alerts():
                        if alert["status"] == "firing" and matches(alert, expected):
                            result.first_seen[expected.alertname] = (received_at, alert)
                            break
            if "FabricInfinibandPortDown" in result.first_seen and time.time() < fault_end(LINK_DOWN, t0) - 2:
                result.down_port_counter_alerts += [
                    a for a in am.get("/api/v2/alerts")
                    if a["labels"].get("alertname") == "FabricInfinibandFatalCounterBreach"
                    and on_port(a["labels"], LINK_DOWN)]
            if len(result.first_seen) == len(wanted) and time.time() > t0 + END_SECONDS:
                break
            time.sleep(1)
        result.report_path = write_report(result, wanted, work)
        yield result


def job_comm(cluster_spec) -> str:
    """The communicator label the simulated job's ranks report."""
    from fabricscope.demo.sources.nccl import job_comm as comm_of

    return comm_of(cluster_spec)


def write_report(result: Run, wanted: list[Expected], work: Path) -> Path:
    report = {}
    for expected in wanted:
        seen = result.first_seen.get(expected.alertname)
        report[expected.fault["kind"]] = {
            "alertname": expected.alertname,
            "fault_start_seconds": expected.fault["at"],
            "time_to_detect_seconds": round(seen[0] - result.fault_time(expected.fault), 2) if seen else None,
            "labels": seen[1]["labels"] if seen else None,
        }
    path = work / "time_to_detect.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\ntime to detect (fault start -> webhook), written to {path}:")
    for kind, entry in report.items():
        ttd = entry["time_to_detect_seconds"]
        print(f"  {kind:<16} {entry['alertname']:<28} {'not detected' if ttd is None else f'{ttd:6.1f}s'}")
    return path


def iso_seconds(stamp: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds) as UNIX seconds."""
    import datetime as dt

    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(whole).replace(tzinfo=dt.timezone.utc).timestamp() + float(f"0.{fraction or 0}")


def healthy_phase_diagnostics(run: Run) -> str:
    """What the exporters themselves flagged during the healthy phase, to say which
    component raised a false alarm (a breached counter, a failing collector...)."""
    end = run.fault_time(LINK_FLAP) - 1
    window = f"{int(end - run.t0)}s"
    lines = []
    for query in (f"max_over_time(fabric_infiniband_port_counter_breached[{window}]) > 0",
                  f'increase(fabric_infiniband_port_health_events_total{{severity!="baseline"}}[{window}]) > 0',
                  f"min_over_time(fabric_scrape_collector_success[{window}]) == 0"):
        result = run.prometheus.get("/api/v1/query", query=query, time=end)["data"]["result"]
        lines.append(f"{query}: " + (", ".join(json.dumps(r["metric"], sort_keys=True) for r in result) or "none"))
    return "\n".join(lines)


# ----------------------------------------------------------------- the promises

def test_nothing_fires_while_the_cluster_is_healthy(run):
    assert run.healthy_firing == [], "alerts fired during the healthy phase:\n" + "\n".join(sorted({
        f"{json.dumps(a['labels'], sort_keys=True)} active since {a['activeAt']} "
        f"(scenario second {iso_seconds(a['activeAt']) - run.t0:.0f}): {a['annotations'].get('description', '')}"
        for a in run.healthy_firing})) + "\n" + healthy_phase_diagnostics(run)
    early = [alert for received_at, alert in run.receiver.alerts() if received_at < run.fault_time(LINK_FLAP)]
    assert early == [], f"notifications before the first fault: {early}"
    # Prometheus' own record agrees (ALERTS covers evaluations between our polls too).
    query = 'ALERTS{alertstate="firing"}'
    series = run.prometheus.get("/api/v1/query_range", query=query, start=run.t0,
                                end=run.fault_time(LINK_FLAP) - 1, step="1s")["data"]["result"]
    assert series == [], [s["metric"] for s in series]


@pytest.mark.parametrize("kind", ["link_flap", "link_down", "microburst", "straggler_rank", "nccl_hang"])
def test_fault_reaches_the_webhook_with_its_labels(run, kind):
    expected = next(e for e in expectations(run.comm) if e.fault["kind"] == kind)
    received = [alert["labels"] for _, alert in run.receiver.alerts() if alert["labels"].get("alertname") == expected.alertname]
    assert expected.alertname in run.first_seen, (
        f"{expected.alertname} for {kind} never reached the webhook within {DETECTION_DEADLINE}s; "
        f"{expected.alertname} notifications seen: {received}; report: {run.report_path}")
    _, alert = run.first_seen[expected.alertname]
    assert alert["labels"]["severity"] in {"critical", "warning"}


def test_hang_pages_once_for_the_communicator_and_names_the_stopped_rank(run):
    """A hang of one rank stalls the job: the stopped rank never enters the next collective
    while every other rank enters it and waits. One alert for the communicator's culprit,
    the rank that stopped (its sequence number is behind its peers'), on its node."""
    hangs = [alert for _, alert in run.receiver.alerts()
             if alert["labels"].get("alertname") == "FabricNcclHang" and alert["status"] == "firing"]
    if not hangs:
        pytest.fail("no FabricNcclHang notification (see test_fault_reaches_the_webhook_with_its_labels)")
    assert {(a["labels"]["cluster"], a["labels"]["comm"]) for a in hangs} == {(CLUSTER, run.comm)}
    rank = HANG["target"]["rank"]
    node = f"gpu-node-{rank // GPUS_PER_NODE}"
    assert {(a["labels"]["rank"], a["labels"]["node"]) for a in hangs} == {(str(rank), node)}
    assert {a["annotations"]["culprit"] for a in hangs} == {f"rank {rank} on {node} (not_entered)"}


def test_port_down_inhibits_the_counter_alerts_of_that_port(run):
    """While mlx5_0:1 of gpu-node-0 is down, its link_downed breach is firing in
    Alertmanager but inhibited by the port-down alert, so no one is paged twice."""
    if "FabricInfinibandPortDown" not in run.first_seen:
        pytest.fail("no FabricInfinibandPortDown notification (see test_fault_reaches_the_webhook_with_its_labels)")
    port_down = run.first_seen["FabricInfinibandPortDown"][1]
    seen = run.down_port_counter_alerts
    assert seen, ("FabricInfinibandFatalCounterBreach for the down port never reached Alertmanager while the "
                  "port was down (nothing to inhibit: is link_downed counted as a fatal breach?)")
    assert all(a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"] == [port_down["fingerprint"]]
               for a in seen), [a["status"] for a in seen]
    notified = [received_at - run.t0 for received_at, alert in run.receiver.alerts()
                if alert["labels"].get("alertname") == "FabricInfinibandFatalCounterBreach"
                and on_port(alert["labels"], LINK_DOWN) and received_at < fault_end(LINK_DOWN, run.t0)]
    assert notified == [], f"counter breach of the down port notified at scenario seconds {notified}"


def test_no_alert_names_a_target_no_fault_touched(run):
    faulted_nodes = {f"gpu-node-{f['node']}" for f in (LINK_FLAP, LINK_DOWN, MICROBURST)}
    stray = []
    for _, alert in run.receiver.alerts():
        labels = alert["labels"]
        if labels.get("comm"):
            ok = labels["comm"] == run.comm
        elif labels.get("device"):
            ok = on_port(labels, LINK_FLAP) or on_port(labels, LINK_DOWN)
        else:
            ok = labels.get("node") in faulted_nodes
        if not ok:
            stray.append(labels)
    assert stray == [], f"alerts about targets no fault touched: {stray}"
