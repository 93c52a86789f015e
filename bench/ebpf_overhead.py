"""Overhead of the ebpf collector's programs on two workloads, measured, not claimed.

Workloads (each run with and without the programs attached, alternating rounds so
drift on a noisy machine hits both sides equally):
  mix      the realistic mix the default configuration is held to (within 1%):
             bulk    1 MiB messages over loopback TCP (a checkpoint or data transfer)
             loader  a data-loader-shaped loop: open, fstat, read in 64 KiB, close, over
                     64 cached files of 256 KiB (one epoch after another)
  tcp      loopback request/response, TCP_NODELAY, one echo server process: 64 B / 64 B
           ping-pong (the worst case) and 512 B / 32 KiB; tcp_probe, sys_enter and
           sched_switch all fire on this path
  syscall  `dd bs=1` from /dev/zero to /dev/null: two syscalls per byte in native code,
           the worst case for raw_tp/sys_enter

Prints throughput and CPU per operation per mode, the loss ratio (median and IQR of
adjacent off/on pairs), and, from one extra round with kernel run-time accounting on,
events counted per second and ns per event (that accounting itself adds cost, so the
measured rounds run without it).

    sudo .venv/bin/python bench/ebpf_overhead.py [--rounds 12] [--seconds 1] [--objects default|all|tcp,sched]
                                                 [--workloads mix,tcp,syscall]
Needs root, kernel BTF and the objects (`make -C exporter/bpf`).
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricscope.exporter.bpf_loader import objects
from fabricscope.exporter.bpf_loader.declarations import load_declarations
from fabricscope.exporter.bpf_loader.kernel_source import KernelMapSource

ECHO_SERVER = """
import resource, socket, struct
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        head = conn.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            break
        request, response = struct.unpack("<II", head)
        if request == 0:   # "how much CPU have you used": microsecond rusage, not 10 ms ticks
            r = resource.getrusage(resource.RUSAGE_SELF)
            conn.sendall(struct.pack("<d", r.ru_utime + r.ru_stime))
            continue
        conn.recv(request, socket.MSG_WAITALL)
        conn.sendall(b"y" * response)
    conn.close()
"""


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) != n:
        raise ConnectionError("echo server went away")
    return data


def _server_cpu(sock: socket.socket) -> float:
    sock.sendall(struct.pack("<II", 0, 0))
    return struct.unpack("<d", _recv_exactly(sock, 8))[0]


def tcp_round(port: int, seconds: float, request: int, response: int) -> tuple[int, float, float]:
    """(round trips, wall seconds, CPU seconds of client + server) for one round."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = struct.pack("<II", request, response) + b"x" * request
        done = 0
        server0, client0 = _server_cpu(sock), _cpu_self()
        start = time.perf_counter()
        end = start + seconds
        while True:
            for _ in range(50):
                sock.sendall(message)
                _recv_exactly(sock, response)
            done += 50
            if time.perf_counter() >= end:
                break
        wall = time.perf_counter() - start
        cpu = (_cpu_self() - client0) + (_server_cpu(sock) - server0)
        return done, wall, cpu


def syscall_round(count: int) -> tuple[int, float, float]:
    """(syscalls, wall seconds, CPU seconds) of `dd bs=1 count=N`: a read + a write per byte."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={count}"],
                   check=True, capture_output=True)
    wall = time.perf_counter() - start
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 2 * count, wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def loader_files(directory: Path, count: int = 64, size: int = 256 * 1024) -> list[str]:
    paths = []
    for i in range(count):
        path = directory / f"sample-{i:03d}.bin"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    return paths


def loader_round(paths: list[str], seconds: float) -> tuple[int, float, float]:
    """(files read, wall seconds, CPU seconds) of a data-loader-shaped syscall loop."""
    cpu0 = _cpu_self()
    start = time.perf_counter()
    end = start + seconds
    done = 0
    while time.perf_counter() < end:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.fstat(fd)
            while os.read(fd, 65536):
                pass
            os.close(fd)
        done += len(paths)
    return done, time.perf_counter() - start, _cpu_self() - cpu0


def calibrate_dd(seconds: float) -> int:
    """Byte count that makes one dd round take about `seconds`."""
    ops, wall, _cpu = syscall_round(200_000)
    return max(10_000, int(ops / wall * seconds / 2))


OBJECTS: set[str] | None = None   # --objects: measure a subset


def attach(enable_stats: bool) -> KernelMapSource:
    decls = [d for d in load_declarations() if OBJECTS is None or d.object in OBJECTS]
    source = KernelMapSource(decls, None, Path("/sys"), Path("/proc"), tracker=None,
                             enable_stats=enable_stats)
    reason, message = source.availability()
    if reason != "ok":
        raise SystemExit(f"eBPF unavailable ({reason}): {message}")
    return source


def measure(name: str, run, rounds: int) -> None:
    rounds_by_mode: dict[str, list[tuple[int, float, float]]] = {"off": [], "on": []}
    for i in range(rounds):
        # Alternate which mode goes first so slow drift does not favour one side.
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            source = attach(enable_stats=False) if mode == "on" else None
            try:
                rounds_by_mode[mode].append(run())
            finally:
                if source:
                    source.close()
    # Adjacent off/on rounds form pairs; the median of the pairwise ratios shrugs off the
    # bursts of other load a shared machine has, which whole-run medians do not.
    pairs = list(zip(rounds_by_mode["off"], rounds_by_mode["on"]))
    tput_loss = sorted(1 - (on[0] / on[1]) / (off[0] / off[1]) for off, on in pairs)
    cpu_loss = sorted(1 - (off[2] / off[0]) / (on[2] / on[0]) for off, on in pairs)
    rate = {m: statistics.median(ops / wall for ops, wall, _ in r) for m, r in rounds_by_mode.items()}
    cpu_ns = {m: statistics.median(cpu / ops * 1e9 for ops, _, cpu in r) for m, r in rounds_by_mode.items()}

    def spread(values):
        q = statistics.quantiles(values, n=4) if len(values) >= 2 else values * 3
        return f"median {statistics.median(values):+6.2%} (IQR {q[0]:+.2%} .. {q[2]:+.2%})"
    print(f"{name}")
    print(f"  throughput  off {rate['off']:12,.0f}/s   on {rate['on']:12,.0f}/s   loss {spread(tput_loss)}")
    print(f"  CPU per op  off {cpu_ns['off']:9,.0f} ns   on {cpu_ns['on']:9,.0f} ns   "
          f"loss at saturation {spread(cpu_loss)}")
    # One more round with kernel run-time accounting on: how many events, what each costs.
    source = attach(enable_stats=True)
    try:
        before = source.program_stats() or {}
        ops, wall, _cpu = run()
        after = source.program_stats() or {}
    finally:
        source.close()
    delta = {p: (after[p][0] - before.get(p, (0, 0))[0], after[p][1] - before.get(p, (0, 0))[1]) for p in after}
    events = sum(n for n, _ in delta.values())
    run_ns = sum(t for _, t in delta.values())
    print(f"  events      {events / wall:12,.0f}/s   {events / ops:5.1f} per op   "
          f"program time {run_ns / max(events, 1):5.1f} ns/event")
    # The steady figure on a noisy machine: kernel-measured program time per operation over
    # the CPU an operation costs without the programs. An upper bound: the run-time
    # accounting that measures it adds its own clock reads to every event.
    print(f"  estimate    {run_ns / ops:8,.0f} ns of program time per op = "
          f"{run_ns / ops / cpu_ns['off']:.2%} of the op's CPU (upper bound)")
    print(f"  {'program':<24}{'events/op':>10}{'ns/event':>10}{'share of op CPU':>17}")
    for program, (n, t) in sorted(delta.items(), key=lambda kv: -kv[1][1]):
        if n:
            print(f"  {program:<24}{n / ops:>10.3f}{t / n:>10.0f}{t / ops / cpu_ns['off']:>17.3%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--objects", default="default",
                        help="default (what the exporter loads without an ebpf.objects setting), all, "
                             "or a comma-separated subset (tcp,sched,syscalls)")
    parser.add_argument("--workloads", default="mix,tcp,syscall")
    args = parser.parse_args()
    global OBJECTS
    from fabricscope.exporter.collectors.ebpf import DEFAULT_OBJECTS
    OBJECTS = (set(DEFAULT_OBJECTS) if args.objects == "default" else None if args.objects == "all"
               else set(args.objects.split(",")))
    workloads = set(args.workloads.split(","))
    if os.geteuid() != 0:
        print("needs root (CAP_BPF + CAP_PERFMON)")
        return 1
    ok, output = objects.build()
    if not ok:
        print(f"cannot build BPF objects: {output}")
        return 1
    shown = ",".join(sorted(OBJECTS)) if OBJECTS else "all"
    print(f"objects: {args.objects} ({shown}); {os.cpu_count()} CPUs, kernel {os.uname().release}; "
          f"{args.rounds} rounds x {args.seconds:g} s per mode")
    if "mix" in workloads:
        run_mix(args)
    if "tcp" in workloads:
        run_tcp(args)
    if "syscall" in workloads:
        count = calibrate_dd(args.seconds)
        measure("syscall-heavy: dd bs=1 /dev/zero -> /dev/null (worst case for sys_enter)",
                lambda: syscall_round(count), args.rounds)
    return 0


def run_mix(args) -> None:
    import tempfile

    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        tcp_round(port, 0.5, 1 << 20, 8)   # warm-up
        measure("mix: bulk TCP, 1 MiB messages over loopback",
                lambda: tcp_round(port, args.seconds, 1 << 20, 8), args.rounds)
    finally:
        server.kill()
        server.wait()
    with tempfile.TemporaryDirectory(prefix="fabricscope-loader-") as directory:
        paths = loader_files(Path(directory))
        loader_round(paths, 0.5)           # warm the page cache
        measure("mix: data-loader loop (open, fstat, 64 KiB reads, close; 256 KiB files)",
                lambda: loader_round(paths, args.seconds), args.rounds)


def run_tcp(args) -> None:
    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        tcp_round(port, 0.5, 64, 64)   # warm-up
        measure("tcp request/response 64 B / 64 B (ping-pong, worst case per byte)",
                lambda: tcp_round(port, args.seconds, 64, 64), args.rounds)
        measure("tcp request/response 512 B / 32 KiB (RPC-sized)",
                lambda: tcp_round(port, args.seconds, 512, 32768), args.rounds)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
