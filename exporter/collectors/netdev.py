"""Ethernet / RoCE interfaces from <sysfs>/class/net/<if>/.

Every file in statistics/ becomes fabric_netdev_<stat>_total. Files that cannot be read
are skipped and counted in fabric_netdev_read_errors{interface,reason}; the other
interfaces and the other files of the same interface are still exported.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..framework import Collector, SampleCache, register
from ..parsers.files import ReadProblem, read_text
from ..parsers.netdev import (NetDevice, NetDeviceFiles, list_interfaces, parse_default_route_interfaces,
                              read_ethtool_statistics, read_net_device)

# Container hosts create one veth per pod; their counters are the CNI's business and
# would multiply the series count by the pod count. The loopback carries no fabric
# traffic, and its ~29 series are worth more elsewhere in a node's budget
# (docs/metrics.md). Everything else is kept.
DEFAULT_EXCLUDE = r"^veth|^lo$"
DEFAULT_INCLUDE = r""

MEGABIT_BYTES = 1_000_000 / 8

# statistics/ files left out by default: counters of half-duplex links (collisions,
# heartbeat, window, aborted) and of compressed (CSLIP/PPP) traffic, which a datacenter NIC
# never moves; each is a series per interface of a node's budget (docs/metrics.md).
DEFAULT_STATISTICS_EXCLUDE = r"^(collisions|tx_heartbeat_errors|tx_window_errors|tx_aborted_errors|(rx|tx)_compressed)$"

# Driver counters (ethtool -S) that sysfs statistics/ lacks and a RoCE operator needs:
# mlx5 buffer/PFC drops and pauses, physical-layer errors, transceiver module events.
# An allow-list, because an mlx5 port has several hundred, most of them per queue.
DEFAULT_ETHTOOL_INCLUDE = (
    r"^(rx_out_of_buffer|rx_discards_phy|tx_discards_phy|rx_pause_ctrl_phy|tx_pause_ctrl_phy"
    r"|rx_prio[0-7]_(pause|discards)|tx_prio[0-7]_pause|rx_buffer_passed_thres_phy"
    r"|rx_crc_errors_phy|rx_symbol_err_phy|rx_pcs_symbol_err_phy|rx_corrected_bits_phy|link_down_events_phy"
    r"|module_(unplug|bus_stuck|high_temp|bad_shorted))$"
)


def _pattern(ctx, flag: str, default: str) -> re.Pattern | None:
    """--collector.netdev.<flag>, else the config file's netdev.<flag_with_underscores>, else
    the default; None when that is empty."""
    key = flag.replace("-", "_")
    pattern = getattr(ctx.args, f"netdev_{key}", None)
    if pattern is None:
        pattern = ctx.section("netdev").get(key, default)
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--collector.netdev.{flag} {pattern!r}: {exc}") from None


@register
class NetdevCollector(Collector):
    name = "netdev"
    description = "Ethernet/RoCE interface state and statistics from /sys/class/net."
    serves_unchanged_samples = True   # expose() through its own SampleCache

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--collector.netdev.device-include", dest="netdev_device_include", default=None,
                            help="regex: only interfaces whose name matches (default: all)")
        parser.add_argument("--collector.netdev.device-exclude", dest="netdev_device_exclude", default=None,
                            help=f"regex: skip interfaces whose name matches (default {DEFAULT_EXCLUDE!r}; '' keeps all)")
        parser.add_argument("--collector.netdev.statistics-exclude", dest="netdev_statistics_exclude", default=None,
                            help="regex: statistics/ files not exported (default: half-duplex and compression "
                                 "counters; '' exports all)")
        parser.add_argument("--collector.netdev.ethtool-include", dest="netdev_ethtool_include", default=None,
                            help="regex: driver counters (ethtool -S) to export for physical interfaces, read only "
                                 "when --path.sysfs is the host's /sys (default: RoCE drop/pause/PHY/module "
                                 "counters; '' disables)")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.include = _pattern(ctx, "device-include", DEFAULT_INCLUDE)
        self.exclude = _pattern(ctx, "device-exclude", DEFAULT_EXCLUDE)
        self.statistics_exclude = _pattern(ctx, "statistics-exclude", DEFAULT_STATISTICS_EXCLUDE)
        # An injected sysfs root describes another machine (a fixture, the demo, a host
        # mount in a container): ioctls on this namespace's interfaces would not match it.
        real_sysfs = Path(ctx.sysfs).resolve() == Path("/sys")
        self.ethtool_include = _pattern(ctx, "ethtool-include", DEFAULT_ETHTOOL_INCLUDE) if real_sysfs else None
        self.route = Path(ctx.procfs) / "net" / "route"
        self._files: dict[str, NetDeviceFiles] = {}   # interface -> its files, held open
        self._lock = threading.Lock()
        self.samples = SampleCache()

    def wanted(self, interface: str) -> bool:
        if self.include is not None and not self.include.search(interface):
            return False
        return not (self.exclude is not None and self.exclude.search(interface))

    def collect(self) -> Iterable[Metric]:
        names = list_interfaces(self.ctx.sysfs)
        if isinstance(names, ReadProblem):
            # No /sys/class/net at all is not "zero interfaces": fail the scrape visibly.
            raise OSError(str(names))
        with self._lock:
            devices = [device for device in (read_net_device(self.ctx.sysfs, name, self._files_of(name))
                                             for name in names if self.wanted(name))
                       if device is not None]
            for gone in set(self._files) - {device.name for device in devices}:
                self._files.pop(gone).close()
            self.samples.next_scrape()
            families = expose(devices, self._default_route_interfaces(), self.statistics_exclude, self.samples)
            if self.ethtool_include is not None:
                families += self._ethtool(devices)
        return families

    def _files_of(self, name: str) -> NetDeviceFiles:
        files = self._files.get(name)
        if files is None:
            files = self._files[name] = NetDeviceFiles(self.ctx.sysfs, name)
        return files

    def close(self) -> None:
        with self._lock:
            for files in self._files.values():
                files.close()
            self._files.clear()

    def _ethtool(self, devices: list[NetDevice]) -> list[Metric]:
        counter_rows, failed_rows = [], []
        for device in devices:
            if device.driver is None:   # virtual interfaces: nothing beyond statistics/
                continue
            counters = read_ethtool_statistics(device.name)
            if isinstance(counters, ReadProblem):
                failed_rows.append(((device.name,), 1))
                continue
            seen = set()
            for name, value in counters or ():
                # Some drivers repeat a name; the first is the one ethtool -S shows first.
                if name not in seen and self.ethtool_include.search(name):
                    seen.add(name)
                    counter_rows.append(((device.name, name), value))
        return [self.samples.family(CounterMetricFamily, "fabric_netdev_ethtool_counter",
                                    "Driver counter from ethtool -S (allow-listed by "
                                    "--collector.netdev.ethtool-include).", ("interface", "counter"), counter_rows),
                self.samples.family(GaugeMetricFamily, "fabric_netdev_ethtool_read_errors",
                                    "1 if the ethtool statistics ioctl failed for the interface on this scrape.",
                                    ("interface",), failed_rows)]

    def _default_route_interfaces(self) -> set[str] | None:
        text = read_text(self.route)
        if isinstance(text, ReadProblem):
            return None  # absent in some network namespaces; then the series is absent too
        return parse_default_route_interfaces(text)


# The families every interface may have a sample in, besides one per statistics/ file.
INFO = ("fabric_netdev_info", "Interface attributes; always 1.", ("interface", "operstate", "driver", "address_family"))
UP = ("fabric_netdev_up", "1 if the interface operstate is up.", ("interface",))
CARRIER = ("fabric_netdev_carrier_changes", "Carrier up/down transitions (carrier_changes).", ("interface",))
SPEED = ("fabric_netdev_speed_bytes_per_second",
         "Negotiated link speed, converted from Mb/s to bytes/s; absent on virtual or unlinked interfaces.",
         ("interface",))
MTU = ("fabric_netdev_mtu_bytes", "Interface MTU in bytes.", ("interface",))
READ_ERRORS = ("fabric_netdev_read_errors", "Files of this interface that could not be read or parsed on this scrape.",
               ("interface", "reason"))
ROUTE = ("fabric_netdev_default_route", "1 if the interface carries an IPv4 default route (/proc/net/route).",
         ("interface",))


def expose(devices: list[NetDevice], default_route: set[str] | None,
           statistics_exclude: re.Pattern | None, cache: SampleCache) -> list[Metric]:
    info, up, carrier, speed, mtu, errors, route = [], [], [], [], [], [], []
    stats: dict[str, list] = {}
    excluded: dict[str, bool] = {}
    for device in devices:
        labels = (device.name,)
        info.append(((device.name, device.operstate or "unknown", device.driver or "", device.address_family), 1))
        if device.operstate is not None:
            up.append((labels, 1.0 if device.operstate == "up" else 0.0))
        if device.carrier_changes is not None:
            carrier.append((labels, device.carrier_changes))
        if device.speed_mbps is not None:
            speed.append((labels, device.speed_mbps * MEGABIT_BYTES))
        if device.mtu is not None:
            mtu.append((labels, device.mtu))
        if default_route is not None:
            route.append((labels, 1.0 if device.name in default_route else 0.0))
        for stat, value in device.statistics.items():
            skip = excluded.get(stat)
            if skip is None:
                skip = excluded[stat] = statistics_exclude is not None and bool(statistics_exclude.search(stat))
            if not skip:
                stats.setdefault(stat, []).append((labels, value))
        for reason, count in sorted(Counter(problem.reason for problem in device.problems).items()):
            errors.append(((device.name, reason), count))

    families = [cache.family(GaugeMetricFamily, *INFO, info), cache.family(GaugeMetricFamily, *UP, up),
                cache.family(CounterMetricFamily, *CARRIER, carrier), cache.family(GaugeMetricFamily, *SPEED, speed),
                cache.family(GaugeMetricFamily, *MTU, mtu), cache.family(GaugeMetricFamily, *READ_ERRORS, errors)]
    if default_route is not None:
        families.append(cache.family(GaugeMetricFamily, *ROUTE, route))
    families += [cache.family(CounterMetricFamily, f"fabric_netdev_{stat}", f"Interface counter statistics/{stat}.",
                              ("interface",), stats[stat]) for stat in sorted(stats)]
    return families
