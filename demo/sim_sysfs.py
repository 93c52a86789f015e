"""The simulated /sys of one GPU node: PCI functions, InfiniBand HCAs and net devices.

Layout and file formats follow a real ConnectX-7 / HGX H100 host, so the collectors
cannot tell the difference: class/infiniband/mlx5_N and class/net/ethN are relative
symlinks into devices/pci.../<bdf>/, bus/pci/devices/<bdf> links every function, and
`device`/`driver` links resolve as on a real kernel.

Counter values grow with traffic every tick (port_*_data in 4-byte words, as mlx5
reports them); background error rates are tiny and stay far below every health
threshold, so a healthy node looks healthy. Faults are applied by sim_node.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .sim_files import TreeWriter
from .sim_topology import NodeTopology, PciFunction

# The counters/ files of an mlx5 port, in the order the kernel creates them.
PORT_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
    "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
    "unicast_rcv_packets", "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests",
    "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests",
)
# Healthy background error rates (events per second per port). All far below the
# thresholds: symbol_error 2/hour against 120/hour (IBTA BER 1e-12), port_rcv_errors
# against >10/s, local_ack_timeout_err against >1/s. Counters not named stay 0, which
# matters for the ones where any increase is fatal (link_downed, excessive_buffer_overrun_errors,
# local_link_integrity_errors, rnr_nak_retry_err).
BACKGROUND_ERRORS = {
    "symbol_error": 1 / 1800, "port_rcv_errors": 1 / 3600, "port_xmit_discards": 1 / 900,
}
BACKGROUND_HW_ERRORS = {
    "out_of_sequence": 1 / 600, "packet_seq_err": 1 / 1200, "duplicate_request": 1 / 1200,
    "implied_nak_seq_err": 1 / 1800, "local_ack_timeout_err": 1 / 7200,
}
# RoCE congestion control is busy on a healthy Ethernet fabric: ECN marks and CNPs flow.
ROCE_CONGESTION = {"np_ecn_marked_roce_packets": 40.0, "np_cnp_sent": 40.0, "rp_cnp_handled": 35.0}

XMIT_WAIT_PER_SECOND = 400.0
AVERAGE_PACKET_BYTES = 4160          # 4 KiB MTU payload plus headers
BYTES_PER_WRITE_REQUEST = 65536      # NCCL's RDMA writes arrive in large messages

STATE_ACTIVE, STATE_DOWN = "4: ACTIVE", "1: DOWN"
PHYS_LINKUP, PHYS_POLLING, PHYS_DISABLED = "5: LinkUp", "2: Polling", "3: Disabled"


@dataclass
class IbPort:
    device: str
    port: int
    base: str                        # sysfs-relative directory of the port
    link_layer: str
    rate: str
    lid: str
    tx_bytes_per_second: float
    rx_bytes_per_second: float
    netdev: str | None = None
    state: str = STATE_ACTIVE
    phys_state: str = PHYS_LINKUP
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PORT_COUNTERS, 0))
    hw_counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HW_COUNTERS, 0))
    # Bytes moved on the last tick, so the netdev on top (RoCE) can follow.
    last_tx_bytes: int = 0
    last_rx_bytes: int = 0

    @property
    def up(self) -> bool:
        return self.state == STATE_ACTIVE


@dataclass
class NetDevice:
    name: str
    base: str                        # sysfs-relative directory (devices/.../net/<name>)
    mtu: int
    speed: int | None                # Mb/s; None where the kernel refuses to report one (lo)
    address: str
    ifindex: int
    type: int                        # ARPHRD_*: 1 ether, 772 loopback
    rx_bytes_per_second: float
    tx_bytes_per_second: float
    operstate: str = "up"
    carrier_up: int = 1
    carrier_down: int = 0
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NETDEV_STATISTICS, 0))


NETDEV_STATISTICS = (
    "collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped", "rx_errors",
    "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors", "rx_nohandler",
    "rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes", "tx_carrier_errors", "tx_compressed",
    "tx_dropped", "tx_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_packets", "tx_window_errors",
)


def occasional(rng: random.Random, per_second: float, dt: float) -> int:
    """How many rare events happen in dt seconds (Bernoulli thinning of a Poisson process)."""
    expected = per_second * dt
    count = int(expected)
    if rng.random() < expected - count:
        count += 1
    return count


class SimSysfs:
    def __init__(self, writer: TreeWriter, topology: NodeTopology, node_index: int, node_name: str,
                 compute_hcas: int, rng: random.Random, uptime: float) -> None:
        self.w = writer
        self.topology = topology
        self.rng = rng
        self.node_name = node_name
        self.ports: dict[str, IbPort] = {}
        self.netdevs: dict[str, NetDevice] = {}
        self._bdf_of: dict[str, str] = {}
        self._build_ports(node_index, compute_hcas, uptime)
        self._build_netdevs(node_index, uptime)

    # ---- model -------------------------------------------------------------------------
    def _build_ports(self, node_index: int, compute_hcas: int, uptime: float) -> None:
        rng = self.rng
        for index, bdf in enumerate(self.topology.hca_bdfs):
            device = f"mlx5_{index}"
            storage = index == compute_hcas
            fn = self.topology.function(bdf)
            self._bdf_of[device] = bdf
            if storage:
                tx, rx = rng.uniform(2e9, 5e9), rng.uniform(2e9, 5e9)
                port = IbPort(device, 1, f"sys/{fn.path}/infiniband/{device}/ports/1", "Ethernet",
                              "200 Gb/sec (4X HDR)", "0x0", tx, rx, netdev="eth1")
            else:
                tx, rx = rng.uniform(20e9, 40e9), rng.uniform(20e9, 40e9)
                port = IbPort(device, 1, f"sys/{fn.path}/infiniband/{device}/ports/1", "InfiniBand",
                              "400 Gb/sec (4X NDR)", hex(node_index * 16 + index + 1), tx, rx)
            # Counters carry the traffic of the uptime before the demo began; error counters
            # start clean so no delta- or "any"-threshold sees a breach that never happened.
            self._traffic(port, uptime * rng.uniform(0.6, 0.9))
            self.ports[device] = port

    def _build_netdevs(self, node_index: int, uptime: float) -> None:
        rng = self.rng
        mgmt = self.topology.function(self.topology.management_bdf)
        storage = self.topology.function(self.topology.hca_bdfs[-1])
        self.netdevs = {
            "lo": NetDevice("lo", "sys/devices/virtual/net/lo", 65536, None, "00:00:00:00:00:00", 1, 772,
                            rng.uniform(2e5, 8e5), 0.0, carrier_up=0),
            "eth0": NetDevice("eth0", f"sys/{mgmt.path}/net/eth0", 1500, 25000, _mac(rng, 0xb4, 0x96, 0x91), 2, 1,
                              rng.uniform(3e6, 9e6), rng.uniform(2e6, 6e6)),
            "eth1": NetDevice("eth1", f"sys/{storage.path}/net/eth1", 9000, 200000, _mac(rng, 0x94, 0x6d, 0xae), 3, 1,
                              0.0, 0.0),
        }
        for dev in self.netdevs.values():
            self._netdev_traffic(dev, uptime, None)

    def _traffic(self, port: IbPort, dt: float) -> None:
        """Advance a port's traffic counters by dt seconds of its usual load."""
        rng, c, hw = self.rng, port.counters, port.hw_counters
        tx = int(port.tx_bytes_per_second * dt * rng.uniform(0.85, 1.15))
        rx = int(port.rx_bytes_per_second * dt * rng.uniform(0.85, 1.15))
        port.last_tx_bytes, port.last_rx_bytes = tx, rx
        c["port_xmit_data"] += tx // 4
        c["port_rcv_data"] += rx // 4
        tx_packets, rx_packets = tx // AVERAGE_PACKET_BYTES, rx // AVERAGE_PACKET_BYTES
        mcast_tx, mcast_rx = occasional(rng, 2.0, dt), occasional(rng, 6.0, dt)
        c["port_xmit_packets"] += tx_packets + mcast_tx
        c["port_rcv_packets"] += rx_packets + mcast_rx
        c["unicast_xmit_packets"] += tx_packets
        c["unicast_rcv_packets"] += rx_packets
        c["multicast_xmit_packets"] += mcast_tx
        c["multicast_rcv_packets"] += mcast_rx
        # port_xmit_wait ticks while the port has data but no credits: a healthy, loaded
        # fabric accumulates some, well under the 10000/s congestion threshold.
        c["port_xmit_wait"] += int(XMIT_WAIT_PER_SECOND * dt * rng.uniform(0.5, 1.5))
        hw["rx_write_requests"] += rx // BYTES_PER_WRITE_REQUEST
        hw["rx_read_requests"] += occasional(rng, 25.0, dt)
        hw["rx_atomic_requests"] += occasional(rng, 0.5, dt)
        if port.link_layer == "Ethernet":
            for name, rate in ROCE_CONGESTION.items():
                hw[name] += occasional(rng, rate * rng.uniform(0.5, 1.5), dt)

    def _netdev_traffic(self, dev: NetDevice, dt: float, carrier_bytes: tuple[int, int] | None) -> None:
        rng, s = self.rng, dev.stats
        if carrier_bytes is not None:      # a RoCE netdev: the HCA port's bytes plus a little TCP
            rx, tx = carrier_bytes
            rx += int(rng.uniform(1e5, 4e5) * dt)
            tx += int(rng.uniform(1e5, 4e5) * dt)
        else:
            rx = int(dev.rx_bytes_per_second * dt * rng.uniform(0.8, 1.2))
            tx = rx if dev.type == 772 else int(dev.tx_bytes_per_second * dt * rng.uniform(0.8, 1.2))
        size = 1100 if dev.mtu <= 1500 or dev.type == 772 else 4200
        s["rx_bytes"] += rx
        s["tx_bytes"] += tx
        s["rx_packets"] += rx // size
        s["tx_packets"] += tx // size
        if dev.type == 1:
            s["multicast"] += occasional(rng, 0.5, dt)
            s["rx_dropped"] += occasional(rng, 1 / 120, dt)   # unknown-protocol frames, as on real hosts

    def tick(self, dt: float) -> None:
        """Healthy behaviour for dt seconds: traffic and rare background errors."""
        rng = self.rng
        for port in self.ports.values():
            if not port.up:
                port.last_tx_bytes = port.last_rx_bytes = 0
                continue
            self._traffic(port, dt)
            for name, rate in BACKGROUND_ERRORS.items():
                port.counters[name] += occasional(rng, rate, dt)
            for name, rate in BACKGROUND_HW_ERRORS.items():
                port.hw_counters[name] += occasional(rng, rate, dt)
        storage = next((p for p in self.ports.values() if p.netdev == "eth1"), None)
        for dev in self.netdevs.values():
            if dev.operstate != "up":
                continue
            carried = (storage.last_rx_bytes, storage.last_tx_bytes) if storage and dev.name == "eth1" else None
            self._netdev_traffic(dev, dt, carried)

    # ---- fault hooks (called by sim_node) ------------------------------------------------
    def set_port_link(self, device: str, up: bool, phys_state: str, flap: bool) -> bool:
        """Take a port down or bring it back; returns True on a transition."""
        port = self.ports[device]
        if up == port.up:
            if not up:
                port.phys_state = phys_state
            return False
        if up:
            port.state, port.phys_state = STATE_ACTIVE, PHYS_LINKUP
        else:
            port.state, port.phys_state = STATE_DOWN, phys_state
            port.counters["link_downed"] += 1
            if flap:  # the link retrained (and failed) before dropping: error recovery ran
                port.counters["link_error_recovery"] += 1
        if port.netdev and port.netdev in self.netdevs:
            dev = self.netdevs[port.netdev]
            dev.operstate = "up" if up else "down"
            if up:
                dev.carrier_up += 1
            else:
                dev.carrier_down += 1
        return True

    def clear_port_counters(self, device: str) -> None:
        """What `perfquery -R` does after a repair: the port's PortCounters start again from 0."""
        port = self.ports[device]
        port.counters = dict.fromkeys(port.counters, 0)

    def bdf(self, device: str) -> str:
        return self._bdf_of[device]

    # ---- files ---------------------------------------------------------------------------
    def write_static(self, node_guid_base: int) -> None:
        """Everything that does not change while the node runs: PCI functions, links, identities."""
        w = self.w
        for fn in self.topology.functions:
            self._write_pci_function(fn)
        for index, (device, port) in enumerate(self.ports.items()):
            fn = self.topology.function(self._bdf_of[device])
            dev_dir = f"sys/{fn.path}/infiniband/{device}"
            storage = port.link_layer == "Ethernet"
            guid = node_guid_base + index
            w.write(f"{dev_dir}/board_id", "MT_0000000891\n" if storage else "MT_0000000838\n")
            w.write(f"{dev_dir}/fw_ver", "28.39.1002\n")
            w.write(f"{dev_dir}/hca_type", "MT4129\n")
            w.write(f"{dev_dir}/hw_rev", "0x0\n")
            w.write(f"{dev_dir}/node_type", "1: CA\n")
            w.write(f"{dev_dir}/node_guid", _guid(guid) + "\n")
            w.write(f"{dev_dir}/sys_image_guid", _guid(guid) + "\n")
            w.write(f"{dev_dir}/node_desc", f"{self.node_name} {device}\n")
            w.symlink(f"{dev_dir}/device", f"sys/{fn.path}")
            w.symlink(f"sys/class/infiniband/{device}", dev_dir)
            w.write(f"{port.base}/link_layer", port.link_layer + "\n")
            w.write(f"{port.base}/lid", port.lid + "\n")
            w.write(f"{port.base}/lid_mask_count", "0\n")
            w.write(f"{port.base}/sm_lid", "0x0\n" if storage else "0x1\n")
            w.write(f"{port.base}/sm_sl", "0\n")
            w.write(f"{port.base}/cap_mask", "0x00010000\n" if storage else "0xa751e848\n")
            if storage:
                w.write(f"{port.base}/gid_attrs/ndevs/0", "eth1\n")
                w.write(f"{port.base}/gid_attrs/types/0", "IB/RoCE v1\n")
        for dev in self.netdevs.values():
            self._write_netdev_static(dev)

    def _write_pci_function(self, fn: PciFunction) -> None:
        w, base = self.w, f"sys/{fn.path}"
        w.write(f"{base}/vendor", fn.vendor + "\n")
        w.write(f"{base}/device", fn.device + "\n")
        w.write(f"{base}/class", fn.pci_class + "\n")
        w.write(f"{base}/numa_node", f"{fn.numa_node}\n")
        w.write(f"{base}/local_cpulist", fn.local_cpulist + "\n")
        w.write(f"{base}/current_link_speed", fn.link_speed + "\n")
        w.write(f"{base}/current_link_width", f"{fn.link_width}\n")
        w.write(f"{base}/max_link_speed", fn.link_speed + "\n")
        w.write(f"{base}/max_link_width", f"{fn.link_width}\n")
        w.write(f"{base}/enable", "1\n")
        w.mkdir(f"sys/bus/pci/drivers/{fn.driver}")
        w.symlink(f"{base}/driver", f"sys/bus/pci/drivers/{fn.driver}")
        w.symlink(f"sys/bus/pci/devices/{fn.bdf}", base)

    def _write_netdev_static(self, dev: NetDevice) -> None:
        w = self.w
        w.write(f"{dev.base}/address", dev.address + "\n")
        w.write(f"{dev.base}/addr_len", "6\n")
        w.write(f"{dev.base}/ifindex", f"{dev.ifindex}\n")
        w.write(f"{dev.base}/type", f"{dev.type}\n")
        w.write(f"{dev.base}/mtu", f"{dev.mtu}\n")
        w.write(f"{dev.base}/tx_queue_len", "1000\n")
        w.write(f"{dev.base}/flags", "0x9\n" if dev.type == 772 else "0x1003\n")
        if dev.speed is not None:
            w.write(f"{dev.base}/speed", f"{dev.speed}\n")
            w.write(f"{dev.base}/duplex", "full\n")
        if dev.type == 1:
            # <bdf>/net/<if>/device -> the PCI function, as the kernel links it.
            w.symlink(f"{dev.base}/device", dev.base.rsplit("/net/", 1)[0])
        w.symlink(f"sys/class/net/{dev.name}", dev.base)

    def write_dynamic(self) -> None:
        """Values that move: counters, link state, operstate. Unchanged files are skipped."""
        w = self.w
        for port in self.ports.values():
            w.write(f"{port.base}/state", port.state + "\n")
            w.write(f"{port.base}/phys_state", port.phys_state + "\n")
            w.write(f"{port.base}/rate", port.rate + "\n")
            for name, value in port.counters.items():
                w.write(f"{port.base}/counters/{name}", f"{value}\n")
            for name, value in port.hw_counters.items():
                w.write(f"{port.base}/hw_counters/{name}", f"{value}\n")
        for dev in self.netdevs.values():
            up = dev.operstate == "up"
            w.write(f"{dev.base}/operstate", ("unknown" if dev.type == 772 else dev.operstate) + "\n")
            w.write(f"{dev.base}/carrier", "1\n" if up else "0\n")
            w.write(f"{dev.base}/carrier_changes", f"{dev.carrier_up + dev.carrier_down}\n")
            w.write(f"{dev.base}/carrier_up_count", f"{dev.carrier_up}\n")
            w.write(f"{dev.base}/carrier_down_count", f"{dev.carrier_down}\n")
            for name, value in dev.stats.items():
                w.write(f"{dev.base}/statistics/{name}", f"{value}\n")


def _guid(value: int) -> str:
    text = f"{value:016x}"
    return ":".join(text[i:i + 4] for i in range(0, 16, 4))


def _mac(rng: random.Random, *oui: int) -> str:
    return ":".join(f"{b:02x}" for b in (*oui, rng.randrange(256), rng.randrange(256), rng.randrange(256)))
