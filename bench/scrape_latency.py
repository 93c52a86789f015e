"""Scrape latency of a full-size node, side by side with Debian's node_exporter.

One simulated node tree (8 compute HCAs + 1 RoCE storage NIC with full counters/ and
hw_counters/, RoCE and management netdevs, /proc/net/snmp + netstat, a kernel log of 10k
lines) is served by:
  * fabricscope's exporter with collectors infiniband, netdev and tcp, as its own process;
  * fabricscope's exporter with its default collectors (all), as another;
  * prometheus-node-exporter (collectors infiniband, netdev, netclass, netstat) on the
    same tree (--path.sysfs/--path.procfs), exporter self-metrics off.
The same HTTP client alternates scrapes among the three so all see the same machine
noise. Prints p50/p99 over N scrapes, series counts, RSS and both p99 ratios (each
fabricscope set against node_exporter).

    .venv/bin/python bench/scrape_latency.py [--scrapes 1000] [--kmsg-lines 10000]

With --gpu, it instead measures the in-process exporter with every collector, the GPU-side
ones fed by the demo's simulated NVML, eBPF maps and NCCL stream for one 8-GPU node. The
simulated NVML costs what an H200 costs per call, as CPU (0.79 ms an error counter, 0.82 ms
each per-link field value; demo/sources/nvml.py). The nvlink collector samples
it in its own threads, the gpu tier (link states) every --nvlink-interval
seconds while the scrapes run, the link tier (per-link counters) every
--nvlink-link-interval seconds. Beside the scrape figures it prints what the same node's
NVML reads would have added to every scrape on the old synchronous path (the old call
pattern, timed directly), how old the served samples were per tier, the CPU of one round
of each tier (the link tier both gated, the GPU error totals unchanged, and reading every
per-link counter), and from those the sampling threads' share of a core for 4 and 8 GPUs
at the default intervals (exporter/collectors/nvlink.py): in steady state (a gated link round, and one
full read every GATE_SAFETY_INTERVALS rounds), while errors climb (every link round
full), and reading every tier at the gpu tier's interval.
"""
from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.plugin import ClusterSpec, NodeSpec  # noqa: E402
from fabricscope.demo.sim_kmsg import KERN_INFO, KERN_WARNING  # noqa: E402
from fabricscope.demo.sim_node import SimNode  # noqa: E402
from fabricscope.demo.stack.binaries import free_ports  # noqa: E402
from measure import percentile, stat_cpu_seconds  # noqa: E402
from nvml_old_path import read_as_the_old_collector  # noqa: E402

def build_node(root: Path, kmsg_lines: int) -> SimNode:
    node = SimNode(NodeSpec(name="bench-node", index=0, gpus=8, hcas=8, root=root), seed=7)
    node.build()
    node.tick(1.0, 1.0, [])
    # A busy kernel log: mostly noise, a few lines the kmsg collector must classify.
    for i in range(kmsg_lines):
        if i % 500 == 0:
            node.kmsg.log(KERN_WARNING, 1.0 + i / 1000, "mlx5_core 0000:17:00.0: mlx5e_ethtool_get_link_ksettings: "
                                                        "query port ptys failed: -5 ACCESS_REG failed")
        else:
            node.kmsg.log(KERN_INFO, 1.0 + i / 1000, f"audit: type=1400 audit({1700000000 + i}.123:{i}): "
                                                     "apparmor=\"ALLOWED\" operation=\"open\" profile=\"snap\"")
    age_directories(root / "sys", 3600.0)
    return node


def age_directories(tree: Path, seconds: float) -> None:
    """Directories dated `seconds` ago, as sysfs's keep the time they were created (at boot
    or hotplug). A directory changed in the last 2 s is listed again on every read (the
    readers' "racily clean" rule, exporter/parsers/held.py), which real sysfs never costs."""
    then = time.time() - seconds
    for directory, _, _ in os.walk(tree):
        os.utime(directory, (then, then), follow_symlinks=False)


def wait_ready(port: int, proc: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"exporter exited early with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            if conn.getresponse().status == 200:
                if proc is not None and proc.poll() is not None:   # someone else answered there
                    raise SystemExit(f"exporter exited early with {proc.returncode}")
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing answered on port {port}")


def scrape(conn: http.client.HTTPConnection) -> tuple[float, bytes]:
    start = time.perf_counter()
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    return time.perf_counter() - start, body


def series_count(body: bytes) -> int:
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def report(name: str, times: list[float], series: int, rss: float | None) -> None:
    rss_text = f"{rss:7.1f} MiB" if rss is not None else "    n/a"
    print(f"{name:<28} p50 {statistics.median(times) * 1e3:7.2f} ms   p99 {percentile(times, 0.99) * 1e3:7.2f} ms"
          f"   series {series:5d}   RSS {rss_text}")


# fabricscope's collector sets compared with node_exporter's four, each a process of its own.
HOST_SETS = {
    "infiniband, netdev, tcp": ["infiniband", "netdev", "tcp"],
    "all (defaults)": None,
}


def start_fabricscope(tree: Path, port: int, collectors: list[str] | None, state: Path) -> subprocess.Popen:
    from fabricscope.exporter.framework import COLLECTORS, load_collector_modules

    load_collector_modules()
    only = [] if collectors is None else [
        *[f"--collector.{name}" for name in collectors],
        *[f"--no-collector.{name}" for name in sorted(COLLECTORS) if name not in collectors]]
    return subprocess.Popen(
        [sys.executable, "-m", "fabricscope.cli", "exporter", f"--web.listen-address=127.0.0.1:{port}",
         f"--path.sysfs={tree}/sys", f"--path.procfs={tree}/proc", f"--path.rootfs={tree}",
         f"--path.kmsg={tree}/kmsg", f"--path.state={state}", "--node-name=bench-node", *only],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def compare_with_node_exporter(args: argparse.Namespace, tree: Path) -> int:
    node_exporter = shutil.which("prometheus-node-exporter")
    if not node_exporter:
        raise SystemExit("prometheus-node-exporter is not installed (make setup installs it)")
    ports = dict(zip([*HOST_SETS, "node_exporter"], free_ports(len(HOST_SETS) + 1)))
    procs = {name: start_fabricscope(tree, ports[name], collectors, tree.parent / f"state-{i}")
             for i, (name, collectors) in enumerate(HOST_SETS.items())}
    procs["node_exporter"] = subprocess.Popen(
        [node_exporter, f"--web.listen-address=127.0.0.1:{ports['node_exporter']}", f"--path.sysfs={tree}/sys",
         f"--path.procfs={tree}/proc", f"--path.rootfs={tree}", "--collector.disable-defaults",
         "--collector.infiniband", "--collector.netdev", "--no-collector.netdev.netlink",
         "--collector.netclass", "--collector.netstat", "--web.disable-exporter-metrics"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for name, proc in procs.items():
            wait_ready(ports[name], proc)
        clients = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=30) for name, port in ports.items()}
        times: dict[str, list[float]] = {name: [] for name in clients}
        bodies: dict[str, bytes] = {}
        for _ in range(args.warmup):
            for conn in clients.values():
                scrape(conn)
        load_before = os.getloadavg()[0]
        cpu_before = {name: stat_cpu_seconds(f"/proc/{proc.pid}/stat") for name, proc in procs.items()}
        busy = busy_files(tree) if args.busy else []
        for _ in range(args.scrapes):
            for path in busy:                 # every exporter then reads each moved once
                move(path)
            for name, conn in clients.items():
                elapsed, bodies[name] = scrape(conn)
                times[name].append(elapsed)
        cpu = {name: (stat_cpu_seconds(f"/proc/{proc.pid}/stat") - cpu_before[name]) / args.scrapes
               for name, proc in procs.items()}
        if busy:
            print(f"busy: {len(busy)} data and packet counter files (every port's and interface's) moved before "
                  "each round of scrapes")
        print(f"full-size node: 8 compute HCAs + 1 RoCE NIC, kernel log {args.kmsg_lines} lines, "
              f"{args.scrapes} scrapes each, alternating, same client; load average {load_before:.1f} -> "
              f"{os.getloadavg()[0]:.1f} while scraping")
        for name in clients:
            label = f"node_exporter {node_exporter_version(node_exporter)}" if name == "node_exporter" \
                else f"fabricscope: {name}"
            report(label, times[name], series_count(bodies[name]), rss_mib(procs[name].pid))
            print(f"{'':<28} CPU per scrape {cpu[name] * 1e3:.2f} ms (the process's user + system time over the "
                  f"scrapes; less sensitive to the machine's load than latency)")
        theirs = times["node_exporter"]
        for name in HOST_SETS:
            ratio99 = percentile(times[name], 0.99) / percentile(theirs, 0.99)
            ratio50 = statistics.median(times[name]) / statistics.median(theirs)
            print(f"ratio fabricscope ({name}) / node_exporter (infiniband, netdev, netclass, netstat): "
                  f"p50 {ratio50:.2f}  p99 {ratio99:.2f}  (target p99 <= 1.0)")
        ib_theirs = sum(1 for line in bodies["node_exporter"].decode().splitlines()
                        if line.startswith("node_infiniband"))
        print(f"node_exporter infiniband series: {ib_theirs}")
        return 0
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=10)


# The counters a busy node moves on every scrape: its ports' and interfaces' data and packet
# counts. Error counters stand still, as on a healthy node.
BUSY_PORT_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                      "unicast_xmit_packets", "unicast_rcv_packets")
BUSY_INTERFACE_STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")


def busy_files(tree: Path) -> list[Path]:
    ports = sorted((tree / "sys" / "class" / "infiniband").glob("*/ports/*/counters"))
    interfaces = sorted((tree / "sys" / "class" / "net").glob("*/statistics"))
    return ([d / name for d in ports for name in BUSY_PORT_COUNTERS if (d / name).exists()]
            + [d / name for d in interfaces for name in BUSY_INTERFACE_STATISTICS if (d / name).exists()])


def move(path: Path) -> None:
    """A counter moved forward, written anew in place (the same file, as sysfs regenerates
    one on each read)."""
    with open(path, "r+") as file:
        value = int(file.read()) + 4096
        file.seek(0)
        file.write(f"{value}\n")
        file.truncate()


def node_exporter_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True)
    words = (done.stdout + done.stderr).split()   # 1.5 prints it on stderr
    return words[2] if len(words) > 2 and words[1] == "version" else "?"


def old_synchronous_path_seconds(backend, gpus) -> float:
    start = time.perf_counter()
    read_as_the_old_collector(backend, gpus)
    return time.perf_counter() - start


def link_rounds_cpu(nvlink, rounds: int) -> float:
    """Median CPU of one GPU's link tier in a round over `rounds` refreshes (its gpu tier,
    the link states, is counted apart: the shares below add the two)."""
    per_round = []
    for _ in range(rounds):
        before = [s.cpu_by_tier["link"] for s in nvlink.samplers]
        assert nvlink.refresh(), "a GPU sample timed out"
        per_round += [s.cpu_by_tier["link"] - b for s, b in zip(nvlink.samplers, before)]
    return statistics.median(per_round)


def measure_gpu_side(args: argparse.Namespace, tree: Path, node: SimNode) -> int:
    from fabricscope.exporter.context import Context
    from fabricscope.demo.sim_sources import NodeSources, discover_source_modules
    from fabricscope.demo.sources.nvml import H200_COSTS
    from fabricscope.exporter.framework import COLLECTORS, load_collector_modules
    from fabricscope.exporter.main import settle_after_start, start_exporter
    from fabricscope.exporter.collectors.nvlink import DEFAULT_LINK_SAMPLE_INTERVAL, DEFAULT_SAMPLE_INTERVAL
    from fabricscope.exporter.nvml.sampler import GATE_SAFETY_INTERVALS

    spec = node.spec
    cluster = ClusterSpec(name="bench", nodes=(spec,), seed=7)
    sources = NodeSources(spec, cluster, discover_source_modules())
    sources.step(1.0, [])
    load_collector_modules()
    enabled = sorted(name for name, cls in COLLECTORS.items() if cls.enabled_by_default)
    ctx = Context(sysfs=tree / "sys", procfs=tree / "proc", rootfs=tree, kmsg=tree / "kmsg",
                  state_dir=tree.parent / "state-gpu", node="bench-node", sources=dict(sources.by_key),
                  config={"nvlink": {"sample_interval_seconds": args.nvlink_interval,
                                     "link_sample_interval_seconds": args.nvlink_link_interval}})
    nvml = sources.by_key["nvml"]
    nvml.costs = H200_COSTS                           # the demo's sleep; burn the driver's CPU here
    old_path = statistics.median(old_synchronous_path_seconds(nvml, nvml.gpus()) for _ in range(3))
    exporter = start_exporter(ctx, enabled, "127.0.0.1:0")
    settle_after_start()      # as the exporter's own start does (exporter/main.py run)
    nvlink = next(c for c in exporter.collectors if c.name == "nvlink")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        for _ in range(args.warmup):
            scrape(conn)
        nvlink.refresh()                              # the first link round settles each GPU's plan
        gated_cpu = link_rounds_cpu(nvlink, 3)       # error totals unchanged: gated
        for sampler in nvlink.samplers:               # every per-link counter read, as when a total moves
            sampler.gate_safety = 0.0
        full_cpu = link_rounds_cpu(nvlink, 3)
        for sampler in nvlink.samplers:
            sampler.gate_safety = GATE_SAFETY_INTERVALS * sampler.link_interval
        conn.close()                                  # the server may have closed it while idle
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        times, nvlink_times, body = [], [], b""
        ages: dict[str, list[float]] = {"gpu": [], "link": []}
        now = 1.0
        cpu0 = {s.gpu.index: dict(s.cpu_by_tier) for s in nvlink.samplers}
        rounds0 = {s.gpu.index: dict(s.rounds_by_tier) for s in nvlink.samplers}
        started, load_before = time.monotonic(), os.getloadavg()[0]
        for i in range(args.scrapes):
            if i % 10 == 0:  # the simulation moves on between scrapes, as in the demo
                now += 1.0
                sources.step(now, [])
            elapsed, body = scrape(conn)
            times.append(elapsed)
            for line in body.decode().splitlines():
                if line.startswith('fabric_scrape_collector_duration_seconds{collector="nvlink"'):
                    nvlink_times.append(float(line.rsplit(" ", 1)[1]))
                elif line.startswith("fabric_nvlink_sample_age_seconds{"):
                    tier = "link" if 'tier="link"' in line else "gpu"
                    ages[tier].append(float(line.rsplit(" ", 1)[1]))
        wall = time.monotonic() - started
        window_cpu = sum(s.cpu_seconds for s in nvlink.samplers) - sum(sum(c.values()) for c in cpu0.values())
        gpu_rounds = sum(s.rounds_by_tier["gpu"] - rounds0[s.gpu.index]["gpu"] for s in nvlink.samplers)
        gpu_round_cpu = (sum(s.cpu_by_tier["gpu"] - cpu0[s.gpu.index]["gpu"] for s in nvlink.samplers)
                         / max(1, gpu_rounds))
        reads = nvlink.samplers[0].latest.error_reads
        gated = nvlink.samplers[0].latest.gated
        print(f"simulated 8-GPU node, all collectors ({', '.join(enabled)}), {args.scrapes} scrapes, in-process; "
              f"simulated NVML at H200 per-call cost (as CPU), gpu tier every {args.nvlink_interval:g} s, "
              f"link tier every {args.nvlink_link_interval:g} s; load average {load_before:.1f} -> "
              f"{os.getloadavg()[0]:.1f} while scraping")
        report("fabricscope (all)", times, series_count(body), rss_mib(os.getpid()))
        print(f"p99 target <= 25 ms: {'met' if percentile(times, 0.99) <= 0.025 else 'NOT met'}")
        print(f"nvlink collector per scrape: p50 {statistics.median(nvlink_times) * 1e3:.2f} ms, "
              f"p99 {percentile(nvlink_times, 0.99) * 1e3:.2f} ms; old synchronous path (same NVML, timed "
              f"directly): {old_path * 1e3:.0f} ms per scrape -> {old_path / percentile(nvlink_times, 0.99):.0f}x")
        for tier, interval in (("gpu", args.nvlink_interval), ("link", args.nvlink_link_interval)):
            print(f"sample age served, {tier} tier: p50 {statistics.median(ages[tier]):.2f} s, "
                  f"max {max(ages[tier]):.2f} s (interval {interval:g} s)")
        print(f"one GPU's round: gpu tier {gpu_round_cpu * 1e3:.2f} ms CPU ({gpu_rounds} rounds); link tier "
              f"gated {gated_cpu * 1e3:.1f} ms CPU ({gated} error counters not read: GPU totals unchanged), "
              f"reading every counter {full_cpu * 1e3:.1f} ms CPU; error counters read per full link round: "
              f"{reads}")
        print(f"CPU of the sampling threads in the window: {window_cpu:.3f} s over {wall:.1f} s = "
              f"{window_cpu / wall * 100:.2f}% of one core (simulated NVML calls burn the CPU the driver's do)")
        steady_link = ((GATE_SAFETY_INTERVALS - 1) * gated_cpu + full_cpu) / GATE_SAFETY_INTERVALS
        gpu_every, link_every = DEFAULT_SAMPLE_INTERVAL, DEFAULT_LINK_SAMPLE_INTERVAL
        for gpus in (4, 8):
            tiered = gpus * (gpu_round_cpu / gpu_every + steady_link / link_every)
            climbing = gpus * (gpu_round_cpu / gpu_every + full_cpu / link_every)
            single = gpus * (gpu_round_cpu + full_cpu) / gpu_every
            print(f"sampling CPU share, {gpus} GPUs: {tiered * 100:.3f}% of a core at the defaults ({gpu_every:g} s / "
                  f"{link_every:g} s, totals unchanged); {climbing * 100:.3f}% while errors climb (every link round "
                  f"full); {single * 100:.2f}% reading every tier every {gpu_every:g} s")
        return 0
    finally:
        exporter.stop()


def source_version() -> str:
    """The commit measured, and whether the tree had changes on top of it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown (not a git checkout)"
    return f"commit {commit}" + (" with uncommitted changes" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # A p99 over 300 scrapes is the third slowest of each: 1,000 for the comparison, whose
    # ratio of two p99s is the figure that matters.
    parser.add_argument("--scrapes", type=int, default=None,
                        help="scrapes of each exporter (default 1000; 300 with --gpu)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--busy", action="store_true",
                        help="move every port's and interface's data and packet counters before each round of "
                             "scrapes, as on a node carrying traffic (default: the tree stands still)")
    parser.add_argument("--kmsg-lines", type=int, default=10_000)
    parser.add_argument("--gpu", action="store_true", help="all collectors, GPU side simulated, in-process")
    parser.add_argument("--nvlink-interval", type=float, default=1.0,
                        help="nvlink sample_interval_seconds with --gpu (default 1: rounds overlap the scrapes)")
    parser.add_argument("--nvlink-link-interval", type=float, default=120.0,
                        help="nvlink link_sample_interval_seconds with --gpu (default 120, the exporter's)")
    args = parser.parse_args()
    args.scrapes = args.scrapes or (300 if args.gpu else 1000)
    print(f"{source_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-") as tmp:
        tree = Path(tmp) / "node"
        node = build_node(tree, args.kmsg_lines)
        return measure_gpu_side(args, tree, node) if args.gpu else compare_with_node_exporter(args, tree)


if __name__ == "__main__":
    sys.exit(main())
