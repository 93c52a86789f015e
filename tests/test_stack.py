"""`fabricscope stack`: config rendering, the local webhook receiver, clear failures, and
the whole stack (demo cluster, Prometheus, Alertmanager, sidecar) started as a user would
and stopped with SIGTERM."""
from __future__ import annotations

import datetime as dt
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import yaml

from fabricscope.demo.main import write_targets_file
from fabricscope.demo.scenario import load_scenario, parse_duration
from fabricscope.demo.topology import demo_job_name
from fabricscope import cli
from fabricscope.demo import stack
from tests import procs

REPO = Path(__file__).resolve().parent.parent
FABRICSCOPE = [sys.executable, "-m", "fabricscope.cli"]


# ----------------------------------------------------------------- config rendering

def test_alertmanager_config_points_webhooks_and_templates_and_overrides_timing(tmp_path):
    config = stack.alertmanager_config("http://127.0.0.1:1/hook",
                                       timing={"group_wait": "1s", "group_interval": "2s"})
    hooks = [hook["url"] for r in config["receivers"] for hook in r.get("webhook_configs") or []]
    assert hooks == ["http://127.0.0.1:1/hook"]
    assert config["templates"] == [str(REPO / "alertmanager" / "templates" / "*.tmpl")]
    routes = [config["route"], *config["route"]["routes"]]
    assert all(route.get("group_wait", "1s") == "1s" for route in routes)
    assert all(route.get("group_interval", "2s") == "2s" for route in routes)
    assert config["route"]["group_wait"] == "1s"
    # Values not overridden are kept as the repository config has them.
    original = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    assert config["route"]["repeat_interval"] == original["route"]["repeat_interval"]
    # The rendered copy is a valid config from another directory.
    path = stack.write_yaml(tmp_path / "am.yml", config)
    check = subprocess.run([procs.require_binary("amtool"), "check-config", str(path)],
                           capture_output=True, text=True)
    assert check.returncode == 0 and "- 1 templates" in check.stdout, check.stdout + check.stderr


def test_alertmanager_config_with_broken_base_file_names_it(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("route: [unclosed\n")
    with pytest.raises(stack.StackError, match="cannot read Alertmanager config .*broken.yml"):
        stack.alertmanager_config("http://x/", base_config=broken)
    not_am = tmp_path / "list.yml"
    not_am.write_text("- 1\n")
    with pytest.raises(stack.StackError, match="no top-level route"):
        stack.alertmanager_config("http://x/", base_config=not_am)


def test_prometheus_config_passes_promtool(tmp_path):
    targets = write_targets_file(tmp_path / "targets.json",
                                 [("gpu-node-0", "127.0.0.1:1"), ("gpu-node-1", "127.0.0.1:2")], "demo")
    assert json.loads(targets.read_text()) == [
        {"targets": ["127.0.0.1:1"], "labels": {"cluster": "demo", "node": "gpu-node-0"}},
        {"targets": ["127.0.0.1:2"], "labels": {"cluster": "demo", "node": "gpu-node-1"}}]
    config = stack.prometheus_config("demo", targets, "127.0.0.1:19093", stack.rule_files(), "1s", "1s",
                                     self_address="127.0.0.1:19090")
    assert config["global"]["external_labels"] == {"cluster": "demo"}
    assert config["scrape_configs"][0]["job_name"] == "fabricscope"
    # Prometheus scrapes itself so FabricRuleGroupIterationsMissed has its input.
    assert config["scrape_configs"][1] == {"job_name": "prometheus",
                                           "static_configs": [{"targets": ["127.0.0.1:19090"]}]}
    path = stack.write_yaml(tmp_path / "prometheus.yml", config)
    check = subprocess.run([procs.require_binary("promtool"), "check", "config", str(path)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_deploy_example_is_valid_and_scrapes_like_the_stack(tmp_path):
    example = REPO / "deploy" / "prometheus" / "prometheus.yml"
    check = subprocess.run([procs.require_binary("promtool"), "check", "config", str(example)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(example.read_text())
    generated = stack.prometheus_config("c", tmp_path / "t.json", "127.0.0.1:1", stack.rule_files())
    for key in ("job_name", "honor_labels"):
        assert config["scrape_configs"][0][key] == generated["scrape_configs"][0][key]
    assert set(config["global"]["external_labels"]) == set(generated["global"]["external_labels"])
    assert {Path(p).name for p in config["rule_files"]} == {p.name for p in stack.rule_files()}
    # The rules select the exporter by the job name both configs use.
    alerts = yaml.safe_load((REPO / "rules" / "fabricscope-alerts.yaml").read_text())
    exprs = [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    assert any(f'up{{job="{stack.SCRAPE_JOB}"}}' in expr for expr in exprs)


def test_fast_alert_overrides_render_and_keep_every_alert(tmp_path):
    committed = {p.name: p.read_text() for p in stack.rule_files()}
    assert committed, "no rendered rules in rules/*.yaml: run `make -C rules render`"
    fast = stack.render_rules(stack.FAST_ALERT_OVERRIDES, tmp_path)
    check = subprocess.run([procs.require_binary("promtool"), "check", "rules", *map(str, fast)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    def alerts(text: str) -> list[tuple[str, str]]:
        return [(rule["alert"], rule["labels"]["severity"]) for group in yaml.safe_load(text)["groups"]
                for rule in group["rules"] if "alert" in rule]

    for path in fast:
        assert alerts(path.read_text()) == alerts(committed[path.name])
    with pytest.raises(stack.StackError, match="unknown config key: for.noSuchAlert"):
        stack.render_rules({"for": {"noSuchAlert": "1s"}}, tmp_path / "bad")


# ----------------------------------------------------------------- webhook receiver

def test_webhook_receiver_records_alerts_and_rejects_bad_posts():
    seen = []
    with stack.WebhookReceiver(on_notification=seen.append) as receiver:
        payload = {"version": "4", "receiver": "sidecar", "status": "firing",
                   "alerts": [{"status": "firing", "labels": {"alertname": "FabricX", "node": "n1", "severity": "warning",
                                          "instance": "127.0.0.1:1", "job": "fabricscope"},
                               "annotations": {"summary": "it broke"}}]}
        assert requests.post(receiver.url, json=payload, timeout=5).status_code == 200
        bad = [requests.post(receiver.url, data=b"{not json", timeout=5),
               requests.post(receiver.url, json={"no": "alerts"}, timeout=5),
               requests.post(receiver.url.replace("/alerts/webhook", "/other"), json=payload, timeout=5),
               requests.post(receiver.url, data=b"", timeout=5)]
        assert [r.status_code for r in bad] == [400, 400, 400, 400]
        assert "not JSON" in bad[0].json()["error"]
        assert [alert["labels"]["alertname"] for _, alert in receiver.alerts()] == ["FabricX"]
        assert len(seen) == 1 and receiver.rejected == 3  # the wrong path is not counted as a payload
        line = stack.format_notification(seen[0])
        assert re.search(r"\[sidecar\] FIRING FabricX \(warning\) node=n1 - it broke$", line), line


# ----------------------------------------------------------------- failures

def run_stack(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # A free sidecar port: the default 19500 may be taken by a sidecar already running here.
    return subprocess.run([*FABRICSCOPE, "stack", *args, "--sidecar-port", "0"], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_missing_binary_says_run_make_setup():
    with pytest.raises(stack.StackError, match=r"prometheus-nonexistent not found .*make setup"):
        stack.find_binary("prometheus-nonexistent")


def test_taken_port_fails_clearly_and_starts_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_stack("--workdir", str(tmp_path), "--prometheus-port", str(port), "--alertmanager-port", "0")
    assert result.returncode == 2
    assert f"Prometheus port 127.0.0.1:{port} is already in use" in result.stderr
    assert "--prometheus-port" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "prometheus.yml").exists()


def test_bad_scenario_fails_clearly(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("faults: [{kind: no_such_fault, at: 1s}]\n")
    result = run_stack("--workdir", str(tmp_path), "--scenario", str(scenario),
                       "--prometheus-port", "0", "--alertmanager-port", "0")
    assert result.returncode == 2
    assert "scenario:" in result.stderr and "no_such_fault" in result.stderr
    assert "Traceback" not in result.stderr


def test_unusable_workdir_fails_clearly(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = run_stack("--workdir", str(blocker / "stack"), "--prometheus-port", "0", "--alertmanager-port", "0")
    assert result.returncode == 2
    assert f"Not a directory: {blocker / 'stack'}" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------- the whole stack

def drain(lines: "queue.Queue[str]") -> list[str]:
    drained = []
    while True:
        try:
            drained.append(lines.get_nowait())
        except queue.Empty:
            return drained


@pytest.mark.slow
def test_stack_runs_scrapes_every_node_loads_rules_and_stops_on_sigterm(tmp_path):
    procs.require_binary("prometheus")
    procs.require_binary("prometheus-alertmanager")
    scenario = tmp_path / "healthy.yaml"
    scenario.write_text(yaml.safe_dump({"seed": 1, "cluster": {"name": "stacktest", "nodes": 3,
                                                               "gpus_per_node": 2, "hcas_per_node": 2},
                                        "tick_seconds": 1, "faults": []}))
    child = start_stack_child("--workdir", str(tmp_path / "work"), "--scenario", str(scenario), "--nodes", "2",
                              "--scrape-interval", "1s")
    try:
        text = read_banner(child)
        assert child.poll() is None, text + child.stderr.read()
        prometheus_url = re.search(r"^Prometheus:\s+(http://\S+)", text, re.M).group(1)
        alertmanager_url = re.search(r"^Alertmanager:\s+(http://\S+)", text, re.M).group(1)
        assert "cluster 'stacktest', 2 nodes" in text
        assert re.search(r"gpu-node-0\s+http://127\.0\.0\.1:\d+/metrics", text)
        assert re.search(r"gpu-node-1\s+http://127\.0\.0\.1:\d+/metrics", text)

        def all_targets_up():
            targets = requests.get(f"{prometheus_url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            up = {(t["labels"]["node"], t["labels"]["cluster"]) for t in targets
                  if t["health"] == "up" and t["labels"]["job"] == stack.SCRAPE_JOB}
            return up == {("gpu-node-0", "stacktest"), ("gpu-node-1", "stacktest")}

        procs.wait_for(all_targets_up, 60, "Prometheus to scrape both simulated nodes")
        # The exporter's own node label is kept (honor_labels), not renamed to exported_node.
        result = requests.get(f"{prometheus_url}/api/v1/query", timeout=5,
                              params={"query": "count by (node) (fabric_exporter_build_info)"}).json()
        assert sorted(r["metric"]["node"] for r in result["data"]["result"]) == ["gpu-node-0", "gpu-node-1"]
        # Fast alerts by default: the mixin rendered into the workdir, same rules, shorter for:.
        groups = requests.get(f"{prometheus_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {Path(g["file"]).name for g in groups} == {p.name for p in stack.rule_files()}
        assert {Path(g["file"]).parent for g in groups} == {tmp_path / "work" / "rules"}
        durations = {r["name"]: r["duration"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
        assert durations["FabricNcclStragglerRank"] == 60
        assert "(fast alerts: shortened for: durations" in text and "--production-alerts loads them" in text
        am = requests.get(f"{alertmanager_url}/api/v2/status", timeout=5).json()
        assert am["cluster"]["status"] == "disabled"
        ams = requests.get(f"{prometheus_url}/api/v1/alertmanagers", timeout=5).json()["data"]["activeAlertmanagers"]
        assert [a["url"] for a in ams] == [f"{alertmanager_url}/api/v2/alerts"]
        # The report command the banner prints draws this very stack's fleet and tracing
        # dashboards (the latter partly from the sidecar).
        report_command = shlex.split(re.search(r"^\s+(\S*fabricscope report .*)$", text, re.M).group(1))
        assert Path(report_command[0]).name == "fabricscope" and os.access(report_command[0], os.X_OK)
        assert report_command[report_command.index("--prometheus-url") + 1] == prometheus_url
        assert cli.main([*report_command[1:], "--dashboard", "fleet", "--dashboard", "tracing"]) == 0
        assert (tmp_path / "work" / "report" / "index.html").exists()

        # The sidecar: TLS with the demo CA; the printed curl example works as written.
        curl = shlex.split(re.search(r"^\s+try:\s+(curl .*)$", text, re.M).group(1))
        answer = subprocess.run(curl, capture_output=True, text=True, timeout=30)
        assert answer.returncode == 0 and "correlations" in json.loads(answer.stdout), answer.stdout + answer.stderr
        sidecar_url = re.search(r"^Sidecar:\s+(https://\S+)", text, re.M).group(1)
        ca = curl[curl.index("--cacert") + 1]
        # The two example questions answer from the live demo data, as printed.
        asks = [shlex.split(command) for command in re.findall(r"^\s+(curl .*/(?:ai/query/conversation|"
                                                                r"queries/meshql))$", text, re.M)]
        assert len(asks) == 2, text

        def answered(command):
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
            body = json.loads(result.stdout) if result.returncode == 0 else {}
            return body if [r for r in body.get("results", []) if r.get("value") is not None] else None
        latency = procs.wait_for(lambda: answered(asks[0]), 60, "the p99 latency example to answer")
        assert latency["query_name"] == "host_latency" and latency["params"]["host"] == "gpu-node-1"
        summary = {r["labels"]["item"]: r["value"] for r in answered(asks[1])["results"]}
        assert summary["nodes_up"] == 2 and summary["gpus"] == 4
        # The chaos example as printed: a demo leaf switch's failure names the demo job it cuts.
        job = demo_job_name(load_scenario(scenario))
        submit, result_command = re.findall(r"^\s+(curl .*/graph/chaos-(?:simulate|results/SIMULATION_ID))$", text, re.M)
        submitted = subprocess.run(shlex.split(submit), capture_output=True, text=True, timeout=30)
        simulation_id = json.loads(submitted.stdout)["simulation_id"]
        result_command = shlex.split(result_command.replace("SIMULATION_ID", simulation_id))

        def simulated():
            body = json.loads(subprocess.run(result_command, capture_output=True, text=True, timeout=30).stdout)
            return body if body.get("status") == "complete" else None
        blast = procs.wait_for(simulated, 30, "the printed chaos simulation to complete")
        assert blast["device"] == "leaf-su0-r1" and blast["affected_jobs"] == [job]
        assert blast["disconnected_devices"]["gpu-node-0/gpu1"] == ["compute"]
        # The stack feeds it synthetic spans.
        procs.wait_for(lambda: "fabric_sidecar_spans_received_total{format=\"seed\"}" in
                       requests.get(f"{sidecar_url}/metrics", verify=ca, timeout=5).text, 30,
                       "synthetic spans at the sidecar")

        # Alertmanager -> the sidecar's webhook (TLS, API key) -> one printed line per alert.
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()
        now = dt.datetime.now(dt.timezone.utc)
        requests.post(f"{alertmanager_url}/api/v2/alerts", timeout=5, json=[{
            "labels": {"alertname": "FabricStackSmoke", "severity": "critical", "cluster": "stacktest",
                       "node": "gpu-node-1"},
            "annotations": {"summary": "posted by the test"},
            "startsAt": now.isoformat(), "endsAt": (now + dt.timedelta(minutes=5)).isoformat()}]).raise_for_status()
        # The sidecar may hear of the alert from Alertmanager's API (its reconciliation) before
        # the notification: that line says it is held; the notification's line names the receiver.
        notified = re.compile(r"\[fabricscope-sidecar\] FIRING FabricStackSmoke \(critical\) cluster=stacktest "
                              r"node=gpu-node-1 - posted by the test$")
        printed = procs.wait_for(lambda: next((line for line in drain(lines) if notified.search(line.rstrip())), None),
                                 60, "the stack to print the notification")
        assert printed
        assert "FabricStackSmoke" in (tmp_path / "work" / "notifications.log").read_text()
        # The critical alert names gpu-node-1: the sidecar attaches that host's blast radius.
        key = curl[curl.index("-H") + 1].split()[-1]

        def enriched():
            found = requests.get(f"{sidecar_url}/graph/chaos-alerts", verify=ca, timeout=5,
                                 headers={"Authorization": f"Bearer {key}"}).json()["alerts"]
            return next((a["blast_radius"] for a in found if a["alertname"] == "FabricStackSmoke"
                         and a["blast_radius"]), None)
        radius = procs.wait_for(enriched, 30, "the alert's blast radius")
        assert radius["device"] == "gpu-node-1" and radius["affected_jobs"] == [job]

        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == 0, child.stderr.read()
        assert "fabricscope stack: stopped" in child.stderr.read()
        for url in (prometheus_url, alertmanager_url):
            with pytest.raises(requests.ConnectionError):
                requests.get(f"{url}/-/ready", timeout=2)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{sidecar_url}/api/versions", verify=ca, timeout=2)
    finally:
        stop_child(child)


def start_stack_child(*args: str) -> subprocess.Popen:
    """`fabricscope stack` as a user runs it, on ports chosen free at start."""
    return subprocess.Popen([*FABRICSCOPE, "stack", *args, "--prometheus-port", "0", "--alertmanager-port", "0",
                             "--sidecar-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def read_banner(child: subprocess.Popen) -> str:
    """Its stdout up to the banner's last line (or to EOF, when it exits early)."""
    banner = []
    for line in child.stdout:
        banner.append(line)
        if line.startswith("Ctrl-C stops everything"):
            break
    return "".join(banner)


def stop_child(child: subprocess.Popen) -> None:
    if child.poll() is None:
        # SIGTERM first: a SIGKILLed stack would leave its Prometheus and Alertmanager
        # (own sessions) running.
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@pytest.mark.slow
def test_stack_stops_everything_when_prometheus_dies(tmp_path):
    procs.require_binary("prometheus")
    procs.require_binary("prometheus-alertmanager")
    work = tmp_path / "work"
    child = start_stack_child("--workdir", str(work), "--nodes", "1")
    try:
        banner = read_banner(child)
        assert child.poll() is None, banner + child.stderr.read()
        prometheus = procs.child_pids_with_argument(f"--storage.tsdb.path={work / 'prometheus-data'}")
        alertmanager = procs.child_pids_with_argument(f"--storage.path={work / 'alertmanager-data'}")
        assert len(prometheus) == 1 and len(alertmanager) == 1
        os.kill(prometheus[0], signal.SIGKILL)
        assert child.wait(30) == 2
        stderr = child.stderr.read()
        assert "prometheus exited unexpectedly" in stderr and "fabricscope stack: stopped" in stderr
        # Alertmanager was stopped with the stack, not left behind.
        assert procs.child_pids_with_argument(f"--storage.path={work / 'alertmanager-data'}") == []
    finally:
        stop_child(child)


def test_fast_alerts_are_the_default_and_production_alerts_an_explicit_choice():
    import argparse

    from fabricscope.demo.stack.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).fast_alerts is True
    assert parser.parse_args(["--fast-alerts"]).fast_alerts is True
    assert parser.parse_args(["--production-alerts"]).fast_alerts is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--fast-alerts", "--production-alerts"])


# A window summed from per-evaluation records (the InfiniBand alert group's `:rise1m`,
# `:drops1m`) is rendered as the window less half the group's interval, so its range text
# follows the interval while the window it covers does not.
STEPPED_RANGE = re.compile(r"(sum_over_time\([a-z_:]+:(?:rise1m|drops1m)(?:\{[^}]*\})?)\[([0-9a-z.]+)\]")


def windows_of(expr: str, interval: str) -> tuple[str, list[float]]:
    """The expression with each stepped range replaced by a mark, and the windows those
    ranges cover (range + half the group interval), in order."""
    half_step = parse_duration(interval, "interval") / 2
    covered = [parse_duration(m.group(2), "range") + half_step for m in STEPPED_RANGE.finditer(expr)]
    return STEPPED_RANGE.sub(r"\1[W]", expr), covered


def test_fast_alert_overrides_render_and_keep_every_threshold(tmp_path):
    """The fast variant differs from production only in for: and group intervals:
    thresholds, windows (so every resolve bound), and the rule set, are the same."""
    def alerts(paths):
        return {r["alert"]: windows_of(r["expr"], g.get("interval", "1m")) for p in paths
                for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fast = alerts(stack.render_rules(stack.FAST_ALERT_OVERRIDES, tmp_path))
    production = alerts(stack.rule_files())
    assert fast.keys() == production.keys()
    changed = {name for name in fast if fast[name] != production[name]}
    assert changed == set()
    # The stepped windows are there to compare (an hour for the BER, 10 and 5 minutes for flaps).
    assert fast["FabricInfinibandPreFailureBER"][1] == [3600.0, 3600.0]
    assert sorted(set(fast["FabricInfinibandLinkFlap"][1])) == [300.0, 600.0]
