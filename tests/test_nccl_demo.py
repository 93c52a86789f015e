"""The demo's simulated NCCL job, driven by Fault objects, through the real nccl collector."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.context import Context
from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import nccl as demo_nccl
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules
from fabricscope.exporter.nccl.tracker import BOUNDARY_SLOTS

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
                     op="AllReduce") == pytest.approx(0.1, abs=demo_nccl.ENTRY_JITTER)
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


def lag_means(registry, comm, ranks):
    return {rank: value(registry, "fabric_nccl_arrival_lag_seconds_sum", comm=comm, rank=str(rank))
            / value(registry, "fabric_nccl_arrival_lag_seconds_count", comm=comm, rank=str(rank)) for rank in ranks}


@pytest.mark.parametrize("params, lag", [({"lag_seconds": 0.08}, 0.08), ({"factor": 2.5}, 0.15)])
def test_a_straggler_enters_late_and_every_rank_keeps_the_same_period(params, lag):
    spec = cluster()
    source, collector, registry = node_exporter(spec)
    straggler = Fault("straggler_rank", None, 0.0, None, target={"rank": 2}, params=params)
    run(source, 10.0, faults=lambda t: [straggler])
    comm = demo_nccl.job_comm(spec)
    averages = {rank: value(registry, "fabric_nccl_completed_average_seconds", comm=comm, rank=str(rank),
                            op="AllReduce") for rank in range(4)}
    # What real NCCL shows: the whole step slows down, on every rank alike...
    assert all(a == pytest.approx(0.1 + lag, abs=2e-4) for a in averages.values()), averages
    # ...and only the arrival lag tells the late rank.
    means = lag_means(registry, comm, range(4))
    assert means[2] == pytest.approx(lag, abs=2e-4)
    assert all(means[r] < 2e-4 for r in (0, 1, 3)), means


def test_without_faults_no_rank_lags_and_nodes_share_one_step_clock():
    spec = cluster()
    exporters = [node_exporter(spec, node_index=i) for i in (0, 1)]
    for t in [i * 0.5 for i in range(21)]:
        for source, _, _ in exporters:
            source.step(t, [])
    comm = demo_nccl.job_comm(spec)
    for index, (_, _, registry) in enumerate(exporters):
        assert all(m < 1e-4 for m in lag_means(registry, comm, range(4 * index, 4 * index + 4)).values())
    # The cross-node join: both nodes hold the same boundary ops in the same slots of their
    # rings (BOUNDARY_SLOTS, as the kernel keeps them), entered within the jitter.
    rings = [boundaries(registry, comm) for _, _, registry in exporters]
    assert rings[0] and rings[0].keys() == rings[1].keys()
    for slot, (k, entered) in rings[0].items():
        assert rings[1][slot][0] == k
        assert abs(rings[1][slot][1] - entered) <= demo_nccl.ENTRY_JITTER


def boundaries(registry, comm):
    """slot -> (k, the node's first entry) of a node's boundary ring, as exported."""
    ring = {}
    for slot in map(str, range(BOUNDARY_SLOTS)):
        k = value(registry, "fabric_nccl_sequence_boundary", comm=comm, slot=slot)
        if k is not None:
            ring[slot] = k, value(registry, "fabric_nccl_sequence_boundary_entry_timestamp_seconds", comm=comm,
                                  slot=slot)
    return ring


def test_nccl_hang_peers_wait_in_the_collective_and_the_stopped_rank_is_the_culprit():
    spec = cluster()
    hang = Fault("nccl_hang", None, 5.0, 20.0, target={"rank": 1})
    def faults(t):
        return [hang] if hang.start <= t < hang.end else []
    source, collector, registry = node_exporter(spec, node_index=0)
    run(source, 8.0, faults)
    comm = demo_nccl.job_comm(spec)
    active = {a.rank: a for a in collector.tracker.active_operations()}
    assert set(active) == {0, 1, 2, 3} and all(a.hanging for a in active.values())
    # Peers entered the op the stopped rank never entered; their API returned (asynchronous).
    assert all(a.api_returned for a in active.values())
    assert active[1].sequence == active[0].sequence - 1
    assert value(registry, "fabric_nccl_hang_culprit", comm=comm, rank="1", reason="not_entered") == 1
    [culprit] = collector.tracker.snapshot().culprits
    assert culprit.waiting == (0, 2, 3)
    first = value(registry, "fabric_nccl_inflight_elapsed_seconds", comm=comm, rank="0", op="AllReduce")
    source.step(12.0, faults(12.0))
    later = value(registry, "fabric_nccl_inflight_elapsed_seconds", comm=comm, rank="0", op="AllReduce")
    assert later == pytest.approx(first + 4.0, abs=0.01)
    calls_during = value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce")
    source.step(15.0, faults(15.0))
    assert value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce") == calls_during
    # The fault ends: the stopped rank enters, everyone resumes, nothing hangs any more.
    for t in (20.0, 20.5, 21.0, 21.5, 22.0):
        source.step(t, faults(t))
    assert value(registry, "fabric_nccl_hanging", comm=comm, rank="0", op="AllReduce") == 0
    assert value(registry, "fabric_nccl_calls_total", comm=comm, rank="0", op="AllReduce") > calls_during + 10
    assert collector.tracker.snapshot().culprits == []


def test_a_hang_on_another_node_stops_this_node_with_no_local_culprit():
    spec = cluster()
    source, collector, registry = node_exporter(spec, node_index=0)
    hang = Fault("nccl_hang", None, 3.0, None, target={"rank": 6})
    run(source, 6.0, lambda t: [hang] if t >= 3.0 else [])
    active = {a.rank: a for a in collector.tracker.active_operations()}
    assert set(active) == {0, 1, 2, 3} and all(a.hanging for a in active.values())
    assert len({a.sequence for a in active.values()}) == 1
    assert collector.tracker.snapshot().culprits == []


def test_long_pause_between_ticks_stays_cheap():
    spec = cluster()
    source, collector, registry = node_exporter(spec)
    source.step(0.0, [])
    source.step(3600.0, [])                    # an hour in one tick: skips ahead
    calls = sum(op.calls for op in collector.tracker.snapshot().ops)
    assert calls <= 4 * (demo_nccl.MAX_CATCH_UP_CALLS + 2)


def test_a_live_node_between_ticks_or_a_late_tick_reads_no_hang():
    """Live (no fixed epoch) the simulation issues calls at its ticks; a scrape between
    them, or while a busy machine delays the next, must not read the call in flight as
    hung (the wall clock here read `fabric_nccl_hanging 1` on half a demo's scrapes)."""
    spec = cluster(seed=12)
    source = demo_nccl.NcclSimSource(spec.nodes[0], spec, random.Random(5))
    load_collector_modules()
    ctx = Context(node=spec.nodes[0].name, sources={"nccl": source})
    [collector] = build_collectors(ctx, ["nccl"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector([collector], node=""))
    began = time.monotonic()
    for tick in range(9):           # ticks of 0.25 s on the wall clock, as DemoCluster steps
        time.sleep(max(0.0, began + tick * 0.25 - time.monotonic()))
        source.step(tick * 0.25, [])
    time.sleep(0.75)                # the next tick, late by half a second
    comm = demo_nccl.job_comm(spec)
    for rank in range(4):
        assert value(registry, "fabric_nccl_hanging", comm=comm, rank=str(rank), op="AllReduce") == 0
        assert value(registry, "fabric_nccl_inflight_elapsed_seconds", comm=comm, rank=str(rank),
                     op="AllReduce") <= 2 * demo_nccl.PERIOD
