"""Kernel signals from eBPF: TCP RTT/connect latency/retransmits, scheduler, syscalls.

Reads a MapSource: the kernel's BPF maps (libbpf CO-RE objects built from exporter/bpf/)
or, in the demo, a simulation holding the same raw structures. When eBPF cannot run
here (not root, no BTF, no libbpf, objects missing, refused by the verifier) the
collector stays cheap: fabric_ebpf_available{reason} 0 and nothing else, logged once.

Config section `ebpf` (all optional):
  peers: {10.0.0.12: gpu-node-3, ...}   peer IP -> host label of fabric_tcp_retransmits_total
  processes: [python, tritonserver]     process names always counted under their own name
  gpu_device_prefix: /dev/nvidia        no longer used: a process is counted by name from its
                                        first ioctl on a GPU device (gpu_device_majors)
  gpu_device_majors: [195, 508]         GPU char-device majors (default: nvidia* in /proc/devices)
  process_scan_interval_seconds: 15
  enable_stats: false                   account program run count/time (BPF_ENABLE_STATS); costs
                                        ~70 ns per event on a VM, so off unless asked for
  objects: [tcp, sched, syscalls]       which programs to load (default: tcp, plus syscalls
                                        with a processes list; see docs/ebpf.md for what each
                                        costs per event)
  tcp_rtt_network_namespaces: [/run/netns/a]  RTT histograms from these namespaces only (default: all)
  window_seconds: {fabric_tcp_rtt_excess_seconds: 10}  a declared window_quantile's window, for
                                        compressed demo timelines (render the rules with it too)
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..bpf_loader import reasons
from ..bpf_loader.declarations import load_declarations
from ..bpf_loader.families import MapConverter
from ..framework import Collector, register

log = logging.getLogger("fabricscope.exporter.bpf_loader")

# Loaded when the config names no `objects`: the program whose cost on the realistic mix
# of bench/ebpf_overhead.py (bulk loopback TCP, a data-loader syscall loop) stays within
# about 1% (docs/ebpf.md has the table). sched (a program on every context switch and
# wakeup) and syscalls (every syscall of the host takes the tracing slow path) cost more
# than that and feed no alert: they are loaded when asked for.
DEFAULT_OBJECTS = ("tcp",)


@register
class EbpfCollector(Collector):
    name = "ebpf"
    description = "TCP, scheduler and syscall signals from eBPF programs (libbpf CO-RE)."

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--collector.ebpf.object-dir", dest="ebpf_object_dir", default=None,
                            help="directory holding the compiled *.bpf.o (default: next to the sources)")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._lock = threading.Lock()
        config = ctx.section("ebpf")
        self._decls = self._selected(load_declarations(), config.get("objects"), self._default_objects(config))
        self._source = ctx.sources.get("bpf")
        if self._source is None:
            self._source = self._kernel_source(config)
        self._converter = MapConverter(self._decls, self._peers(config), config.get("window_seconds"))
        reason, message = self._source.availability()
        attached = sorted(p for p, ok in self._source.programs().items() if ok)
        if reason == reasons.OK:
            log.info("eBPF ready: %d programs attached (%s)", len(attached), ", ".join(attached))
        elif attached:
            log.error("eBPF partly attached: %d programs serve (%s), the rest do not (%s): %s; exporting "
                      "fabric_ebpf_available 0 and fabric_ebpf_program_attached per program",
                      len(attached), ", ".join(attached), reason, message)
        else:
            log.warning("eBPF unavailable (%s): %s; exporting fabric_ebpf_available 0", reason, message)

    def _default_objects(self, config: dict) -> set[str] | None:
        """Without an explicit `objects` list: DEFAULT_OBJECTS, plus syscalls when a
        `processes` allow-list asks for per-process syscall counts (the list means nothing
        without it)."""
        if "bpf" in self.ctx.sources:     # the demo simulates every program
            return None
        if config.get("processes"):
            return {*DEFAULT_OBJECTS, "syscalls"}
        log.info("eBPF: loading %s (sched and syscalls cost more per event; set ebpf.objects to load them)",
                 ", ".join(DEFAULT_OBJECTS))
        return set(DEFAULT_OBJECTS)

    @staticmethod
    def _selected(decls, wanted, default=None):
        if wanted is None:
            return decls if default is None else [d for d in decls if d.object in default]
        # The config schema holds `objects` to a list of the objects that exist.
        return [d for d in decls if d.object in set(wanted)]

    def _kernel_source(self, config: dict):
        from ..bpf_loader.kernel_source import KernelMapSource
        from ..bpf_loader.processes import ProcessTracker

        object_dir = getattr(self.ctx.args, "ebpf_object_dir", None) or config.get("object_dir")
        majors = config.get("gpu_device_majors")
        tracker = ProcessTracker(
            procfs=self.ctx.procfs,
            allow_comms=frozenset(map(str, config.get("processes") or ())),
            explicit_majors=[int(m) for m in majors] if majors is not None else None,
            interval_seconds=float(config.get("process_scan_interval_seconds", 15)),
        )
        return KernelMapSource(self._decls, Path(object_dir) if object_dir else None, self.ctx.sysfs,
                               self.ctx.procfs, tracker, enable_stats=bool(config.get("enable_stats", False)),
                               tcp_namespaces=tuple(config.get("tcp_rtt_network_namespaces") or ()))

    def _peers(self, config: dict) -> dict[str, str]:
        """Source-known peers plus ebpf.peers (IP -> host name, validated by the schema)."""
        return {**self._source.peers(), **(config.get("peers") or {})}

    @property
    def source(self):
        return self._source

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            reason, _message = self._source.availability()
            available = GaugeMetricFamily("fabric_ebpf_available",
                                          "1 if every declared eBPF program is attached; 0 otherwise, reason "
                                          "says why (attached programs keep serving: "
                                          "fabric_ebpf_program_attached).", labels=["reason"])
            available.add_metric([reason], 1.0 if reason == reasons.OK else 0.0)
            yield available
            if not any(self._source.programs().values()):
                return
            self._source.refresh()
            yield from self._self_metrics()
            yield from self._converter.families(self._source)

    def _self_metrics(self) -> Iterable[Metric]:
        attached = GaugeMetricFamily("fabric_ebpf_program_attached", "1 if the BPF program is attached.",
                                     labels=["program"])
        for program, ok in sorted(self._source.programs().items()):
            attached.add_metric([program], 1.0 if ok else 0.0)
        yield attached
        untracked = GaugeMetricFamily("fabric_ebpf_untracked_processes",
                                      "Processes of interest that did not fit the kernel's tracked-process "
                                      "map; their syscalls count under comm=\"other\".", labels=[])
        untracked.add_metric([], float(self._source.untracked_processes()))
        yield untracked
        stats = self._source.program_stats()
        enabled = GaugeMetricFamily("fabric_ebpf_run_statistics_enabled", "1 if the kernel accounts BPF "
                                    "program run count and time (ebpf.enable_stats or sysctl "
                                    "kernel.bpf_stats_enabled=1).", labels=[])
        enabled.add_metric([], 0.0 if stats is None else 1.0)
        yield enabled
        if stats is None:
            return   # not accounted: absent, never a fake 0
        runs = CounterMetricFamily("fabric_ebpf_program_run_count", "Times the BPF program ran "
                                   "(kernel run-time statistics).", labels=["program"])
        run_time = CounterMetricFamily("fabric_ebpf_program_run_seconds", "Time spent running the BPF "
                                       "program (kernel run-time statistics, ns / 1e9).", labels=["program"])
        for program, (count, ns) in sorted(stats.items()):
            runs.add_metric([program], count)
            run_time.add_metric([program], ns / 1e9)
        yield runs
        yield run_time

    def close(self) -> None:
        with self._lock:
            if self.ctx.sources.get("bpf") is None:
                self._source.close()
