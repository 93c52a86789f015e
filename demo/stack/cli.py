"""`fabricscope stack`: the demo cluster, real Prometheus with the rules, real Alertmanager,
and the query sidecar.

One command for a newcomer: simulated GPU nodes (each a real exporter on its own port)
are scraped by the Debian `prometheus` binary loaded with the packaged rules, which sends
alerts to the Debian `prometheus-alertmanager` running the packaged alertmanager.yml,
whose webhook is the sidecar (`fabricscope sidecar`, TLS with a CA minted for the demo,
API keys minted for the run). The sidecar records each alert and the stack prints it, so
the whole path from fault to notification is visible; the stack also feeds the sidecar
synthetic request spans whose paths cross the demo's faults, so SLO violations and their
correlations appear on their own. --webhook-url sends Alertmanager elsewhere instead.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricscope.atomicfile import write_atomically
from .binaries import ensure_port_free, find_binary, free_port
from .configs import (FAST_ALERT_OVERRIDES, alertmanager_config, prometheus_config, render_rules, rule_files,
                      write_yaml)
from .errors import StackError
from .processes import ManagedProcess, start_alertmanager, start_prometheus
from .shards import ShardedVictoria
from .victoria import (own_metrics_jobs, start_victoria_metrics, start_vmagent, start_vmalert, vmagent_scrape_config,
                       vmalert_rules)
from .timescale import scale_exporter_config, scale_route_timing, scale_rule_overrides, scale_scenario
from .sidecar import DEFAULT_SIDECAR_PORT, Periodic, SidecarProcess, alert_printer, mint_key, span_feeder, start_sidecar
from .webhook import SIDECAR_WEBHOOK_PATH

log = logging.getLogger("fabricscope.demo.stack")

# Defaults outside 9100-9999 (allocated on the Prometheus default-port wiki), next to the
# exporter's 19400 and the sidecar's 19500, so the stack never collides with a real
# Prometheus (9090) or Alertmanager (9093) on the same machine.
DEFAULT_PROMETHEUS_PORT = 19090
DEFAULT_ALERTMANAGER_PORT = 19093
BACKENDS = ("prometheus", "victoriametrics")
# Every target scraped by two vmagent members: one member lost loses no series.
DEFAULT_REPLICATION = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=None,
                        help="scenario YAML (default: the demo's default scenario)")
    parser.add_argument("--workdir", type=Path, default=Path("var/stack"),
                        help="where configs, simulated node trees, TSDB and logs go (default ./var/stack)")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop after this many seconds (default 0: run until Ctrl-C / SIGTERM)")
    parser.add_argument("--backend", choices=BACKENDS, default="prometheus",
                        help="prometheus (default): one Prometheus scrapes, stores and evaluates the rules; "
                             "victoriametrics: vmagent scrapes and remote-writes to VictoriaMetrics, vmalert "
                             "evaluates the same rules (docs/scale.md)")
    parser.add_argument("--shards", type=int, default=None, metavar="N",
                        help="with --backend victoriametrics: N vmagent members in cluster mode, each target "
                             "scraped by --replication of them, VictoriaMetrics deduplicating the copies, one "
                             "vmalert per cluster on the rules scoped to that cluster (docs/scale.md)")
    parser.add_argument("--replication", type=int, default=None, metavar="R",
                        help=f"with --shards: the vmagent members that scrape each target (default "
                             f"{DEFAULT_REPLICATION}; losing R-1 members loses no series)")
    parser.add_argument("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT,
                        help=f"port on 127.0.0.1 of the Prometheus HTTP API: Prometheus, or VictoriaMetrics with "
                             f"--backend victoriametrics (default {DEFAULT_PROMETHEUS_PORT})")
    parser.add_argument("--alertmanager-port", type=int, default=DEFAULT_ALERTMANAGER_PORT,
                        help=f"Alertmanager port on 127.0.0.1 (default {DEFAULT_ALERTMANAGER_PORT})")
    parser.add_argument("--sidecar-port", type=int, default=DEFAULT_SIDECAR_PORT,
                        help=f"query sidecar port on 127.0.0.1, HTTPS (default {DEFAULT_SIDECAR_PORT})")
    parser.add_argument("--nodes", type=int, default=None,
                        help="number of simulated nodes (default: the scenario's)")
    parser.add_argument("--webhook-url", default=None,
                        help="where Alertmanager's webhook posts instead of the stack's sidecar "
                             f"(default: the sidecar's {SIDECAR_WEBHOOK_PATH}, which records and the stack prints "
                             "each notification)")
    alerts = parser.add_mutually_exclusive_group()
    alerts.add_argument("--fast-alerts", dest="fast_alerts", action="store_true", default=True,
                        help="(default) render the rules with shortened for: durations and 15s rule-group "
                             "intervals, same thresholds and windows, so each demo fault alerts while it lasts")
    alerts.add_argument("--production-alerts", dest="fast_alerts", action="store_false",
                        help="load the committed rule files (production for: durations) instead")
    parser.add_argument("--scrape-interval", default=None,
                        help="Prometheus scrape and rule evaluation interval (default 5s; 1s with --time-scale)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="K",
                        help="a compressed clock: the scenario's timeline, the rules' windows, for: durations "
                             "and intervals, and Alertmanager's group timings run K times faster (thresholds "
                             "unchanged; docs/stack.md). Default 1")
    parser.add_argument("--receivers-url", default=None,
                        help="also post the pager and ticket receivers' notifications (integration-less by "
                             "default) to this webhook URL, to see what would page")
    parser.add_argument("--log.level", dest="log_level", default="warning",
                        choices=["debug", "info", "warning", "error"])


def load_stack_scenario(path: str | None, nodes: int | None, time_scale: float = 1.0):
    """The scenario to run, resized to --nodes when given, on the --time-scale clock."""
    from fabricscope import yamlsafe
    from fabricscope.demo.scenario import ScenarioError, default_scenario_path, load_scenario

    source = Path(path) if path else default_scenario_path()
    try:
        if time_scale != 1:
            try:
                raw = yamlsafe.load(source.read_text())
            except (OSError, ValueError) as exc:
                raise ScenarioError(f"{source}: {exc}") from None
            if not isinstance(raw, dict):
                raise ScenarioError(f"{source}: not a scenario mapping")
            scenario = load_scenario(scale_scenario(raw, time_scale))
        else:
            scenario = load_scenario(source)
        if nodes is not None:
            resized = scenario.with_nodes(nodes)
            dropped = len(scenario.faults) - len(resized.faults)
            if dropped:
                log.warning("--nodes %d drops %d fault(s) aimed at nodes that no longer exist", nodes, dropped)
            scenario = resized
    except ScenarioError as exc:
        raise StackError(f"scenario: {exc}") from None
    return scenario


def describe_faults(scenario) -> list[str]:
    lines = []
    for fault in sorted(scenario.faults, key=lambda f: f.start):
        end = f"{fault.end:g}s" if fault.end is not None else "end"
        where = fault.node or "cluster-wide"
        target = " ".join(f"{k}={v}" for k, v in sorted(fault.target.items()))
        lines.append(f"  {fault.start:>6g}s .. {end:<7} {fault.kind:<20} {where} {target}".rstrip())
    return lines or ["  (no faults: a healthy cluster)"]


@dataclass
class Stack:
    """Everything `fabricscope stack` runs; stop() tears down in dependency order."""
    cluster: Any = None
    sidecar: SidecarProcess | None = None
    alertmanager: ManagedProcess | None = None
    prometheus: ManagedProcess | None = None
    # --backend victoriametrics: these three instead of Prometheus.
    vmalert: ManagedProcess | None = None
    vmagent: ManagedProcess | None = None
    victoria_metrics: ManagedProcess | None = None
    # --shards: vmagent members, one vmalert per cluster and the store, instead of the three above.
    sharded: ShardedVictoria | None = None
    feeder: Periodic | None = None
    printer: Periodic | None = None

    def servers(self) -> list[ManagedProcess]:
        """The server processes that must keep running."""
        return [part for part in (self.prometheus, self.vmalert, self.vmagent, self.victoria_metrics,
                                  *(self.sharded.processes() if self.sharded else ()),
                                  self.alertmanager, self.sidecar and self.sidecar.process) if part is not None]

    def stop(self) -> None:
        # The span feeder and alert printer first (they call the sidecar), then what
        # scrapes and evaluates (it sends to Alertmanager and the store), the store after
        # its readers and writers, the cluster last; each step runs even if an earlier one
        # failed.
        for name, stopper in (("span feeder", self.feeder and self.feeder.stop),
                              ("alert printer", self.printer and self.printer.stop),
                              ("prometheus", self.prometheus and self.prometheus.stop),
                              ("vmalert", self.vmalert and self.vmalert.stop),
                              ("vmagent", self.vmagent and self.vmagent.stop),
                              ("sharded backend", self.sharded and self.sharded.stop),
                              ("alertmanager", self.alertmanager and self.alertmanager.stop),
                              ("sidecar", self.sidecar and self.sidecar.stop),
                              ("victoria-metrics", self.victoria_metrics and self.victoria_metrics.stop),
                              ("demo cluster", self.cluster and self.cluster.stop)):
            if stopper:
                try:
                    stopper()
                except Exception:
                    log.exception("stopping %s", name)


def fabricscope_command() -> str:
    """The `fabricscope` script beside this interpreter (e.g. .venv/bin/fabricscope under
    `make run`), so a printed command works without the virtualenv on PATH."""
    script = Path(sys.executable).with_name("fabricscope")
    return shlex.quote(str(script)) if script.exists() else "fabricscope"


@dataclass
class StackRun:
    """What the parts of one `fabricscope stack` run are told about each other."""
    args: argparse.Namespace
    scenario: Any
    workdir: Path
    host: str
    rules: list[Path]
    prometheus_port: int = 0
    alertmanager_port: int = 0
    keys_file: Path | None = None
    demo_key: str = ""
    demo_key_file: Path | None = None
    alertmanager_key: str = ""
    topology_file: Path | None = None
    webhook_url: str = ""

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.host}:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{self.host}:{self.alertmanager_port}"

    @property
    def victoria(self) -> bool:
        return self.args.backend == "victoriametrics"


def start_stack(args: argparse.Namespace, stack: Stack, out=sys.stdout) -> None:
    """Start every part into `stack` (so the caller can always stop what did start)."""
    host = "127.0.0.1"
    check_prerequisites(args, host)
    scenario = load_stack_scenario(args.scenario, args.nodes, args.time_scale)
    workdir = fresh_workdir(Path(args.workdir).resolve())
    run = StackRun(args, scenario, workdir, host, stack_rules(args, workdir))
    start_cluster_and_sidecar(run, stack)
    start_alertmanager_part(run, stack, out)
    backend_lines = start_backend(run, stack)
    stack.feeder = span_feeder(stack.sidecar, run.demo_key, scenario, stack.cluster.now)
    stack.feeder.start()
    if stack.printer:
        stack.printer.start()
    print("\n".join(banner(run, stack, backend_lines)), file=out, flush=True)


def check_prerequisites(args: argparse.Namespace, host: str) -> None:
    """Binaries, sidecar dependencies, ports and options: fail before anything starts, not
    halfway through. Fills in the scrape interval's default."""
    check_sharding(args)
    victoria = args.backend == "victoriametrics"
    for binary in (("victoria-metrics", "vmagent", "vmalert") if victoria else ("prometheus",)) + (
            "prometheus-alertmanager",):
        find_binary(binary)
    missing = [module for module in ("cryptography", "apiflask") if importlib.util.find_spec(module) is None]
    if missing:
        raise StackError(f"the stack runs the query sidecar, which needs {', '.join(missing)}: "
                         "pip install 'fabricscope[sidecar]' (make setup installs it)")
    ensure_port_free(host, args.prometheus_port, "VictoriaMetrics" if victoria else "Prometheus", "--prometheus-port")
    ensure_port_free(host, args.alertmanager_port, "Alertmanager", "--alertmanager-port")
    ensure_port_free(host, args.sidecar_port, "Sidecar", "--sidecar-port")
    chosen = [p for p in (args.prometheus_port, args.alertmanager_port, args.sidecar_port) if p]
    if len(set(chosen)) != len(chosen):
        raise StackError("--prometheus-port, --alertmanager-port and --sidecar-port must differ")
    if not args.time_scale >= 1:
        raise StackError(f"--time-scale must be >= 1, got {args.time_scale:g}")
    if args.scrape_interval is None:
        args.scrape_interval = "1s" if args.time_scale > 1 else "5s"


def check_sharding(args: argparse.Namespace) -> None:
    """--shards and --replication: only on the VictoriaMetrics backend, and a replication
    that the members can carry. Fills in the replication's default."""
    if args.shards is None:
        if args.replication is not None:
            raise StackError("--replication needs --shards (it is the vmagent members scraping each target)")
        return
    if args.backend != "victoriametrics":
        raise StackError(f"--shards needs --backend victoriametrics (vmagent's cluster mode), got --backend "
                         f"{args.backend}")
    replication = DEFAULT_REPLICATION if args.replication is None else args.replication
    if replication < 1:
        raise StackError(f"--replication must be at least 1, got {replication}")
    if args.shards < 2 or args.shards < replication:
        raise StackError(f"--shards must be at least 2 and at least --replication ({replication}): each target is "
                         f"scraped by {replication} of the N vmagent members, got --shards {args.shards}")
    args.replication = replication


def fresh_workdir(workdir: Path) -> Path:
    """The workdir without a previous run's TSDB, Alertmanager state, sidecar database and
    keys, and notification log: alerts and spans of a previous run must not reappear as if
    this scenario caused them."""
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("prometheus-data", "alertmanager-data", "victoria-metrics-data", "vmagent-data", "shards"):
        shutil.rmtree(workdir / stale, ignore_errors=True)
    for stale in ("sidecar.db", "sidecar.db-wal", "sidecar.db-shm", "keys.yaml"):
        (workdir / "sidecar" / stale).unlink(missing_ok=True)
    (workdir / "notifications.log").unlink(missing_ok=True)
    return workdir


def stack_rules(args: argparse.Namespace, workdir: Path) -> list[Path]:
    """The rule files to load: rendered with fast alerts and/or the compressed clock, or
    the committed production files."""
    if args.time_scale != 1:
        rules = render_rules(scale_rule_overrides(FAST_ALERT_OVERRIDES if args.fast_alerts else {}, args.time_scale),
                             workdir / "rules", stack_exporter_config(args))
    elif args.fast_alerts:
        rules = render_rules(FAST_ALERT_OVERRIDES, workdir / "rules")
    else:
        rules = rule_files()
    if not rules:
        log.warning("no rendered rule files found: Prometheus runs without alerting rules (run `make rules`)")
    return rules


def stack_exporter_config(args: argparse.Namespace) -> dict:
    """The demo exporters' config: on a compressed clock their p99 window is compressed too
    (the rules are rendered with the same, stack_rules)."""
    return scale_exporter_config(args.time_scale) if args.time_scale != 1 else {}


def start_cluster_and_sidecar(run: StackRun, stack: Stack) -> None:
    """The demo cluster, the keys, and the sidecar (which reconciles its alert records with
    Alertmanager's API, on a port chosen now: Alertmanager starts after it)."""
    from fabricscope.demo.cluster import DemoCluster
    from fabricscope.demo.topology import write_demo_inventory

    args, host = run.args, run.host
    stack.cluster = DemoCluster(run.scenario, run.workdir / "cluster", base_port=0, listen_host=host,
                                exporter_config=stack_exporter_config(args))
    stack.cluster.start()
    run.prometheus_port = args.prometheus_port or free_port(host)
    run.alertmanager_port = args.alertmanager_port or free_port(host)
    sidecar_dir = run.workdir / "sidecar"
    run.keys_file = sidecar_dir / "keys.yaml"
    run.demo_key = mint_key(run.keys_file, "demo", "admin")
    # For `fabricscope report --sidecar-token-file` (a key is never put on a command line).
    run.demo_key_file = sidecar_dir / "demo-key"
    write_atomically(run.demo_key_file, run.demo_key, mode=0o600)
    run.alertmanager_key = mint_key(run.keys_file, "alertmanager", "write")
    # The sidecar simulates failures on the demo cluster's generated topology, merged with
    # the demo's live metrics (link and NVLink faults, the NCCL job) every 15 s.
    run.topology_file = write_demo_inventory(run.scenario, sidecar_dir / "topology.yaml")
    stack.sidecar = start_sidecar(sidecar_dir, host, args.sidecar_port or free_port(host), run.prometheus_url,
                                  run.keys_file,
                                  extra_args=["--chaos-topology", str(run.topology_file), "--chaos-refresh-seconds",
                                              "15", "--alertmanager-url", run.alertmanager_url,
                                              "--alertmanager-reconcile-seconds",
                                              f"{max(1.0, 15 / args.time_scale):g}"])


def start_alertmanager_part(run: StackRun, stack: Stack, out) -> None:
    """Alertmanager, its webhook posting to the sidecar (whose notifications the stack
    prints and logs) unless --webhook-url names another receiver."""
    args = run.args
    run.webhook_url, webhook_http_config = args.webhook_url, None
    if not run.webhook_url:
        run.webhook_url = stack.sidecar.url + SIDECAR_WEBHOOK_PATH
        webhook_http_config = {"authorization": {"type": "Bearer", "credentials": run.alertmanager_key},
                               "tls_config": {"ca_file": str(stack.sidecar.certs.ca)}}
        notifications_log = run.workdir / "notifications.log"

        def show(text: str) -> None:
            out.write(text + "\n")
            out.flush()
            with open(notifications_log, "a") as handle:
                handle.write(text + "\n")

        stack.printer = alert_printer(stack.sidecar, run.demo_key, show)

    am_routing = alertmanager_config(run.webhook_url, webhook_http_config=webhook_http_config)
    if args.receivers_url:
        for receiver in am_routing["receivers"]:
            if receiver["name"] in ("pager", "ticket") and not receiver.get("webhook_configs"):
                receiver["webhook_configs"] = [{"url": args.receivers_url, "send_resolved": True}]
    if args.time_scale != 1:
        am_routing = scale_route_timing(am_routing, args.time_scale)
    am_config = write_yaml(run.workdir / "alertmanager.yml", am_routing)
    stack.alertmanager = start_alertmanager(am_config, run.workdir / "alertmanager-data", run.host,
                                            run.alertmanager_port, run.workdir / "alertmanager.log")


def start_backend(run: StackRun, stack: Stack) -> list[str]:
    """Prometheus, or VictoriaMetrics with vmagent and vmalert, scraping the cluster and the
    stack's servers and evaluating the rules; the banner's lines about it."""
    from fabricscope.demo.main import write_targets_file

    args, host, workdir, rules = run.args, run.host, run.workdir, run.rules
    targets_file = write_targets_file(workdir / "targets.json", stack.cluster.targets, run.scenario.cluster_name)
    scrape = prometheus_config(
        run.scenario.cluster_name, targets_file, f"{host}:{run.alertmanager_port}", rules,
        scrape_interval=args.scrape_interval, evaluation_interval=args.scrape_interval,
        self_address=None if run.victoria else f"{host}:{run.prometheus_port}",
        sidecar_address=stack.sidecar.url.split("://", 1)[1],
        sidecar_ca=stack.sidecar.certs.ca if stack.sidecar.certs else None)
    rule_list = ', '.join(str(p) for p in rules) or 'none'
    if run.victoria and args.shards:
        return start_sharded_backend(run, stack, scrape, rule_list)
    if run.victoria:
        dropped = start_victoria_backend(stack, scrape, rules, workdir, host, run.prometheus_port,
                                         run.alertmanager_url, args.scrape_interval, run.scenario.cluster_name)
        vmagent_url = stack.vmagent.ready_url.rsplit('/', 1)[0]
        vmalert_url = stack.vmalert.ready_url.rsplit('/', 1)[0]
        return [
            f"VictoriaMetrics: {run.prometheus_url}   (Prometheus API; vmui: {run.prometheus_url}/vmui)",
            f"  vmagent:      {vmagent_url}   (scrapes, remote-writes; targets: {vmagent_url}/targets)",
            f"  vmalert:      {vmalert_url}   (alerts: {vmalert_url}/api/v1/alerts)",
            f"  rules:        {rule_list}"
            + (f" (for vmalert without {', '.join(sorted({d.rsplit(': ', 1)[1] for d in dropped}))} on "
               f"{len(dropped)} rules)" if dropped else "")]
    prom_config = write_yaml(workdir / "prometheus.yml", scrape)
    stack.prometheus = start_prometheus(prom_config, workdir / "prometheus-data", host, run.prometheus_port,
                                        workdir / "prometheus.log")
    return [f"Prometheus:     {run.prometheus_url}   (alerts: {run.prometheus_url}/alerts, targets: "
            f"{run.prometheus_url}/targets)",
            f"  rules:        {rule_list}"]


def start_sharded_backend(run: StackRun, stack: Stack, scrape: dict, rule_list: str) -> list[str]:
    """demo/stack/shards.py's set-up for the demo's cluster: --shards vmagent members in
    cluster mode, VictoriaMetrics on --prometheus-port, one vmalert for the cluster on the
    rules scoped to it; the banner's lines about it."""
    args, cluster = run.args, run.scenario.cluster_name
    stack.sharded = ShardedVictoria(run.workdir / "shards", scrape, [cluster], run.rules, run.alertmanager_url,
                                    scrape_interval=args.scrape_interval, members=args.shards,
                                    replication=args.replication, host=run.host, store_port=run.prometheus_port,
                                    own_metrics=True)
    stack.sharded.start()
    dropped = stack.sharded.dropped[cluster]
    return [
        f"VictoriaMetrics: {run.prometheus_url}   (Prometheus API; vmui: {run.prometheus_url}/vmui; "
        f"dedup {args.scrape_interval})",
        f"  vmagents:     {args.shards} members in cluster mode, each target scraped by {args.replication}:",
        *(f"    member {member}:   {stack.sharded.vmagent_url(member)}   "
          f"(targets: {stack.sharded.vmagent_url(member)}/targets)" for member in range(args.shards)),
        f"  vmalert:      {stack.sharded.vmalert_url(cluster)}   (cluster {cluster}; alerts: "
        f"{stack.sharded.vmalert_url(cluster)}/api/v1/alerts)",
        f"  rules:        {rule_list}, scoped to cluster=\"{cluster}\" in {run.workdir / 'shards' / 'rules' / cluster}"
        + (f" (for vmalert without {', '.join(sorted({d.rsplit(': ', 1)[1] for d in dropped}))} on "
           f"{len(dropped)} rules)" if dropped else "")]


def banner(run: StackRun, stack: Stack, backend_lines: list[str]) -> list[str]:
    """What the stack prints once every part runs: where each is, what to try."""
    args, scenario, workdir = run.args, run.scenario, run.workdir
    sidecar_url, ca, demo_key = stack.sidecar.url, stack.sidecar.certs.ca, run.demo_key
    return [
        "",
        f"fabricscope stack: cluster {scenario.cluster_name!r}, {scenario.nodes} nodes x "
        f"{scenario.gpus_per_node} GPUs, scenario {scenario.source}",
        "",
        "Exporters:",
        *(f"  {node:<16} http://{address}/metrics" for node, address in stack.cluster.targets),
        *backend_lines[:-1],
        backend_lines[-1]
        + (" (fast alerts: shortened for: durations; the production rules are "
           f"{', '.join(str(p) for p in rule_files())}, --production-alerts loads them)" if args.fast_alerts else
           " (production for: durations)"),
        f"Alertmanager:   {run.alertmanager_url}",
        f"Sidecar:        {sidecar_url}   (TLS, CA {ca}; OpenAPI: {sidecar_url}/api/v1/openapi.json)",
        f"  API key:      {demo_key}   (scope admin; keys in {run.keys_file})",
        f"  try:          curl --cacert {ca} -H 'Authorization: Bearer {demo_key}' {sidecar_url}/tracing/correlations",
        "  spans:        synthetic requests every 2s; paths crossing a faulted node run over their SLO",
        "  ask:          (registered queries only, docs/query.md; fabricscope query \"...\" does the same)",
        *(f"    {question}\n      {command}" for question, command in
          example_questions(sidecar_url, ca, demo_key, scenario.node_name(min(1, scenario.nodes - 1)))),
        f"  chaos:        what a demo leaf switch takes down, then the result (SIMULATION_ID from the first "
        f"answer; docs/chaos.md, topology {run.topology_file}):",
        *(f"      {command}" for command in chaos_example(sidecar_url, ca, demo_key, scenario)),
        f"Notifications:  {run.webhook_url}" + ("" if args.webhook_url else
                                                f"  (recorded by the sidecar, printed below and in "
                                                f"{workdir / 'notifications.log'})"),
        f"Workdir:        {workdir}  (configs, logs, TSDB)",
        "",
        "Report (the dashboards drawn to PNG and one HTML page; run it while the stack runs):",
        f"  {fabricscope_command()} report --prometheus-url {run.prometheus_url} --from now-30m --to now "
        f"--scrape-interval {args.scrape_interval} --out {workdir / 'report'} "
        f"--sidecar-url {stack.sidecar.url} --sidecar-token-file {run.demo_key_file}"
        + (f" --sidecar-ca {stack.sidecar.certs.ca}" if stack.sidecar.certs else ""),
        "",
        "Fault timeline (seconds since start" + (f", repeating every {scenario.repeat:g}s):" if scenario.repeat else "):"),
        *describe_faults(scenario),
        "",
        "Ctrl-C stops everything." if not args.duration else f"Stopping after {args.duration:g}s.",
        "",
    ]


def start_victoria_backend(stack: Stack, prom_config: dict, rules: list[Path], workdir: Path, host: str, port: int,
                           alertmanager_url: str, interval: str, cluster: str) -> list[str]:
    """VictoriaMetrics on `port`, vmagent scraping what `prom_config` scrapes (and the three
    servers' own metrics) into it, vmalert evaluating `rules` into it and alerting
    `alertmanager_url`. Returns what vmalert's copy of the rules dropped."""
    vm_url = f"http://{host}:{port}"
    stack.victoria_metrics = start_victoria_metrics(workdir / "victoria-metrics-data", host, port,
                                                    workdir / "victoria-metrics.log")
    vmalert_rule_files, dropped = vmalert_rules(rules, workdir / "vmalert-rules")
    vmalert_port, vmagent_port = free_port(host), free_port(host)
    scrape = vmagent_scrape_config(prom_config)
    # The backend's own metrics, as Prometheus scrapes itself: ingestion, rule evaluation.
    scrape["scrape_configs"] += own_metrics_jobs(host, [("victoria-metrics", [port]), ("vmagent", [vmagent_port]),
                                                        ("vmalert", [vmalert_port])])
    config = write_yaml(workdir / "vmagent.yml", scrape)
    stack.vmagent = start_vmagent(config, workdir / "vmagent-data", host, vmagent_port, f"{vm_url}/api/v1/write",
                                  workdir / "vmagent.log")
    stack.vmalert = start_vmalert(vmalert_rule_files, vm_url, alertmanager_url, host, vmalert_port,
                                  workdir / "vmalert.log", evaluation_interval=interval, labels={"cluster": cluster})
    return dropped


def example_questions(sidecar_url: str, ca: Path, key: str, node: str) -> list[tuple[str, str]]:
    """Two questions the demo's live data answers from the first minute, each with the curl
    command that asks the sidecar (natural language, then MeshQL)."""
    asks = [(f"What is the p99 latency of {node}?", "/ai/query/conversation",
             {"message": f"What is the p99 latency of {node}?"}),
            ("How is the fleet doing?  (as MeshQL: SHOW SUMMARY)", "/queries/meshql",
             {"query": "SHOW SUMMARY"})]
    return [(question, curl_command(ca, key, sidecar_url + path, body)) for question, path, body in asks]


def chaos_example(sidecar_url: str, ca: Path, key: str, scenario) -> list[str]:
    """Start a simulation of a demo leaf switch's failure, then read its result
    (SIMULATION_ID: the simulation_id of the first answer)."""
    leaf = f"leaf-su0-r{min(3, scenario.hcas_per_node - 1)}"
    return [curl_command(ca, key, f"{sidecar_url}/graph/chaos-simulate",
                         {"device": leaf, "failure_type": "switch_failure", "include_jobs": True}),
            curl_command(ca, key, f"{sidecar_url}/graph/chaos-results/SIMULATION_ID")]


def curl_command(ca: Path, key: str, url: str, body: dict | None = None) -> str:
    words = ["curl", "--cacert", shlex.quote(str(ca)), "-H", shlex.quote(f"Authorization: Bearer {key}")]
    if body is not None:
        words += ["-H", shlex.quote("Content-Type: application/json"), "-d", shlex.quote(json.dumps(body))]
    return " ".join([*words, shlex.quote(url)])


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = Stack()
    try:
        start_stack(args, stack)
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stop.wait(1.0):
            for part in stack.servers():
                if not part.running():
                    raise StackError(f"{part.name} exited unexpectedly; last output:\n{part.log_tail()}")
            if deadline is not None and time.monotonic() >= deadline:
                break
        return 0
    except StackError as exc:
        print(f"fabricscope stack: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:   # unwritable workdir, a demo exporter port refused, ...
        print(f"fabricscope stack: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}",
              file=sys.stderr)
        return 2
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("fabricscope stack: stopped", file=sys.stderr)
