"""Simulated NCCL traffic: one data-parallel job over every GPU of the demo cluster.

Each rank calls AllReduce every PERIOD seconds of simulated time. The calls go into the
node's NcclTracker through call_entered / call_returned, the methods the uprobe path uses,
so the demo's metrics come out of the same accounting as real ones.

Faults:
- straggler_rank (target rank; params lag_seconds or factor): that rank's period, hence
  its operation durations, grow by lag_seconds (default 0.05) or by factor.
- nccl_hang (target rank): that rank stops issuing; every other rank issues one more call
  and blocks inside it (the API never returns), so all have an operation in flight whose
  elapsed keeps growing. When the fault ends, everyone resumes.
"""
from __future__ import annotations

import random
import time

from fabricscope.exporter.nccl.commid import UNIQUE_ID_BYTES, comm_label, unique_id_hash
from fabricscope.exporter.nccl.events import NcclCall
from ..plugin import ClusterSpec, Fault, NodeSpec

PERIOD = 0.1                      # seconds of simulated time between a rank's AllReduces
GRADIENT_COUNT = 16 * 1024 * 1024  # float32 elements per AllReduce (64 MiB)
GRADIENT_BYTES = GRADIENT_COUNT * 4
ENQUEUE_SECONDS = 30e-6
MAX_CATCH_UP_CALLS = 200          # a long pause between ticks skips ahead instead of replaying
DEFAULT_LAG = 0.05


def job_comm(cluster: ClusterSpec) -> str:
    unique_id = random.Random(f"nccl-unique-id-{cluster.seed}").randbytes(UNIQUE_ID_BYTES)
    return comm_label(unique_id_hash(unique_id))


def hang_faults(faults: list[Fault]) -> list[Fault]:
    return [fault for fault in faults if fault.kind == "nccl_hang"]


def rank_period(rank: int, faults: list[Fault]) -> float:
    """Seconds between this rank's calls under the active faults (straggler slows it)."""
    period = PERIOD
    for fault in faults:
        if fault.kind == "straggler_rank" and int(fault.target.get("rank", -1)) == rank:
            if "factor" in fault.params:
                period = PERIOD * float(fault.params["factor"])
            else:
                period = PERIOD + float(fault.params.get("lag_seconds", DEFAULT_LAG))
    return period


def ring_allreduce_bytes(nranks: int) -> int:
    """Bytes each rank sends (and receives) per ring AllReduce of GRADIENT_BYTES."""
    return 0 if nranks < 2 else GRADIENT_BYTES * 2 * (nranks - 1) // nranks


class _Rank:
    __slots__ = ("rank", "next_call", "blocked_token", "stopped")

    def __init__(self, rank: int, first_call: float) -> None:
        self.rank = rank
        self.next_call = first_call
        self.blocked_token = None     # the call this rank is stuck inside (nccl_hang)
        self.stopped = False


class NcclSimSource:
    key = "nccl"

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, rng: random.Random, epoch: float | None = None) -> None:
        self.node = node
        self.nranks = cluster.world_size
        self.comm = job_comm(cluster)
        self.rng = rng
        # Simulated seconds are mapped onto wall-clock time from this instant.
        self.epoch = time.time() if epoch is None else epoch
        self.now = 0.0
        self.tracker = None
        self._serial = 0
        # Ranks start a little apart, as real ones do.
        self.ranks = [_Rank(node.index * node.gpus + gpu, first_call=(gpu * 0.003) % PERIOD)
                      for gpu in range(node.gpus)]

    def attach(self, tracker) -> None:
        self.tracker = tracker
        for rank in self.ranks:
            tracker.register_comm(self.comm, rank.rank, self.nranks)

    def clock(self) -> float:
        """Wall-clock time of the simulation: what 'now' means to the tracker."""
        return self.epoch + self.now

    def step(self, now: float, faults: list[Fault]) -> None:
        self.now = max(self.now, now)
        if self.tracker is None:
            return
        hangs = hang_faults(faults)
        hung_ranks = {int(fault.target.get("rank", -1)) for fault in hangs}
        hang_start = min((f.start for f in hangs), default=None)
        for rank in self.ranks:
            if not hangs and (rank.stopped or rank.blocked_token is not None):
                self._resume(rank)
            if rank.stopped:
                continue
            if now - rank.next_call > MAX_CATCH_UP_CALLS * PERIOD:
                rank.next_call = now - PERIOD
            period = rank_period(rank.rank, faults)
            while rank.next_call <= now and not rank.stopped:
                if rank.rank in hung_ranks and hang_start is not None and rank.next_call >= hang_start:
                    rank.stopped = True          # the faulty rank never issues again
                    break
                blocks = hang_start is not None and rank.next_call >= hang_start
                self._issue(rank, rank.next_call, blocks)
                rank.next_call += period
                if blocks:
                    rank.stopped = True          # waits inside NCCL for the missing rank

    def _issue(self, rank: _Rank, at: float, blocks: bool) -> None:
        self._serial += 1
        token = ("demo", rank.rank, self._serial)
        start = self.epoch + at
        self.tracker.call_entered(NcclCall(op="AllReduce", comm=self.comm, rank=rank.rank, nranks=self.nranks,
                                           nbytes=GRADIENT_BYTES, start=start), token=token)
        if blocks:
            rank.blocked_token = (token, start)
        else:
            self.tracker.call_returned(token, ENQUEUE_SECONDS * self.rng.uniform(0.8, 1.2))

    def _resume(self, rank: _Rank) -> None:
        if rank.blocked_token is not None:
            token, start = rank.blocked_token
            self.tracker.call_returned(token, self.clock() - start)
            rank.blocked_token = None
        rank.stopped = False
        rank.next_call = max(rank.next_call, self.now)


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> NcclSimSource:
    return NcclSimSource(node, cluster, rng)
