"""DemoCluster: simulated nodes, their sources, one real exporter per node, a tick thread.

    with DemoCluster(load_scenario("default.yaml"), "var/demo") as cluster:
        for node, address in cluster.targets:
            ...  # scrape http://{address}/metrics

Each node's exporter is exporter.main.start_exporter with every collector enabled by
default, pointed at the node's simulated sys/, proc/ and kmsg and given the node's
simulated sources: exactly the code path of a real node.

The scenario clock starts at start(). Tick k happens at scenario time k * tick_seconds;
if the thread falls behind, it runs the missed ticks back to back (the state at tick k
never depends on wall-clock timing), so what a scrape sees is reproducible.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import load_collector_modules
from fabricscope.exporter.main import RunningExporter, start_exporter
from .plugin import ClusterSpec, NodeSpec
from .scenario import Scenario, load_scenario
from .sim_files import claim_tmpfs_home, tmpfs_home
from .sim_node import SimNode, prepare_root
from .sim_sources import NodeSources, discover_source_modules

# The demo's NVML only sleeps through its calls (demo/sources/nvml.py), and its
# scenarios run minutes, with dashboards over 15 s windows: per-link NVLink counters are
# read every 10 s there, not every 120 s as on a real node (docs/nvlink.md).
DEMO_EXPORTER_CONFIG = {"nvlink": {"link_sample_interval_seconds": 10}}

log = logging.getLogger("fabricscope.demo")


class DemoEngine:
    """The simulation without servers or threads: nodes, sources and the tick function.
    Tests and benchmarks drive it directly; DemoCluster drives it from a clock."""

    def __init__(self, scenario: Scenario, workdir: str | Path, use_tmpfs: bool = True,
                 exporter_config: dict | None = None) -> None:
        self.scenario = scenario
        self.workdir = Path(workdir)
        # Sections set over DEMO_EXPORTER_CONFIG's, e.g. a compressed timeline's shorter
        # ebpf.window_seconds (the rules are then rendered with the same config).
        self.exporter_config = {**DEMO_EXPORTER_CONFIG, **(exporter_config or {})}
        # Node trees live on tmpfs when the workdir is on disk (see sim_files.tmpfs_home);
        # workdir/<node> is then a symlink to the tree, for people to browse.
        self.home = tmpfs_home(self.workdir) if use_tmpfs else None
        base = self.home or self.workdir
        specs = tuple(NodeSpec(name=scenario.node_name(i), index=i, gpus=scenario.gpus_per_node,
                               hcas=scenario.hcas_per_node, root=base / scenario.node_name(i))
                      for i in range(scenario.nodes))
        self.cluster = ClusterSpec(name=scenario.cluster_name, nodes=specs, seed=scenario.seed)
        self.nodes = [SimNode(spec, scenario.seed) for spec in specs]
        self.sources: list[NodeSources] = []
        self.tick_index = 0

    def build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.home is not None:
            claim_tmpfs_home(self.home)
        for node in self.nodes:
            if self.home is not None:
                link = self.workdir / node.spec.name
                if link.is_symlink():
                    link.unlink()
                elif link.exists():
                    prepare_root(link)      # an on-disk tree from an earlier run: checked, cleared
                    link.rmdir()
            node.build()
            if self.home is not None:
                os.symlink(node.root, self.workdir / node.spec.name)
        modules = discover_source_modules()
        self.sources = [NodeSources(node.spec, self.cluster, modules) for node in self.nodes]
        faults = self.scenario.active_faults(0.0)
        for node_sources in self.sources:
            node_sources.step(0.0, self._faults_for(node_sources.node.name, faults))

    def close(self) -> None:
        """Remove tmpfs-backed trees (memory, not disk); on-disk trees stay for inspection."""
        if self.home is None:
            return
        for node in self.nodes:
            link = self.workdir / node.spec.name
            if link.is_symlink():
                link.unlink()
            shutil.rmtree(node.root, ignore_errors=True)
        try:
            (self.home / ".owner-pid").unlink(missing_ok=True)
            self.home.rmdir()
            self.home.parent.rmdir()
        except OSError:
            pass   # another demo's trees still live there

    def __enter__(self) -> "DemoEngine":
        self.build()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _faults_for(self, node_name: str, faults: list) -> list:
        return [f for f in faults if f.node is None or f.node == node_name]

    def now(self) -> float:
        return self.tick_index * self.scenario.tick_seconds

    def step(self, write: bool = True) -> None:
        """Advance every node by one tick: sources first, then the node's files (skipped
        with write=False while catching up; the next written tick carries the state)."""
        self.tick_index += 1
        now = self.now()
        faults = self.scenario.active_faults(now)
        for node, node_sources in zip(self.nodes, self.sources):
            mine = self._faults_for(node.spec.name, faults)
            node_sources.step(now, mine)
            try:
                node.tick(now, self.scenario.tick_seconds, mine, write)
            except OSError:  # e.g. a full disk: log it, keep the other nodes ticking
                log.exception("demo node %s could not write tick %d", node.spec.name, self.tick_index)

    def context(self, index: int) -> Context:
        node = self.nodes[index]
        return Context(sysfs=node.sysfs_root, procfs=node.procfs_root, rootfs=node.root, kmsg=node.kmsg_path,
                       state_dir=node.state_dir, node=node.spec.name, sources=dict(self.sources[index].by_key),
                       config=self.exporter_config)


class DemoCluster:
    def __init__(self, scenario: Scenario | str | Path | dict, workdir: str | Path, base_port: int = 0,
                 listen_host: str = "127.0.0.1", use_tmpfs: bool = True,
                 exporter_config: dict | None = None) -> None:
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.engine = DemoEngine(self.scenario, workdir, use_tmpfs=use_tmpfs, exporter_config=exporter_config)
        self.base_port = base_port
        self.listen_host = listen_host
        self.exporters: list[RunningExporter] = []
        self._targets: list[tuple[str, str]] = []
        self.finished = threading.Event()    # set when the scenario's duration has run out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None
        self.tick_seconds_spent = 0.0         # CPU-side cost of ticks, for the banner/benchmark
        self.ticks_run = 0

    @property
    def targets(self) -> list[tuple[str, str]]:
        """(node name, "host:port") of each node's exporter, in node order."""
        return list(self._targets)

    def now(self) -> float:
        """Seconds of scenario time since start() (0 before it)."""
        return 0.0 if self._started_at is None else time.monotonic() - self._started_at

    def start(self) -> "DemoCluster":
        enabled = [name for name, cls in sorted(load_collector_modules().items()) if cls.enabled_by_default]
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        try:
            self.engine.build()
            for index, node in enumerate(self.engine.nodes):
                port = self.base_port + index if self.base_port else 0
                try:
                    self.exporters.append(start_exporter(self.engine.context(index), enabled, f"{host}:{port}"))
                except OSError as exc:   # name the node and address, not just "Address already in use"
                    raise OSError(exc.errno, f"{node.spec.name}: cannot listen on {host}:{port}: "
                                             f"{exc.strerror or exc}") from exc
        except Exception:
            self._stop_exporters()
            self.engine.close()
            raise
        self._targets = [(node.spec.name, f"{host}:{exporter.port}")
                         for node, exporter in zip(self.engine.nodes, self.exporters)]
        log.info("demo cluster %s: %d nodes, collectors: %s", self.scenario.cluster_name, len(self.exporters),
                 ", ".join(enabled))
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="demo-ticks", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        tick = self.scenario.tick_seconds
        duration = self.scenario.duration
        while not self._stop.is_set():
            due = int((time.monotonic() - self._started_at) // tick)
            while self.engine.tick_index < due and not self._stop.is_set():
                if duration is not None and self.engine.now() + tick > duration + 1e-9:
                    self.finished.set()
                    return
                began = time.perf_counter()
                try:
                    self.engine.step(write=self.engine.tick_index + 1 == due)
                except Exception:  # a broken tick must not silently freeze the whole demo
                    log.exception("demo tick %d failed", self.engine.tick_index)
                self.tick_seconds_spent += time.perf_counter() - began
                self.ticks_run += 1
            next_due = self._started_at + (self.engine.tick_index + 1) * tick
            self._stop.wait(max(0.0, next_due - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._stop_exporters()
        self.engine.close()

    def _stop_exporters(self) -> None:
        for exporter in self.exporters:
            try:
                exporter.stop()
            except Exception:
                log.exception("stopping exporter %s", exporter.address)
        self.exporters = []

    def __enter__(self) -> "DemoCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
