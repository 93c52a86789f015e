"""The demo's simulated NCCL job, driven by Fault objects, through the real nccl collector."""
from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.context import Context
from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import nccl as demo_nccl
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules

EPOCH = 1_800_000_000.0


def cluster(nodes=2, gpus=4, seed=11):
    specs = tuple(NodeSpec(f"gpu-node-{i}", i, gpus, 2, Path("/nonexistent")) for i in range(nodes))
    return ClusterSpec("test", specs, seed)


def node_exporter(spec, node_index=0):
    source = demo_nccl.NcclSimSource(spec.nodes[node_index], spec, random.Random(5), epoch=EPOCH)
    load_collector_modules()
    ctx = Context(node=spec.nodes[node_index].name, sources={"nccl": source})
    [collector] = build_collectors(ctx, ["nccl"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector([collector], node=""))
    return source, collector, registry


def run(source, until, faults=lambda t: [], tick=0.5):
    t = 0.0
    while t <= until + 1e-9:
        source.step(t, faults(t))
        t += tick


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_every_local_rank_allreduces_every_100ms_with_cluster_wide_ranks():
    spec = cluster()
    source, collector, registry = node_exporter(spec, node_index=1)
    run(source, 10.0)
    comm = demo_nccl.job_comm(spec)
    for rank in range(4, 8):                   # node 1 of 2 x 4 GPUs holds ranks 4..7
        calls = value(registry, "fabric_nccl_calls_total", comm=comm, rank=str(rank), op="AllReduce")
        assert 99 <= calls <= 101
        assert value(registry, "fabric_nccl_bytes_total", comm=comm, rank=str(rank),
                     op="AllReduce") == calls * demo_nccl.GRADIENT_BYTES
        assert value(registry, "fabric_nccl_comm_info", comm=comm, rank=str(rank), nranks="8") == 1
        assert value(registry, "fabric_nccl_completed_average_seconds", comm=comm, rank=str(rank),
                     op="AllReduce") == pytest.approx(0.1)
        assert value(registry, "fabric_nccl_hanging", comm=comm, rank=str(rank), op="AllReduce") == 0
    assert value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce") is None


def test_same_seed_same_numbers():
    spec = cluster()
    snapshots = []
    for _ in range(2):
        source, collector, _ = node_exporter(spec)
        run(source, 5.0)
        snapshots.append(collector.tracker.snapshot().ops)
    assert snapshots[0] == snapshots[1]


def mad_outliers(values: dict[int, float], threshold=3.0):
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    scale = max(mad, 0.01 * median)           # identical healthy ranks: MAD 0
    return {rank for rank, v in values.items() if abs(v - median) / scale > threshold}


@pytest.mark.parametrize("params, expected", [({"lag_seconds": 0.08}, 0.18), ({"factor": 2.5}, 0.25)])
def test_straggler_rank_deviates_from_the_median(params, expected):
    spec = cluster()
    source, collector, registry = node_exporter(spec)
    straggler = Fault("straggler_rank", None, 0.0, None, target={"rank": 2}, params=params)
    run(source, 10.0, faults=lambda t: [straggler])
    comm = demo_nccl.job_comm(spec)
    averages = {rank: value(registry, "fabric_nccl_completed_average_seconds", comm=comm, rank=str(rank),
                            op="AllReduce") for rank in range(4)}
    assert averages[2] == pytest.approx(expected)
    assert mad_outliers(averages) == {2}


def test_nccl_hang_makes_every_rank_hang_and_elapsed_grow():
    spec = cluster()
    # The hung rank lives on the other node: this node's ranks still stop and hang.
    source, collector, registry = node_exporter(spec, node_index=0)
    hang = Fault("nccl_hang", None, 5.0, 20.0, target={"rank": 6})
    faults = lambda t: [hang] if hang.start <= t < hang.end else []
    run(source, 8.0, faults)
    comm = demo_nccl.job_comm(spec)
    active = {a.rank: a for a in collector.tracker.active_operations()}
    assert set(active) == {0, 1, 2, 3} and all(a.hanging for a in active.values())
    assert all(not a.api_returned for a in active.values())       # blocked inside NCCL
    first = value(registry, "fabric_nccl_inflight_elapsed_seconds", comm=comm, rank="0", op="AllReduce")
    assert first > 3 * 0.1
    source.step(12.0, faults(12.0))
    later = value(registry, "fabric_nccl_inflight_elapsed_seconds", comm=comm, rank="0", op="AllReduce")
    assert later == pytest.approx(first + 4.0, abs=0.01)
    calls_during = value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce")
    source.step(15.0, faults(15.0))
    assert value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce") == calls_during
    # The fault ends: everyone resumes and nothing hangs any more.
    for t in (20.0, 20.5, 21.0, 21.5, 22.0):
        source.step(t, faults(t))
    assert value(registry, "fabric_nccl_hanging", comm=comm, rank="0", op="AllReduce") == 0
    assert value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce") > calls_during + 10


def test_hung_rank_itself_stops_and_hangs():
    spec = cluster()
    source, collector, registry = node_exporter(spec, node_index=0)
    hang = Fault("nccl_hang", "gpu-node-0", 3.0, None, target={"rank": 1})
    run(source, 6.0, lambda t: [hang] if t >= 3.0 else [])
    active = {a.rank: a for a in collector.tracker.active_operations()}
    assert active[1].hanging and active[1].api_returned           # issued nothing more
    assert active[1].start < EPOCH + 3.0 <= active[0].start


def test_long_pause_between_ticks_stays_cheap():
    spec = cluster()
    source, collector, registry = node_exporter(spec)
    source.step(0.0, [])
    source.step(3600.0, [])                    # an hour in one tick: skips ahead
    calls = sum(op.calls for op in collector.tracker.snapshot().ops)
    assert calls <= 4 * (demo_nccl.MAX_CATCH_UP_CALLS + 2)
