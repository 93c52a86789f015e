"""FabricTcpMicroburst on the real kernel: shaped links, real traffic, the exporter's eBPF
tcp program, Prometheus with the production rules (root; netns, veth, tbf).

Four cases and a control (below) run side by side, each on its own namespaces (tests/rtt_lab.py: client, router,
server, the queue in the router as in a switch) with its own exporter watching only them
(ebpf.tcp_rtt_network_namespaces), labelled node=<case>. Every case has a
request/response flow (64 bytes every 10 ms, TCP_NODELAY) across a 20 Mbit tbf; the
client logs every round trip it sees. Bulk flows run cubic, Linux's default:

- burst10x: an unpaced bulk flow fills the 80 ms queue from 6:00 to 7:30; the
  application's p99 rises 10x or more -> the alert fires within 30 s;
- burst2x: from 6:00 to 7:30, 600-byte messages 100 times a second through a tbf bucket
  of one packet: a request waits behind one message (0.24 ms) at most; the application's
  p99 must stay under 3x its baseline -> no alert;
- steady: a bulk flow fills the queue from the start to the end -> no alert;
- baseline: the request/response flow alone for 10 minutes -> no alert.

A fifth lab, `control`, is the baseline again and is judged by nothing: it tells host
from case. On this 2-vCPU VM every lab's excess p99 has risen together, from 0.1-0.25 ms
to 0.8-1.3 ms, for one to two minutes at a time with no traffic change (the host's own
softirq latency, which every socket on it sees), and the rule rightly read that as 3x
its average in the quiet cases. So each moment a case fires where it should not is held
against it unless the control's excess stood at HOST_RISE times its median within the
rule's 1-minute window; an alert the control does not share fails. A run whose control
was raised more than half the time fails: rises must stay the exception to excuse anything.

Recorded, not asserted: `paced2x`, a paced flow that raised the application's p99 1.7x
and 2.6x in two runs (a narrow band: see RECORDED_ONLY), and, where the host has bbr, `steady_bbr`, the
steady case under bbr.
bbr sizes its queue by its own probing, and the application sees it: on this VM 5-s
windows of p99 54 ms among 11 ms ones, which the rule (p99 over 3x its 5-minute
average) rightly reads as a burst once a baseline stands (docs/ebpf.md). Before the lab
pinned cubic, bulk flows ran the host's default (bbr here) through a queue in the sender's
own qdisc, and the steady case fired in two runs of two.

The recorded cases run only when FABRIC_RTT_REPORT asks for the figures: each lab is five
Python processes and an exporter, and on two cores fewer of them leave the host quieter.

The whole run takes about 10.5 minutes of wall time (the 10-minute baseline; the cases
share it) and little CPU: five small Python processes per case, five exporters and one
Prometheus. The figures (application RTT against the exporter's p99 per case) go to
<tmp>/rtt_microburst.json; FABRIC_RTT_REPORT=path writes them there too, for
bench/rtt_microburst_table.py (the table in docs/ebpf.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from bench.measure import percentile
from fabricscope.demo import stack
from fabricscope.exporter.bpf_loader.objects import object_path
from fabricscope.queryapi.query.params import duration_seconds
from tests import procs
from tests.conftest import could_not_run, free_port, require_tool
from tests.rtt_lab import BulkFlow, Lab, Shaping, wait_until
from tests.rtt_traffic import THINK_SECONDS

pytestmark = [pytest.mark.slow, pytest.mark.timing]

BURST_START, BURST_END = 360.0, 450.0     # after a 6-minute baseline: the rule's 5m average + 1m window
RUN_SECONDS = 600.0                       # the baseline case's 10 minutes
ALERT_WITHIN = 30.0
SCRAPE = "5s"
CONTROL = "control"                       # the baseline again, judged by nothing (see above)
HOST_RISE = 2.0                           # the control's excess over its own baseline median

CASES = {
    "burst10x": {"bulk": [BulkFlow(BURST_START, BURST_END)]},
    "burst2x": {"bulk": [BulkFlow(BURST_START, BURST_END, rate=60_000, chunk=600)],
                "shaping": Shaping(burst="1600")},
    "steady": {"bulk": [BulkFlow(0.0, RUN_SECONDS + 30)]},
    "baseline": {},
    CONTROL: {},
}
# Recorded (rtt_microburst.json, docs/ebpf.md), not asserted: what the rule does where the
# application's latency moves by a factor that is neither clearly under 3x nor far over it.
RECORDED_ONLY = {
    # A bulk flow paced to 30 kB/s (1.2% of the link): its packets leave in small bursts,
    # and a request behind one waits. The application's p99 moved 1.7x in one calibration
    # run and 2.5x at 35 kB/s (7x at 50 kB/s): p99 crosses from "rarely delayed" to
    # "delayed" in a narrow band, so this case lands either side of 3x.
    "paced2x": {"bulk": [BulkFlow(BURST_START, BURST_END, rate=30_000)], "shaping": Shaping(burst="1600")},
    # The steady case under bbr, where the host has it (docs/ebpf.md).
    "steady_bbr": {"bulk": [BulkFlow(0.0, RUN_SECONDS + 30, congestion_control="bbr")]},
}


def _cases() -> dict[str, dict]:
    if not os.environ.get("FABRIC_RTT_REPORT"):
        return dict(CASES)
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    recorded = {name: setup for name, setup in RECORDED_ONLY.items()
                if name != "steady_bbr" or "bbr" in available}
    return {**CASES, **recorded}


EXCESS_P99 = "node:fabric_tcp_rtt_excess_seconds:p99_1m"
SRTT_P99 = 'histogram_quantile(0.99, sum by (node, le) (rate(fabric_tcp_rtt_seconds_bucket[1m])))'


def _preconditions() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, tbf, eBPF)")
    for tool in ("ip", "tc"):
        require_tool(tool, "iproute2")
    if not object_path("tcp").is_file():
        could_not_run("exporter/bpf/tcp.bpf.o is not built (make bpf)")
    probe = subprocess.run(["ip", "netns", "add", "fsrtt-probe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "fsrtt-probe"], capture_output=True)
    if probe.returncode != 0:
        could_not_run(f"cannot create a network namespace: {probe.stderr.strip()}")


def _start_exporter(lab: Lab, workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    config = workdir / f"{lab.name}-exporter.yml"
    stack.write_yaml(config, {"ebpf": {"objects": ["tcp"], "tcp_rtt_network_namespaces": lab.namespaces}})
    log = open(workdir / f"{lab.name}-exporter.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricscope.cli", "exporter", f"--web.listen-address=127.0.0.1:{port}",
         f"--config.file={config}", f"--node-name={lab.name}", f"--path.state={workdir / lab.name}-state",
         "--collector.ebpf", "--no-collector.infiniband", "--no-collector.kmsg", "--no-collector.nccl",
         "--no-collector.netdev", "--no-collector.nvlink", "--no-collector.tcp"],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, port


def _wait_serving(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exporter exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except requests.ConnectionError:
            time.sleep(0.2)
            continue
        if 'fabric_ebpf_available{node' in body and 'reason="ok"' in body:
            return
        if "fabric_ebpf_available" in body:
            could_not_run(f"eBPF unavailable in the exporter:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    pytest.fail(f"exporter on :{port} not serving after 60 s:\n{log.read_text()[-2000:]}")


def _firing(prom: procs.Server) -> set[str]:
    alerts = prom.get("/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["node"] for a in alerts
            if a["labels"].get("alertname") == "FabricTcpMicroburst" and a["state"] == "firing"}


def _series(prom: procs.Server, query: str, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
    result = prom.get("/api/v1/query_range", query=query, start=start, end=end, step="5")["data"]["result"]
    return {r["metric"].get("node", ""): [(float(t), float(v)) for t, v in r["values"]] for r in result}


def _keep_firing_for(rules: list[Path]) -> float:
    """How long (seconds) the rendered FabricTcpMicroburst rules keep firing after their
    condition clears: the longest of its tiers."""
    held = [duration_seconds(rule.get("keep_firing_for", "0s"))
            for path in rules for group in yaml.safe_load(path.read_text()).get("groups", [])
            for rule in group["rules"] if rule.get("alert") == "FabricTcpMicroburst"]
    assert held, f"no FabricTcpMicroburst rule in {rules}"
    return max(held)


def _p99_over(points: list[tuple[float, float]], t0: float, since: float, until: float) -> float:
    """The largest p99_1m recorded in [since, until) seconds from t0 (seconds; nan if none)."""
    values = [v for t, v in points if since <= t - t0 < until and v == v]
    return max(values) if values else float("nan")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    _preconditions()
    workdir = tmp_path_factory.mktemp("rtt")
    rules = stack.render_rules({}, workdir / "rules")    # production rules, unchanged
    labs = [Lab(name, index, workdir, **setup) for index, (name, setup) in enumerate(_cases().items(), start=1)]
    exporters = []
    try:
        for lab in labs:
            lab.up()
        exporters = [_start_exporter(lab, workdir) for lab in labs]
        for lab, (proc, port) in zip(labs, exporters):
            _wait_serving(proc, port, workdir / f"{lab.name}-exporter.log")
        targets = workdir / "targets.json"
        targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}" for _, port in exporters],
                                        "labels": {"cluster": "rtt"}}]))
        config = stack.prometheus_config("rtt", targets, "127.0.0.1:9", rules,
                                         scrape_interval=SCRAPE, evaluation_interval=SCRAPE)
        with procs.prometheus(config, workdir / "prom") as prom:
            t0 = time.time() + 2
            for lab in labs:
                lab.start_traffic(t0)
            first_fired: dict[str, float] = {}
            fired_at: dict[str, list[float]] = {}      # every poll that found it firing
            while time.time() < t0 + RUN_SECONDS:
                for node in _firing(prom):
                    first_fired.setdefault(node, time.time() - t0)
                    fired_at.setdefault(node, []).append(round(time.time() - t0, 1))
                problems = [p for lab in labs for p in lab.problems()]
                assert not problems, problems
                wait_until(min(time.time() + 2, t0 + RUN_SECONDS))
            end = time.time()
            excess = _series(prom, EXCESS_P99, t0, end)
            srtt = _series(prom, SRTT_P99, t0, end)
        # The recorded series too, every 5 s from t0: what a changed rule would have seen.
        report = {"first_fired": first_fired, "fired_at": fired_at, "cases": {}, "t0": t0,
                  "keep_firing_for_s": _keep_firing_for(rules),
                  "series": {name: [(round(t - t0, 1), v) for t, v in points] for name, points in excess.items()}}
        for lab in labs:
            phases = {"baseline": (60.0, BURST_START), "burst": (BURST_START, BURST_END)}
            figures = {}
            for phase, (since, until) in phases.items():
                rtts = lab.app_rtts(since, until)
                figures[phase] = {
                    "app_round_trips": len(rtts),
                    "app_p50_s": percentile(rtts, 0.5), "app_p99_s": percentile(rtts, 0.99),
                    "excess_p99_max_s": _p99_over(excess.get(lab.name, []), t0, since, until),
                    "srtt_p99_max_s": _p99_over(srtt.get(lab.name, []), t0, since, until),
                }
            report["cases"][lab.name] = figures
        (workdir / "rtt_microburst.json").write_text(json.dumps(report, indent=1))
        if os.environ.get("FABRIC_RTT_REPORT"):
            Path(os.environ["FABRIC_RTT_REPORT"]).write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
        yield report
    finally:
        for proc, _port in exporters:
            proc.terminate()
        for proc, _port in exporters:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for lab in labs:
            lab.down()


def _app_ratio(case: dict) -> float:
    return case["burst"]["app_p99_s"] / case["baseline"]["app_p99_s"]


def test_a_burst_that_raises_application_latency_tenfold_alerts_within_30_s(run):
    case = run["cases"]["burst10x"]
    assert _app_ratio(case) >= 10, f"the burst did not raise the application's p99 10x: {case}"
    fired = [t for t in run["fired_at"].get("burst10x", []) if t >= BURST_START]
    assert fired, f"FabricTcpMicroburst never fired in the burst: {case}"
    assert fired[0] <= BURST_START + ALERT_WITHIN, f"fired at {fired[0]:.0f} s, burst at {BURST_START:.0f} s"
    # Before the burst it is a quiet case like the others; the alert may stay until the
    # burst is out of its 1-minute window, and then as long as the rule keeps it firing.
    _judge(run, "burst10x", expected=(BURST_START, BURST_END + 60.0))


def _quiet_level(points: list[tuple[float, float]]) -> float:
    """A lab's usual excess p99: the median of its series."""
    values = sorted(v for t, v in points if t >= 15.0 and v == v)
    return values[len(values) // 2] if values else float("nan")


def _host_rises(run: dict) -> list[float]:
    """The moments (seconds from the start) at which the control lab, whose traffic never
    changes, had its excess p99 at HOST_RISE times its quiet level or more."""
    points = run["series"].get(CONTROL, [])
    level = _quiet_level(points)
    return [t for t, v in points if v == v and v >= HOST_RISE * level]


def _judge(run: dict, case: str, expected: tuple[float, float] | None = None) -> None:
    """Every moment `case` was firing outside `expected` (seconds from the start) must be
    shared by the host: the control's excess had risen within the rule's 1-minute window
    (test_the_control_lab_tells_host_from_case holds those rises to half the run)."""
    rises = _host_rises(run)
    held = run["keep_firing_for_s"]
    outside = [t for t in run["fired_at"].get(case, [])
               if expected is None or not expected[0] <= t <= expected[1] + held]
    # What fires at t was seen in the 1-minute window before t, or held that much longer. A
    # host-wide stall reaches the control's series up to one scrape (its exporter is scraped
    # at another moment of the interval) and one evaluation (the p99 is recorded at the next)
    # after the case's: a CI run saw the case fire at 78.5 s and the control rise at 85 s.
    shared_after = 2 * duration_seconds(SCRAPE)
    unexplained = [t for t in outside if not any(t - 60.0 - held <= r <= t + shared_after for r in rises)]
    assert not unexplained, (
        f"FabricTcpMicroburst fired on {case} at {unexplained[0]:.0f} s (and {len(unexplained) - 1} more polls) "
        f"with no rise in the control lab; control rose at {rises}: {run['cases'][case]}")
    if outside:
        print(f"{case}: fired at {outside[0]:.0f}-{outside[-1]:.0f} s, each moment shared by the control lab "
              f"(the host's latency, not the case's)")


def test_the_control_lab_tells_host_from_case(run):
    """The judge itself: the control carried the baseline's traffic, and its series exists
    for the whole run (else every verdict on a quiet moment would rest on nothing)."""
    control = run["cases"][CONTROL]
    # One round trip per think time at most; half of that is plenty of traffic to judge by.
    possible = (BURST_START - 60.0) / THINK_SECONDS
    assert control["baseline"]["app_round_trips"] >= possible / 2, control
    recorded = [t for t, v in run["series"].get(CONTROL, []) if v == v]
    assert recorded and min(recorded) < 90 and max(recorded) > RUN_SECONDS - 30, recorded[:3]
    # Rises excuse quiet cases, so they must stay the exception: a signal that jitters
    # everywhere (a broken excess, a host always busy) fails here instead of excusing all.
    # Measured here: 15% and 30% of two runs.
    rises = _host_rises(run)
    assert len(rises) <= 0.5 * len(recorded), (
        f"the control lab's excess p99 stood at {HOST_RISE}x its median or more in {len(rises)} of "
        f"{len(recorded)} points: too noisy a run or signal to tell host from case: {control}")


def test_request_response_alone_for_ten_minutes_does_not_alert(run):
    _judge(run, "baseline")


def test_a_light_burst_that_leaves_application_latency_under_3x_does_not_alert(run):
    case = run["cases"]["burst2x"]
    # Against the control's own ratio over the same phases: a host-wide stall during the
    # burst raised every lab's application p99 (6.9x the control's, 9.2x the baseline's in
    # one run here), which is not the light burst's doing.
    host = max(1.0, _app_ratio(run["cases"][CONTROL]))
    assert _app_ratio(case) / host < 3, (
        f"the light burst raised the application's p99 3x or more beyond the control's {host:.1f}x: {case}")
    _judge(run, "burst2x")


def test_a_steady_bulk_flow_does_not_alert(run):
    case = run["cases"]["steady"]
    assert 1 / 1.5 <= _app_ratio(case) <= 1.5, f"the steady flow's application latency moved: {case}"
    _judge(run, "steady")
