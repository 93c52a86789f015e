"""Simulated NCCL traffic: one synchronous data-parallel job over every GPU of the demo cluster.

What real NCCL shows through the uprobes (measured on 4 GPUs, docs/nccl.md), and so what
this models:
- Every rank calls AllReduce once per step and the step ends with a synchronisation, so
  every rank has the same call-to-call period. Each step starts when the slowest rank of
  the previous one is done.
- A straggler (`straggler_rank`, target rank; params lag_seconds, default 0.05, or factor:
  lag = PERIOD x (factor - 1)) enters every collective late by the lag. The step, and so
  every rank's period, grows by the lag; only its arrival lag sets it apart.
- A hang (`nccl_hang`, target rank) stops that rank before it enters the next
  collective; every other rank enters it (the API returns at once, NCCL calls are
  asynchronous) and waits for the collective to complete, issuing nothing more. When the
  fault ends, the stopped rank enters and the job goes on.
Calls go into the node's NcclTracker through call_entered / call_returned, one by one (the
uprobe path applies the kernel's per-call accounting instead, apply_probed). Every node derives the same step times from the same fault schedule and
a shared epoch (nodes whose clocks are in step).
"""
from __future__ import annotations

import random
import time

from fabricscope.exporter.nccl.commid import UNIQUE_ID_BYTES, comm_label, unique_id_hash
from fabricscope.exporter.nccl.events import NcclCall
from ..plugin import ClusterSpec, Fault, NodeSpec

PERIOD = 0.1                      # seconds of simulated time per step without a straggler
GRADIENT_COUNT = 16 * 1024 * 1024  # float32 elements per AllReduce (64 MiB)
GRADIENT_BYTES = GRADIENT_COUNT * 4
ENQUEUE_SECONDS = 30e-6
ENTRY_JITTER = 100e-6             # ranks released by the same synchronisation enter within this
MAX_CATCH_UP_CALLS = 200          # a long pause between ticks skips ahead instead of replaying
DEFAULT_LAG = 0.05
# Simulated pid of the process driving local GPU i (one rank per GPU, as torchrun starts them).
RANK_PID_BASE = 4100

# One wall-clock origin per simulated cluster, shared by its nodes' sources: a job's
# ranks are compared across nodes by their entry times.
_EPOCHS: dict[tuple[str, int], float] = {}


def job_comm(cluster: ClusterSpec) -> str:
    unique_id = random.Random(f"nccl-unique-id-{cluster.seed}").randbytes(UNIQUE_ID_BYTES)
    return comm_label(unique_id_hash(unique_id))


def rank_pid(local_gpu: int) -> int:
    return RANK_PID_BASE + local_gpu


def hang_faults(faults: list[Fault]) -> list[Fault]:
    return [fault for fault in faults if fault.kind == "nccl_hang"]


def rank_lags(faults: list[Fault]) -> dict[int, float]:
    """Seconds each straggling rank enters late under the active faults."""
    lags = {}
    for fault in faults:
        if fault.kind != "straggler_rank":
            continue
        rank = int(fault.target.get("rank", -1))
        if "factor" in fault.params:
            lags[rank] = PERIOD * (float(fault.params["factor"]) - 1.0)
        else:
            lags[rank] = float(fault.params.get("lag_seconds", DEFAULT_LAG))
    return {rank: lag for rank, lag in lags.items() if lag > 0}


def rank_period(rank: int, faults: list[Fault]) -> float:
    """Seconds between a rank's calls: the same for every rank, since each step waits for
    the latest one (a straggler slows the whole job, not only itself)."""
    return PERIOD + max(rank_lags(faults).values(), default=0.0)


def ring_allreduce_bytes(nranks: int) -> int:
    """Bytes each rank sends (and receives) per ring AllReduce of GRADIENT_BYTES."""
    return 0 if nranks < 2 else GRADIENT_BYTES * 2 * (nranks - 1) // nranks


class NcclSimSource:
    key = "nccl"

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, rng: random.Random, epoch: float | None = None) -> None:
        self.node = node
        self.nranks = cluster.world_size
        self.comm = job_comm(cluster)
        self.rng = rng
        # Simulated seconds are mapped onto wall-clock time from this instant.
        self.epoch = _EPOCHS.setdefault((cluster.name, cluster.seed), time.time()) if epoch is None else epoch
        self.now = 0.0
        self.tracker = None
        self._serial = 0
        self.ranks = [node.index * node.gpus + gpu for gpu in range(node.gpus)]
        self.next_step = 0.0            # simulated time the next step starts
        self.waiting: set[int] | None = None   # during a hang: the local ranks still to enter

    def attach(self, tracker) -> None:
        self.tracker = tracker
        for rank in self.ranks:
            tracker.register_comm(self.comm, rank, self.nranks)

    def rank_processes(self) -> list[tuple[str, int, int, int]]:
        """(comm, rank, nranks, pid): a rail-optimised node runs local rank i on GPU i."""
        return [(self.comm, rank, self.nranks, rank_pid(local)) for local, rank in enumerate(self.ranks)]

    def clock(self) -> float:
        """What 'now' means to the tracker: the simulated instant up to which calls have
        been issued. The simulation issues calls at its ticks, so a clock running on with
        the wall between ticks (or while a busy machine delays one) would age the call in
        flight past its hang threshold with no call missing: measured, half of a 2-node
        demo's scrapes read `fabric_nccl_hanging 1` at a 0.5 s tick with the wall clock
        here. The node clock the rules read for offsets is the scrape's wall clock
        (fabric_nccl_scrape_timestamp_seconds), not this one."""
        return self.epoch + self.now

    def step(self, now: float, faults: list[Fault]) -> None:
        self.now = max(self.now, now)
        if self.tracker is None:
            return
        hangs = hang_faults(faults)
        if self.waiting is not None:
            if hangs:
                return                  # the job is stuck in the collective
            for rank in sorted(self.waiting):
                self._enter(rank, now)  # the stopped rank comes back and enters
            self.waiting = None
            self.next_step = now + PERIOD
        if now - self.next_step > MAX_CATCH_UP_CALLS * PERIOD:
            self.next_step = now - PERIOD
        hung = {int(fault.target.get("rank", -1)) for fault in hangs}
        hang_start = min((fault.start for fault in hangs), default=None)
        lags = rank_lags(faults)
        late = max(lags.values(), default=0.0)
        # A step is issued once its last rank's entry time has passed.
        while self.next_step + late <= now:
            start = self.next_step
            stopping = hang_start is not None and start >= hang_start
            for rank in self.ranks:
                if stopping and rank in hung:
                    continue
                self._enter(rank, start + lags.get(rank, 0.0) + self.rng.uniform(0.0, ENTRY_JITTER))
            if stopping:
                self.waiting = set(self.ranks) & hung
                return
            self.next_step = start + PERIOD + late

    def _enter(self, rank: int, at: float) -> None:
        self._serial += 1
        token = ("demo", rank, self._serial)
        self.tracker.call_entered(NcclCall(op="AllReduce", comm=self.comm, rank=rank, nranks=self.nranks,
                                           nbytes=GRADIENT_BYTES, start=self.epoch + at), token=token)
        self.tracker.call_returned(token, ENQUEUE_SECONDS * self.rng.uniform(0.8, 1.2))


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> NcclSimSource:
    return NcclSimSource(node, cluster, rng)
