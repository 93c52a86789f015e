"""An exporter that starts after the job, or is killed mid-job and restarted: what it names.

Two jobs of WORLD ranks (one GPU each: all_reduce of 64 MiB, then a synchronisation as
`loss.item()` does), each under the exporter's nccl collector run as a process of its own:
  job 1  the exporter starts first and sees every init        -> "init" (the reference)
         then it is killed with SIGKILL and started again     -> "restart"
  job 2  the exporter starts 20 s after the job               -> "late"
A reference exporter sees every init and runs throughout: each later exporter is compared
with it on the same operations. A restarted exporter keeps its state dir, as on a node. For every exporter life it records: the seconds from its start until every rank is named
(fabric_nccl_comm_info with a rank >= 0), the comm id, rank, nranks and GPU of each rank
(fabric_nccl_rank_info), where the identity came from (fabric_nccl_comm_identities), the
mean arrival lag per rank while the last rank sleeps 40 ms before every all-reduce, and the
hang's culprit while that rank stops. It also prints the communicator layout found in the
job's libnccl (exporter/nccl/commlayout.py). Writes $OUT/nccl_late_attach.{json,log}.

    sudo NCCL_NVLS_ENABLE=0 python3 bench/device/nccl_late_attach.py              # GPUs, PyTorch
    sudo .venv/bin/python bench/device/nccl_late_attach.py --backend fake --quick  # here: fake libnccl

Needs what nccl_straggler.py needs (bench/device/README.md).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nccl_straggler import free_port, import_exporter, label, pick, ready_for_uprobes, scrape  # noqa: E402

ROOT = HERE.parents[1]
COMPUTE_SECONDS = 0.005


# ---- the exporter, a process of its own (SIGKILL must hit the real thing) --------------------

def serve(port: int, state: str) -> None:
    import_exporter()
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.bpf_loader import objects
    from fabricscope.exporter.main import start_exporter

    nccl = {"bpf_object": str(objects.object_path("nccl"))}
    if os.environ.get("FABRIC_BENCH_BOUNDARY_OPS"):
        nccl["boundary_ops"] = int(os.environ["FABRIC_BENCH_BOUNDARY_OPS"])
    ctx = Context(state_dir=Path(state), node=socket.gethostname(), config={"nccl": nccl})
    start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    signal.pause()


class Exporter:
    def __init__(self, log, state_dir: str | None = None) -> None:
        """state_dir: a killed exporter's, for its restart (a node keeps it across restarts)."""
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="fabricscope-state-")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.started = time.time()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port), self.state_dir])
        while True:
            try:
                scrape(self.base)
                break
            except OSError:
                if self.proc.poll() is not None or time.time() - self.started > 60:
                    raise SystemExit("the exporter did not start")
                time.sleep(0.2)
        log(f"exporter pid {self.proc.pid} serving after {time.time() - self.started:.1f} s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


# ---- the job ----------------------------------------------------------------------------------

def wait_until(when: float) -> None:
    """Sleep to within a millisecond of `when` (CLOCK_REALTIME), then spin: a rank wakes within
    tens of microseconds of it, not a scheduler tick later."""
    while (left := when - time.time()) > 0.002:
        time.sleep(left - 0.001)
    while time.time() < when:
        pass


def worker(rank: int, world: int, backend: str, library: str, control, progress, ready, go, barrier,
           port: int, one_gpu: bool = False, tick: float = 0.0, overruns=None, ticks=None) -> None:
    """control = [delay seconds, stop until (UNIX s), last step]; the last rank is delayed/stopped.
    one_gpu: every rank on GPU 0, each its own NCCL "host" (NCCL_HOSTID), joined over sockets on
    lo; each step two all-reduces, 4 MiB then one float (a gradient bucket and a stop flag).
    tick > 0: every rank starts each step at one agreed wall-clock time (this host's
    CLOCK_REALTIME), the last rank `delay` after it, so arrivals differ by the programmed delay
    and wake-up jitter only. Without it, ranks time-sliced on one GPU leave each step's
    synchronisation in turn, milliseconds apart, and enter the next step so. The time is agreed
    in the job itself: the small collective becomes one float64 with MAX, each rank proposing
    `now + tick`; a step that outlasts the tick starts late and is counted (overruns)."""
    starts = [0.0]                                        # with a tick: the next step's agreed start
    if backend == "torch" and one_gpu:
        os.environ.update(NCCL_HOSTID=f"fabric-bench-rank-{rank}", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1",
                          NCCL_IB_DISABLE="1", NCCL_NET="Socket", NCCL_SOCKET_IFNAME="lo")
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        torch.cuda.nccl.version()
        ready.set()
        go.wait()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=rank, world_size=world)
        grad = torch.ones(1024 * 1024, dtype=torch.float32, device="cuda:0")
        flag = torch.zeros(1, dtype=torch.float64 if tick else torch.float32, device="cuda:0")

        def step() -> None:
            if not tick:
                time.sleep(COMPUTE_SECONDS)
                dist.all_reduce(grad)
                dist.all_reduce(flag)
                flag.item()
                return
            dist.all_reduce(grad)
            flag.fill_(time.time() + tick)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            starts[0] = flag.item()

        finish = dist.destroy_process_group
    elif backend == "torch":
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        torch.cuda.nccl.version()                  # libnccl is loaded (and can be probed) before init
        ready.set()
        go.wait()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=rank, world_size=world)
        grad = torch.ones(16 * 1024 * 1024, dtype=torch.float32, device=f"cuda:{rank}")

        def step() -> None:
            time.sleep(COMPUTE_SECONDS)
            grad.fill_(1.0)
            dist.all_reduce(grad)
            grad[0].item()

        finish = dist.destroy_process_group
    else:
        lib = ctypes.CDLL(library)
        ready.set()
        go.wait()

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]

        uid, comm = UniqueId(), ctypes.c_void_p()
        lib.ncclGetUniqueId(ctypes.byref(uid))
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
        buf = (ctypes.c_float * 1024)()
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]

        def step() -> None:
            if not tick:
                time.sleep(COMPUTE_SECONDS)
            lib.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None)
            if one_gpu:                                   # the plan's second, small collective
                time.sleep(0.001)
                lib.ncclAllReduce(buf, buf, 1, 7, 0, comm, None)
            if tick and rank == 0:                        # the fake reduces nothing: rank 0 proposes,
                ticks[0] = time.time() + tick             # the barrier publishes it
            barrier.wait()
            if tick:
                starts[0] = ticks[0]

        def finish() -> None:
            lib.ncclCommDestroy(comm)
    count = 0
    while count < control[2]:
        count += 1
        if tick and starts[0]:
            if time.time() > starts[0]:
                overruns[rank] += 1
            wait_until(starts[0])
        if rank == world - 1:
            if control[1] > time.time():
                time.sleep(control[1] - time.time())
            elif control[0] > 0:
                time.sleep(control[0])
        step()
        progress[rank] = count
    finish()


class Job:
    def __init__(self, world: int, backend: str, library: str, salt: int, one_gpu: bool = False,
                 tick: float = 0.0) -> None:
        context = mp.get_context("spawn")
        self.backend, self.salt = backend, salt
        os.environ["FAKE_NCCL_ID_SALT"] = str(salt)            # the fake library's comm id of this job
        # NCCL's own word on its communicators ("commId 0x... - Init START"): what the
        # exporter's comm label must equal.
        self.nccl_logs = Path(tempfile.mkdtemp(prefix="nccl-logs-"))
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT", NCCL_DEBUG_FILE=f"{self.nccl_logs}/%p.log")
        self.control = context.Array("d", [0.0, 0.0, 1e12], lock=False)
        self.progress = context.Array("l", world, lock=False)
        self.overruns = context.Array("l", world, lock=False)     # steps started after their tick
        ticks = context.Array("d", 1, lock=False)
        readies = [context.Event() for _ in range(world)]
        self._go = context.Event()
        barrier = context.Barrier(world)
        port = free_port()
        self.procs = [context.Process(target=worker, args=(rank, world, backend, library, self.control, self.progress,
                                                          readies[rank], self._go, barrier, port, one_gpu, tick,
                                                          self.overruns, ticks),
                                      daemon=True)
                      for rank in range(world)]
        for proc in self.procs:
            proc.start()
        for event in readies:
            if not event.wait(180):
                raise SystemExit("a rank did not start within 180 s")
        self.started = time.time()

    def go(self) -> None:
        """Initialise and run; returns once every rank has made a step."""
        self._go.set()
        deadline = time.time() + 180
        while min(self.progress) == 0:
            if time.time() > deadline:
                raise SystemExit("the job made no step within 180 s")
            time.sleep(0.2)

    def comms(self) -> dict[str, list]:
        """comm label -> [(rank, nranks, cudaDev)] as NCCL logged them (torch), or as the fake
        library derives the id from this job's salt."""
        if self.backend == "fake":
            sys.path.insert(0, str(ROOT))
            from tests.nccl_fake import identity

            unique_id = bytearray((i * 37 + 11) & 0xFF for i in range(128))
            unique_id[100] ^= self.salt
            return {f"{identity.comm_hash(bytes(unique_id)):016x}": []}
        found: dict[str, list] = {}
        pattern = re.compile(r"rank (\d+) nranks (\d+) cudaDev (\d+).*commId 0x([0-9a-f]+)")
        for log in self.nccl_logs.glob("*.log"):
            for match in pattern.finditer(log.read_text(errors="replace")):
                rank, nranks, dev, comm = match.groups()
                found.setdefault(f"{int(comm, 16):016x}", []).append((int(rank), int(nranks), int(dev)))
        return found

    def stop(self) -> None:
        self.control[0] = self.control[1] = 0.0
        self.control[2] = max(self.progress) + 20  # every rank stops at the same step
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


# ---- what one exporter life sees ---------------------------------------------------------------

def named(exporter: Exporter, world: int, deadline: float, job: Job) -> tuple[float | None, dict]:
    """Seconds from the exporter's start until `world` ranks of the job's comm (as NCCL names
    it) are named; the ranks."""
    end = time.time() + deadline
    while time.time() < end:
        expected = job.comms()
        samples = scrape(exporter.base)
        by_comm: dict[str, dict[int, dict]] = {}
        for key in pick(samples, "fabric_nccl_rank_info"):
            labels = dict(key[1])
            if int(labels["rank"]) >= 0:
                by_comm.setdefault(labels["comm"], {})[int(labels["rank"])] = {
                    "nranks": int(labels["nranks"]), "gpu": labels["gpu"]}
        full = [c for c, ranks in by_comm.items() if len(ranks) >= world and c in expected]
        if full:
            comm = full[0]
            return time.time() - exporter.started, {"comm": comm, "ranks": by_comm[comm],
                                                    "nccl_says": expected[comm],
                                                    "identities": {f"{label(k, 'source')}/{label(k, 'reason')}/{label(k, 'join')}": v
                                                                   for k, v in pick(samples, "fabric_nccl_comm_identities").items()}}
        time.sleep(0.25)
    unknown = {f"{dict(k[1])}": v for k, v in pick(scrape(exporter.base), "fabric_nccl_comm_info").items()}
    return None, {"comm_info": unknown}


def lag_phase(exporters: dict[str, Exporter], job: Job, comms: dict[str, str], seconds: float,
              delay: float | None) -> dict[str, dict]:
    """Mean arrival lag per rank over the same window, as each exporter saw it. delay None:
    leave the delay as it is."""
    if delay is not None:
        job.control[0] = delay
        time.sleep(1.0)

    def totals(name):
        samples = scrape(exporters[name].base)
        out = {}
        for key, value in pick(samples, "fabric_nccl_arrival_lag_seconds_sum", comm=comms[name]).items():
            out.setdefault(int(label(key, "rank")), [0.0, 0.0])[0] = value
        for key, value in pick(samples, "fabric_nccl_arrival_lag_seconds_count", comm=comms[name]).items():
            out.setdefault(int(label(key, "rank")), [0.0, 0.0])[1] = value
        return out

    before = {name: totals(name) for name in exporters}
    time.sleep(seconds)
    after = {name: totals(name) for name in exporters}
    if delay is not None:
        job.control[0] = 0.0
    lag: dict[str, dict] = {}
    for name in exporters:
        lag[name] = {}
        for rank, (total, count) in sorted(after[name].items()):
            total0, count0 = before[name].get(rank, [0.0, 0.0])
            lag[name][rank] = {"mean_lag_ms": round((total - total0) / (count - count0) * 1000, 3)
                               if count > count0 else None, "ops": int(count - count0)}
    return lag


def stop_phase(exporters: dict[str, Exporter], job: Job, comms: dict[str, str], seconds: float) -> dict[str, dict]:
    start = time.time()
    job.control[0] = 0.0
    job.control[1] = start + seconds
    found: dict[str, dict] = {}
    while time.time() < start + seconds - 1 and len(found) < len(exporters):
        time.sleep(0.5)
        for name, exporter in exporters.items():
            if name in found:
                continue
            active = json.loads(urllib.request.urlopen(exporter.base + "/nccl/operations/active", timeout=10).read())
            culprits = [c for c in active.get("culprits", []) if c["comm"] == comms[name]]
            if culprits:
                found[name] = {"named_after_s": round(time.time() - start, 1),
                               "culprits": [{k: c[k] for k in ("rank", "reason", "op", "sequence", "waiting_ranks")}
                                            for c in culprits]}
    while time.time() < start + seconds + 2:         # the rank comes back before the job moves on
        time.sleep(0.2)
    return {name: found.get(name, {"named_after_s": None, "culprits": []}) for name in exporters}


def compare(reference: Exporter, other: Exporter, name: str, job: Job, world: int, args, log,
            delay_on: bool = False) -> dict:
    """`other` (started late or restarted) against `reference` (saw the init), on the same
    job at the same time: identity, then lag (the last rank 40 ms late), then the culprit."""
    result: dict = {}
    for who, exporter in (("reference", reference), (name, other)):
        seconds, identity = named(exporter, world, args.name_deadline, job)
        result[who] = {"named_after_s": None if seconds is None else round(seconds, 1), **identity}
        log(f"  {who}: named after {result[who]['named_after_s']} s: {json.dumps(identity)}")
    if result[name]["named_after_s"] is None:
        return result
    exporters = {"reference": reference, name: other}
    comms = {who: result[who]["comm"] for who in exporters}
    time.sleep(2)
    lag = lag_phase(exporters, job, comms, args.phase, None if delay_on else 0.040)
    stop = stop_phase(exporters, job, comms, args.phase)
    for who in exporters:
        result[who]["lag_40ms"] = lag[who]
        result[who]["stop"] = stop[who]
        log(f"  {who}: lag (ms) while rank {world - 1} sleeps 40 ms: "
            + ", ".join(f"{r}: {v['mean_lag_ms']}" for r, v in lag[who].items())
            + f"; stopped: {json.dumps(stop[who])}")
    return result


def layout_of_job_library(pid: int) -> dict:
    import_exporter()
    from fabricscope.exporter.nccl import commlayout, discovery

    maps = discovery.read_maps(Path("/proc"), pid) or ""
    nccl, _ = discovery.nccl_candidates(discovery.mapped_files(maps))
    out = {}
    for path in nccl:
        try:
            layout = commlayout.library_layout(path)
            out[path] = {"rank_at": hex(layout.rank_at), "version": layout.version,
                         "counter": layout.counter and layout.counter.name, "no_counter": layout.counter_reason}
        except commlayout.LayoutUnknown as exc:
            out[path] = {"unknown": exc.reason, "message": str(exc)}
    return out



# ---- --plan restarts: numbering across SIGKILLs and late starts (docs/nccl.md, "Numbering") ------

def _by_rank(samples, name: str, comm: str) -> dict[int, float]:
    return {int(label(k, "rank")): v for k, v in pick(samples, name, comm=comm).items()}


def _numbered(samples, comm: str, world: int) -> bool:
    how = {int(label(k, "rank")): label(k, "numbering") for k in pick(samples, "fabric_nccl_rank_numbering", comm=comm)}
    return len(how) >= world and all(v == "counter" for v in how.values())


def aligned_with(reference: Exporter, exporter: Exporter, comm: str, job: Job, world: int) -> dict:
    """Whether both exporters give each rank's ops the same numbers, checked with no clock:
    the last rank stops for 2 s, so every rank stands still (its peers wait inside the step
    it has not entered), and both exporters' fabric_nccl_operation_sequence must then be
    equal rank by rank. The reference saw the init; the other started while the job ran."""
    stop_until = time.time() + 2.0
    job.control[1] = stop_until
    time.sleep(1.6)                                   # both read the kernel's state once a second
    a = _by_rank(scrape(reference.base), "fabric_nccl_operation_sequence", comm)
    b = _by_rank(scrape(exporter.base), "fabric_nccl_operation_sequence", comm)
    time.sleep(max(0.0, stop_until - time.time()) + 1.6)    # the late op's 2 s lag stays out of the windows
    ranks = range(world)
    return {"aligned": all(r in a and r in b and a[r] == b[r] for r in ranks),
            "sequences": {r: (a.get(r), b.get(r)) for r in ranks}}


def lag_windows(exporters: list[Exporter], comm: str, windows: int, seconds: float = 1.0) -> list[list[dict]]:
    """Per exporter, per window of `seconds` (a scrape interval): each rank's mean arrival lag (s)."""
    def totals(e):
        samples = scrape(e.base)
        total = _by_rank(samples, "fabric_nccl_arrival_lag_seconds_sum", comm)
        count = _by_rank(samples, "fabric_nccl_arrival_lag_seconds_count", comm)
        return {r: (total[r], count.get(r, 0.0)) for r in total}
    before = [totals(e) for e in exporters]
    out: list[list[dict]] = [[] for _ in exporters]
    for _ in range(windows):
        time.sleep(seconds)
        after = [totals(e) for e in exporters]
        for i in range(len(exporters)):
            out[i].append({r: (t - before[i].get(r, (0, 0))[0]) / (c - before[i].get(r, (0, 0))[1])
                           for r, (t, c) in after[i].items() if c > before[i].get(r, (0, 0))[1]})
        before = after
    return out


def judge_life(reference: Exporter, exporter: Exporter, comm: str, job: Job, world: int, late: int, windows: int,
               log) -> dict:
    """An exporter started (again) while the job runs, against the reference that saw the init."""
    deadline = time.time() + 60
    while not _numbered(scrape(exporter.base), comm, world):
        if time.time() > deadline:
            return {"numbered_after_s": None}
        time.sleep(0.2)
    numbered_after = time.time() - exporter.started
    check = aligned_with(reference, exporter, comm, job, world)
    aligned = check["aligned"]
    seen, ref = lag_windows([exporter, reference], comm, windows)
    named_in = next((i + 1 for i, w in enumerate(seen) if w and max(w, key=w.get) == late and w[late] > 0.002), None)
    mean = {r: sum(w.get(r, 0.0) for w in seen) / len(seen) for r in range(world)}
    ref_mean = {r: sum(w.get(r, 0.0) for w in ref) / len(ref) for r in range(world)}
    row = {"numbered_after_s": round(numbered_after, 1), "aligned": aligned, "sequences": check["sequences"],
           "rank_named": max(mean, key=mean.get), "named_within_scrapes": named_in,
           "late_rank_lag_ms": round(mean[late] * 1e3, 2),
           "largest_healthy_lag_ms": round(max(v for r, v in mean.items() if r != late) * 1e3, 2),
           "reference_largest_healthy_lag_ms": round(max(v for r, v in ref_mean.items() if r != late) * 1e3, 2),
           "windows_ms": [{r: round(v * 1e3, 2) for r, v in w.items()} for w in seen]}
    log(f"  numbered after {row['numbered_after_s']} s, aligned {aligned}, rank named {row['rank_named']} "
        f"(first in scrape {named_in}), late rank {row['late_rank_lag_ms']} ms, largest healthy "
        f"{row['largest_healthy_lag_ms']} ms (reference {row['reference_largest_healthy_lag_ms']} ms)")
    return row


def restarts_plan(args, world: int, library: str, log, start_exporter, save=lambda plan: None) -> dict:
    """One job: exporters started 5-60 s after it, then one exporter SIGKILLed at random
    moments and restarted after 1-10 s, each against a reference that saw the init."""
    import random

    rng = random.Random(args.seed)
    late = world - 1
    reference = start_exporter()
    time.sleep(2)
    already = next(iter(pick(scrape(reference.base), "fabric_nccl_processes_traced").values()), 0)
    job = Job(world, args.backend, library, salt=21, one_gpu=True, tick=args.tick)
    deadline = time.time() + 60
    while next(iter(pick(scrape(reference.base), "fabric_nccl_processes_traced").values()), 0) < already + world:
        if time.time() > deadline:
            raise SystemExit("the reference did not trace the ranks within 60 s")
        time.sleep(0.25)
    job.control[0] = args.delay                       # the last rank late to every step from the start
    job.go()
    job_start = time.time()
    seconds, identity = named(reference, world, args.name_deadline, job)
    if seconds is None:
        raise SystemExit(f"the reference did not name the job's ranks: {identity}")
    comm = identity["comm"]
    results_layout = layout_of_job_library(job.procs[0].pid)
    log(f"communicator layout of the job's libnccl: {json.dumps(results_layout)}")
    log(f"job running, comm {comm} (NCCL says {identity['nccl_says']}), rank {late} {args.delay * 1e3:.0f} ms late")
    results: dict = {"comm": comm, "late_rank": late, "delay_ms": args.delay * 1e3, "late_starts": [], "restarts": [],
                     "layout": results_layout, "tick_s": args.tick}

    def judged(exporter: Exporter, windows: int) -> dict:
        """judge_life, with the steps run and those started after their tick meanwhile."""
        steps, overruns = min(job.progress), sum(job.overruns)
        row = judge_life(reference, exporter, comm, job, world, late, windows, log)
        return {**row, "steps": min(job.progress) - steps, "overruns": sum(job.overruns) - overruns}
    for at in args.late_starts:
        time.sleep(max(0.0, job_start + at - time.time()))
        exporter = start_exporter()
        log(f"exporter started {time.time() - job_start:.1f} s after the job:")
        row = {"started_after_job_s": round(exporter.started - job_start, 1),
               **judged(exporter, args.windows)}
        row["comm"] = named(exporter, world, 10, job)[1].get("comm")
        results["late_starts"].append(row)
        save(results)                                   # what a run cut short still tells
        exporter.kill()
    other = start_exporter()
    judge_life(reference, other, comm, job, world, late, 2, log)
    for repeat in range(1, args.restarts + 1):
        time.sleep(rng.uniform(0.0, 6.0))               # a random moment of the job
        kill_at = time.time() - job_start
        other.kill()
        delay = rng.uniform(1.0, 10.0)
        time.sleep(delay)
        other = start_exporter(restarting=other)
        log(f"restart {repeat}: killed at {kill_at:.1f} s, started again {delay:.1f} s later (same state dir):")
        row = {"repeat": repeat, "kill_at_s": round(kill_at, 1), "restart_delay_s": round(delay, 1),
               **judged(other, args.windows)}
        row["comm"] = named(other, world, 10, job)[1].get("comm")
        results["restarts"].append(row)
        save(results)
    other.kill()
    results["steps"], results["overruns"] = list(job.progress), list(job.overruns)
    job.stop()
    return results


def tables(results: dict, commit: str) -> str:
    """The restart and late-start tables (Markdown) of a --plan restarts run."""
    plan = results["plan"]
    late, ok = plan["late_rank"], "✅"
    tick = plan.get("tick_s") or 0
    lives = plan["restarts"] + plan["late_starts"]
    paced = (f"each step an all-reduce of 4 MiB then one of one float64 (MAX: the next step's start); every rank "
             f"starts each step at that agreed wall-clock time (CLOCK_REALTIME, {tick * 1e3:.0f} ms after the "
             f"latest rank's proposal), rank {late} {plan['delay_ms']:.0f} ms after it; steps in the judged windows "
             f"that started after their time: {sum(r.get('overruns', 0) for r in lives)} of "
             f"{sum(r.get('steps', 0) for r in lives)} rank-steps" if tick else
             f"each step an all-reduce of 4 MiB then one of one float; rank {late} {plan['delay_ms']:.0f} ms late "
             f"to every step")
    head = (f"Measured at commit `{commit}` on {results['host']} ({results['backend']}): {results['world']} ranks "
            f"on one GPU (NCCL_HOSTID per rank, sockets on lo), {paced}. Lags are the mean arrival lag "
            f"over {len(plan['restarts'][0]['windows_ms']) if plan['restarts'] else '?'} scrape windows of 1 s after "
            f"the exporter numbered every rank by NCCL's counter; 'reference' is an exporter that saw the init.\n")

    def verdict(row):
        good = (row.get("aligned") and row.get("rank_named") == late and row.get("named_within_scrapes") in (1, 2)
                and row.get("comm") == plan["comm"])
        return ok if good else "❌"

    def healthy(row):
        return ok if (row.get("largest_healthy_lag_ms") or 99) <= 1.0 else "❌"

    lines = [head, "### Restarts (SIGKILL, same state dir)\n",
             "| repeat | kill at (s into the job) | restart delay (s) | numbered after (s) | aligned | rank named "
             "(scrape) | late rank lag (ms) | largest healthy lag (ms) | reference's (ms) | same comm "
             "| numbered alike, late rank named ≤ 2 scrapes | healthy ≤ 1 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in plan["restarts"]:
        lines.append(f"| {row['repeat']} | {row['kill_at_s']} | {row['restart_delay_s']} | {row.get('numbered_after_s')} "
                     f"| {row.get('aligned')} | {row.get('rank_named')} ({row.get('named_within_scrapes')}) "
                     f"| {row.get('late_rank_lag_ms')} | {row.get('largest_healthy_lag_ms')} "
                     f"| {row.get('reference_largest_healthy_lag_ms')} | {row.get('comm') == plan['comm']} | {verdict(row)} "
                     f"| {healthy(row)} |")
    lines += ["", "### Late starts\n",
              "| started after the job (s) | numbered after (s) | aligned | rank named (scrape) | late rank lag (ms) "
              "| largest healthy lag (ms) | reference's (ms) | same comm | numbered alike, late rank named ≤ 2 "
              "scrapes | healthy ≤ 1 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in plan["late_starts"]:
        lines.append(f"| {row['started_after_job_s']} | {row.get('numbered_after_s')} | {row.get('aligned')} "
                     f"| {row.get('rank_named')} ({row.get('named_within_scrapes')}) | {row.get('late_rank_lag_ms')} "
                     f"| {row.get('largest_healthy_lag_ms')} | {row.get('reference_largest_healthy_lag_ms')} "
                     f"| {row.get('comm') == plan['comm']} | {verdict(row)} | {healthy(row)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["torch", "fake"], default="torch")
    parser.add_argument("--world", type=int, default=0, help="ranks (default: the GPUs, at most 4; fake: 3)")
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    parser.add_argument("--plan", choices=["compare", "restarts"], default="compare",
                        help="restarts: one job on GPU 0 (NCCL_HOSTID per rank), late starts then SIGKILLs")
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--late-starts", type=float, nargs="*", default=[5, 20, 40, 60])
    parser.add_argument("--delay", type=float, default=0.005, help="the last rank's lateness (s)")
    parser.add_argument("--windows", type=int, default=5, help="scrape windows of 1 s judged per exporter life")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--tick", type=float, default=0.0,
                        help="restarts: start every step at an agreed wall-clock time this long after the "
                             "latest rank's proposal (s; 0: as the GPU's time-slicing lets them)")
    parser.add_argument("--table", type=Path, help="print the tables of a --plan restarts JSON and exit")
    parser.add_argument("--commit", default="", help="with --table: the commit measured")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "STATE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    if args.table:
        print(tables(json.loads(args.table.read_text()), args.commit), end="")
        return 0
    if not ready_for_uprobes():
        return 2
    args.phase = 6.0 if args.quick else 10.0
    args.name_deadline = 45.0
    library = ""
    if args.backend == "fake":
        sys.path.insert(0, str(ROOT))
        from tests.nccl_fake.build import build_fake_nccl

        library = str(build_fake_nccl(Path(tempfile.mkdtemp(prefix="fake-nccl-")))[0])
        world = args.world or (4 if args.plan == "restarts" else 3)
    else:
        import torch

        world = args.world or (4 if args.plan == "restarts" else min(4, torch.cuda.device_count()))
    t0 = time.time()
    lines: list[str] = []

    def log(message: str) -> None:
        line = f"[{time.time() - t0:6.1f}s] {message}"
        print(line, flush=True)
        lines.append(line)

    results: dict = {"backend": args.backend, "world": world, "host": socket.gethostname(), "runs": {}}
    log(f"{world} ranks, backend {args.backend}")
    exporters: list[Exporter] = []

    def start_exporter(restarting: Exporter | None = None) -> Exporter:
        exporter = Exporter(log, restarting.state_dir if restarting else None)
        exporters.append(exporter)
        return exporter

    if args.plan == "restarts":
        def save(plan: dict | None = None) -> None:
            if plan is not None:
                results["plan"] = plan
            out = os.environ.get("OUT")
            if out:
                Path(out).mkdir(parents=True, exist_ok=True)
                (Path(out) / "nccl_restarts.json").write_text(json.dumps(results, indent=1, default=str))
                (Path(out) / "nccl_restarts.log").write_text("\n".join(lines) + "\n")
        try:
            results["plan"] = restarts_plan(args, world, library, log, start_exporter, save)
        except SystemExit as exc:
            log(f"ABORTED: {exc}")
            results["error"] = str(exc)
        finally:
            for exporter in exporters:
                exporter.kill()
        save()
        return 1 if "error" in results else 0
    try:
        # The reference sees every init and runs throughout; the other is killed and
        # restarted, or started after the job, and is compared with it on the same ops.
        reference, other = start_exporter(), start_exporter()
        time.sleep(2)

        def traced() -> float:
            return min(next(iter(pick(scrape(e.base), "fabric_nccl_processes_traced").values()), 0)
                       for e in (reference, other))

        already = traced()                              # other NCCL processes on the host
        job = Job(world, args.backend, library, salt=11)
        traced_by = time.time() + 60                    # the probes in place before the ranks' init
        while traced() < already + world:
            if time.time() > traced_by:
                raise SystemExit("the exporters did not trace the ranks within 60 s")
            time.sleep(0.25)
        job.go()
        log("job 1 running")
        results["layout"] = layout_of_job_library(job.procs[0].pid)
        log(f"communicator layout of the job's libnccl: {json.dumps(results['layout'])}")
        time.sleep(5)
        other.kill()
        log("exporter killed with SIGKILL mid-job; started again (same state dir):")
        other = start_exporter(restarting=other)
        results["runs"]["restart"] = compare(reference, other, "restart", job, world, args, log)
        job.control[0] = 0.040
        time.sleep(3)
        time.sleep(6)                                   # its sequence marks saved while the rank is late
        other.kill()
        log("exporter killed with SIGKILL while the last rank is 40 ms late to every all-reduce; "
            "started again (same state dir):")
        other = start_exporter(restarting=other)
        results["runs"]["restart_while_late"] = compare(reference, other, "restart_while_late", job, world, args,
                                                        log, delay_on=True)
        other.kill()
        job.stop()
        job = Job(world, args.backend, library, salt=12)
        job.go()
        log("job 2 running; the other exporter starts 20 s after the job's first step")
        time.sleep(20)
        other = start_exporter()
        results["runs"]["late"] = compare(reference, other, "late", job, world, args, log)
        job.stop()
    except SystemExit as exc:
        log(f"ABORTED: {exc}")
        results["error"] = str(exc)
    finally:
        for exporter in exporters:
            exporter.kill()
    results["summary"] = summarise(results)
    log("SUMMARY " + json.dumps(results["summary"], indent=1))
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "nccl_late_attach.json").write_text(json.dumps(results, indent=1, default=str))
        (Path(out) / "nccl_late_attach.log").write_text("\n".join(lines) + "\n")
    return 1 if "error" in results else 0


def summarise(results: dict) -> dict:
    """Each later exporter against the reference that saw the init, on the same ops."""
    summary = {}

    def view(run: dict) -> dict:
        lag = run.get("lag_40ms", {})
        slowest = max(lag, key=lambda r: lag[r]["mean_lag_ms"] or 0.0) if lag else None
        return {"comm": run.get("comm"), "ranks": run.get("ranks"), "straggler": slowest,
                "straggler_mean_lag_ms": lag[slowest]["mean_lag_ms"] if slowest is not None else None,
                "culprits": [(c["rank"], c["reason"], c["op"]) for c in run.get("stop", {}).get("culprits", [])]}

    for name, run in results["runs"].items():
        ref, other = view(run.get("reference", {})), view(run.get(name, {}))
        summary[name] = {"named_after_s": run.get(name, {}).get("named_after_s"),
                         "identities": run.get(name, {}).get("identities"),
                         "same": {key: ref[key] == other[key] for key in ("comm", "ranks", "straggler", "culprits")},
                         "straggler_mean_lag_ms": {"reference": ref["straggler_mean_lag_ms"],
                                                   name: other["straggler_mean_lag_ms"]},
                         "reference": ref, name: other}
    return summary


if __name__ == "__main__":
    sys.exit(main())
