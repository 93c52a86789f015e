"""InfiniBand / RoCE ports: link state, every port counter, and NIC health verdicts.

Reads <sysfs>/class/infiniband through exporter.parsers.infiniband, classifies NIC roles
(exporter.health.nic_roles), runs the health tracker (thresholds, latching, resets,
boot-ID, device disappearance, persistent state) and maps the result to the metrics in
docs/metrics.md. Thresholds and role overrides come from the `infiniband` section of
--config.file; see docs/infiniband.md.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..context import Context
from ..framework import Collector, add_sample, register
from ..health import nic_roles
from ..health.gpu_nic_affinity import NicCandidate, nearest_nics
from ..health.link_state import is_active
from ..health.thresholds import load_thresholds
from ..health.tracker import HealthTracker
from ..parsers.infiniband import InfiniBandDevice, StaticCache, read_infiniband
from ..statefile import StateFile, state_metrics


@register
class InfiniBandCollector(Collector):
    name = "infiniband"
    description = "InfiniBand/RoCE port state, counters and NIC health (fatal/non-fatal thresholds)."

    def __init__(self, ctx: Context, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ctx)
        section = ctx.section("infiniband")
        self.thresholds = load_thresholds(section)
        self.role_overrides = nic_roles.load_role_overrides(section)
        self.static_cache = StaticCache()
        self.tracker = HealthTracker(StateFile(ctx.state_dir / "infiniband.json"), self.thresholds,
                                     ctx.procfs, clock)
        self._topology_key: tuple | None = None
        self._near_gpu: dict[str, bool | None] = {}
        self._gpus: list[nic_roles.Gpu] = []
        # The web server is threaded: two overlapping scrapes must not interleave their
        # updates of the health history (a breach would be judged twice).
        self._lock = threading.Lock()

    def _roles(self, devices: list[InfiniBandDevice]) -> dict[str, str]:
        placements = [nic_roles.NicPlacement(d.name, d.pci.path if d.pci else None,
                                             d.pci.numa_node if d.pci else None,
                                             tuple(p.netdev for p in d.ports if p.netdev))
                      for d in devices]
        # GPU scan and PCI proximity cannot change without a device change: cache them.
        key = tuple((p.device, p.pci_path) for p in placements)
        if key != self._topology_key:
            self._gpus = nic_roles.find_gpus(self.ctx.sysfs)
            self._near_gpu = nic_roles.gpu_proximity(placements, self._gpus)
            self._topology_key = key
        default_ifaces = nic_roles.default_route_interfaces(self.ctx.procfs)
        return {p.device: nic_roles.classify(p, self._near_gpu.get(p.device), default_ifaces,
                                             any(is_active(port) for port in d.ports),
                                             self.role_overrides.get(p.device))
                for p, d in zip(placements, devices)}

    def _affinity(self, devices: list[InfiniBandDevice]):
        def port_of(device: InfiniBandDevice) -> int | None:
            active = [p.port for p in device.ports if is_active(p)]
            return min(active or [p.port for p in device.ports], default=None)
        nics = [NicCandidate(d.name, d.pci.path if d.pci else None, d.pci.numa_node if d.pci else None, port_of(d))
                for d in devices]
        return nearest_nics(self._gpus, nics)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return self._collect()

    def close(self) -> None:
        with self._lock:
            self.static_cache.close()

    def _collect(self) -> list[Metric]:
        devices = [d for d in read_infiniband(self.ctx.sysfs, self.static_cache)
                   if not (d.pci is not None and d.pci.is_virtual_function)]   # VFs: the PF reports
        roles = self._roles(devices)
        health = self.tracker.update(devices, roles)
        tracker = self.tracker

        g = GaugeMetricFamily
        c = CounterMetricFamily
        device_info = g("fabric_infiniband_device_info", "InfiniBand/RoCE device metadata and NIC role; always 1.",
                        labels=["device", "board_id", "fw_version", "hca_type", "node_guid", "role", "numa_node"])
        port_info = g("fabric_infiniband_port_info", "Port link layer and netdev; always 1.",
                      labels=["device", "port", "link_layer", "netdev"])
        state = g("fabric_infiniband_port_state", "Port logical state code (ports/<n>/state).",
                  labels=["device", "port", "state"])
        phys = g("fabric_infiniband_port_phys_state", "Port physical state code (ports/<n>/phys_state).",
                 labels=["device", "port", "phys_state"])
        rate = g("fabric_infiniband_port_rate_bytes_per_second",
                 "Port signalling rate in bytes per second (ports/<n>/rate, Gb/s converted).", labels=["device", "port"])
        rx = c("fabric_infiniband_port_receive_bytes", "Bytes received (counters/port_rcv_data, 4-byte words x 4).",
               labels=["device", "port"])
        tx = c("fabric_infiniband_port_transmit_bytes", "Bytes transmitted (counters/port_xmit_data, 4-byte words x 4).",
               labels=["device", "port"])
        counter = c("fabric_infiniband_port_counter", "Port counters from ports/<n>/counters/<counter>.",
                    labels=["device", "port", "counter"])
        hw_counter = c("fabric_infiniband_port_hw_counter", "Driver counters from ports/<n>/hw_counters/<counter>.",
                       labels=["device", "port", "counter"])
        breached = g("fabric_infiniband_port_counter_breached",
                     "1 while a counter threshold is breached (latched until reset or a full window recovers).",
                     labels=["device", "port", "counter", "severity"])
        fatal = g("fabric_infiniband_port_fatal", "1 when the port is DOWN, phys Disabled or has a fatal counter breach.",
                  labels=["device", "port"])
        anomaly = g("fabric_infiniband_port_anomaly", "1 for an uncabled port or a card with fewer active ports than its peers.",
                    labels=["device", "port", "check"])
        affinity = g("fabric_gpu_nic_affinity_info", "The NIC port nearest each GPU in the PCIe tree (path: "
                     "same_switch, same_root_port, same_numa, cross_socket, unknown); gpu is the NVML index; "
                     "always 1.", labels=["gpu", "device", "port", "path"])
        for a in self._affinity(devices):
            affinity.add_metric([str(a.gpu), a.device, str(a.port), a.path], 1)
        errors = g("fabric_infiniband_device_read_errors", "Files of this device that could not be used on this scrape.",
                   labels=["device", "reason"])

        for device in devices:
            d = device.name
            device_info.add_metric([d, device.board_id or "", device.fw_ver or "", device.hca_type or "",
                                    device.node_guid or "", roles.get(d, "unknown"),
                                    "" if device.pci is None or device.pci.numa_node is None else str(device.pci.numa_node)], 1)
            reasons: dict[str, int] = {}
            for problem in device.problems:
                reasons[problem.reason] = reasons.get(problem.reason, 0) + 1
            for reason, count in sorted(reasons.items()):
                errors.add_metric([d, reason], count)
            for port in device.ports:
                p = str(port.port)
                port_info.add_metric([d, p, port.link_layer or "", port.netdev or ""], 1)
                if port.state is not None:
                    state.add_metric([d, p, port.state.name], port.state.code)
                if port.phys_state is not None:
                    phys.add_metric([d, p, port.phys_state.name], port.phys_state.code)
                if port.rate_bytes_per_second is not None:
                    rate.add_metric([d, p], port.rate_bytes_per_second)
                for name, value in port.counters.items():
                    if name == "port_rcv_data":
                        rx.add_metric([d, p], value * 4)
                    elif name == "port_xmit_data":
                        tx.add_metric([d, p], value * 4)
                    else:                        # most of the series: add_sample, not add_metric
                        add_sample(counter, {"device": d, "port": p, "counter": name}, value)
                for name, value in port.hw_counters.items():
                    add_sample(hw_counter, {"device": d, "port": p, "counter": name}, value)
                verdict = health.ports[(d, port.port)]
                for (name, severity), flag in sorted(verdict.breached.items()):
                    breached.add_metric([d, p, name, severity], flag)
                fatal.add_metric([d, p], int(verdict.fatal))
                anomaly.add_metric([d, p, "uncabled"], int(verdict.uncabled))
                anomaly.add_metric([d, p, "homogeneity"], int(verdict.inhomogeneous))
        families = [device_info, port_info, state, phys, rate, rx, tx, counter, hw_counter,
                    breached, fatal, anomaly, errors, affinity]

        missing = g("fabric_infiniband_device_missing", "1 when a device this node had is gone (fatal).", labels=["device"])
        for name, flag in sorted(health.missing.items()):
            missing.add_metric([name], flag)
        events = c("fabric_infiniband_port_health_events", "Health events: fatal, non_fatal, recovery, baseline.",
                   labels=["device", "port", "severity"])
        for (d, p, severity), count in sorted(tracker.events.items()):
            events.add_metric([d, p, severity], count)
        resets = c("fabric_infiniband_port_counter_resets", "Counters seen going down between scrapes (admin clear with perfquery -x, driver reload).",
                   labels=["device", "port", "counter"])
        for (key, name), count in sorted(tracker.reset_counts.items()):
            d, _, p = key.rpartition("/")
            resets.add_metric([d, p, name], count)
        downs = c("fabric_infiniband_port_down_transitions", "ACTIVE -> not ACTIVE transitions seen by the exporter (persisted).",
                  labels=["device", "port"])
        for key, count in sorted(tracker.down_transitions.items()):
            d, _, p = key.rpartition("/")
            downs.add_metric([d, p], count)
        families += [missing, events, resets, downs]
        families += state_metrics(self.name, tracker.load_problem, tracker.state_file.write_errors,
                                  tracker.boot_id_changes)
        return families
