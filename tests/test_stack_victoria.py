"""`fabricscope stack --backend victoriametrics` end to end, started as a user runs it:
the demo's exporters scraped by vmagent into VictoriaMetrics, the fast-alert rules
evaluated by vmalert, a scripted port-down paging through the same Alertmanager into the
sidecar, whose questions are answered from VictoriaMetrics. About 90 s: the port goes down
15 s in, its alert holds 30 s (fast alerts), critical alerts wait 10 s in Alertmanager."""
from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests import procs

REPO = Path(__file__).resolve().parent.parent
FAULT = {"kind": "link_down", "node": 1, "at": "15s", "target": {"device": "mlx5_0", "port": 1}}
SCENARIO = {"seed": 5, "cluster": {"name": "vmstack", "nodes": 2, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 1, "faults": [FAULT]}
PAGE_DEADLINE = 150          # fault at 15 s + for: 30 s + evaluation, scrape and grouping waits, on a busy box


@pytest.mark.slow
def test_victoriametrics_backend_pages_a_scripted_fault_through_vmalert_and_alertmanager(tmp_path):
    for binary in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager"):
        procs.require_binary(binary)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    child, lines = start_victoria_stack(scenario, tmp_path / "work")
    try:
        banner = read_until(lines, "Ctrl-C stops everything", 120, child)
        started = time.monotonic()
        vm_url = re.search(r"^VictoriaMetrics:\s+(http://\S+)", banner, re.M).group(1)
        vmalert_url = re.search(r"^  vmalert:\s+(http://\S+)", banner, re.M).group(1)
        assert not re.search(r"^Prometheus:", banner, re.M)
        assert "(for vmalert without keep_firing_for" in banner

        # The page: the down port's critical alert, as Alertmanager's webhook (receiver
        # fabricscope-sidecar) delivered it to the sidecar, which the stack prints.
        # (Which alert pages for a down port is the rules' business: any critical one.)
        page = read_until(lines, "[fabricscope-sidecar] FIRING FabricInfiniband", PAGE_DEADLINE, child,
                          also="(critical)")
        line = page.splitlines()[-1]
        alertname = re.search(r"FIRING (\w+)", line).group(1)
        for label in ("cluster=vmstack", "node=gpu-node-1", "device=mlx5_0", "port=1"):
            assert label in line, line
        assert "alertgroup=" not in line           # the same labels Prometheus would send
        print(f"page {time.monotonic() - started:.0f} s after the banner (the port went down at 15 s)")

        # vmalert evaluated it, and wrote the alert's state back into VictoriaMetrics.
        alerts = requests.get(f"{vmalert_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        assert any(a["name"] == alertname and a["state"] == "firing" for a in alerts)
        firing = requests.get(f"{vm_url}/api/v1/query", timeout=10, params={
            "query": f'ALERTS{{alertname="{alertname}", alertstate="firing"}}'}).json()
        assert [r["metric"]["node"] for r in firing["data"]["result"]] == ["gpu-node-1"]
        # Recording rules evaluated by vmalert, stored in VictoriaMetrics.
        recorded = requests.get(f"{vm_url}/api/v1/series", timeout=10,
                                params={"match[]": '{__name__=~"node:.+|gpu:.+|job:.+"}'}).json()["data"]
        assert recorded, "no recording-rule results in VictoriaMetrics"

        # The sidecar answers from VictoriaMetrics (its Prometheus URL is VictoriaMetrics').
        key = re.search(r"API key:\s+(\S+)", banner).group(1)
        ca = re.search(r"CA (\S+);", banner).group(1)
        sidecar_url = re.search(r"^Sidecar:\s+(https://\S+)", banner, re.M).group(1)
        answer = requests.post(f"{sidecar_url}/queries/meshql", json={"query": "SHOW SUMMARY"}, timeout=30,
                               headers={"Authorization": f"Bearer {key}"}, verify=ca)
        assert answer.status_code == 200, answer.text
        assert "gpu-node-1" in answer.text or "vmstack" in answer.text or answer.json(), answer.text
    finally:
        if child.poll() is None:
            child.terminate()
            child.wait(60)
    assert child.returncode == 0, child.stderr.read()
    # VictoriaMetrics, vmagent and vmalert (each named with a path in the workdir) are gone.
    assert procs.child_pids_with_argument(str(tmp_path / "work")) == []


def start_victoria_stack(scenario: Path, workdir: Path, *flags: str) -> tuple[subprocess.Popen, queue.Queue]:
    """`fabricscope stack --backend victoriametrics` started as a user does (free ports, 2 s
    scrapes, `flags` added), and a queue its stdout lines arrive on."""
    child = subprocess.Popen([sys.executable, "-m", "fabricscope.cli", "stack", "--backend", "victoriametrics",
                              *flags, "--scenario", str(scenario), "--workdir", str(workdir),
                              "--scrape-interval", "2s", "--prometheus-port", "0", "--alertmanager-port", "0",
                              "--sidecar-port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()
    return child, lines


def read_until(lines: queue.Queue, marker: str, timeout: float, child: subprocess.Popen, also: str = "") -> str:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if child.poll() is not None:
                break
            continue
        seen.append(line)
        if marker in line and also in line:
            return "".join(seen)
    stderr = child.stderr.read() if child.poll() is not None else ""
    pytest.fail(f"no {marker!r} within {timeout:.0f} s; output:\n{''.join(seen)}\n{stderr}")
