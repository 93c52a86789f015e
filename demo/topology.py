"""The demo cluster's topology: the chaos generator's rail-optimized fat tree, sized and
named like the scenario's nodes, with the demo's NCCL job on every GPU.

The job is named as live enrichment names an NCCL communicator (chaos.live.comm_job_name),
so the live merge of the demo's own metrics updates this job instead of adding a second.
`demo_inventory` is the same cluster as an inventory document (docs/chaos.md), which the
stack writes to a file for the sidecar's --chaos-topology.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from fabricscope.chaos.inventory import build_topology, parse_inventory
from fabricscope.chaos.live import comm_job_name
from fabricscope.chaos.model import Topology
from .plugin import ClusterSpec
from .scenario import Scenario
from .sources.nccl import job_comm


def demo_job_name(scenario: Scenario) -> str:
    """The name live enrichment gives the demo's NCCL job."""
    return comm_job_name(job_comm(ClusterSpec(name=scenario.cluster_name, nodes=(), seed=scenario.seed)))


def demo_inventory(scenario: Scenario) -> dict:
    gpus = scenario.gpus_per_node
    ranks = [{"rank": node * gpus + gpu, "gpu": f"{scenario.node_name(node)}/gpu{gpu}"}
             for node in range(scenario.nodes) for gpu in range(gpus)]
    return {"version": 1, "name": scenario.cluster_name,
            "generate": {"hosts": scenario.nodes, "gpus_per_host": gpus, "rails": scenario.hcas_per_node,
                         "host_prefix": f"{scenario.node_prefix}-"},
            "jobs": [{"name": demo_job_name(scenario), "ranks": ranks}]}


def demo_topology(scenario: Scenario) -> Topology:
    return build_topology(parse_inventory(demo_inventory(scenario), "<demo>"), "<demo>")


def write_demo_inventory(scenario: Scenario, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# The demo cluster for chaos simulations (docs/chaos.md), written by fabricscope stack.\n"
                    + yaml.safe_dump(demo_inventory(scenario), sort_keys=False))
    return path
