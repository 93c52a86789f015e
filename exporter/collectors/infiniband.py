"""InfiniBand / RoCE ports: link state, every port counter, and NIC health verdicts.

Reads <sysfs>/class/infiniband through exporter.parsers.infiniband, classifies NIC roles
(exporter.health.nic_roles), runs the health tracker (thresholds, latching, resets,
boot-ID, device disappearance, persistent state) and maps the result to the metrics in
docs/metrics.md. Thresholds and role overrides come from the `infiniband` section of
--config.file; see docs/infiniband.md.

Exposition is one table, FIELDS: each row a family and the function that lists its
samples from one scrape's View, filled by expose(). Samples go through a SampleCache, so
the many counters that did not move since the last scrape are served as the same objects
and not formatted again.
"""
from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..context import Context
from ..framework import Collector, SampleCache, register, series_name
from ..health import nic_roles
from ..health.gpu_nic_affinity import Affinity, NicCandidate, nearest_nics
from ..health.link_state import is_active
from ..health.thresholds import load_thresholds
from ..health.tracker import HealthTracker, NodeHealth
from ..parsers.infiniband import InfiniBandDevice, InfiniBandPort, StaticCache, read_infiniband
from ..statefile import StateFile, state_metrics


# Driver counters (ports/<n>/hw_counters) exported besides those a threshold judges
# (local_ack_timeout_err, out_of_sequence, rnr_nak_retry_err, roce_slow_restart): RoCE
# congestion (ECN marks, CNPs) and receive-buffer drops, which the InfiniBand dashboard draws. An mlx5 port has about 30 of them; all of them on every port
# would be a sixth of an 8-GPU node's series budget (docs/metrics.md). `hw_counter_include:
# ""` in the infiniband section exports every one.
DEFAULT_HW_COUNTER_INCLUDE = r"^(out_of_buffer|out_of_sequence|np_cnp_sent|np_ecn_marked_roce_packets|rp_cnp_handled)$"
# Port counters (ports/<n>/counters, the standard IBA set) left out by default: the
# unicast/multicast split of the packet counts (port_rcv_packets / port_xmit_packets stay),
# VL15 (subnet management) drops and switch relay errors, which an HCA port does not count.
# `counter_exclude: ""` exports every one.
DEFAULT_COUNTER_EXCLUDE = r"^((unicast|multicast)_(rcv|xmit)_packets|VL15_dropped|port_rcv_switch_relay_errors)$"


class CounterSelection:
    """Which counter files are exported (config section `infiniband`): every counters/ file
    but those matching counter_exclude, the hw_counters/ files matching hw_counter_include;
    a counter a threshold judges always."""

    def __init__(self, section: Mapping, judged: Iterable[str]) -> None:
        include = section.get("hw_counter_include", DEFAULT_HW_COUNTER_INCLUDE)
        exclude = section.get("counter_exclude", DEFAULT_COUNTER_EXCLUDE)
        self.hw_include = re.compile(include) if include else None
        self.exclude = re.compile(exclude) if exclude else None
        self.judged = frozenset(judged)

    def counter(self, name: str) -> bool:
        return self.exclude is None or name in self.judged or self.exclude.search(name) is None

    def hw_counter(self, name: str) -> bool:
        return self.hw_include is None or name in self.judged or self.hw_include.search(name) is not None


@dataclass(slots=True)
class View:
    """What one scrape found, as the FIELDS' sample functions read it."""
    devices: list[InfiniBandDevice]
    roles: Mapping[str, str]
    health: NodeHealth
    tracker: HealthTracker
    affinity: list[Affinity]

    def ports(self) -> Iterator[tuple[InfiniBandDevice, InfiniBandPort, str]]:
        """(device, port, port number as a label) for every port."""
        for device in self.devices:
            for port in device.ports:
                yield device, port, str(port.port)


Samples = Iterable[tuple[tuple[str, ...], float]]   # (label values, value)


class PerPort(NamedTuple):
    """A family whose samples are each port's, built from one object of the port alone."""
    source: Callable[[InfiniBandPort], object]            # what the port's samples are built from
    rows: Callable[[InfiniBandDevice, InfiniBandPort, str], Samples]


class Field(NamedTuple):
    metric: str                      # the exported name (a counter's without _total)
    counter: bool
    help: str
    labels: tuple[str, ...]
    samples: Callable[[View], Samples] | PerPort


PORT = ("device", "port")
# Mellanox port_*_data counters count 4-byte words; exported as bytes in their own families.
_BYTE_COUNTERS = {"port_rcv_data", "port_xmit_data"}


def _device_info(view: View) -> Samples:
    for d in view.devices:
        numa = "" if d.pci is None or d.pci.numa_node is None else str(d.pci.numa_node)
        yield (d.name, d.board_id or "", d.fw_ver or "", d.hca_type or "", d.node_guid or "",
               view.roles.get(d.name, "unknown"), numa), 1


def _port_info(view: View) -> Samples:
    for d, port, p in view.ports():
        yield (d.name, p, port.link_layer or "", port.netdev or ""), 1


def _state(view: View) -> Samples:
    for d, port, p in view.ports():
        if port.state is not None:
            yield (d.name, p, port.state.name), port.state.code


def _phys_state(view: View) -> Samples:
    for d, port, p in view.ports():
        if port.phys_state is not None:
            yield (d.name, p, port.phys_state.name), port.phys_state.code


def _rate(view: View) -> Samples:
    for d, port, p in view.ports():
        if port.rate_bytes_per_second is not None:
            yield (d.name, p), port.rate_bytes_per_second


def _bytes(counter: str) -> Callable[[View], Samples]:
    def samples(view: View) -> Samples:
        for d, port, p in view.ports():
            words = port.counters.get(counter)
            if words is not None:
                yield (d.name, p), words * 4
    return samples


# Only the selected counter files were read (the collector's StaticCache): what was read is
# exported. Per port: the parser serves a port's counters as the same object while their
# files read the same, and then so are the port's samples (SampleCache.group).
def _counter_rows(d: InfiniBandDevice, port: InfiniBandPort, p: str) -> Samples:
    for name, value in port.counters.items():
        if name not in _BYTE_COUNTERS:
            yield (d.name, p, name), value


def _hw_counter_rows(d: InfiniBandDevice, port: InfiniBandPort, p: str) -> Samples:
    for name, value in port.hw_counters.items():
        yield (d.name, p, name), value


_counters = PerPort(lambda port: port.counters, _counter_rows)
_hw_counters = PerPort(lambda port: port.hw_counters, _hw_counter_rows)


# The breach, anomaly and missing-device flags are exported only while raised (1): an alert
# reads `== 1` and resolves when the series goes, and a 0 for every judged counter of every
# port was a tenth of an 8-GPU node's series budget.
def _breached(view: View) -> Samples:
    for d, port, p in view.ports():
        for (name, severity), flag in sorted(view.health.ports[port.key].breached.items()):
            if flag:
                yield (d.name, p, name, severity), flag


def _fatal(view: View) -> Samples:
    for d, port, p in view.ports():
        yield (d.name, p), int(view.health.ports[port.key].fatal)


def _anomaly(view: View) -> Samples:
    for d, port, p in view.ports():
        verdict = view.health.ports[port.key]
        for check, raised in (("uncabled", verdict.uncabled), ("homogeneity", verdict.inhomogeneous)):
            if raised:
                yield (d.name, p, check), 1


def _read_errors(view: View) -> Samples:
    for d in view.devices:
        for reason, count in sorted(Counter(problem.reason for problem in d.problems).items()):
            yield (d.name, reason), count


def _affinity(view: View) -> Samples:
    for a in view.affinity:
        yield (str(a.gpu), a.device, str(a.port), a.path), 1


def _missing(view: View) -> Samples:
    for name, flag in sorted(view.health.missing.items()):
        if flag:
            yield (name,), flag


def _events(view: View) -> Samples:
    for (key, severity), count in sorted(view.tracker.events.items()):
        yield (key.device, str(key.port), severity), count


def _resets(view: View) -> Samples:
    for (key, name), count in sorted(view.tracker.reset_counts.items()):
        yield (key.device, str(key.port), name), count


def _down_transitions(view: View) -> Samples:
    for key, count in sorted(view.tracker.down_transitions.items()):
        yield (key.device, str(key.port)), count


FIELDS: tuple[Field, ...] = (
    Field("fabric_infiniband_device_info", False, "InfiniBand/RoCE device metadata and NIC role; always 1.",
          ("device", "board_id", "fw_version", "hca_type", "node_guid", "role", "numa_node"), _device_info),
    Field("fabric_infiniband_port_info", False, "Port link layer and netdev; always 1.",
          (*PORT, "link_layer", "netdev"), _port_info),
    Field("fabric_infiniband_port_state", False, "Port logical state code (ports/<n>/state).",
          (*PORT, "state"), _state),
    Field("fabric_infiniband_port_phys_state", False, "Port physical state code (ports/<n>/phys_state).",
          (*PORT, "phys_state"), _phys_state),
    Field("fabric_infiniband_port_rate_bytes_per_second", False,
          "Port signalling rate in bytes per second (ports/<n>/rate, Gb/s converted).", PORT, _rate),
    Field("fabric_infiniband_port_receive_bytes", True,
          "Bytes received (counters/port_rcv_data, 4-byte words x 4).", PORT, _bytes("port_rcv_data")),
    Field("fabric_infiniband_port_transmit_bytes", True,
          "Bytes transmitted (counters/port_xmit_data, 4-byte words x 4).", PORT, _bytes("port_xmit_data")),
    Field("fabric_infiniband_port_counter", True, "Port counters from ports/<n>/counters/<counter>, but those "
          "matching infiniband.counter_exclude.", (*PORT, "counter"), _counters),
    Field("fabric_infiniband_port_hw_counter", True, "Driver counters from ports/<n>/hw_counters/<counter>: "
          "those a threshold judges and those matching infiniband.hw_counter_include.", (*PORT, "counter"),
          _hw_counters),
    Field("fabric_infiniband_port_counter_breached", False,
          "1 while a counter threshold is breached (latched until reset or a full window recovers); "
          "absent otherwise.", (*PORT, "counter", "severity"), _breached),
    Field("fabric_infiniband_port_fatal", False,
          "1 when the port is DOWN, phys Disabled or has a fatal counter breach.", PORT, _fatal),
    Field("fabric_infiniband_port_anomaly", False, "1 for an uncabled port or a card with fewer active ports "
          "than its peers; absent otherwise.", (*PORT, "check"), _anomaly),
    Field("fabric_infiniband_device_read_errors", False, "Files of this device that could not be used on this scrape.",
          ("device", "reason"), _read_errors),
    Field("fabric_gpu_nic_affinity_info", False, "The NIC port nearest each GPU in the PCIe tree (path: "
          "same_switch, same_root_port, same_numa, cross_socket, unknown); gpu is the NVML index; always 1.",
          ("gpu", "device", "port", "path"), _affinity),
    Field("fabric_infiniband_device_missing", False, "1 when a device this node had is gone (fatal); absent "
          "otherwise.", ("device",), _missing),
    Field("fabric_infiniband_port_health_events", True, "Health events: fatal, non_fatal, recovery, baseline.",
          (*PORT, "severity"), _events),
    Field("fabric_infiniband_port_counter_resets", True,
          "Counters seen going down between scrapes (admin clear with perfquery -x, driver reload).",
          (*PORT, "counter"), _resets),
    Field("fabric_infiniband_port_down_transitions", True,
          "ACTIVE -> not ACTIVE transitions seen by the exporter (persisted).", PORT, _down_transitions),
)


def expose(view: View, cache: SampleCache) -> list[Metric]:
    """Every FIELDS family, filled from `view`."""
    families = []
    for field in FIELDS:
        kind = CounterMetricFamily if field.counter else GaugeMetricFamily
        if field.samples.__class__ is not PerPort:
            families.append(cache.family(kind, field.metric, field.help, field.labels, field.samples(view)))
            continue
        family = cache.empty(kind, field.metric, field.help, field.labels)
        name, (source, rows) = series_name(family), field.samples
        for d, port, p in view.ports():
            family.samples += cache.group(name, field.labels, port.key, source(port),
                                          lambda d=d, port=port, p=p: rows(d, port, p))
        families.append(family)
    return families


@register
class InfiniBandCollector(Collector):
    name = "infiniband"
    description = "InfiniBand/RoCE port state, counters and NIC health (fatal/non-fatal thresholds)."
    serves_unchanged_samples = True   # expose() through its own SampleCache

    def __init__(self, ctx: Context, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ctx)
        section = ctx.section("infiniband")
        self.thresholds = load_thresholds(section)
        self.role_overrides = nic_roles.load_role_overrides(section)
        self.selection = CounterSelection(section, (t.counter for t in self.thresholds))
        # Only the counter files exported or judged are read at all.
        self.static_cache = StaticCache(self.selection.counter, self.selection.hw_counter)
        self.tracker = HealthTracker(StateFile(ctx.state_dir / "infiniband.json"), self.thresholds,
                                     ctx.procfs, clock)
        self.samples = SampleCache()
        self._topology_key: tuple | None = None
        self._near_gpu: dict[str, bool | None] = {}
        self._gpus: list[nic_roles.Gpu] = []
        self._affinity_of: tuple[tuple[NicCandidate, ...], list[Affinity]] | None = None
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
            self._affinity_of = None
        default_ifaces = nic_roles.default_route_interfaces(self.ctx.procfs)
        return {p.device: nic_roles.classify(p, self._near_gpu.get(p.device), default_ifaces,
                                             any(is_active(port) for port in d.ports),
                                             self.role_overrides.get(p.device))
                for p, d in zip(placements, devices)}

    def _affinity(self, devices: list[InfiniBandDevice]) -> list[Affinity]:
        def port_of(device: InfiniBandDevice) -> int | None:
            active = [p.port for p in device.ports if is_active(p)]
            return min(active or [p.port for p in device.ports], default=None)
        nics = tuple(NicCandidate(d.name, d.pci.path if d.pci else None, d.pci.numa_node if d.pci else None,
                                  port_of(d)) for d in devices)
        # The PCIe walk is the same until a device or its chosen port changes.
        if self._affinity_of is None or self._affinity_of[0] != nics:
            self._affinity_of = (nics, nearest_nics(self._gpus, list(nics)))
        return self._affinity_of[1]

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
        self.samples.next_scrape()
        view = View(devices, roles, health, self.tracker, self._affinity(devices))
        tracker = self.tracker
        return [*expose(view, self.samples),
                *state_metrics(self.name, tracker.load_problem, tracker.state_file.write_errors,
                               tracker.boot_id_changes, self.samples)]
