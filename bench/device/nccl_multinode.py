"""Several "nodes" on one host: the straggler and the hang's culprit across nodes, under clock skew.

Each node is a network namespace joined to the others by a bridge (veth pairs: NCCL's
socket transport, or the fake library's synchronisation, goes over it) and a PID and mount
namespace holding its ranks and its own exporter. The exporter runs inside the node's PID
namespace, as a container sharing a pod's PID namespace does: its procfs shows the node's
ranks only, and its BPF programs account only them (exporter/bpf/fabric.h scoped_pid_tgid).
No filter flag: production would scope an exporter the same way.

One Prometheus per clock skew scrapes every exporter through a proxy here that shifts every
`*_timestamp_seconds` sample of the last node by the skew (that node's clock, as seen by
Prometheus, is off by that much), and evaluates the production rules (the mixin rendered
with the demo's fast alerts: shorter `for:`, the NCCL rule groups every 5 s, the same
thresholds and windows). Faults, each repeated with no-fault time in between:
  rank        one rank of the last node enters every collective late (--delay-ms)
  node        every rank of the last node enters late
  hang        one rank of the last node stops before a collective
Reported per skew: when the condition became true (the alert pending), when the alert fires
under the production `for:` (condition-true + that `for:`, the condition holding), which
rank and node were named, any other node named (wrong), alerts in the no-fault time, and
the rules' clock offset estimate against the skew applied.

    sudo .venv/bin/python bench/device/nccl_multinode.py --backend fake --plan quick     # here
    sudo python3 bench/device/nccl_multinode.py --backend torch --plan device            # 2+ GPUs

Needs root, kernel BTF, libbpf, exporter/bpf/{nccl,procwatch}.bpf.o, pyroute2, `prometheus`
(PATH or --prometheus), `nsenter` and `unshare`. Writes $OUT/nccl_multinode.json and .log.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import http.server
import json
import mmap
import os
import re
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from nccl_straggler import import_exporter  # noqa: E402  (the source tree, vendored deps, carried libbpf)

SUBNET = "10.25.0"                 # the bridge is .1, node i is .(10 + i)
BRIDGE = "fsmnbr0"
EXPORTER_PORT = 9477
BARRIER_PORT = 9478
MASTER_PORT = 9479
MAX_RANKS = 16
# Control block shared by the harness and every rank (a file: it crosses the mount
# namespaces, which keep the same filesystem): per global rank the delay before each
# collective (s) and a time to stop until (UNIX s), then the last step all ranks run and
# whether they may start (set once every node's exporter traces its ranks: a comm's
# sequence numbers count from its init, so every rank's init must be seen for the k-th
# collective to be the same operation on every node).
CONTROL = struct.Struct(f"<{MAX_RANKS}d{MAX_RANKS}dqq")
TIMESTAMP_SUFFIX = "_timestamp_seconds"


# ---- the ranks ------------------------------------------------------------------------------------

class Control:
    def __init__(self, path: Path, writable: bool = False) -> None:
        if writable:
            path.write_bytes(CONTROL.pack(*([0.0] * MAX_RANKS), *([0.0] * MAX_RANKS), 1 << 60, 0))
        self.file = open(path, "r+b" if writable else "rb")
        self.map = mmap.mmap(self.file.fileno(), CONTROL.size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)

    def read(self) -> tuple:
        values = CONTROL.unpack(self.map[:CONTROL.size])
        return values[:MAX_RANKS], values[MAX_RANKS:2 * MAX_RANKS], values[-2]

    def started(self) -> bool:
        return CONTROL.unpack(self.map[:CONTROL.size])[-1] == 1

    def write(self, delays=None, stops=None, last_step=None, go=None) -> None:
        values = CONTROL.unpack(self.map[:CONTROL.size])
        old_delays, old_stops = values[:MAX_RANKS], values[MAX_RANKS:2 * MAX_RANKS]
        self.map[:CONTROL.size] = CONTROL.pack(*(delays or old_delays), *(stops or old_stops),
                                               values[-2] if last_step is None else last_step,
                                               values[-1] if go is None else int(go))


def wait_for_go(control: Control) -> None:
    print("loaded", flush=True)
    while not control.started():
        time.sleep(0.1)


def rank_main(args) -> None:
    """One rank: compute, (a fault's delay or stop), the collective, the step's synchronisation."""
    control = Control(Path(args.control))
    world, rank = args.world, args.rank
    if args.backend == "torch":
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(args.local_rank)
        torch.cuda.nccl.version()              # libnccl is loaded (and probed) before the comm's init
        wait_for_go(control)
        dist.init_process_group("nccl", init_method=f"tcp://{SUBNET}.10:{MASTER_PORT}", rank=rank, world_size=world)
        grad = torch.ones(4 * 1024 * 1024, dtype=torch.float32, device=f"cuda:{args.local_rank}")   # 16 MiB

        def collective() -> None:
            grad.fill_(1.0)
            dist.all_reduce(grad)
            grad[0].item()                     # the per-step synchronisation (as loss.item())

        def finish() -> None:
            dist.destroy_process_group()
    else:
        lib = ctypes.CDLL(args.library)

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]

        wait_for_go(control)
        uid, comm = UniqueId(), ctypes.c_void_p()
        lib.ncclGetUniqueId(ctypes.byref(uid))
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]
        buf = (ctypes.c_float * 1024)()
        # The fake library moves no data: the ranks wait for each other over the network
        # instead, at a barrier the harness serves on the bridge (what the stream
        # synchronisation after a real all-reduce amounts to).
        barrier = socket.create_connection((f"{SUBNET}.1", BARRIER_PORT), timeout=600)
        barrier.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def collective() -> None:
            lib.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None)
            barrier.sendall(b"s")
            if barrier.recv(1) != b"g":
                raise SystemExit("barrier closed")

        def finish() -> None:
            lib.ncclCommDestroy(comm)
    print("running", flush=True)
    step = 0
    while True:
        delays, stops, last_step = control.read()
        if step >= last_step:
            break
        step += 1
        time.sleep(args.compute)
        if stops[rank] > time.time():
            time.sleep(stops[rank] - time.time())
        elif delays[rank] > 0:
            time.sleep(delays[rank])
        collective()
    finish()


# ---- a node: its exporter and ranks, inside its namespaces ----------------------------------------

def node_main(args) -> None:
    import_exporter()
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.main import start_exporter

    config = {"nccl": {"rescan_seconds": 1.0, "bpf_object": str(ROOT / "exporter" / "bpf" / "nccl.bpf.o"),
                       "boundary_ops": args.boundary_ops}}
    ctx = Context(state_dir=Path(tempfile.mkdtemp(prefix=f"{args.node}-state-")), node=args.node, config=config)
    exporter = start_exporter(ctx, ["nccl"], f"0.0.0.0:{EXPORTER_PORT}")
    [collector] = exporter.collectors
    if collector.uprobes is None or collector.uprobes.reason != "ok":
        print(f"uprobes unavailable: {getattr(collector.uprobes, 'reason', None)}", flush=True)
        sys.exit(2)
    print(f"exporter up, pid namespace {collector.uprobes.pidns}", flush=True)
    env = dict(os.environ)
    if args.backend == "torch":
        # Between the nodes: sockets over the veth only (docs: /work/shared/DEVICE.md).
        env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1", NCCL_NET="Socket",
                   NCCL_SOCKET_IFNAME=f"fsv{args.index}p", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                   NVSHMEM_DISABLE_NVLS="1")
    ranks = []
    for local in range(args.ranks_per_node):
        rank = args.index * args.ranks_per_node + local
        rank_env = env
        if args.backend == "torch" and args.gpus:
            # Fewer GPUs than ranks: ranks share them. NCCL refuses two ranks of a comm on
            # one device only when they share a host hash, so each rank gets its own host id
            # and NCCL joins them over its socket transport (/work/shared/DEVICE.md).
            rank_env = dict(env, NCCL_HOSTID=f"fabricscope-rank{rank}")
        ranks.append(subprocess.Popen(
            [sys.executable, __file__, "rank", "--backend", args.backend, "--library", args.library or "",
             "--control", args.control, "--world", str(args.world), "--rank", str(rank),
             "--local-rank", str((args.gpu_base + local) % args.gpus if args.gpus else args.gpu_base + local),
             "--compute", str(args.compute)], env=rank_env))
    codes = [proc.wait() for proc in ranks]
    print(f"ranks exited {codes}", flush=True)
    time.sleep(1.0)
    exporter.stop()


# ---- the harness --------------------------------------------------------------------------------

class Network:
    """A bridge here and one network namespace per node, each joined to it by a veth pair."""

    def __init__(self, nodes: int) -> None:
        from pyroute2 import IPRoute, netns

        self.nodes = nodes
        self.ipr = IPRoute()
        self.netns = netns
        self.remove()
        self.ipr.link("add", ifname=BRIDGE, kind="bridge")
        bridge = self.ipr.link_lookup(ifname=BRIDGE)[0]
        self.ipr.addr("add", index=bridge, address=f"{SUBNET}.1", mask=24)
        self.ipr.link("set", index=bridge, state="up")
        for i in range(nodes):
            self._add_node(i, bridge)

    def _add_node(self, i: int, bridge: int) -> None:
        from pyroute2 import NetNS

        name = self.namespace(i)
        self.netns.create(name)
        self.ipr.link("add", ifname=f"fsv{i}", kind="veth", peer=f"fsv{i}p")
        self.ipr.link("set", index=self.ipr.link_lookup(ifname=f"fsv{i}p")[0], net_ns_fd=name)
        self.ipr.link("set", index=self.ipr.link_lookup(ifname=f"fsv{i}")[0], master=bridge, state="up")
        with NetNS(name) as ns:
            inside = ns.link_lookup(ifname=f"fsv{i}p")[0]
            ns.addr("add", index=inside, address=f"{SUBNET}.{10 + i}", mask=24)
            ns.link("set", index=inside, state="up")
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")

    @staticmethod
    def namespace(i: int) -> str:
        return f"fsmn-node{i}"

    def remove(self) -> None:
        for name in [BRIDGE] + [f"fsv{i}" for i in range(self.nodes)]:
            for index in self.ipr.link_lookup(ifname=name):
                self.ipr.link("del", index=index)
        for i in range(self.nodes):
            if self.namespace(i) in self.netns.listnetns():
                self.netns.remove(self.namespace(i))


class Barrier(threading.Thread):
    """The fake job's step synchronisation: every rank sends a byte, then all are released."""

    def __init__(self, world: int) -> None:
        super().__init__(daemon=True, name="barrier")
        self.world = world
        self.server = socket.create_server((f"{SUBNET}.1", BARRIER_PORT))

    def run(self) -> None:
        conns = []
        while len(conns) < self.world:
            conn, _ = self.server.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append(conn)
        try:
            while True:
                for conn in conns:
                    if conn.recv(1) != b"s":
                        return
                for conn in conns:
                    conn.sendall(b"g")
        except OSError:
            return


class Skew:
    """How far one node's clock is off Prometheus': a constant number of milliseconds ("-50"),
    or a clock drifting from 0 at so many parts per million ("d100": 0.1 ms more each second,
    as an undisciplined oscillator or a slewing clock does)."""

    def __init__(self, spec: str) -> None:
        spec = spec.strip()
        try:
            if spec.startswith("d"):
                self.ms, self.ppm, self.key = 0.0, float(spec[1:]), f"drift{float(spec[1:]):g}ppm"
            else:
                self.ms, self.ppm, self.key = float(spec), 0.0, str(float(spec))
        except ValueError:
            raise SystemExit(f"--skews-ms: {spec!r} is neither milliseconds nor d<ppm>") from None
        self.t0 = time.time()

    def seconds(self, now: float | None = None) -> float:
        return self.ms / 1000 + ((time.time() if now is None else now) - self.t0) * self.ppm * 1e-6


class SkewProxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Prometheus' view of one node whose clock is off by `skew` (None: on time): every sample
    that is a reading of the node's clock (`*_timestamp_seconds`) is shifted; nothing else
    changes."""
    daemon_threads = True

    def __init__(self, upstream: str, skew: Skew | None) -> None:
        self.upstream, self.skew = upstream, skew
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


def shift_timestamps(body: str, skew: "Skew | None") -> str:
    """Each reading of the node's clock shifted by the skew at the moment it was read (its
    own value): a drifting clock stamps a boundary entry seconds old with its drift of then,
    not of the scrape (each node keeps several boundaries: re-stamping them at every scrape
    would make them drift after the fact)."""
    if skew is None or not (skew.ms or skew.ppm):
        return body
    out = []
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            if series.split("{", 1)[0].endswith(TIMESTAMP_SUFFIX):
                line = f"{series} {float(value) + skew.seconds(float(value))!r}"
        out.append(line)
    return "\n".join(out) + "\n"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        try:
            body = urllib.request.urlopen(self.server.upstream, timeout=5).read().decode()
        except OSError as exc:
            self.send_error(502, str(exc))
            return
        data = shift_timestamps(body, self.server.skew).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class Prometheus:
    def __init__(self, binary: str, workdir: Path, rules: list[Path], targets: list[str], scrape: str) -> None:
        import yaml

        workdir.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": scrape, "scrape_timeout": scrape, "evaluation_interval": scrape},
                  "rule_files": [str(r) for r in rules],
                  "scrape_configs": [{"job_name": "fabricscope", "honor_labels": True,
                                      "static_configs": [{"targets": targets, "labels": {"cluster": "multinode"}}]}]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([binary, f"--config.file={workdir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={workdir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     stdout=subprocess.DEVNULL, stderr=open(workdir / "prometheus.log", "wb"))
        self.base = f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict]:
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]["result"]

    def alerts(self) -> list[dict]:
        return json.loads(urllib.request.urlopen(self.base + "/api/v1/alerts", timeout=10).read())["data"]["alerts"]

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(self.base + "/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


NCCL_ALERTS = ("FabricNcclStragglerRank", "FabricNcclStragglerNode", "FabricNcclHang", "FabricNcclNodeClockUnsettled")


class Harness:
    def __init__(self, args) -> None:
        self.args = args
        self.t0 = time.time()
        self.lines: list[str] = []
        self.nodes = [f"node-{chr(ord('a') + i)}" for i in range(args.nodes)]
        self.world = args.nodes * args.ranks_per_node
        self.skews = [Skew(s) for s in args.skews_ms.split(",")]
        self.workdir = Path(tempfile.mkdtemp(prefix="fabricscope-multinode-"))
        self.procs: list[subprocess.Popen] = []
        self.proms: dict[float, Prometheus] = {}
        self.network = None

    def log(self, message: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {message}"
        print(line, flush=True)
        self.lines.append(line)

    # -- set-up --
    def start(self) -> None:
        args = self.args
        self.control_path = self.workdir / "control"
        self.control = Control(self.control_path, writable=True)
        library = ""
        if args.backend == "fake":
            sys.path.insert(0, str(ROOT))
            from tests.nccl_fake.build import build_fake_nccl

            library = str(build_fake_nccl(self.workdir)[0])
            Barrier(self.world).start()
        boundary_ops = args.boundary_ops
        for i, node in enumerate(self.nodes):
            command = ["nsenter", f"--net=/var/run/netns/{Network.namespace(i)}", "unshare", "--pid", "--fork",
                       "--mount-proc", "--", sys.executable, __file__, "node", "--node", node, "--index", str(i),
                       "--backend", args.backend, "--library", library, "--control", str(self.control_path),
                       "--world", str(self.world), "--ranks-per-node", str(args.ranks_per_node),
                       "--gpu-base", str(i * args.ranks_per_node if args.backend == "torch" else 0),
                       "--compute", str(args.compute), "--boundary-ops", str(boundary_ops),
                       "--gpus", str(args.gpus)]
            self.procs.append(subprocess.Popen(command, stdout=open(self.workdir / f"{node}.log", "wb"),
                                               stderr=subprocess.STDOUT))
        rules = self.render_rules()
        for skew in self.skews:
            targets = []
            for i, node in enumerate(self.nodes):
                proxy = SkewProxy(f"http://{SUBNET}.{10 + i}:{EXPORTER_PORT}/metrics",
                                  skew if i == len(self.nodes) - 1 else None)
                targets.append(proxy.address)
            self.proms[skew.key] = Prometheus(args.prometheus, self.workdir / f"prom-{skew.key}", rules, targets,
                                              args.scrape)
        self.log(f"{len(self.nodes)} nodes x {args.ranks_per_node} ranks ({args.backend}); Prometheus per skew "
                 f"{[s.key for s in self.skews]} (ms) on {self.nodes[-1]} ({[p.base for p in self.proms.values()]}); "
                 f"workdir {self.workdir}")

    def render_rules(self) -> list[Path]:
        if self.args.rules_dir:
            return sorted(Path(self.args.rules_dir).resolve().glob("fabricscope-*.yaml"))
        sys.path.insert(0, str(ROOT))
        from fabricscope.rules.render import render
        from fabricscope.demo.stack.configs import FAST_ALERT_OVERRIDES

        return render(json.loads(self.args.overrides) if self.args.overrides else FAST_ALERT_OVERRIDES,
                      self.workdir / "rules")

    def exporter_text(self, i: int) -> str:
        try:
            return urllib.request.urlopen(f"http://{SUBNET}.{10 + i}:{EXPORTER_PORT}/metrics", timeout=3).read().decode()
        except OSError:
            return ""

    def wait_traced(self, timeout: float) -> None:
        """Every node's exporter traces its rank processes (they have loaded the library and
        wait); then they may start."""
        deadline = time.time() + timeout
        traced = {}
        while time.time() < deadline:
            for i, node in enumerate(self.nodes):
                for line in self.exporter_text(i).splitlines():
                    if line.startswith("fabric_nccl_processes_traced"):
                        traced[node] = float(line.rpartition(" ")[2])
            if len(traced) == len(self.nodes) and all(v >= self.args.ranks_per_node for v in traced.values()):
                self.log(f"processes traced per node: {traced}; the ranks start")
                self.control.write(go=True)
                return
            time.sleep(0.5)
        raise SystemExit(f"the nodes' exporters did not trace their ranks within {timeout:g} s: {traced}")

    def wait_running(self, timeout: float) -> None:
        """Every node's exporter sees its own ranks (and only them) in the comm."""
        deadline = time.time() + timeout
        seen: dict = {}
        while time.time() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SystemExit(f"a node exited ({proc.returncode}): see {self.workdir}")
            seen = {}
            for i, node in enumerate(self.nodes):
                ranks = {line.split('rank="')[1].split('"')[0] for line in self.exporter_text(i).splitlines()
                         if line.startswith("fabric_nccl_operation_sequence{")}
                if ranks:
                    seen[node] = sorted(ranks, key=int)
            if len(seen) == len(self.nodes) and all(len(r) == self.args.ranks_per_node for r in seen.values()):
                self.log(f"ranks per node's exporter: {seen}")
                self.scoping = seen
                return
            time.sleep(1)
        raise SystemExit(f"the nodes' exporters did not each see their ranks within {timeout:g} s: {seen}")

    # -- observation --
    def snapshot(self) -> dict[str, list[dict]]:
        """Every Prometheus' NCCL alerts now (pending and firing), with labels."""
        out = {}
        for skew, prom in self.proms.items():
            try:
                out[skew] = [a for a in prom.alerts() if a["labels"].get("alertname") in NCCL_ALERTS]
            except OSError:
                out[skew] = []
        return out

    def watch(self, seconds: float, fault: dict | None, phase: dict, previous: dict | None = None) -> None:
        """Poll every Prometheus for `seconds`; note per skew when the fault's alert went
        pending (its condition true) and firing, what it named, and what it named wrongly:
        a straggler alert on another node, a hang culprit on another node, or, with no
        fault, any straggler alert except one still raised for the previous fault's node
        (`lingering`: its windows have not yet passed). FabricNcclNodeClockUnsettled is right
        (`clock`) only for the drifting node; anywhere else it is wrong."""
        start = time.time()
        drifting = {skew.key for skew in self.skews if skew.ppm}
        for skew in self.skews:
            phase["skews"].setdefault(skew.key, {"pending_after_s": None, "condition_true_s": None,
                                                 "firing_after_s": None, "named": [],
                                                 "wrong": [], "lingering": [], "clock": [], "culprit": None})
        while time.time() - start < seconds:
            time.sleep(1.0)
            now = time.time() - start
            for skew, alerts in self.snapshot().items():
                record = phase["skews"][skew]
                for alert in alerts:
                    labels = alert["labels"]
                    name = labels["alertname"]
                    who = {"alert": name, "node": labels.get("node"), "rank": labels.get("rank"),
                           "state": alert["state"]}
                    if name == "FabricNcclNodeClockUnsettled":
                        right = skew in drifting and who["node"] == self.nodes[-1]
                        self.note(record["clock"] if right else record["wrong"], who)
                    elif fault and self.matches(fault, name, labels):
                        if record["pending_after_s"] is None:
                            record["pending_after_s"] = round(now, 1)
                            # The evaluation that found the condition true, on Prometheus'
                            # clock (this host's): exact, where the poll is only to 1 s.
                            record["condition_true_s"] = round(active_at(alert) - start, 2)
                        if alert["state"] == "firing" and record["firing_after_s"] is None:
                            record["firing_after_s"] = round(now, 1)
                        if name == "FabricNcclHang" and alert["state"] == "firing":
                            record["culprit"] = alert["annotations"].get("culprit")
                            named = set(re.findall(r"rank (\d+) on (\S+) \(", record["culprit"] or ""))
                            if named - {(str(fault["rank"]), fault["node"])}:
                                self.note(record["wrong"], {**who, "culprit": record["culprit"]})
                        self.note(record["named"], who)
                    elif name == "FabricNcclHang":
                        if previous is not None and previous["kind"] == "hang":
                            self.note(record["lingering"], who)
                        else:
                            self.note(record["wrong"], who)
                    elif fault is not None:
                        if who["node"] != fault["node"]:
                            self.note(record["wrong"], who)
                        else:
                            self.note(record["lingering"], who)
                    elif previous is not None and who["node"] == previous["node"]:
                        self.note(record["lingering"], who)
                    else:
                        self.note(record["wrong"], who)

    @staticmethod
    def note(into: list, who: dict) -> None:
        if who not in into:
            into.append(who)

    @staticmethod
    def short(whos: list[dict]) -> str:
        return ", ".join(f"{w['alert'].removeprefix('FabricNccl')}({w['node']}"
                         + (f" rank {w['rank']}" if w['rank'] else "") + f", {w['state']})" for w in whos) or "-"

    def matches(self, fault: dict, name: str, labels: dict) -> bool:
        if fault["kind"] == "hang":
            return name == "FabricNcclHang"
        if fault["kind"] == "node":
            return name == "FabricNcclStragglerNode" and labels.get("node") == fault["node"]
        return (labels.get("node") == fault["node"]
                and (name == "FabricNcclStragglerRank" and labels.get("rank") == str(fault["rank"])
                     or name == "FabricNcclStragglerNode" and self.args.ranks_per_node == 1))

    def clock_estimates(self) -> dict:
        out = {}
        for skew in self.skews:
            try:
                rows = self.proms[skew.key].query("node:fabric_nccl_clock_offset_seconds:min5m")
            except OSError:
                continue
            applied = skew.seconds()
            values = {r["metric"]["node"]: float(r["value"][1]) for r in rows}
            if len(values) == len(self.nodes):
                first, last = values[self.nodes[0]], values[self.nodes[-1]]
                out[skew.key] = {"estimated_ms": round((last - first) * 1000, 3), "applied_ms": round(applied * 1000, 3),
                                 "error_ms": round((last - first - applied) * 1000, 3)}
        return out

    # -- faults --
    def fault_targets(self, kind: str) -> tuple[dict, list[int]]:
        last = len(self.nodes) - 1
        ranks = [last * self.args.ranks_per_node + local for local in range(self.args.ranks_per_node)]
        if kind == "node":
            return {"kind": kind, "node": self.nodes[last]}, ranks
        return {"kind": kind, "node": self.nodes[last], "rank": ranks[-1]}, ranks[-1:]

    def run_fault(self, kind: str, on: float, off: float, repeat: int) -> dict:
        fault, ranks = self.fault_targets(kind)
        phase = {"fault": fault, "repeats": []}
        for n in range(repeat):
            self.wait_clear(fault, self.args.clear_timeout)
            record = {"skews": {}}
            delays, stops = [0.0] * MAX_RANKS, [0.0] * MAX_RANKS
            for rank in ranks:
                if kind == "hang":
                    stops[rank] = time.time() + on
                else:
                    delays[rank] = self.args.delay_ms / 1000
            self.control.write(delays=delays, stops=stops)
            self.log(f"{kind} #{n + 1}: ranks {ranks} on {fault['node']} "
                     + (f"stop {on:g} s" if kind == "hang" else f"{self.args.delay_ms:g} ms late for {on:g} s"))
            self.watch(on, fault, record)
            self.control.write(delays=[0.0] * MAX_RANKS, stops=[0.0] * MAX_RANKS)
            quiet = {"skews": {}}
            self.watch(off, None, quiet, previous=fault)
            record["after"] = {k: v["wrong"] for k, v in quiet["skews"].items()}
            for skew, r in record["skews"].items():
                self.log(f"   skew {skew:>5} ms: pending after {r['pending_after_s']} s, firing after "
                         f"{r['firing_after_s']} s, named {self.short(r['named'])}, wrong {self.short(r['wrong'])}"
                         + (f", culprit: {r['culprit']}" if r["culprit"] else "")
                         + (f", flagged after the fault: {self.short(record['after'][skew])}"
                            if record['after'][skew] else ""))
            phase["repeats"].append(record)
        return phase

    def wait_clear(self, fault: dict, timeout: float) -> None:
        """Before a repeat: until no Prometheus still shows the previous repeat's alert
        (pending or firing), so that each repeat's times count from its own start."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not any(self.matches(fault, a["labels"]["alertname"], a["labels"])
                       for alerts in self.snapshot().values() for a in alerts):
                return
            time.sleep(1.0)
        self.log(f"   the previous {fault['kind']} alert still shows after {timeout:g} s")

    def no_fault(self, seconds: float, name: str = "no fault") -> dict:
        self.log(f"{name}: no fault for {seconds:g} s")
        record = {"skews": {}}
        self.watch(seconds, None, record)
        flags = {skew: r["wrong"] for skew, r in record["skews"].items()}
        self.log("   flagged without a fault: " + "; ".join(f"{s} ms: {self.short(f)}" for s, f in flags.items()))
        return {"fault": None, "name": name, "false_flags": flags,
                "clock": {skew: r["clock"] for skew, r in record["skews"].items()}}

    def stop(self) -> None:
        self.control.write(last_step=0)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for prom in self.proms.values():
            prom.stop()
        if self.network is not None:
            self.network.remove()


PLANS = {
    # (warm-up, no-fault, [(fault, on s, off s, repeats)], final no-fault)
    "quick": (40, 0, [("rank", 45, 30, 1), ("hang", 60, 20, 1)], 0),
    # make test's (tests/test_nccl_multinode.py), with its shortened rule windows and for:
    "debug": (60, 60, [("hang", 30, 10, 1)], 0),
    "test": (10, 10, [("rank", 22, 5, 1), ("node", 25, 5, 1), ("hang", 22, 3, 1)], 0),
    # One GPU per node on a 2-GPU host: the late rank is its whole node. The node offset is
    # the least over 1m, so a fault is held 90 s and the windows get 60 s to clear.
    "device": (45, 30, [("node", 90, 60, 2), ("hang", 60, 20, 1)], 0),
    "device-short": (30, 20, [("node", 85, 40, 1), ("hang", 60, 10, 1)], 0),
    # One GPU, about 7.5 minutes: the start-up watched for 60 s (the clock estimates settle
    # within it), then the node fault 3 times and the hang twice, for p50/p90 per skew; each
    # repeat starts once the previous one's alert has cleared (--clear-timeout).
    "device-1gpu": (60, 0, [("node", 45, 15, 3), ("hang", 70, 5, 2)], 0),
    # The late node alone, 5 times: its condition's p90 from more faults than device-1gpu's 3.
    "device-1gpu-node": (60, 0, [("node", 45, 15, 5)], 0),
}


def summarise(results: dict) -> dict:
    """Per fault and skew: pending (condition true) and firing times p50/p90, who was named,
    wrong-node attributions; false flags in the no-fault time."""
    summary: dict = {"faults": {}, "false_flags": {}, "startup_flags": {}, "false_pages": {}, "startup_pages": {},
                     "clock_alerts": {}}

    def flagged(skew: str, flags: list[dict], startup: bool = False) -> None:
        """Every flag without a fault (pending or firing), and of them the pages (firing): a
        pending alert is a condition the for: has not yet held, and pages no one."""
        pages = [f for f in flags if f["state"] == "firing"]
        summary["false_flags"].setdefault(skew, []).extend(flags)
        summary["false_pages"].setdefault(skew, []).extend(pages)
        if startup:
            summary["startup_flags"].setdefault(skew, []).extend(flags)
            summary["startup_pages"].setdefault(skew, []).extend(pages)
    for phase in results["phases"]:
        for skew, whos in phase.get("clock", {}).items():
            summary["clock_alerts"].setdefault(skew, []).extend(w for w in whos if w not in summary["clock_alerts"][skew])
        for record in phase.get("repeats", []):
            for skew, r in record["skews"].items():
                whos = summary["clock_alerts"].setdefault(skew, [])
                whos.extend(w for w in r.get("clock", []) if w not in whos)
        if phase["fault"] is None:
            for skew, flags in phase["false_flags"].items():
                flagged(skew, flags, startup=phase.get("name") == "start-up")
            continue
        kind = phase["fault"]["kind"]
        per_skew = summary["faults"].setdefault(kind, {})
        for record in phase["repeats"]:
            for skew, r in record["skews"].items():
                s = per_skew.setdefault(skew, {"pending_s": [], "condition_s": [], "firing_s": [], "named": [],
                                               "wrong": [], "culprits": []})
                s["pending_s"].append(r["pending_after_s"])
                s["condition_s"].append(r.get("condition_true_s"))
                s["firing_s"].append(r["firing_after_s"])
                s["named"] += [w for w in r["named"] if w not in s["named"]]
                s["wrong"] += [w for w in r["wrong"] if w not in s["wrong"]]
                if r["culprit"]:
                    s["culprits"].append(r["culprit"])
            for skew, flags in record.get("after", {}).items():
                flagged(skew, flags)
    for kind, per_skew in summary["faults"].items():
        for s in per_skew.values():
            for key in ("pending_s", "condition_s", "firing_s"):
                got = sorted(v for v in s[key] if v is not None)
                s[key + "_p50"] = percentile(got, 50)
                s[key + "_p90"] = percentile(got, 90)
                s[key + "_missed"] = sum(v is None for v in s[key])
    return summary


def active_at(alert: dict) -> float:
    """An alert's activeAt (RFC 3339, nanoseconds) as Unix seconds."""
    stamp = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$", alert["activeAt"])
    whole = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return whole.timestamp() + float("0." + (stamp.group(2) or "0"))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    index = min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))   # nearest rank
    return values[index]


def harness_main(args) -> int:
    if os.geteuid() != 0:
        print("needs root: namespaces, veth pairs and uprobes", file=sys.stderr)
        return 2
    for tool in ("nsenter", "unshare", args.prometheus):
        if shutil.which(tool) is None:
            print(f"{tool} not found", file=sys.stderr)
            return 2
    import_exporter()                  # the vendored PyYAML and pyroute2 where the host lacks them
    warm, quiet, faults, final = PLANS[args.plan]
    harness = Harness(args)
    results: dict = {"backend": args.backend, "nodes": harness.nodes, "ranks_per_node": args.ranks_per_node,
                     "skews_ms": [s.key for s in harness.skews], "commit": args.commit, "delay_ms": args.delay_ms, "plan": args.plan,
                     "scrape": args.scrape, "host": socket.gethostname(), "phases": []}
    status = 0
    # Outside the try: pyroute2 forks to create a namespace, and its child exits by SystemExit.
    harness.network = Network(args.nodes)
    try:
        harness.start()
        harness.wait_traced(args.start_timeout)
        harness.wait_running(args.start_timeout)
        results["exporter_sees"] = harness.scoping
        # The job's first minutes are watched too: a late-node or clock alert there is a
        # start-up false alarm (fresh exporters and Prometheus, the job's first collectives).
        results["phases"].append(harness.no_fault(warm, "start-up"))
        if quiet:
            results["phases"].append(harness.no_fault(quiet))
        for kind, on, off, repeat in faults:
            results["phases"].append(harness.run_fault(kind, on, off, repeat))
            write_results(args, harness, results)      # a run cut short keeps what it measured
        if final:
            results["phases"].append(harness.no_fault(final))
        results["clock_estimates"] = harness.clock_estimates()
        harness.log(f"clock offset estimates (last node against the first): {results['clock_estimates']}")
    except SystemExit as exc:
        harness.log(f"ABORTED: {exc}")
        results["error"] = str(exc)
        status = 1
    finally:
        harness.stop()
        for node in harness.nodes:
            log = harness.workdir / f"{node}.log"
            if log.is_file():
                results.setdefault("node_logs", {})[node] = log.read_text()[-3000:]
    results["summary"] = summarise(results)
    harness.log("SUMMARY " + json.dumps(results["summary"]))
    harness.log(f"results in {write_results(args, harness, results)}")
    return status


def write_results(args, harness: "Harness", results: dict) -> Path:
    out = Path(args.out or os.environ.get("OUT") or harness.workdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nccl_multinode.json").write_text(json.dumps(results, indent=1))
    (out / "nccl_multinode.log").write_text("\n".join(harness.lines) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    rank = sub.add_parser("rank")
    node = sub.add_parser("node")
    for p in (rank, node):
        p.add_argument("--backend", choices=["fake", "torch"], required=True)
        p.add_argument("--library", default="")
        p.add_argument("--control", required=True)
        p.add_argument("--world", type=int, required=True)
        p.add_argument("--compute", type=float, required=True)
    rank.add_argument("--rank", type=int, required=True)
    rank.add_argument("--local-rank", type=int, default=0)
    node.add_argument("--node", required=True)
    node.add_argument("--index", type=int, required=True)
    node.add_argument("--ranks-per-node", type=int, required=True)
    node.add_argument("--gpu-base", type=int, default=0)
    node.add_argument("--boundary-ops", type=int, required=True)
    node.add_argument("--gpus", type=int, default=0)
    for p in (parser,):
        p.add_argument("--backend", choices=["fake", "torch"], default="fake")
        p.add_argument("--plan", choices=sorted(PLANS), default="quick")
        p.add_argument("--nodes", type=int, default=2)
        p.add_argument("--ranks-per-node", type=int, default=2)
        p.add_argument("--skews-ms", default="-50,-10,-2,0,2,10,50",
                       help="one Prometheus per skew of the last node's clock: ms, or d<ppm> for a clock "
                            "drifting from 0 at that rate")
        p.add_argument("--gpus", type=int, default=0,
                       help="GPUs on this host when there are fewer than ranks: ranks share them (0: one each)")
        p.add_argument("--commit", default="", help="the commit measured, recorded in the results")
        p.add_argument("--delay-ms", type=float, default=5.0)
        p.add_argument("--compute", type=float, default=0.005, help="each step's compute before the collective, s")
        p.add_argument("--boundary-ops", type=int, default=1024,
                       help="the exporters' nccl.boundary_ops: each node keeps its last 4 boundaries, so they "
                            "may come as often as 2 per scrape interval (docs/nccl.md, \"Across nodes\")")
        p.add_argument("--scrape", default="2s")
        p.add_argument("--prometheus", default="prometheus")
        p.add_argument("--rules-dir", help="rendered rules (default: render the mixin with the fast alerts)")
        p.add_argument("--overrides", help="JSON overrides for the mixin instead of the fast alerts")
        p.add_argument("--start-timeout", type=float, default=120)
        p.add_argument("--clear-timeout", type=float, default=60,
                       help="before each repeat, wait at most this long for the previous repeat's alert to clear")
        p.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "rank":
        rank_main(args)
        return 0
    if args.mode == "node":
        node_main(args)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    return harness_main(args)


if __name__ == "__main__":
    sys.exit(main())
