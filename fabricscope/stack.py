"""`fabricscope stack`: the demo cluster, real Prometheus with the rules, real Alertmanager.

One command for a newcomer: simulated GPU nodes (each a real exporter on its own port)
are scraped by the Debian `prometheus` binary loaded with the repository's rules/*.yaml,
which sends alerts to the Debian `prometheus-alertmanager` running
alertmanager/alertmanager.yml. The sidecar webhook of that config points at the query
sidecar when one is given (--webhook-url), else at a small local receiver that prints
each notification, so the whole path from fault to notification is visible.

The process helpers here (ManagedProcess, start_prometheus, start_alertmanager, the
config renderers and WebhookReceiver) are also what the end-to-end tests use.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import yaml

log = logging.getLogger("fabricscope.stack")

REPO_ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = REPO_ROOT / "rules"
ALERTMANAGER_DIR = REPO_ROOT / "alertmanager"

# Defaults outside 9100-9999 (allocated on the Prometheus default-port wiki), next to the
# exporter's 19400 and the sidecar's 19500, so the stack never collides with a real
# Prometheus (9090) or Alertmanager (9093) on the same machine.
DEFAULT_PROMETHEUS_PORT = 19090
DEFAULT_ALERTMANAGER_PORT = 19093
SIDECAR_WEBHOOK_PATH = "/alerts/webhook"
SCRAPE_JOB = "fabricscope"

SETUP_HINT = "run `make setup` (installs the Debian packages prometheus and prometheus-alertmanager)"


class StackError(Exception):
    """A problem the user can fix (missing binary, port taken, bad file); printed as is."""


# ---------------------------------------------------------------------------------------
# Binaries and ports

def find_binary(name: str) -> str:
    """Absolute path of `name` from PATH or /usr/bin, or a StackError saying how to get it."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if not found:
        raise StackError(f"{name} not found on PATH or in /usr/bin; {SETUP_HINT}")
    return found


def ensure_port_free(host: str, port: int, what: str, flag: str | None = None) -> None:
    """Fail early and clearly instead of letting a child process die on bind."""
    if port == 0:
        return
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            hint = f"; choose another with {flag}" if flag else ""
            raise StackError(f"{what} port {host}:{port} is already in use ({exc.strerror}){hint}") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------
# Child processes

@dataclass
class ManagedProcess:
    """A child server process with a readiness URL; stop() always reaps it.

    Output goes to `log_path` (not a pipe nobody reads, which would block the child once
    the pipe buffer fills)."""
    name: str
    argv: list[str]
    ready_url: str
    log_path: Path
    # For an https ready_url served with a certificate of a private CA (the demo's).
    ssl_context: ssl.SSLContext | None = None
    env: dict[str, str] | None = None      # the child's environment (default: ours)
    process: subprocess.Popen | None = None
    _log_file: Any = field(default=None, repr=False)

    def start(self, timeout: float = 60.0) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        # A new session so Ctrl-C in the terminal reaches only us; we stop the child
        # ourselves, in order, after the things that depend on it.
        self.process = subprocess.Popen(self.argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise StackError(f"{self.name} exited with status {code} before it was ready; "
                                 f"last output:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2, context=self.ssl_context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} not ready at {self.ready_url} after {timeout:.0f}s; "
                                 f"last output:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_prometheus(config_path: Path, data_dir: Path, host: str, port: int, log_path: Path,
                     extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    binary = find_binary("prometheus")
    argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={host}:{port}", "--log.level=warn", *(extra_args or [])]
    return ManagedProcess("prometheus", argv, f"http://{host}:{port}/-/ready", log_path).start(timeout)


def start_alertmanager(config_path: Path, data_dir: Path, host: str, port: int, log_path: Path,
                       extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    binary = find_binary("prometheus-alertmanager")
    argv = [binary, f"--config.file={config_path}", f"--storage.path={data_dir}",
            f"--web.listen-address={host}:{port}", f"--web.external-url=http://{host}:{port}/",
            # Empty: no gossip cluster (a single local Alertmanager needs no peers, and
            # the default 0.0.0.0:9094 may be taken).
            "--cluster.listen-address=", "--log.level=warn", *(extra_args or [])]
    return ManagedProcess("alertmanager", argv, f"http://{host}:{port}/-/ready", log_path).start(timeout)


# ---------------------------------------------------------------------------------------
# Configuration

def rule_files(rules_dir: Path = RULES_DIR) -> list[Path]:
    """The rendered rule files Prometheus loads: every rules/*.yaml."""
    return sorted(path.resolve() for path in Path(rules_dir).glob("*.yaml"))


# `--fast-alerts`: production `for:` durations (up to 15 minutes) outlast most demo
# faults, so a newcomer would see few alerts. These keep every threshold and window and
# only shorten how long a condition must hold, and how often each rule group runs.
FAST_ALERT_OVERRIDES: dict[str, Any] = {
    "intervals": {group: "15s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
    "for": {"ncclHang": "30s", "ncclRankStalled": "30s", "straggler": "1m", "ibPortDown": "30s",
            "ibDeviceMissing": "30s", "ibPortFatal": "30s", "ibFatalCounter": "30s", "ibDegraded": "1m",
            "ibBer": "1m", "ibAnomaly": "2m", "nvlinkDown": "30s", "nvlinkErrors": "1m",
            "nvlinkCollapse": "1m", "exporterDown": "1m", "collectorFailing": "1m", "ebpfUnavailable": "1m"},
}


def rules_renderer():
    """The rules' own rendering helper, rules/render.py (render(), RenderError). rules/ is
    not an installed package, so it is loaded from the checkout this module lives in."""
    import importlib.util

    helper = RULES_DIR / "render.py"
    spec = importlib.util.spec_from_file_location("fabricscope_rules_render", helper)
    if spec is None or not helper.exists():
        raise StackError(f"{helper} not found: rendering rules with overrides needs the repository checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_rules(overrides: dict[str, Any], out_dir: Path) -> list[Path]:
    """The mixin rendered with `overrides` by rules/render.py, into `out_dir`."""
    module = rules_renderer()
    try:
        return module.render(overrides, out_dir)
    except module.RenderError as exc:
        raise StackError(f"rendering rules with overrides: {exc}") from None


def prometheus_config(cluster: str, targets_file: Path, alertmanager_address: str,
                      rules: list[Path], scrape_interval: str = "5s",
                      evaluation_interval: str = "5s", self_address: str | None = None) -> dict[str, Any]:
    scrape_configs: list[dict[str, Any]] = [{
        "job_name": SCRAPE_JOB,
        # The exporter sets `node` on every series itself; honouring it keeps one
        # `node` label instead of node + exported_node. Targets still label `up`.
        "honor_labels": True,
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
    }]
    if self_address:
        # Prometheus' own metrics feed the pipeline alerts (missed rule-group iterations).
        scrape_configs.append({"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]})
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
            # Added to every alert sent to Alertmanager (routing groups by cluster).
            "external_labels": {"cluster": cluster},
        },
        "rule_files": [str(path) for path in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]},
        "scrape_configs": scrape_configs,
    }


def alertmanager_config(webhook_url: str, base_config: Path = ALERTMANAGER_DIR / "alertmanager.yml",
                        timing: dict[str, str] | None = None) -> dict[str, Any]:
    """The repository's Alertmanager config, made runnable from another directory.

    Template globs become absolute (Alertmanager resolves them against the config file's
    directory), every webhook URL becomes `webhook_url`, and `timing` (group_wait,
    group_interval, repeat_interval) replaces those values on every route, which is how
    the end-to-end test gets 1s grouping without a second copy of the routing tree."""
    try:
        config = yaml.safe_load(Path(base_config).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(f"cannot read Alertmanager config {base_config}: {exc}") from None
    if not isinstance(config, dict) or "route" not in config:
        raise StackError(f"{base_config}: not an Alertmanager config (no top-level route)")
    base_dir = Path(base_config).resolve().parent
    config["templates"] = [str(base_dir / glob) for glob in config.get("templates") or []]
    for receiver in config.get("receivers") or []:
        for webhook in receiver.get("webhook_configs") or []:
            webhook["url"] = webhook_url
    if timing:
        config["route"].update(timing)
        _override_route_timing(config["route"].get("routes") or [], timing)
    return config


def _override_route_timing(routes: list[dict[str, Any]], timing: dict[str, str]) -> None:
    # Child routes inherit from their parent, so only values a child sets itself need
    # replacing; the root gets them all.
    for route in routes:
        for key, value in timing.items():
            if key in route:
                route[key] = value
        _override_route_timing(route.get("routes") or [], timing)


def write_yaml(path: Path, data: Any) -> Path:
    return _write_atomically(path, yaml.safe_dump(data, sort_keys=False))


def _write_atomically(path: Path, text: str) -> Path:
    # Prometheus' file_sd watcher (and a config reload) must never read a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------
# Local webhook receiver

@dataclass
class ReceivedNotification:
    received_at: float        # time.time() when the POST arrived
    payload: dict[str, Any]   # Alertmanager webhook payload (version "4")


class WebhookReceiver:
    """A tiny HTTP server that accepts Alertmanager webhook POSTs, records them and hands
    each to `on_notification`. Bad requests get a 400 and are counted, never raised."""

    MAX_BODY = 4 * 1024 * 1024

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: str = SIDECAR_WEBHOOK_PATH,
                 on_notification: Callable[[ReceivedNotification], None] | None = None) -> None:
        self.path = path
        self.notifications: list[ReceivedNotification] = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._on_notification = on_notification
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                problem = receiver._accept(self)
                body = json.dumps({"status": "error", "error": problem} if problem else {"status": "ok"}).encode()
                self.send_response(400 if problem else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)

    def _accept(self, handler: BaseHTTPRequestHandler) -> str | None:
        if handler.path.split("?", 1)[0] != self.path:
            return f"unknown path {handler.path!r}; post to {self.path}"
        try:
            length = int(handler.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length <= 0 or length > self.MAX_BODY:
            with self._lock:
                self.rejected += 1
            return f"Content-Length must be between 1 and {self.MAX_BODY}"
        try:
            payload = json.loads(handler.rfile.read(length))
        except ValueError as exc:
            payload, problem = None, f"body is not JSON: {exc}"
        else:
            problem = None if isinstance(payload, dict) and isinstance(payload.get("alerts"), list) \
                else "body is not an Alertmanager webhook payload (no alerts list)"
        if problem:
            with self._lock:
                self.rejected += 1
            return problem
        notification = ReceivedNotification(time.time(), payload)
        with self._lock:
            self.notifications.append(notification)
        if self._on_notification is not None:
            try:
                self._on_notification(notification)
            except Exception:
                log.exception("webhook notification handler failed")
        return None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{self.path}"

    def alerts(self) -> list[tuple[float, dict[str, Any]]]:
        """Every alert received so far, as (received_at, alert), in arrival order."""
        with self._lock:
            return [(n.received_at, alert) for n in self.notifications for alert in n.payload["alerts"]]

    def start(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "WebhookReceiver":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def format_notification(notification: ReceivedNotification) -> str:
    """One line per alert, as the stack prints them."""
    lines = []
    stamp = time.strftime("%H:%M:%S", time.localtime(notification.received_at))
    receiver = notification.payload.get("receiver", "?")
    for alert in notification.payload["alerts"]:
        labels = dict(alert.get("labels") or {})
        # Scrape bookkeeping says nothing about where the fault is; node does.
        labels.pop("instance", None)
        labels.pop("job", None)
        name = labels.pop("alertname", "?")
        severity = labels.pop("severity", "?")
        where = " ".join(f"{key}={value}" for key, value in sorted(labels.items()))
        summary = (alert.get("annotations") or {}).get("summary", "")
        lines.append(f"{stamp} [{receiver}] {str(alert.get('status', '?')).upper()} {name} ({severity}) "
                     f"{where}{' - ' + summary if summary else ''}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The command

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=None,
                        help="scenario YAML (default: the demo's default scenario)")
    parser.add_argument("--workdir", type=Path, default=Path("var/stack"),
                        help="where configs, simulated node trees, TSDB and logs go (default ./var/stack)")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop after this many seconds (default 0: run until Ctrl-C / SIGTERM)")
    parser.add_argument("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT,
                        help=f"Prometheus port on 127.0.0.1 (default {DEFAULT_PROMETHEUS_PORT})")
    parser.add_argument("--alertmanager-port", type=int, default=DEFAULT_ALERTMANAGER_PORT,
                        help=f"Alertmanager port on 127.0.0.1 (default {DEFAULT_ALERTMANAGER_PORT})")
    parser.add_argument("--nodes", type=int, default=None,
                        help="number of simulated nodes (default: the scenario's)")
    parser.add_argument("--webhook-url", default=None,
                        help="where Alertmanager's sidecar webhook posts, e.g. the query sidecar's "
                             f"http://127.0.0.1:19500{SIDECAR_WEBHOOK_PATH} (default: a local receiver "
                             "that prints each notification)")
    parser.add_argument("--fast-alerts", action="store_true",
                        help="render the rules with shortened for: durations and rule-group intervals "
                             "(same thresholds) so each demo fault alerts while it lasts")
    parser.add_argument("--scrape-interval", default="5s",
                        help="Prometheus scrape and rule evaluation interval (default 5s)")
    parser.add_argument("--log.level", dest="log_level", default="warning",
                        choices=["debug", "info", "warning", "error"])


def load_stack_scenario(path: str | None, nodes: int | None):
    """The scenario to run, resized to --nodes when given."""
    from fabricscope.demo.scenario import ScenarioError, default_scenario_path, load_scenario

    source = Path(path) if path else default_scenario_path()
    try:
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
    receiver: WebhookReceiver | None = None
    alertmanager: ManagedProcess | None = None
    prometheus: ManagedProcess | None = None

    def stop(self) -> None:
        # Prometheus first (it sends to Alertmanager and scrapes the cluster), the
        # cluster last; each step runs even if an earlier one failed.
        for name, stopper in (("prometheus", self.prometheus and self.prometheus.stop),
                              ("alertmanager", self.alertmanager and self.alertmanager.stop),
                              ("webhook receiver", self.receiver and self.receiver.stop),
                              ("demo cluster", self.cluster and self.cluster.stop)):
            if stopper:
                try:
                    stopper()
                except Exception:
                    log.exception("stopping %s", name)


def start_stack(args: argparse.Namespace, stack: Stack, out=sys.stdout) -> None:
    """Start every part into `stack` (so the caller can always stop what did start)."""
    host = "127.0.0.1"
    for binary in ("prometheus", "prometheus-alertmanager"):
        find_binary(binary)   # fail before anything starts, not halfway through
    ensure_port_free(host, args.prometheus_port, "Prometheus", "--prometheus-port")
    ensure_port_free(host, args.alertmanager_port, "Alertmanager", "--alertmanager-port")
    if args.prometheus_port and args.prometheus_port == args.alertmanager_port:
        raise StackError("--prometheus-port and --alertmanager-port must differ")
    scenario = load_stack_scenario(args.scenario, args.nodes)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if args.fast_alerts:
        rules = render_rules(FAST_ALERT_OVERRIDES, workdir / "rules")
    else:
        rules = rule_files()
    if not rules:
        log.warning("no rules/*.yaml found: Prometheus runs without alerting rules (run `make rules`)")
    # Fresh TSDB, Alertmanager state and notification log each run: alerts of a previous
    # run must not reappear as if this scenario caused them.
    for stale in ("prometheus-data", "alertmanager-data"):
        shutil.rmtree(workdir / stale, ignore_errors=True)
    (workdir / "notifications.log").unlink(missing_ok=True)

    from fabricscope.demo.cluster import DemoCluster
    from fabricscope.demo.main import write_targets_file

    stack.cluster = DemoCluster(scenario, workdir / "cluster", base_port=0, listen_host=host)
    stack.cluster.start()
    targets_file = write_targets_file(workdir / "targets.json", stack.cluster.targets, scenario.cluster_name)

    webhook_url = args.webhook_url
    if not webhook_url:
        notifications_log = workdir / "notifications.log"

        printing = threading.Lock()   # the receiver serves each POST on its own thread

        def show(notification: ReceivedNotification) -> None:
            text = format_notification(notification) + "\n"
            with printing:
                out.write(text)
                out.flush()
                with open(notifications_log, "a") as handle:
                    handle.write(text)

        stack.receiver = WebhookReceiver(host, 0, on_notification=show).start()
        webhook_url = stack.receiver.url

    am_config = write_yaml(workdir / "alertmanager.yml", alertmanager_config(webhook_url))
    alertmanager_port = args.alertmanager_port or free_port(host)
    stack.alertmanager = start_alertmanager(am_config, workdir / "alertmanager-data", host, alertmanager_port,
                                            workdir / "alertmanager.log")
    prometheus_port = args.prometheus_port or free_port(host)
    prom_config = write_yaml(workdir / "prometheus.yml", prometheus_config(
        scenario.cluster_name, targets_file, f"{host}:{alertmanager_port}", rules,
        scrape_interval=args.scrape_interval, evaluation_interval=args.scrape_interval,
        self_address=f"{host}:{prometheus_port}"))
    stack.prometheus = start_prometheus(prom_config, workdir / "prometheus-data", host, prometheus_port,
                                        workdir / "prometheus.log")

    prometheus_url = f"http://{host}:{prometheus_port}"
    alertmanager_url = f"http://{host}:{alertmanager_port}"
    banner = [
        "",
        f"fabricscope stack: cluster {scenario.cluster_name!r}, {scenario.nodes} nodes x "
        f"{scenario.gpus_per_node} GPUs, scenario {scenario.source}",
        "",
        "Exporters:",
        *(f"  {node:<16} http://{address}/metrics" for node, address in stack.cluster.targets),
        f"Prometheus:     {prometheus_url}   (alerts: {prometheus_url}/alerts, targets: {prometheus_url}/targets)",
        f"  rules:        {', '.join(str(p) for p in rules) or 'none'}"
        + (" (shortened for: durations, --fast-alerts)" if args.fast_alerts else
           " (production for: durations; --fast-alerts shortens them)"),
        f"Alertmanager:   {alertmanager_url}",
        f"Notifications:  {webhook_url}" + ("" if args.webhook_url else
                                            f"  (printed below and in {workdir / 'notifications.log'})"),
        f"Workdir:        {workdir}  (configs, logs, TSDB)",
        "",
        "Fault timeline (seconds since start" + (f", repeating every {scenario.repeat:g}s):" if scenario.repeat else "):"),
        *describe_faults(scenario),
        "",
        "Ctrl-C stops everything." if not args.duration else f"Stopping after {args.duration:g}s.",
        "",
    ]
    print("\n".join(banner), file=out, flush=True)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = Stack()
    try:
        start_stack(args, stack)
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stop.wait(1.0):
            for part in (stack.prometheus, stack.alertmanager):
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
