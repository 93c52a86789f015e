"""`fabricscope exporter`: flags, collector selection, and the serving loop."""
from __future__ import annotations

import argparse
import gc
import logging
import signal
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from fabricscope.httpadmission import TrustedSources

from . import __version__
from .context import Context
from .exposition import Renderer
from .framework import (COLLECTORS, DEFAULT_COLLECTOR_TIMEOUT, Collector, ScrapeCollector, build_collectors,
                        load_collector_modules)
from .web import serve
from .isolated import IsolatedStepError, in_child
from .malloc import cap_malloc_arenas, return_free_heap
from .parsers.held import raise_open_file_limit
from .schema import ConfigError
from .webconfig import load_web_config

log = logging.getLogger("fabricscope.exporter")

# Outside the 9100-9999 range that the Prometheus default-port registry has allocated.
DEFAULT_LISTEN = ":19400"


def build_info(version: str) -> GaugeMetricFamily:
    info = GaugeMetricFamily("fabric_exporter_build_info", "Exporter version; always 1.", labels=["version"])
    info.add_metric([version], 1.0)
    return info


@dataclass
class RunningExporter:
    address: str
    server: object
    collectors: list[Collector]
    render_metrics: Callable[[], bytes]
    scrape: ScrapeCollector | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        self.server.stop()
        if self.scrape is not None:
            self.scrape.close()
        _close_all(self.collectors)


def _close_all(collectors: list[Collector]) -> None:
    for collector in collectors:
        try:
            collector.close()
        except Exception:
            log.exception("closing collector %s", collector.name)


def start_exporter(ctx: Context, enabled: list[str], address: str = DEFAULT_LISTEN,
                   web_config_file: str | None = None,
                   collector_timeout: float = DEFAULT_COLLECTOR_TIMEOUT,
                   trusted_sources: TrustedSources | None = None) -> RunningExporter:
    web = load_web_config(web_config_file)   # before any probe is attached: fail fast
    web.trusted = trusted_sources or TrustedSources()
    load_collector_modules()
    collectors = build_collectors(ctx, enabled)
    scrape = ScrapeCollector(collectors, node=ctx.node, timeout=collector_timeout)
    renderer = Renderer({"node": ctx.node} if ctx.node else {})
    info = build_info(__version__)   # constant: built once, not per scrape

    def render_metrics() -> bytes:
        return renderer.render([*scrape.families(), info])

    routes = {}
    for collector in collectors:
        routes.update(collector.routes())
    try:
        server = serve(address, render_metrics, web, routes, ctx.node)
    except OSError:   # e.g. address in use: release probes and threads before failing
        scrape.close()
        _close_all(collectors)
        raise
    return RunningExporter(address, server, collectors, render_metrics, scrape)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    load_collector_modules()
    parser.add_argument("--web.listen-address", dest="listen", default=DEFAULT_LISTEN,
                        help=f"address to serve /metrics on (default {DEFAULT_LISTEN})")
    parser.add_argument("--web.config.file", dest="web_config", default=None,
                        help="exporter-toolkit web config (TLS, basic auth)")
    parser.add_argument("--web.trusted-sources", dest="trusted_sources", type=trusted_sources_flag,
                        default=TrustedSources(), metavar="CIDR,...",
                        help="the scrapers' addresses (e.g. 10.0.0.5/32,10.1.0.0/16): connection slots are "
                             "kept for them when a crowd fills the rest, and a password flood from another "
                             "client at their address does not throttle their own user's login")
    parser.add_argument("--path.sysfs", dest="sysfs", default="/sys")
    parser.add_argument("--path.procfs", dest="procfs", default="/proc")
    parser.add_argument("--path.rootfs", dest="rootfs", default="/")
    parser.add_argument("--path.kmsg", dest="kmsg", default="/dev/kmsg",
                        help="kernel log source: /dev/kmsg, or a file of kmsg records")
    parser.add_argument("--path.state", dest="state_dir", default="/var/lib/fabricscope",
                        help="directory for persistent local state (cursors, counter snapshots)")
    parser.add_argument("--config.file", dest="config_file", default=None,
                        help="YAML file with per-collector sections (thresholds, allow-lists)")
    parser.add_argument("--node-name", dest="node", default=None,
                        help="value of the node label on every series (default: hostname; '' to omit)")
    parser.add_argument("--scrape.collector-timeout", dest="collector_timeout", type=float,
                        default=DEFAULT_COLLECTOR_TIMEOUT,
                        help="seconds a collector may take on a scrape before it is reported as failed "
                             f"(default {DEFAULT_COLLECTOR_TIMEOUT:g})")
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"])
    for name, cls in sorted(COLLECTORS.items()):
        group = parser.add_mutually_exclusive_group()
        state = "enabled" if cls.enabled_by_default else "disabled"
        group.add_argument(f"--collector.{name}", dest=f"collector_{name}", action="store_true",
                           default=None, help=f"enable the {name} collector ({state} by default). {cls.description}")
        group.add_argument(f"--no-collector.{name}", dest=f"collector_{name}", action="store_false",
                           default=None, help=f"disable the {name} collector")
        cls.add_arguments(parser)


def trusted_sources_flag(text: str) -> TrustedSources:
    """--web.trusted-sources: comma-separated CIDRs, refused at start-up when one is not."""
    try:
        return TrustedSources([part for part in text.split(",") if part.strip()])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def enabled_collectors(args: argparse.Namespace) -> list[str]:
    enabled = []
    for name, cls in sorted(COLLECTORS.items()):
        flag = getattr(args, f"collector_{name}", None)
        if flag is True or (flag is None and cls.enabled_by_default):
            enabled.append(name)
    return enabled


def context_from_args(args: argparse.Namespace) -> Context:
    config, source = {}, "config"
    if args.config_file:
        source = args.config_file
        try:
            # In a child process: pydantic and PyYAML are imported there, not here.
            config = in_child(_load_config_file, args.config_file)
        except (ConfigError, IsolatedStepError) as exc:
            raise SystemExit(f"fabricscope exporter: --config.file {exc}") from None
    ctx = Context(sysfs=Path(args.sysfs), procfs=Path(args.procfs), rootfs=Path(args.rootfs),
                  kmsg=Path(args.kmsg), state_dir=Path(args.state_dir), config=config, args=args,
                  config_source=source, config_validated=True)
    if args.node is not None:
        ctx.node = args.node
    return ctx


def _load_config_file(path: str) -> dict:
    from .config import load_config_file   # imports pydantic: called in a child process
    return load_config_file(path)


def settle_after_start() -> None:
    """Once everything is started: what start-up allocated for good (modules, caches,
    static device info) lives for the whole process, so move it out of the cyclic GC's
    reach: otherwise each full collection walks it all, which tripled the p99 scrape
    latency (bench/scrape_latency.py). Then hand the heap start-up freed back to the kernel."""
    gc.collect()
    gc.freeze()
    return_free_heap()


def run(args: argparse.Namespace) -> int:
    # Blocked before any thread starts, so every thread inherits the mask and SIGTERM/SIGINT
    # stay pending until the main thread takes them with sigtimedwait() below. A Python handler
    # would not do: the kernel hands a process's signal to any thread that does not block
    # it, and a main thread asleep in a wait never learns of a signal another thread took
    # (a container then waited out its grace period, intermittently). A signal during
    # start-up is taken as soon as start-up is done; PID 1 of a container, which ignores
    # signals it has no handler for, is served the same way.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    # Before any thread starts: glibc's per-thread malloc arenas (8 per core) grow the RSS
    # with the host's core count (exporter/malloc.py).
    cap_malloc_arenas()
    raise_open_file_limit()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = context_from_args(args)
    enabled = enabled_collectors(args)
    try:
        exporter = start_exporter(ctx, enabled, args.listen, args.web_config, args.collector_timeout,
                                  args.trusted_sources)
    except (ConfigError, OSError, IsolatedStepError) as exc:   # bad web config, address in use, ...
        raise SystemExit(f"fabricscope exporter: {exc}") from None
    settle_after_start()
    log.info("fabricscope exporter %s on %s (node %r), collectors: %s", __version__, args.listen,
             ctx.node, ", ".join(enabled))
    # Timed, so that the Python handlers of other signals (a debugging hook on SIGUSR1, say)
    # still run on this thread within a second: sigwait() would hold them until it returns.
    while signal.sigtimedwait(stop_signals, 1.0) is None:
        pass
    # Probes are released by the exporter rather than by the kernel at exit: the kernel
    # detaches a process's uprobes one after another, behind a grace period each, while the
    # exporter detaches them in parallel (libbpf.destroy_links).
    exporter.stop()
    log.info("stopped")
    return 0
