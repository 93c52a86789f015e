"""Fleet mode: the scenario's nodes in full, the rest of the fleet as copies of node 0 on one
port, each its own target (about 10 s: one simulated node)."""
from __future__ import annotations

import json
import re
import time

import requests

from fabricscope.demo.cluster import DemoCluster
from fabricscope.demo.fleet import Fleet
from fabricscope.demo.scenario import load_scenario

SCENARIO = {"seed": 3, "cluster": {"name": "fleettest", "nodes": 1, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 1, "faults": []}


def series(body: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in body.splitlines() if line and not line.startswith("#")}


def test_copies_are_separate_targets_with_their_own_node_and_ranks(tmp_path):
    cluster = DemoCluster(load_scenario(SCENARIO), tmp_path / "demo")
    with Fleet(cluster, 4) as fleet:
        groups = fleet.file_sd_groups()
        assert [g["labels"]["node"] for g in groups] == ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
        assert "__metrics_path__" not in groups[0]["labels"]          # the simulated node's own exporter
        assert {g["labels"]["__metrics_path__"] for g in groups[1:]} == \
            {f"/nodes/gpu-node-{i}/metrics" for i in (1, 2, 3)}
        assert len({g["targets"][0] for g in groups[1:]}) == 1       # one port for every copy
        node0 = f"http://{cluster.targets[0][1]}/metrics"
        copy = f"http://{groups[3]['targets'][0]}{groups[3]['labels']['__metrics_path__']}"
        deadline = time.monotonic() + 30      # until the simulated job's ranks show
        while 'fabric_nccl_rank_info{' not in requests.get(node0, timeout=10).text:
            assert time.monotonic() < deadline, "no NCCL ranks on the simulated node"
            time.sleep(0.5)
        time.sleep(1.1)                       # a fresh rendering for the copies
        original, copied = requests.get(node0, timeout=10).text, requests.get(copy, timeout=10).text
        # The same families, every series under the copy's node label.
        assert 'node="gpu-node-0"' not in copied
        assert abs(len(series(original)) - len(series(copied))) <= 5   # renders a second apart
        names = lambda body: {re.match(r"[a-z_:]+", key).group(0) for key in series(body)}  # noqa: E731
        assert names(original) == names(copied)
        # Ranks renumbered into one fleet-wide job: copy 3 of 2-GPU nodes holds ranks 6 and 7 of 8.
        ranks = sorted(int(r) for r in re.findall(r'^fabric_nccl_rank_info\{[^}]*rank="(\d+)"', copied, re.M))
        assert ranks == [6, 7]
        assert re.search(r'^fabric_nccl_rank_info\{[^}]*nranks="8"', copied, re.M)
        assert requests.get(copy.replace("gpu-node-3", "gpu-node-9"), timeout=10).status_code == 404
        written = json.loads(fleet.write_targets_file(tmp_path / "targets.json").read_text())
        assert written == groups
