"""A shaped link between two network namespaces through a third that routes between them,
with request/response and bulk traffic across it (root; netns, veth and tbf).

    client netns ──veth── router netns ──veth (tbf on the router's side: toward the server)── server netns

The queue is in the router, as a switch's is, not in the sending host's own qdisc, where
the sender's kernel (TCP Small Queues, pacing) has a say in how deep it grows. Bulk flows
run cubic unless told otherwise (BulkFlow.congestion_control): through the router a cubic
flow fills the tbf queue to its limit and backs off on the drop, as TCP fills a switch
buffer (the request/response client's p99 read 83.6 ms in every 5-s window of a 90-s
check). Under bbr, this VM's default, the queue follows bbr's own probing instead
(docs/ebpf.md).

The request/response client records every round trip it sees (the application's RTT);
bulk flows start and stop on a schedule. The request/response processes run under a
real-time scheduling class (chrt -f): on a busy host (a CI machine, a shared box) their
round trips would otherwise measure how long they waited for a CPU, which is not what
these tests are about. Several labs run side by side: each has its own
namespaces and addresses, and an exporter watching only them
(ebpf.tcp_rtt_network_namespaces).
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ECHO_PORT = 7000
SINK_PORT = 7001
NETNS_DIR = Path("/run/netns")
REALTIME_PRIORITY = 10        # SCHED_FIFO, low among real-time tasks (kernel threads use 50+)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


@dataclass
class Shaping:
    rate: str = "20mbit"          # the bottleneck
    latency: str = "80ms"         # tbf queue: how long a packet may wait
    burst: str = "10kb"           # bucket depth (>= rate / HZ)


@dataclass
class BulkFlow:
    start: float                  # seconds after the lab's start
    stop: float
    rate: float | None = None     # bytes/s, paced by the kernel; None: as fast as the link takes
    chunk: int | None = None      # with rate: written in messages of this many bytes (one packet each)
    # Linux's default. Under bbr (this VM's default) a flow's queue follows bbr's own probing:
    # a steady flow gave the request/response client 5-s windows of p99 54 ms among 11 ms
    # ones, a real spike its p99_1m holds for a minute (docs/ebpf.md).
    congestion_control: str = "cubic"


@dataclass
class Lab:
    name: str                     # short: namespace and link names derive from it
    index: int                    # 0..250, picks the addresses
    workdir: Path
    shaping: Shaping = field(default_factory=Shaping)
    bulk: list[BulkFlow] = field(default_factory=list)
    sink_window: int | None = None    # clamp the bulk receiver's window (bytes): a bounded queue
    started: float = 0.0
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def client_ns(self) -> str:
        return f"fsrtt-{self.name}-c"

    @property
    def server_ns(self) -> str:
        return f"fsrtt-{self.name}-s"

    @property
    def router_ns(self) -> str:
        return f"fsrtt-{self.name}-r"

    @property
    def server_ip(self) -> str:
        return f"10.232.{self.index}.2"

    @property
    def client_ip(self) -> str:
        return f"10.231.{self.index}.1"

    @property
    def namespaces(self) -> list[str]:
        """Paths of both namespaces (what an exporter watching this lab is given)."""
        return [str(NETNS_DIR / self.client_ns), str(NETNS_DIR / self.server_ns)]

    @property
    def rtt_log(self) -> Path:
        return self.workdir / f"{self.name}-rtt.log"

    def up(self) -> None:
        self.down()
        c, r, s = self.client_ns, self.router_ns, self.server_ns
        for ns in (c, r, s):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        # (namespace, its veth, its address, the router's veth, the router's address on that link)
        for ns, ip, router_ip, side in ((c, self.client_ip, f"10.231.{self.index}.254", "c"),
                                        (s, self.server_ip, f"10.232.{self.index}.254", "s")):
            dev, router_dev = f"fr{self.index}{side}", f"fr{self.index}{side}r"
            sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", router_dev, "netns", r)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", r, "addr", "add", f"{router_ip}/24", "dev", router_dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", r, "link", "set", router_dev, "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", router_ip)
        sh("ip", "netns", "exec", r, "tc", "qdisc", "add", "dev", f"fr{self.index}sr", "root", "tbf",
           "rate", self.shaping.rate, "burst", self.shaping.burst, "latency", self.shaping.latency)

    def start_traffic(self, started: float) -> None:
        """Servers, the request/response client, and the bulk schedule relative to `started`
        (a unix time shared by labs running side by side)."""
        self.started = started
        self.rtt_log.write_text("")
        self._spawn(self.server_ns, "echo", str(ECHO_PORT))
        self._spawn(self.server_ns, "sink", str(SINK_PORT), *([str(self.sink_window)] if self.sink_window else []))
        self._spawn(self.client_ns, "rr", self.server_ip, str(ECHO_PORT), str(self.rtt_log))
        for flow in self.bulk:
            args = [self.server_ip, str(SINK_PORT), f"{started + flow.start:.3f}", f"{started + flow.stop:.3f}",
                    flow.congestion_control]
            pacing = [f"{flow.rate:.0f}"] + ([str(flow.chunk)] if flow.chunk else []) if flow.rate else []
            self._spawn(self.client_ns, "bulk", *args, *pacing)

    def _spawn(self, ns: str, *args: str) -> None:
        log = open(self.workdir / f"{self.name}-{args[0]}.err", "a")
        realtime = ["chrt", "-f", str(REALTIME_PRIORITY)] if args[0] in ("echo", "rr") else []
        self._procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, *realtime, sys.executable, "-m", "tests.rtt_traffic", *args],
            stdout=subprocess.DEVNULL, stderr=log, cwd=Path(__file__).resolve().parent.parent))
        log.close()

    def problems(self) -> list[str]:
        """Traffic processes that died (their stderr), if any."""
        dead = [p for p in self._procs if p.poll() is not None and p.returncode != 0]
        return [f"{self.name}: {' '.join(map(str, p.args[4:]))} exited {p.returncode}" for p in dead]

    def app_rtts(self, since: float, until: float) -> list[float]:
        """Round trips (seconds) the client saw between two offsets from the lab's start."""
        out = []
        for line in self.rtt_log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and since <= float(parts[0]) - self.started < until:
                out.append(float(parts[1]))
        return out

    def stop_traffic(self) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs.clear()

    def down(self) -> None:
        self.stop_traffic()
        for ns in (self.client_ns, self.router_ns, self.server_ns):
            sh("ip", "netns", "del", ns, check=False)


def wait_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))
