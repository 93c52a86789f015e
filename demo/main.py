"""`fabricscope demo`: run the simulated cluster, one exporter per node on loopback."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .cluster import DemoCluster
from .scenario import ScenarioError, default_scenario_path, load_scenario
from .sim_node import NodeRootError
from .targets import file_sd_groups, write_targets_file  # noqa: F401  (imported from here by the stack and tests)

log = logging.getLogger("fabricscope.demo")
DEFAULT_BASE_PORT = 19410   # outside the 9100-9999 range the Prometheus port registry has allocated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=None,
                        help=f"scenario YAML (default: {default_scenario_path().name} shipped with fabricscope)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="number of simulated nodes (overrides the scenario; faults on nodes beyond it are dropped)")
    parser.add_argument("--listen-host", default="127.0.0.1", help="address the node exporters listen on")
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                        help=f"node i listens on base-port + i (default {DEFAULT_BASE_PORT}; 0 picks free ports)")
    parser.add_argument("--workdir", default="./var/demo", help="where the simulated node filesystems live")
    parser.add_argument("--duration", type=float, default=None,
                        help="stop after this many seconds (default: run until Ctrl-C)")
    parser.add_argument("--fleet", type=int, default=None, metavar="N",
                        help="serve N nodes in all from this process: the scenario's nodes simulated in full, "
                             "the rest copies of node 0 on one port (--fleet-port), each at /nodes/<node>/metrics "
                             "with its own node label (docs/demo.md#fleet-mode)")
    parser.add_argument("--fleet-port", type=int, default=0, help="port of the fleet's copies (default: a free one)")
    parser.add_argument("--targets-file", default=None,
                        help="write a Prometheus file_sd JSON here with one target per node (labels node, cluster)")
    parser.add_argument("--no-tmpfs", dest="tmpfs", action="store_false",
                        help="keep the node trees under --workdir even when it is on disk (default: on tmpfs, "
                             "linked from --workdir, because disk renames make ticks slow)")
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"])


def banner(cluster: DemoCluster) -> str:
    scenario = cluster.scenario
    lines = [f"fabricscope demo: cluster {scenario.cluster_name!r}, {len(cluster.targets)} nodes x "
             f"{scenario.gpus_per_node} GPUs x {scenario.hcas_per_node} HCAs, seed {scenario.seed}, "
             f"{len(scenario.faults)} scripted faults ({scenario.source})"]
    for node, address in cluster.targets:
        lines.append(f"  {node:<14} http://{address}/metrics")
    if scenario.repeat:
        lines.append(f"  fault timeline repeats every {scenario.repeat:g}s; Ctrl-C to stop")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        scenario = load_scenario(args.scenario or default_scenario_path())
        if args.nodes is not None:
            before = len(scenario.faults)
            scenario = scenario.with_nodes(args.nodes)
            if len(scenario.faults) < before:
                log.warning("%d faults target nodes beyond --nodes %d and were dropped",
                            before - len(scenario.faults), args.nodes)
    except ScenarioError as exc:
        print(f"fabricscope demo: {exc}", file=sys.stderr)
        return 2
    if args.duration is not None and args.duration <= 0:
        print("fabricscope demo: --duration must be positive", file=sys.stderr)
        return 2
    cluster = DemoCluster(scenario, args.workdir, base_port=args.base_port, listen_host=args.listen_host,
                          use_tmpfs=args.tmpfs)
    fleet = None
    if args.fleet is not None:
        from .fleet import Fleet
        try:
            fleet = Fleet(cluster, args.fleet, args.listen_host, args.fleet_port)
        except ValueError as exc:
            print(f"fabricscope demo: --fleet: {exc}", file=sys.stderr)
            return 2
    try:
        (fleet or cluster).start()
    except (NodeRootError, OSError) as exc:
        print(f"fabricscope demo: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        if args.targets_file:
            if fleet is not None:
                fleet.write_targets_file(args.targets_file)
            else:
                write_targets_file(args.targets_file, cluster.targets, cluster.scenario.cluster_name)
        print(banner(cluster), flush=True)
        if fleet is not None:
            print(f"  + {len(fleet.copy_names)} copies of {scenario.node_name(0)}: "
                  f"http://{args.listen_host}:{fleet.port}/nodes/<node>/metrics "
                  f"({fleet.copy_names[0] if fleet.copy_names else '-'} .. "
                  f"{fleet.copy_names[-1] if fleet.copy_names else '-'})", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # Wake on Ctrl-C, the --duration limit, or the scenario's own duration running out.
        waited = 0.0
        while not stop.is_set() and not cluster.finished.is_set():
            step = 0.5 if args.duration is None else min(0.5, args.duration - waited)
            if step <= 0:
                break
            stop.wait(step)
            waited += step
    finally:
        (fleet or cluster).stop()
    if cluster.ticks_run:
        log.info("ran %d ticks, %.2f ms per tick", cluster.ticks_run,
                 1000 * cluster.tick_seconds_spent / cluster.ticks_run)
    return 0
