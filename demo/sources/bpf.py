"""Simulated eBPF maps: what tcp.bpf.c, sched.bpf.c and syscalls.bpf.c would hold.

Implements exporter.ebpf.source.MapSource with the kernel's own layouts (log-linear
slot arrays in microseconds, each histogram with the layout its .yaml declares, u64 counters keyed by peer address or process name), so the
ebpf collector converts them with exactly the code it uses on a real host.

Healthy: smoothed RTT log-normal around 40 µs (20-80 µs, a thin tail), run-queue latency
around 8 µs, steady syscall/ioctl/mmap rates from a "python" training process.

Each RTT sample also feeds fabric_tcp_rtt_excess_seconds (the sample minus its
connection's min RTT, 25 µs here) and fabric_tcp_rtt_samples_total by kind; a quarter of
them are one-segment ACKs on a client's next request or on no data (possibly delayed),
which the kernel program counts but leaves out of the excess histogram.

Fault microburst (params: multiplier, default 60; fraction, default 0.05;
retransmit_factor, default 20): that fraction of RTT samples is multiplied, so the p99 of
fabric_tcp_rtt_seconds and of fabric_tcp_rtt_excess_seconds jumps to milliseconds (well
over 3x its 5-minute average), and retransmits to the node's peers rise.
"""
from __future__ import annotations

import ipaddress
import math
import random
import struct
import threading

from fabricscope.exporter.bpf_loader.declarations import load_declarations
from fabricscope.exporter.bpf_loader.histogram import BucketLayout, KernelHistogram, encode_hist
from ..plugin import ClusterSpec, Fault, NodeSpec

RTT_MEDIAN_US = 40.0
RTT_SIGMA = 0.3
RTT_TAIL_FRACTION = 0.003      # a thin healthy tail...
RTT_TAIL_FACTOR = 3.0          # ...at a few times the median
RTT_SAMPLES_PER_SECOND = 400   # sampled: the real tcp_probe sees every segment
MIN_RTT_US = 25.0              # each connection's min RTT: the excess is measured above it
# RTT sample kinds as tcp.bpf.c indexes them (several_segments, reply, next_request,
# delayed_ack), with their share of a node's samples; the last two stay out of the excess.
RTT_SAMPLE_SHARES = ((0, 0.55), (1, 0.2), (2, 0.15), (3, 0.1))
LEFT_OUT_KINDS = (2, 3)
CONNECT_MEDIAN_US = 90.0
CONNECTS_PER_SECOND = 2.0
RUNQ_MEDIAN_US = 8.0
RUNQ_SAMPLES_PER_SECOND = 600
SWITCHES_PER_SECOND = 24000.0
MIGRATIONS_PER_SECOND = 350.0
RETRANSMITS_PER_PEER_PER_SECOND = 0.02
EXTERNAL_RETRANSMITS_PER_SECOND = 0.05
MAX_SAMPLES_PER_STEP = 20000
# process name -> (syscalls/s, GPU ioctls/s, mmap/s, munmap/s, mremap/s)
PROCESS_RATES = {
    "python": (52000.0, 9000.0, 40.0, 38.0, 1.5),
    "": (21000.0, 0.0, 180.0, 175.0, 2.0),      # untracked processes: the *_other arrays
}
DEFAULT_MULTIPLIER = 60.0
DEFAULT_FRACTION = 0.05
DEFAULT_RETRANSMIT_FACTOR = 20.0
NS_PER_EVENT = {"tcp_probe": 95, "inet_sock_set_state": 140, "tcp_retransmit_skb": 180,
                "sched_wakeup": 70, "sched_wakeup_new": 70, "sched_switch": 110,
                "sched_migrate_task": 45, "sys_enter": 60}


def node_address(index: int) -> str:
    """The simulated cluster network: node i is 10.0.0.(i+1)."""
    return str(ipaddress.IPv4Address("10.0.0.1") + index)


def _v4_mapped(addr: str) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + ipaddress.IPv4Address(addr).packed


def _comm_key(name: str) -> bytes:
    return name.encode()[:15].ljust(16, b"\0")


OTHER = _comm_key("")


class _Hist:
    """One kernel histogram map: integer microseconds through the declared slot function."""

    def __init__(self, layout: BucketLayout) -> None:
        self.layout = layout
        self.slots = [0] * layout.slots
        self.sum = 0

    def observe(self, value_us: float) -> None:
        v = max(0, int(value_us))   # the kernel divides ns by 1000: truncation
        self.slots[self.layout.slot_for(v)] += 1
        self.sum += v

    def encode(self) -> bytes:
        return encode_hist(KernelHistogram(tuple(self.slots), self.sum), self.layout)


class BpfSimSource:
    key = "bpf"

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> None:
        self.node = node
        self.rng = rng
        self.now = 0.0
        self._peers = {node_address(n.index): n.name for n in cluster.nodes if n.name != node.name}
        self._external = "192.0.2.10"   # outside the cluster: decodes to "other"
        declarations = load_declarations()
        layouts = {m.name: m.layout for decl in declarations for m in decl.metrics if m.layout}
        self.rtt = _Hist(layouts["fabric_tcp_rtt_seconds"])
        self.rtt_excess = _Hist(layouts["fabric_tcp_rtt_excess_seconds"])
        self.rtt_kinds = [0] * len(RTT_SAMPLE_SHARES)
        self.connect = _Hist(layouts["fabric_tcp_connect_latency_seconds"])
        self.runq = _Hist(layouts["fabric_sched_runqueue_latency_seconds"])
        self.switches = 0
        self.migrations = 0
        self.retransmits: dict[bytes, int] = {}
        self.syscalls: dict[bytes, int] = {}
        self.ioctls: dict[bytes, int] = {}
        self.mmaps: dict[bytes, int] = {}
        self.runs: dict[str, int] = {name: 0 for name in NS_PER_EVENT}
        self._programs = [p for decl in declarations for p in decl.programs]
        self._fraction: dict[str, float] = {}    # carried fractional counts between steps
        self._readers = self._map_readers()
        # The demo's tick thread steps while exporter threads scrape: one lock for both.
        self._lock = threading.Lock()

    # ---- simulation -------------------------------------------------------------

    def _count(self, name: str, rate: float, dt: float) -> int:
        """Events in dt at `rate`/s, carrying fractions so slow rates still add up."""
        exact = rate * dt + self._fraction.get(name, 0.0)
        whole = int(exact)
        self._fraction[name] = exact - whole
        if whole > 50:   # a little noise on large counts, none on the rare ones
            whole = max(0, int(self.rng.gauss(whole, math.sqrt(whole))))
        return whole

    def _poisson(self, lam: float) -> int:
        if lam <= 0:
            return 0
        if lam > 30:
            return max(0, int(round(self.rng.gauss(lam, math.sqrt(lam)))))
        threshold, k, p = math.exp(-lam), 0, 1.0
        while True:
            p *= self.rng.random()
            if p <= threshold:
                return k
            k += 1

    def _rtt_sample_kind(self) -> int:
        u = self.rng.random()
        for kind, share in RTT_SAMPLE_SHARES:
            if u < share:
                return kind
            u -= share
        return RTT_SAMPLE_SHARES[-1][0]

    def step(self, now: float, faults: list[Fault]) -> None:
        with self._lock:
            self._step(now, faults)

    def _step(self, now: float, faults: list[Fault]) -> None:
        dt = now - self.now
        if dt <= 0:
            return
        self.now = now
        burst = next((f for f in faults if f.kind == "microburst"), None)
        multiplier = float(burst.params.get("multiplier", DEFAULT_MULTIPLIER)) if burst else 1.0
        fraction = float(burst.params.get("fraction", DEFAULT_FRACTION)) if burst else 0.0
        retrans_factor = float(burst.params.get("retransmit_factor", DEFAULT_RETRANSMIT_FACTOR)) if burst else 1.0

        mu = math.log(RTT_MEDIAN_US)
        samples = min(MAX_SAMPLES_PER_STEP, self._count("rtt", RTT_SAMPLES_PER_SECOND, dt))
        for _ in range(samples):
            rtt = self.rng.lognormvariate(mu, RTT_SIGMA)
            u = self.rng.random()
            if u < fraction:
                rtt *= multiplier * self.rng.uniform(0.7, 1.5)
            elif u < fraction + RTT_TAIL_FRACTION:
                rtt *= RTT_TAIL_FACTOR
            self.rtt.observe(rtt)
            kind = self._rtt_sample_kind()
            self.rtt_kinds[kind] += 1
            if kind not in LEFT_OUT_KINDS:
                self.rtt_excess.observe(max(0.0, rtt - MIN_RTT_US))
        self.runs["tcp_probe"] += samples

        conns = self._count("connect", CONNECTS_PER_SECOND, dt)
        for _ in range(conns):
            self.connect.observe(self.rng.lognormvariate(math.log(CONNECT_MEDIAN_US), 0.4) * (multiplier if burst else 1))
        self.runs["inet_sock_set_state"] += 3 * conns

        for addr in self._peers:
            n = self._poisson(RETRANSMITS_PER_PEER_PER_SECOND * retrans_factor * dt)
            if n:
                key = _v4_mapped(addr)
                self.retransmits[key] = self.retransmits.get(key, 0) + n
                self.runs["tcp_retransmit_skb"] += n
        n = self._poisson(EXTERNAL_RETRANSMITS_PER_SECOND * dt)
        if n:
            key = _v4_mapped(self._external)
            self.retransmits[key] = self.retransmits.get(key, 0) + n
            self.runs["tcp_retransmit_skb"] += n

        runq = min(MAX_SAMPLES_PER_STEP, self._count("runq", RUNQ_SAMPLES_PER_SECOND, dt))
        for _ in range(runq):
            self.runq.observe(self.rng.lognormvariate(math.log(RUNQ_MEDIAN_US), 0.8))
        switches = self._count("switches", SWITCHES_PER_SECOND, dt)
        self.switches += switches
        self.runs["sched_switch"] += switches
        self.runs["sched_wakeup"] += switches // 2
        migrations = self._count("migrations", MIGRATIONS_PER_SECOND, dt)
        self.migrations += migrations
        self.runs["sched_migrate_task"] += migrations

        for comm, (sys_rate, ioctl_rate, mmap_rate, munmap_rate, mremap_rate) in PROCESS_RATES.items():
            key = _comm_key(comm)
            n = self._count(f"sys/{comm}", sys_rate, dt)
            self.syscalls[key] = self.syscalls.get(key, 0) + n
            self.runs["sys_enter"] += n
            if ioctl_rate:
                self.ioctls[key] = self.ioctls.get(key, 0) + self._count(f"ioctl/{comm}", ioctl_rate, dt)
            for op, rate in enumerate((mmap_rate, munmap_rate, mremap_rate)):
                mkey = key + struct.pack("<I", op)
                self.mmaps[mkey] = self.mmaps.get(mkey, 0) + self._count(f"mmap{op}/{comm}", rate, dt)

    # ---- MapSource ------------------------------------------------------------

    def availability(self) -> tuple[str, str]:
        return "ok", ""

    def programs(self) -> dict[str, bool]:
        return {p: True for p in self._programs}

    def program_stats(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {p: (self.runs.get(p, 0), self.runs.get(p, 0) * NS_PER_EVENT.get(p, 100)) for p in self._programs}

    def peers(self) -> dict[str, str]:
        return dict(self._peers)

    def untracked_processes(self) -> int:
        return 0   # the simulated node's process set always fits

    def refresh(self) -> None:
        pass

    def read_map(self, obj: str, map_name: str) -> list[tuple[bytes, bytes]]:
        read = self._readers.get((obj, map_name))
        if read is None:
            raise KeyError(f"{obj}/{map_name}")
        with self._lock:
            return read()

    def _map_readers(self) -> dict:
        """(object, map) -> a function building the map's current (key, value) pairs."""
        zero = struct.pack("<I", 0)
        u64 = lambda v: struct.pack("<Q", v)   # noqa: E731
        return {
            ("tcp", "fabric_tcp_rtt_seconds"): lambda: [(zero, self.rtt.encode())],
            ("tcp", "fabric_tcp_rtt_excess_seconds"): lambda: [(zero, self.rtt_excess.encode())],
            ("tcp", "fabric_tcp_rtt_samples_total"): lambda: [(struct.pack("<I", i), u64(v))
                                                              for i, v in enumerate(self.rtt_kinds)],
            ("tcp", "fabric_tcp_connect_latency_seconds"): lambda: [(zero, self.connect.encode())],
            ("tcp", "fabric_tcp_retransmits_total"): lambda: [(k, u64(v)) for k, v in self.retransmits.items()],
            ("tcp", "fabric_ebpf_map_update_errors_total"): lambda: [(struct.pack("<I", i), u64(0)) for i in range(2)],
            ("sched", "fabric_sched_runqueue_latency_seconds"): lambda: [(zero, self.runq.encode())],
            ("sched", "fabric_sched_context_switches_total"): lambda: [(zero, u64(self.switches))],
            ("sched", "fabric_sched_migrations_total"): lambda: [(zero, u64(self.migrations))],
            ("sched", "fabric_ebpf_map_update_errors_total"): lambda: [(zero, u64(0))],
            ("syscalls", "fabric_process_syscalls_total"): lambda: self._tracked(self.syscalls),
            ("syscalls", "fabric_gpu_driver_ioctls_total"): lambda: self._tracked(self.ioctls),
            ("syscalls", "fabric_process_mmap_calls_total"): lambda: self._tracked(self.mmaps),
            ("syscalls", "fabric_process_syscalls_other"): lambda: [(zero, u64(self.syscalls.get(OTHER, 0)))],
            ("syscalls", "fabric_gpu_driver_ioctls_other"): lambda: [(zero, u64(self.ioctls.get(OTHER, 0)))],
            ("syscalls", "fabric_process_mmap_calls_other"): lambda: [
                (struct.pack("<I", op), u64(self.mmaps.get(OTHER + struct.pack("<I", op), 0))) for op in range(3)],
            ("syscalls", "fabric_ebpf_map_update_errors_total"): lambda: [(struct.pack("<I", i), u64(0)) for i in range(3)],
        }

    @staticmethod
    def _tracked(counts: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
        # Named processes live in the hash maps; "other" in the per-CPU arrays.
        return [(k, struct.pack("<Q", v)) for k, v in counts.items() if not k.startswith(OTHER)]

    def close(self) -> None:
        pass


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> BpfSimSource:
    return BpfSimSource(node, cluster, rng)
