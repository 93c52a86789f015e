"""`fabricscope chaos`: blast-radius simulation from the command line.

    fabricscope chaos simulate --device leaf-su0-r3 --failure-type switch_failure
    fabricscope chaos simulate --device gpu-node-1 --failure-type rack_failure --topology cluster.yaml
    fabricscope chaos devices --kind leaf_switch

Without --topology the demo cluster's topology is used (the default scenario, or --scenario).
"""
from __future__ import annotations

import argparse
import json
import sys

from .blast import FAILURE_TYPES, BlastRadiusEngine, BlastResult, ChaosInputError
from .inventory import InventoryError, load_topology
from .model import DEVICE_KINDS, Topology

PATH_LINES = 25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    simulate = sub.add_parser("simulate", help="simulate a failure and print its blast radius")
    simulate.add_argument("--device", required=True, help="device (or, for rack_failure, rack) that fails")
    simulate.add_argument("--failure-type", default="device_failure", choices=FAILURE_TYPES)
    simulate.add_argument("--no-jobs", dest="include_jobs", action="store_false", help="do not list affected jobs")
    simulate.add_argument("--json", action="store_true", help="print the whole result as JSON")
    devices = sub.add_parser("devices", help="list the topology's devices (names to simulate)")
    devices.add_argument("--kind", choices=DEVICE_KINDS, help="only devices of this kind")
    for p in (simulate, devices):
        p.add_argument("--topology", help="inventory file (YAML or JSON, see docs/chaos.md); default: the demo cluster")
        p.add_argument("--scenario", help="demo scenario whose cluster to use when --topology is not given")


def _topology(args) -> Topology:
    if args.topology:
        return load_topology(args.topology)
    from fabricscope.demo.scenario import default_scenario_path, load_scenario
    from fabricscope.demo.topology import demo_topology
    return demo_topology(load_scenario(args.scenario or default_scenario_path()))


def format_result(result: BlastResult, topology: Topology) -> list[str]:
    kinds = ", ".join(f"{kind} {count}" for kind, count in result.affected_by_kind.items())
    lines = [f"{result.failure_type} of {result.device} on {topology.name!r} (topology {result.topology_version})",
             f"  impact score: {result.impact_score:.4f}  (0.4 x {result.affected_device_count}/{result.total_devices} "
             f"devices + 0.6 x {result.affected_job_count}/{result.total_active_jobs} jobs)",
             f"  affected devices: {result.affected_device_count} ({kinds})"]
    if result.affected_jobs is not None:
        lines.append(f"  affected jobs: {', '.join(result.affected_jobs) if result.affected_jobs else 'none'}")
    lines.append("  path (BFS order):")
    for step in result.path[:PATH_LINES]:
        via = f" <- {step['via']}" if step["via"] else ""
        lines.append(f"    {step['device']}{via}: {step['reason']}")
    if len(result.path) > PATH_LINES:
        lines.append(f"    ... {result.affected_device_count - PATH_LINES} more (--json for all)")
    return lines


def run(args) -> int:
    try:
        topology = _topology(args)
        if args.chaos_command == "devices":
            for name, kind in topology.graph.nodes(data="kind"):
                if args.kind is None or kind == args.kind:
                    print(f"{name}\t{kind}")
            return 0
        result = BlastRadiusEngine(topology).simulate(args.device, args.failure_type, args.include_jobs)
    except (InventoryError, ChaosInputError) as exc:
        print(f"fabricscope chaos: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(format_result(result, topology)))
    return 0
