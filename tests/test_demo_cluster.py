"""The demo cluster end to end: real exporters over HTTP, the tick clock, the CLI."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from fabricscope.demo.cluster import DemoCluster
from fabricscope.demo.scenario import load_scenario
from tests.procs import wait_for

REPO = Path(__file__).resolve().parent.parent
STORM = {"kind": "symbol_error_storm", "node": 1, "at": "1s", "target": {"device": "mlx5_1", "port": 1},
         "params": {"rate_per_second": 40}}


def two_nodes(*faults):
    return load_scenario({"seed": 3, "cluster": {"name": "ci", "nodes": 2, "gpus_per_node": 2, "hcas_per_node": 2},
                          "tick_seconds": 0.5, "faults": list(faults)})


def scrape(address: str) -> dict[tuple, float]:
    text = requests.get(f"http://{address}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def cluster(tmp_path):
    with DemoCluster(two_nodes(STORM), tmp_path / "demo") as running:
        yield running


def test_every_node_serves_its_own_metrics(cluster):
    assert [node for node, _ in cluster.targets] == ["gpu-node-0", "gpu-node-1"]
    assert len({address for _, address in cluster.targets}) == 2
    for node, address in cluster.targets:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address)
        samples = scrape(address)
        names = {name for name, _ in samples}
        nodes = {dict(labels).get("node") for _, labels in samples}
        assert nodes == {node}, f"{address} must label every series with its own node only"
        failed = [dict(labels)["collector"] for (n, labels), v in samples.items()
                  if n == "fabric_scrape_collector_success" and v != 1]
        assert failed == [], f"collectors failed on {node}: {failed}"
        present = {"fabric_exporter_build_info", "fabric_scrape_collector_success"}
        for module, family in (("infiniband", "fabric_infiniband_port_counter_total"),
                               ("infiniband", "fabric_infiniband_port_receive_bytes_total"),
                               ("netdev", "fabric_netdev_up"),
                               ("tcp", "fabric_tcp_retransmitted_segments_total"),
                               ("kmsg", "fabric_kernel_log_lines_total")):
            if os.path.exists(REPO / "exporter" / "collectors" / f"{module}.py"):
                present.add(family)
        assert present <= names, present - names


def test_symbol_error_storm_shows_on_the_target_port_only(cluster):
    storm_node = dict(cluster.targets)["gpu-node-1"]
    quiet_node = dict(cluster.targets)["gpu-node-0"]

    def symbol_errors(address, device):
        return sample(scrape(address), "fabric_infiniband_port_counter_total", counter="symbol_error",
                      device=device, node=dict((a, n) for n, a in cluster.targets)[address], port="1")

    # After a few seconds of a 40/s storm the target has dozens of errors, everything else ~0.
    wait_for(lambda: (symbol_errors(storm_node, "mlx5_1") or 0) >= 40, 30, "symbol errors on gpu-node-1 mlx5_1")
    assert cluster.now() >= 1.0
    for address, device in ((storm_node, "mlx5_0"), (storm_node, "mlx5_2"), (quiet_node, "mlx5_1")):
        assert symbol_errors(address, device) <= 1, (address, device)


def test_the_scenario_clock_advances_ticks(cluster):
    first = cluster.engine.tick_index
    wait_for(lambda: cluster.engine.tick_index >= first + 3, 30, "three more ticks")
    assert cluster.engine.now() <= cluster.now() + 1e-6, "ticks never run ahead of the clock"


def test_stop_releases_ports_and_memory(tmp_path):
    running = DemoCluster(two_nodes(), tmp_path / "demo").start()
    address = running.targets[0][1]
    trees = [node.root for node in running.engine.nodes]
    assert all(tree.is_dir() for tree in trees)
    running.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{address}/metrics", timeout=2)
    if running.engine.home is not None:   # tmpfs trees are memory: gone after stop
        assert not any(tree.exists() for tree in trees)


def test_fixed_base_port_assigns_consecutive_ports(tmp_path):
    from conftest import free_port

    base = free_port()
    with DemoCluster(two_nodes(), tmp_path / "demo", base_port=base) as running:
        assert [address for _, address in running.targets] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]


def fabricscope(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "fabricscope.cli", "demo", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_cli_runs_for_a_duration_and_writes_file_sd_targets(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("seed: 1\ncluster: {name: clitest, nodes: 3, gpus_per_node: 1, hcas_per_node: 1}\n"
                        "faults: [{kind: microburst, node: 2, at: 1s}]\n")
    targets = tmp_path / "sd" / "targets.json"
    result = fabricscope("--scenario", str(scenario), "--nodes", "2", "--base-port", "0", "--workdir",
                         str(tmp_path / "work"), "--duration", "2", "--targets-file", str(targets))
    assert result.returncode == 0, result.stderr
    assert "cluster 'clitest', 2 nodes" in result.stdout
    urls = re.findall(r"(gpu-node-\d)\s+http://(127\.0\.0\.1:\d+)/metrics", result.stdout)
    assert [node for node, _ in urls] == ["gpu-node-0", "gpu-node-1"]
    document = json.loads(targets.read_text())
    assert document == [{"targets": [address], "labels": {"node": node, "cluster": "clitest"}}
                        for node, address in urls]
    assert "1 faults target nodes beyond --nodes 2 and were dropped" in result.stderr
    assert "ms per tick" in result.stderr


@pytest.mark.parametrize("content, message", [
    ("faults: [{kind: nope, at: 1s}]\n", "fault 0: unknown kind 'nope'"),
    ("faults: [{kind: microburst, node: 9, at: 1s}]\n", "node 9 is out of range"),
    ("tick_seconds: fast\n", "tick_seconds: bad duration 'fast'"),
])
def test_cli_rejects_bad_scenarios_clearly(tmp_path, content, message):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(content)
    result = fabricscope("--scenario", str(scenario), "--workdir", str(tmp_path / "w"), "--duration", "1")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_refuses_to_clear_a_foreign_directory(tmp_path):
    work = tmp_path / "w"
    (work / "gpu-node-0").mkdir(parents=True)
    (work / "gpu-node-0" / "notes.txt").write_text("mine")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {nodes: 1, gpus_per_node: 1, hcas_per_node: 1}\n")
    result = fabricscope("--scenario", str(scenario), "--workdir", str(work), "--base-port", "0", "--duration", "1")
    assert result.returncode == 1
    assert "was not created by the demo; refusing to clear it" in result.stderr
    assert (work / "gpu-node-0" / "notes.txt").read_text() == "mine"


def test_default_demo_starts_fast(tmp_path):
    """`make run` must show data quickly: the full default cluster serves a scrape within
    a few seconds of start (reported, not asserted as a timing)."""
    began = time.perf_counter()
    with DemoCluster(load_scenario(REPO / "demo/scenarios/default.yaml"), tmp_path / "demo") as running:
        samples = scrape(running.targets[-1][1])
        elapsed = time.perf_counter() - began
    assert sample(samples, "fabric_exporter_build_info", node="gpu-node-3", version=__import__("fabricscope.exporter", fromlist=["_"]).__version__)
    print(f"default 4-node demo: first scrape {elapsed:.2f}s after start")


def test_cli_reports_a_port_in_use_by_node_and_address(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        scenario = tmp_path / "s.yaml"
        scenario.write_text("cluster: {nodes: 1, gpus_per_node: 1, hcas_per_node: 1}\n")
        result = fabricscope("--scenario", str(scenario), "--workdir", str(tmp_path / "w"),
                             "--base-port", str(port), "--duration", "1")
    assert result.returncode == 1
    assert f"gpu-node-0: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
    from fabricscope.demo.sim_files import tmpfs_home

    if tmpfs_home(tmp_path / "w") is not None:   # memory-backed trees are not left behind
        assert not (tmp_path / "w" / "gpu-node-0").exists()


def test_scenario_duration_ends_the_run(tmp_path):
    scenario = load_scenario({"cluster": {"nodes": 1, "gpus_per_node": 1, "hcas_per_node": 1},
                              "tick_seconds": 0.25, "duration": "1s"})
    with DemoCluster(scenario, tmp_path / "demo") as running:
        assert running.finished.wait(30), "the scenario's duration never ran out"
        assert running.engine.tick_index == 4 and running.engine.now() == 1.0
