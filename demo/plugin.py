"""The contract between the demo's scenario engine and its simulated sources.

The engine (demo/) owns the clock, the cluster shape and the scripted faults.
Each module in demo/sources/ that defines `make_source(node, cluster, rng)`
contributes one simulated backend per node; the engine puts it in the node exporter's
`Context.sources[source.key]` and calls `step()` on every tick with the faults active on
that node. Collectors use `ctx.sources.get(key)` in place of the host's real source, so a
demo metric goes through exactly the code a real one does.

A source module may also define `FAULT_KINDS` (an iterable of str): fault kinds only it
acts on, which the scenario loader then accepts besides the built-in ones.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class NodeSpec:
    name: str                 # e.g. "gpu-node-0"; also the exporter's node label
    index: int                # 0-based position in the cluster
    gpus: int                 # GPUs on this node
    hcas: int                 # InfiniBand HCAs on this node (mlx5_0 .. mlx5_{hcas-1})
    root: Path                # this node's simulated filesystem root (sys/, proc/, kmsg)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    seed: int

    @property
    def world_size(self) -> int:
        """Ranks of the simulated training job: one per GPU, node-major order."""
        return sum(node.gpus for node in self.nodes)


@dataclass(frozen=True)
class Fault:
    kind: str                 # symbol_error_storm, link_flap, link_down, microburst,
                              # nccl_hang, straggler_rank, nvlink_down, ...
    node: str | None          # None: cluster-wide (e.g. a job-level fault)
    start: float              # seconds since the scenario began
    end: float | None         # None: until the scenario ends
    target: dict[str, Any] = field(default_factory=dict)   # e.g. {"device": "mlx5_3", "port": 1}
    params: dict[str, Any] = field(default_factory=dict)   # e.g. {"rate_per_second": 50}


class SimSource(Protocol):
    key: str                  # Context.sources key the collector looks up ("nvml", "bpf", "nccl")

    def step(self, now: float, faults: list[Fault]) -> None:
        """Advance the simulation to `now` (seconds since start); `faults` are those active
        on this node or cluster-wide at `now`."""


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> SimSource:  # pragma: no cover
    """Signature every demo/sources/<name>.py module provides."""
    raise NotImplementedError
