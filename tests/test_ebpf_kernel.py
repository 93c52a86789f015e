"""The ebpf collector on the real kernel: real traffic in, real counts out.

Loopback TCP for RTT and connect latency, a temporary nftables drop rule for
retransmits, thread ping-pong for the scheduler, and a named child process for the
syscall, GPU-ioctl (a configured device major) and mmap counters.
Needs root and kernel BTF; skips with the reason elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.context import Context
from fabricscope.exporter.bpf_loader import objects
from fabricscope.exporter.framework import COLLECTORS, load_collector_modules
from tests.conftest import could_not_run, require_tool
from tests.installed import loopback_retransmits

load_collector_modules()

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists(),
                                reason="needs root and kernel BTF (/sys/kernel/btf/vmlinux)")


@pytest.fixture(scope="session")
def built():
    ok, output = objects.build()
    if not ok:
        could_not_run(f"BPF objects could not be built: {output}")


# sched and syscalls are opt-in (the default loads tcp only): tests that need them say so.
ALL_OBJECTS = ["tcp", "sched", "syscalls"]


def _collector(config=None, object_dir=None, sysfs=Path("/sys")):
    args = argparse.Namespace(ebpf_object_dir=str(object_dir) if object_dir else None)
    return COLLECTORS["ebpf"](Context(node="", sysfs=sysfs, config={"ebpf": config or {}}, args=args))


@pytest.fixture
def collector(built):
    made = []

    def make(config=None, object_dir=None, sysfs=Path("/sys")):
        c = _collector(config, object_dir, sysfs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def scrape(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def value(collector, name, labels=None) -> float:
    return scrape(collector).get_sample_value(name, labels or {}) or 0.0


class EchoServer:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


def test_loopback_tcp_gives_rtt_and_connect_latency_samples(collector):
    c = collector()
    assert value(c, "fabric_ebpf_available", {"reason": "ok"}) == 1
    assert value(c, "fabric_ebpf_program_attached", {"program": "tcp_probe"}) == 1
    rtt_before = value(c, "fabric_tcp_rtt_seconds_count")
    connect_before = value(c, "fabric_tcp_connect_latency_seconds_count")
    server = EchoServer()
    try:
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", server.port)) as client:
                for _ in range(5):
                    client.sendall(b"x" * 512)
                    assert len(client.recv(4096)) > 0
    finally:
        server.close()
    reg = scrape(c)
    assert reg.get_sample_value("fabric_tcp_connect_latency_seconds_count") - connect_before >= 20
    assert reg.get_sample_value("fabric_tcp_rtt_seconds_count") - rtt_before >= 20
    # Loopback connects complete well under 100 ms: everything lands in finite buckets.
    assert reg.get_sample_value("fabric_tcp_connect_latency_seconds_bucket", {"le": repr(2.0 ** 17 * 1e-6)}) \
        == reg.get_sample_value("fabric_tcp_connect_latency_seconds_count")
    assert reg.get_sample_value("fabric_tcp_rtt_seconds_sum") > 0


def test_dropped_segments_count_as_retransmits_to_the_named_peer(collector):
    require_tool("nft", "nftables")
    c = collector({"peers": {"127.0.0.1": "loopback-peer"}})
    before = value(c, "fabric_tcp_retransmits_total", {"peer": "loopback-peer"})
    assert loopback_retransmits(lambda: value(c, "fabric_tcp_retransmits_total", {"peer": "loopback-peer"}) > before)
    # Only configured cluster hosts or "other": never a raw address.
    reg = scrape(c)
    peers = {s.labels["peer"] for fam in reg.collect() if fam.name == "fabric_tcp_retransmits" for s in fam.samples}
    assert peers <= {"loopback-peer", "other"}


def test_context_switches_and_runqueue_samples(collector):
    c = collector({"objects": ["sched"]})
    switches = value(c, "fabric_sched_context_switches_total")
    runq = value(c, "fabric_sched_runqueue_latency_seconds_count")
    ping, pong = threading.Event(), threading.Event()

    def responder():
        for _ in range(200):
            ping.wait()
            ping.clear()
            pong.set()
    t = threading.Thread(target=responder)
    t.start()
    for _ in range(200):
        ping.set()
        pong.wait()
        pong.clear()
    t.join()
    assert value(c, "fabric_sched_context_switches_total") - switches >= 200
    assert value(c, "fabric_sched_runqueue_latency_seconds_count") - runq >= 100


CHILD = """
import ctypes, mmap, os, sys
ctypes.CDLL(None).prctl(15, b"fabric-gpu-test", 0, 0, 0)   # PR_SET_NAME
print("ready", flush=True)
sys.stdin.readline()
fd = os.open("/dev/null", os.O_RDONLY)
import fcntl
for _ in range({n}):
    try:
        fcntl.ioctl(fd, 0x4600)            # an ioctl on the configured "GPU" major
    except OSError:
        pass
    m = mmap.mmap(-1, 1 << 16)
    m.close()
print("done", flush=True)
"""


def test_syscalls_ioctls_and_mmaps_of_a_tracked_process(collector):
    n = 150
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(n=n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        # /dev/null (major 1) stands in for a GPU device node: same fd-based path.
        c = collector({"processes": ["fabric-gpu-test"], "gpu_device_majors": [1]})
        list(c.collect())   # the first scrape syncs the tracked processes into the kernel
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
    finally:
        child.stdin.close()
        child.wait(10)
    reg = scrape(c)
    comm = {"comm": "fabric-gpu-test"}
    assert reg.get_sample_value("fabric_gpu_driver_ioctls_total", comm) == n
    assert reg.get_sample_value("fabric_process_mmap_calls_total", {**comm, "op": "mmap"}) >= n
    assert reg.get_sample_value("fabric_process_mmap_calls_total", {**comm, "op": "munmap"}) >= n
    assert reg.get_sample_value("fabric_process_syscalls_total", comm) >= 3 * n
    assert reg.get_sample_value("fabric_process_syscalls_total", {"comm": "other"}) > 0
    # The exited child leaves the kernel's tracked set on the next process scan.
    tracked = lambda: {int.from_bytes(k, "little") for k, _ in c.source.read_map("syscalls", "tracked_tgids")}  # noqa: E731
    assert child.pid in tracked()
    c.source.tracker.request_rescan()   # the next scrape rescans now, not in 15 s
    list(c.collect())
    assert child.pid not in tracked()
    # Only the tracked process and "other": the label stays bounded.
    comms = {s.labels["comm"] for fam in reg.collect() if fam.name == "fabric_process_syscalls" for s in fam.samples}
    assert comms <= {"fabric-gpu-test", "other"} | {p.read_text().strip() for p in Path("/proc").glob("[0-9]*/comm")
                                                    if _holds_gpu(p.parent)}


def test_a_process_is_counted_by_name_from_its_first_gpu_ioctl_without_any_scan(collector):
    n = 40
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(n=n).replace("fabric-gpu-test", "fabric-gpu-new")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        # No allow-list: only the kernel can find it, at its first ioctl on the "GPU" major.
        c = collector({"gpu_device_majors": [1], "objects": ["syscalls"], "process_scan_interval_seconds": 3600})
        list(c.collect())
        tracked = lambda: {int.from_bytes(k, "little") for k, _ in c.source.read_map("syscalls", "tracked_tgids")}  # noqa: E731
        assert child.pid not in tracked()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        assert child.pid in tracked()
    finally:
        child.stdin.close()
        child.wait(10)
    reg = scrape(c)
    # The first ioctl counted as "other" (it is what found the process), the rest by name.
    assert reg.get_sample_value("fabric_gpu_driver_ioctls_total", {"comm": "fabric-gpu-new"}) == n - 1


def _holds_gpu(pid_dir: Path) -> bool:
    try:
        return any(os.readlink(fd).startswith("/dev/nvidia") for fd in (pid_dir / "fd").iterdir())
    except OSError:
        return False


def test_program_run_statistics_are_exported_when_asked_for(collector):
    c = collector({"enable_stats": True, "objects": ALL_OBJECTS})
    for _ in range(20):
        os.getppid()
    assert value(c, "fabric_ebpf_run_statistics_enabled") == 1
    assert value(c, "fabric_ebpf_program_run_count_total", {"program": "sys_enter"}) > 0
    assert value(c, "fabric_ebpf_program_run_seconds_total", {"program": "sys_enter"}) > 0


def test_run_statistics_are_off_by_default(collector):
    if Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() == "1":
        pytest.skip("kernel.bpf_stats_enabled=1 on this host: statistics are on for everyone")
    reg = scrape(collector({"objects": ALL_OBJECTS}))
    assert reg.get_sample_value("fabric_ebpf_program_attached", {"program": "sys_enter"}) == 1
    assert reg.get_sample_value("fabric_ebpf_run_statistics_enabled") == 0
    assert reg.get_sample_value("fabric_ebpf_program_run_count_total", {"program": "sys_enter"}) is None


def test_missing_objects_report_object_missing(collector, tmp_path):
    c = collector(object_dir=tmp_path)
    families = list(c.collect())
    assert [f.name for f in families] == ["fabric_ebpf_available"]
    assert families[0].samples[0].labels == {"reason": "object_missing"}
    assert families[0].samples[0].value == 0


# The ebpf collector of a container: a host sysfs mounted elsewhere (the DaemonSet's
# --path.sysfs=/host/sys), run in a mount namespace of its own so that what it mounts, or
# fails to, is its alone. Prints the collector's samples as JSON.
CONTAINER_COLLECTOR = textwrap.dedent("""
    import argparse, json, logging, sys
    from pathlib import Path
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.framework import COLLECTORS, load_collector_modules
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    load_collector_modules()
    args = argparse.Namespace(ebpf_object_dir=None)
    c = COLLECTORS["ebpf"](Context(node="", sysfs=Path(sys.argv[1]), config={"ebpf": {"objects": ["tcp"]}}, args=args))
    print(json.dumps([[s.name, s.labels, s.value] for f in c.collect() for s in f.samples]))
    c.close()
""")


def collector_in_own_mount_namespace(sysfs: Path, prelude: str) -> tuple[dict, str]:
    """(samples {(name, frozenset(labels)): value}, log) of CONTAINER_COLLECTOR run after
    `prelude` (shell) in a private mount namespace."""
    require_tool("unshare")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f'{prelude}\nexec "$0" -c "$1" "$2"', sys.executable, CONTAINER_COLLECTOR, str(sysfs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {(name, frozenset(labels.items())): v for name, labels, v in json.loads(done.stdout)}
    return found, done.stderr


def host_sysfs_elsewhere(tmp_path: Path) -> Path:
    """A sysfs root as a container sees the host's at /host/sys: the kernel's BTF, and no
    tracefs under it (libbpf never reads one there anyway)."""
    (tmp_path / "kernel/btf").mkdir(parents=True)
    (tmp_path / "kernel/btf/vmlinux").symlink_to("/sys/kernel/btf/vmlinux")
    return tmp_path


def test_host_sysfs_elsewhere_still_attaches_every_tcp_program(built, tmp_path):
    """tracefs is mounted where libbpf reads tracepoint ids (the process's own
    /sys/kernel/tracing), not under --path.sysfs: all three TCP programs attach."""
    sysfs = host_sysfs_elsewhere(tmp_path)
    found, log = collector_in_own_mount_namespace(sysfs, "umount /sys/kernel/tracing 2>/dev/null; true")
    attached = {dict(labels)["program"]: v for (name, labels), v in found.items() if name == "fabric_ebpf_program_attached"}
    assert attached == {"tcp_probe": 1, "inet_sock_set_state": 1, "tcp_retransmit_skb": 1}, log[-3000:]
    assert found[("fabric_ebpf_available", frozenset({("reason", "ok")}))] == 1


def test_without_tracefs_where_libbpf_looks_the_partial_attach_is_reported(built, tmp_path):
    """libbpf reads /sys/kernel/debug/tracing when that path exists: a file there (no
    tracefs can be mounted on it) leaves the two classic tracepoints detached. The tp_btf
    program still serves, and nothing says "ok": fabric_ebpf_available is 0 with the
    reason, each detached program is 0, and the log says what to mount."""
    if not Path("/sys/kernel/debug").is_dir():
        could_not_run("/sys/kernel/debug is missing: kernel without CONFIG_DEBUG_FS")
    sysfs = host_sysfs_elsewhere(tmp_path)
    found, log = collector_in_own_mount_namespace(
        sysfs, "mount -t tmpfs fabricscope-test /sys/kernel/debug && touch /sys/kernel/debug/tracing")
    attached = {dict(labels)["program"]: v for (name, labels), v in found.items() if name == "fabric_ebpf_program_attached"}
    assert attached == {"tcp_probe": 1, "inet_sock_set_state": 0, "tcp_retransmit_skb": 0}, log[-3000:]
    assert found[("fabric_ebpf_available", frozenset({("reason", "no_tracefs")}))] == 0
    assert ("fabric_ebpf_available", frozenset({("reason", "ok")})) not in found
    # The attached program keeps serving its histogram.
    assert any(name == "fabric_tcp_rtt_seconds_count" for name, _ in found)
    assert "eBPF partly attached" in log and "/sys/kernel/debug/tracing" in log
