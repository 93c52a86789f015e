"""The record every NCCL source produces: uprobes, POST /nccl/operations, the demo."""
from __future__ import annotations

from dataclasses import dataclass

# The values of the `op` label. ncclBcast is reported as Broadcast (same collective).
OPS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AllToAll", "Send", "Recv")


@dataclass(frozen=True)
class NcclCall:
    op: str              # AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, Send, Recv
    comm: str            # communicator id: hex splitmix64 over the 128-byte ncclUniqueId
    rank: int
    nranks: int
    nbytes: int          # count x datatype size
    start: float         # wall-clock seconds (time.time() base) when the call was entered
    enqueue_seconds: float | None = None   # entry -> return of the API call (uprobes)
    end: float | None = None               # completion, when the source knows it (ingest API)
    # The collective's sequence number on the comm where the source counts them (the
    # uprobes count in the kernel, so a lost event shifts nothing); else the tracker counts.
    sequence: int | None = None
    # The process that made the call, where the source says (ingest's optional `pid`): only
    # used to find the rank's GPU and job (fabric_nccl_rank_info), never a label.
    pid: int | None = None
