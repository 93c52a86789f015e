"""NCCL uprobes: init/destroy events, comm ids, discovery, and (as root) the real BPF path
against a fake libnccl.so.2 built here with NCCL's exact signatures. The kernel's per-call
accounting, decoded without a kernel: tests/test_nccl_kernel_state.py."""
from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import requests

from fabricscope.exporter.context import Context
from fabricscope.exporter.nccl import discovery
from fabricscope.exporter.nccl.commid import comm_label, splitmix64, unique_id_hash
from fabricscope.exporter.nccl.tracker import NcclTracker
from tests.nccl_fake import identity
from tests.nccl_fake.build import build_fake_nccl, build_step_driver
from fabricscope.exporter.nccl.commid import fold_words
from fabricscope.exporter.nccl.uprobe import (EV_COMM_END, EV_COMM_INIT, EVENT, INIT_ALL, INIT_RANK, INIT_SPLIT,
                                              EventHandler, decode_event)
from tests.conftest import could_not_run, require_tool

FAKE_UNIQUE_ID = bytes((i * 37 + 11) & 0xFF for i in range(128))    # ncclGetUniqueId in fake_nccl.c


def salted_unique_id(salt: int) -> bytes:
    """The fake library's id under FAKE_NCCL_ID_SALT: each test's job gets a comm of its
    own, so fake-NCCL processes of other runs on the same machine (traced too) never join it."""
    unique_id = bytearray(FAKE_UNIQUE_ID)
    unique_id[100] ^= salt
    return bytes(unique_id)


# ---- pure parts ----------------------------------------------------------------------------

def test_splitmix64_reference_value_and_full_id_fold():
    assert splitmix64(0) == 0xE220A8397B1DCDAF          # first output of SplitMix64 seeded with 0
    other = bytearray(FAKE_UNIQUE_ID)
    other[100] ^= 1                                    # differs only far past the first 8 bytes
    assert unique_id_hash(FAKE_UNIQUE_ID) != unique_id_hash(bytes(other))
    with pytest.raises(ValueError, match="128 bytes"):
        unique_id_hash(b"short")


def event(kind, op=0, comm=0x1000, ident=0, aux=0, pid=10, tid=11, peer=-1, rank=0, nranks=0, ts=5_000_000_000):
    return EVENT.pack(ts, comm, ident, aux, pid, tid, kind, op, peer, rank, nranks)


UID_HASH = unique_id_hash(FAKE_UNIQUE_ID)


def test_init_events_name_communicators_by_the_kernel_identity():
    tracker = NcclTracker(clock=lambda: 1e9 + 100)
    handler = EventHandler(tracker)
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_RANK, rank=3, nranks=8, ident=UID_HASH))
    split = splitmix64(UID_HASH ^ splitmix64(1))
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_SPLIT, comm=0x2000, aux=0x1000, peer=1, rank=5, ident=split))
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_SPLIT, comm=0x2100, aux=0xDEAD, peer=1, rank=6, ident=0))
    clique = fold_words([30, 0x3000])
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_ALL, comm=0x3000, aux=0x3000, rank=0, nranks=2, pid=30,
                             ident=clique))
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_ALL, comm=0x3008, aux=0x3000, rank=1, nranks=2, pid=30,
                             ident=clique))
    assert sorted(tracker.snapshot().comms) == sorted([
        (comm_label(UID_HASH), 3, 8), (comm_label(split), 5, 0), (comm_label(clique), 0, 2),
        (comm_label(clique), 1, 2), (handler.comms[(10, 0x2100)].label, 6, 0)])
    assert handler.comms[(10, 0x2100)].label.startswith("unknown-")        # parent never seen
    # A comm initialised before the probes: named by process and pointer, rank unknown.
    assert handler.comm(20, 0xBEEF).label.startswith("unknown-") and handler.comm(20, 0xBEEF).rank == -1
    handler.handle_raw(event(EV_COMM_END, comm=0x1000))
    first = handler.comms[(10, 0x1000)]
    assert handler.ended == [(10, 0x1000, first)]
    assert handler.end(10, 0x1000, first) is True
    assert (10, 0x1000) not in handler.comms
    handler.process_exited(30)
    assert not any(pid == 30 for pid, _ in handler.comms)


class _Map:
    """A BPF map stand-in for KernelReader: a dict, deletes recorded."""

    def __init__(self, value_size):
        self.entries, self.deleted, self.value_size = {}, [], value_size

    def items(self):
        return list(self.entries.items())

    def delete(self, key):
        self.deleted.append(key)
        return self.entries.pop(key, None) is not None


def test_a_pointer_reused_by_a_new_comm_keeps_the_new_comm_and_its_kernel_entries():
    """malloc hands a destroyed ncclComm's memory to the next init: the destroy's last read
    must not take the newer comm's name or kernel entries with it."""
    from fabricscope.exporter.nccl import kernel_state as ks
    from fabricscope.exporter.nccl.uprobe import KernelReader

    maps = {name: _Map(layout.size) for name, layout in ks.MAP_LAYOUTS.items()}
    handler = EventHandler(NcclTracker())
    reader = KernelReader(type("Obj", (), {"map": lambda self, name: maps[name]})(), handler)
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_RANK, rank=3, nranks=8, ident=UID_HASH))
    handler.handle_raw(event(EV_COMM_END))
    ended = reader.take_ended()
    handler.handle_raw(event(EV_COMM_INIT, op=INIT_RANK, rank=1, nranks=4, ident=UID_HASH ^ 1))   # same pointer
    newer = handler.comms[(10, 0x1000)]
    reader.end_comms(ended)
    assert handler.comms[(10, 0x1000)] is newer and newer.label == comm_label(UID_HASH ^ 1)
    assert maps["nccl_rank_state"].deleted == [] and maps["nccl_op_stats"].deleted == []
    # Without a newer comm, the destroyed one's entries go.
    handler.handle_raw(event(EV_COMM_END))
    reader.end_comms(reader.take_ended())
    assert (10, 0x1000) not in handler.comms
    assert maps["nccl_rank_state"].deleted == [ks.COMM_KEY.pack(10, 0, 0x1000)]


def test_bad_events_are_counted_not_fatal():
    handler = EventHandler(NcclTracker())
    handler.handle_raw(b"\1\2\3")
    handler.handle_raw(event(77))
    handler.handle_raw(event(EV_COMM_INIT, op=9))
    handler.handle_raw(event(EV_COMM_END, comm=0x4242))                 # never initialised: nothing to end
    assert handler.counts() == (3, {"short_record": 1, "unknown_kind": 1, "unknown_init": 1})
    assert handler.ended == []
    assert decode_event(event(EV_COMM_INIT, rank=7)).rank == 7
    with pytest.raises(ValueError):
        decode_event(b"\0" * 10)


def test_maps_parsing_and_static_fallback():
    maps = "\n".join([
        "7f00-7f10 r-xp 00000000 08:01 1234 /opt/conda/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "7f10-7f20 r--p 00010000 08:01 1234 /opt/conda/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "7f20-7f30 r-xp 00000000 08:01 99 /usr/lib/libtorch_cuda.so",
        "7f30-7f40 r-xp 00000000 08:01 98 /tmp/libnccl.so.2 (deleted)",
        "7f40-7f50 rw-p 00000000 00:00 0 [heap]",
        "7f50-7f60 rw-p 00000000 00:00 0",
        "garbage",
    ])
    files = discovery.mapped_files(maps)
    assert files == ["/opt/conda/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
                     "/usr/lib/libtorch_cuda.so"]
    assert discovery.nccl_candidates(files) == ([files[0]], [files[1]])
    assert discovery.nccl_candidates(["/x/libnccl-net.so", "/x/libnccl.so"]) == (["/x/libnccl.so"], [])


# ---- the fake library ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    require_tool("gcc")
    return build_fake_nccl(tmp_path_factory.mktemp("nccl_fake"))


def test_fake_library_exports_the_probed_functions(fake_nccl):
    library, _ = fake_nccl
    exported = discovery.exported_functions(str(library))
    assert {"ncclAllReduce", "ncclCommInitRank", "ncclReduce", "ncclSend"} <= exported
    assert "maybe_block" not in exported


# ---- root: the real BPF path ---------------------------------------------------------------

def bpf_object() -> Path:
    from fabricscope.exporter.bpf_loader import objects

    path = objects.object_path("nccl")
    ok, output = objects.build()                 # make: rebuilt only when a source is newer
    if not ok or not path.is_file():
        could_not_run(f"cannot build nccl.bpf.o: {output[-300:]}")
    return path


@pytest.fixture
def uprobe_exporter(port, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: uprobes load BPF programs")
    from fabricscope.exporter.bpf_loader import reasons
    from fabricscope.exporter.main import start_exporter

    problem = reasons.preflight()
    if problem:
        pytest.skip(f"eBPF unavailable here: {problem[1]}")
    ctx = Context(state_dir=tmp_path, node="n1",
                  config={"nccl": {"rescan_seconds": 0.2, "boundary_ops": 10,
                                    "bpf_object": str(bpf_object())}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    [collector] = running.collectors
    if collector.uprobes is None or collector.uprobes.reason != "ok":
        running.stop()
        could_not_run(f"NCCL uprobes could not load: {getattr(collector.uprobes, 'reason', 'none')}")
    yield f"http://127.0.0.1:{port}", collector
    running.stop()


def scrape(base) -> dict[str, float]:
    samples = {}
    for line in requests.get(base + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def series(name, **labels):
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "node": "n1"}.items())) + "}"


def wait_for(predicate, what, deadline=30.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def traced(collector, pids) -> bool:
    """Every pid is traced (other processes mapping a fake libnccl may be traced too)."""
    return pids <= collector.uprobes._pids


class Rank:
    """One driver process: a rank of the fake communicator."""

    def __init__(self, driver, nranks, rank, n_allreduce, allreduce_count, n_allgather, allgather_count, env=None):
        self.proc = subprocess.Popen([str(driver), str(nranks), str(rank), str(n_allreduce), str(allreduce_count),
                                      str(n_allgather), str(allgather_count)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        assert self.proc.stdout.readline().strip() == "ready"

    def tell(self, line="go"):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, line):
        assert self.proc.stdout.readline().strip() == line

    def finish(self):
        self.tell("exit")
        assert self.proc.wait(timeout=30) == 0


def test_uprobes_count_every_call_of_processes_started_after_the_exporter(uprobe_exporter, fake_nccl):
    base, collector = uprobe_exporter
    library, driver = fake_nccl
    n, m, k, sendcount = 40, 1000, 7, 333
    salt = random.randrange(1, 256)
    ranks = [Rank(driver, 2, rank, n, m, k, sendcount, env={"FAKE_NCCL_ID_SALT": str(salt)}) for rank in (0, 1)]
    pids = {r.proc.pid for r in ranks}
    wait_for(lambda: traced(collector, pids), "both ranks traced")
    # Traced means probed: the library's probes are in place before the ranks start.
    assert scrape(base)[series("fabric_nccl_probe_attached", library=str(library))] == 1
    for r in ranks:
        r.tell()
    for r in ranks:
        r.expect("done")
    comm = comm_label(identity.comm_hash(salted_unique_id(salt)))
    # Both ranks' last call, counted and in flight: the maps are read one after another, so
    # a read that meets a rank entering its last call can count it and still show the one
    # before as current; the next read (every poll) agrees.
    def last_calls_seen() -> bool:
        now = scrape(base)
        return all(now.get(series("fabric_nccl_calls_total", comm=comm, rank=rank, op="Recv")) == 1
                   and series("fabric_nccl_inflight_elapsed_seconds", comm=comm, rank=rank, op="Recv") in now
                   for rank in ("0", "1"))
    wait_for(last_calls_seen, "the last call of both ranks")
    samples = scrape(base)
    for rank in ("0", "1"):
        def s(name, op):
            return samples.get(series(name, comm=comm, rank=rank, op=op))
        assert samples[series("fabric_nccl_comm_info", comm=comm, rank=rank, nranks="2")] == 1
        assert s("fabric_nccl_calls_total", "AllReduce") == n
        assert s("fabric_nccl_bytes_total", "AllReduce") == n * m * 4           # float32
        assert s("fabric_nccl_calls_total", "AllGather") == k
        assert s("fabric_nccl_bytes_total", "AllGather") == k * sendcount * 1           # int8, per-rank sendcount
        assert s("fabric_nccl_bytes_total", "Reduce") == 10 * 8                 # comm passed on the stack
        assert s("fabric_nccl_bytes_total", "Broadcast") == 3 * 2               # bfloat16
        assert s("fabric_nccl_bytes_total", "Send") == 5 * 8
        assert s("fabric_nccl_bytes_total", "Recv") == 5 * 8
        assert s("fabric_nccl_enqueue_seconds_count", "AllReduce") == n
        assert s("fabric_nccl_operation_duration_seconds_count", "AllReduce") == n
        assert s("fabric_nccl_inflight_elapsed_seconds", "Recv") is not None
    # ncclCommSplit(comm, color 7, key rank): NCCL's hash, rank and size of the new comm,
    # read from it.
    split = comm_label(identity.split_hash(identity.comm_hash(salted_unique_id(salt)), 7))
    for rank in ("0", "1"):
        assert samples[series("fabric_nccl_comm_info", comm=split, rank=rank, nranks="2")] == 1
        assert samples[series("fabric_nccl_bytes_total", comm=split, rank=rank, op="AllReduce")] == 12
    assert samples[series("fabric_nccl_events_lost_total")] == 0
    for r in ranks:
        r.finish()
    # Exited processes are detached: no library left to probe, nothing in flight.
    wait_for(lambda: series("fabric_nccl_probe_attached", library=str(library)) not in scrape(base),
             "detach after the processes exited")
    samples = scrape(base)
    assert not pids & collector.uprobes._pids
    assert samples[series("fabric_nccl_processes_exited_total")] >= 2
    assert not any(key.startswith("fabric_nccl_inflight_elapsed_seconds") and comm in key for key in samples)


@pytest.mark.timing
def test_a_call_blocked_inside_nccl_is_in_flight_and_hanging_then_completes(uprobe_exporter, fake_nccl, tmp_path):
    base, collector = uprobe_exporter
    library, driver = fake_nccl
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    n = 8                                         # the 8th AllReduce blocks; 7 complete before it
    salt = random.randrange(1, 256)
    rank = Rank(driver, 4, 2, n, 256, 1, 16, env={"FAKE_NCCL_ID_SALT": str(salt), "FAKE_NCCL_BLOCK_FIFO": str(fifo),
                                                  "FAKE_NCCL_BLOCK_CALL": str(n)})
    wait_for(lambda: traced(collector, {rank.proc.pid}), "rank traced")
    rank.tell()
    comm = comm_label(identity.comm_hash(salted_unique_id(salt)))

    def blocked():
        active = requests.get(base + "/nccl/operations/active", timeout=10).json()["operations"]
        return [op for op in active if op["op"] == "AllReduce" and not op["api_returned"] and op["comm"] == comm]

    [first] = wait_for(blocked, "the blocked AllReduce")
    assert first["rank"] == 2 and first["nranks"] == 4 and first["bytes"] == 256 * 4
    [second] = wait_for(lambda: [op for op in blocked() if op["elapsed_seconds"] > first["elapsed_seconds"]],
                        "elapsed time to grow")
    assert second["completed_count"] == n - 1 and second["hanging"] is True
    samples = scrape(base)
    assert samples[series("fabric_nccl_hanging", comm=comm, rank="2", op="AllReduce")] == 1
    assert samples[series("fabric_nccl_calls_total", comm=comm, rank="2", op="AllReduce")] == n
    with open(fifo, "wb") as release:
        release.write(b"x")
    rank.expect("done")
    wait_for(lambda: scrape(base).get(series("fabric_nccl_calls_total", comm=comm, rank="2", op="Recv")) == 1,
             "the calls after the release")
    samples = scrape(base)
    assert samples[series("fabric_nccl_hanging", comm=comm, rank="2", op="AllReduce")] == 0
    assert samples[series("fabric_nccl_operation_duration_seconds_count", comm=comm, rank="2",
                          op="AllReduce")] == n
    assert samples[series("fabric_nccl_enqueue_seconds_count", comm=comm, rank="2", op="AllReduce")] == n
    rank.finish()


def test_missing_object_is_a_reason_not_a_crash(port, tmp_path):
    from fabricscope.exporter.main import start_exporter

    ctx = Context(state_dir=tmp_path, node="n1",
                  config={"nccl": {"bpf_object": str(tmp_path / "absent.bpf.o")}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    try:
        samples = scrape(f"http://127.0.0.1:{port}")
        reasons = [k for k, v in samples.items() if k.startswith("fabric_nccl_uprobes_available") and v == 0]
        assert len(reasons) == 1 and ('reason="object_missing"' in reasons[0] or 'reason="not_root"' in reasons[0])
        assert samples[series("fabric_scrape_collector_success", collector="nccl")] == 1
    finally:
        running.stop()


# ---- arrival lag and the hang's culprit: several ranks of one job ------------------------------

@pytest.fixture(scope="module")
def step_driver(fake_nccl):
    library, _ = fake_nccl
    return build_step_driver(library.parent)


class Job:
    """NRANKS step-driver processes on one communicator, sharing one barrier file. The
    comm id is the job's own (salted), so fake-NCCL processes of other runs on the same
    machine, traced too, never join it."""

    def __init__(self, driver, tmp_path, nranks, nsteps, delays=None, stop=None):
        barrier = tmp_path / "barrier"
        barrier.write_bytes(b"\0" * 64)
        delays, stop = delays or {}, stop or {}
        salt = random.randrange(1, 256)
        self.comm = comm_label(identity.comm_hash(salted_unique_id(salt)))
        self.procs = [subprocess.Popen([str(driver), str(nranks), str(rank), str(nsteps), str(delays.get(rank, 0)),
                                        str(stop.get(rank, 0)), str(barrier)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, "FAKE_NCCL_ID_SALT": str(salt)})
                      for rank in range(nranks)]
        self.pids = {proc.pid for proc in self.procs}
        for proc in self.procs:
            assert proc.stdout.readline().strip() == "ready"

    def tell(self, rank, line="go"):
        self.procs[rank].stdin.write(line + "\n")
        self.procs[rank].stdin.flush()

    def expect(self, rank, line):
        assert self.procs[rank].stdout.readline().strip() == line

    def finish(self):
        for rank in range(len(self.procs)):
            self.tell(rank, "exit")
        for proc in self.procs:
            assert proc.wait(timeout=30) == 0

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def run_job(base, collector, driver, tmp_path, nranks, nsteps, delays=None):
    job = Job(driver, tmp_path, nranks, nsteps, delays)
    try:
        wait_for(lambda: traced(collector, job.pids), "all ranks traced")
        for rank in range(nranks):
            job.tell(rank)
        for rank in range(nranks):
            job.expect(rank, "done")
        comm = job.comm
        def count(r):
            return scrape(base).get(series("fabric_nccl_arrival_lag_seconds_count", comm=comm, rank=str(r)))
        wait_for(lambda: all(count(r) == nsteps for r in range(nranks)), "every step's lag of every rank")
        samples = scrape(base)
        job.finish()
    finally:
        job.kill()
    mean = {r: samples[series("fabric_nccl_arrival_lag_seconds_sum", comm=comm, rank=str(r))] / nsteps
            for r in range(nranks)}
    return samples, comm, mean


@pytest.mark.timing
def test_a_late_rank_shows_its_delay_as_arrival_lag_and_no_other_does(uprobe_exporter, step_driver, tmp_path):
    base, collector = uprobe_exporter
    delay = 0.05
    samples, comm, mean = run_job(base, collector, step_driver, tmp_path, nranks=4, nsteps=30,
                                  delays={2: int(delay * 1e6)})
    assert mean[2] == pytest.approx(delay, rel=0.10), mean
    assert all(mean[r] < 0.1 * delay for r in (0, 1, 3)), mean
    # Every rank keeps the same period: call-to-call durations cannot tell the late rank.
    periods = [samples[series("fabric_nccl_operation_duration_seconds_sum", comm=comm, rank=str(r), op="AllReduce")]
               for r in range(4)]
    assert max(periods) - min(periods) < 0.1 * min(periods), periods
    # The sequence numbers and the node's entries into the last boundaries (ops 10, 20, 30
    # with boundary_ops 10, in slots 1, 2, 3 of every rank's ring in the kernel): what a rule
    # joins across nodes. The entry is the node's first rank's, one step period per op apart;
    # the late rank's delay is its arrival lag, above.
    assert all(samples[series("fabric_nccl_operation_sequence", comm=comm, rank=str(r))] == 30 for r in range(4))
    entered = {}
    for k, slot in ((10, "1"), (20, "2"), (30, "3")):
        assert samples[series("fabric_nccl_sequence_boundary", comm=comm, slot=slot)] == k
        entered[k] = samples[series("fabric_nccl_sequence_boundary_entry_timestamp_seconds", comm=comm, slot=slot)]
    assert series("fabric_nccl_sequence_boundary", comm=comm, slot="0") not in samples
    period = periods[0] / samples[series("fabric_nccl_operation_duration_seconds_count", comm=comm, rank="0",
                                         op="AllReduce")]
    assert entered[20] - entered[10] == pytest.approx(10 * period, rel=0.2)
    assert entered[30] - entered[20] == pytest.approx(10 * period, rel=0.2)


@pytest.mark.timing
def test_without_delay_no_rank_lags(uprobe_exporter, step_driver, tmp_path):
    base, collector = uprobe_exporter
    _, _, mean = run_job(base, collector, step_driver, tmp_path, nranks=4, nsteps=30)
    assert all(m < 0.005 for m in mean.values()), mean


@pytest.mark.timing
def test_a_stopped_rank_is_named_the_culprit_while_its_peers_wait(uprobe_exporter, step_driver, tmp_path):
    base, collector = uprobe_exporter
    job = Job(step_driver, tmp_path, nranks=3, nsteps=40, stop={1: 20})
    comm = job.comm
    try:
        wait_for(lambda: traced(collector, job.pids), "all ranks traced")
        for rank in range(3):
            job.tell(rank)
        job.expect(1, "stopped")

        def culprits():
            return [c for c in requests.get(base + "/nccl/operations/active", timeout=10).json()["culprits"]
                    if c["comm"] == comm]

        [culprit] = wait_for(culprits, "the hang's culprit")
        assert culprit == {"comm": comm, "rank": 1, "reason": "not_entered", "sequence": 20, "op": "AllReduce",
                           "waiting_ranks": [0, 2],
                           "message": "rank 1 never entered AllReduce #20, which ranks 0 and 2 are waiting in"}
        samples = scrape(base)
        assert samples[series("fabric_nccl_hang_culprit", comm=comm, rank="1", reason="not_entered")] == 1
        assert [k for k in samples if k.startswith("fabric_nccl_hang_culprit") and comm in k] == \
            [series("fabric_nccl_hang_culprit", comm=comm, rank="1", reason="not_entered")]
        # The peers wait in the op the culprit never entered: hanging once 3x their average.
        wait_for(lambda: scrape(base).get(series("fabric_nccl_hanging", comm=comm, rank="0", op="AllReduce")) == 1,
                 "the waiting peer to hang")
        # The rank resumes: the hang and its culprit clear.
        job.tell(1)
        for rank in range(3):
            job.expect(rank, "done")
        wait_for(lambda: not culprits(), "the culprit to clear")
        job.finish()
    finally:
        job.kill()
