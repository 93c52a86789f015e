"""The demo cluster's topology: the chaos generator's rail-optimized fat tree, sized and
named like the scenario's nodes, with the demo's NCCL job on every GPU.

The job is named as live enrichment names an NCCL communicator (chaos.live.comm_job_name),
so the live merge of the demo's own metrics updates this job instead of adding a second.
"""
from __future__ import annotations

from fabricscope.chaos.generator import FatTreeSpec, generate_fat_tree, node_major_job
from fabricscope.chaos.live import comm_job_name
from fabricscope.chaos.model import Topology
from .plugin import ClusterSpec
from .scenario import Scenario
from .sources.nccl import job_comm


def demo_job_name(scenario: Scenario) -> str:
    """The name live enrichment gives the demo's NCCL job."""
    return comm_job_name(job_comm(ClusterSpec(name=scenario.cluster_name, nodes=(), seed=scenario.seed)))


def demo_topology(scenario: Scenario) -> Topology:
    hosts = tuple(scenario.node_name(i) for i in range(scenario.nodes))
    spec = FatTreeSpec(hosts=scenario.nodes, gpus_per_host=scenario.gpus_per_node, rails=scenario.hcas_per_node,
                       host_names=hosts, name=scenario.cluster_name)
    topology = generate_fat_tree(spec)
    topology.add_job(node_major_job(demo_job_name(scenario), list(hosts), scenario.gpus_per_node, source="demo"))
    return topology
