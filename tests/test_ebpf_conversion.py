"""Pure pieces of the ebpf collector: histogram buckets, key decoders, counters, declarations,
process discovery, and the collector on the demo's simulated maps and on a host without BTF."""
from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from fabricscope.exporter.context import Context
from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import bpf as sim_bpf
from fabricscope.exporter.bpf_loader import decoders, histogram, processes
from fabricscope.exporter.bpf_loader.counters import LabelCounters
from fabricscope.exporter.bpf_loader.declarations import load_declarations, parse_declaration
from fabricscope.exporter.bpf_loader.families import MapConverter
from fabricscope.exporter.bpf_loader.window_quantile import bucket_quantile
from fabricscope.exporter.framework import COLLECTORS, load_collector_modules
from fabricscope.exporter.main import start_exporter

load_collector_modules()


# ---- log-linear histogram -> seconds ------------------------------------------------

RTT = histogram.BucketLayout(sub_bits=3, min_exp=3, max_exp=20)


@pytest.mark.parametrize("value, slot", [
    (0, 0), (1, 0), (8, 0),                      # v <= 2^min_exp
    (9, 1), (10, 2), (16, 8),                    # (8, 16]: 8 buckets of width 1
    (17, 9), (18, 9), (19, 10), (32, 16),        # (16, 32]: width 2
    (33, 17), (36, 17), (37, 18),                # (32, 64]: width 4
    (1025, 1 + 7 * 8), (1152, 1 + 7 * 8), (1153, 2 + 7 * 8),
    (2 ** 20, 136), (2 ** 20 + 1, 137), (2 ** 40, 137),   # overflow
])
def test_slot_function(value, slot):
    assert RTT.slot_for(value) == slot


def test_every_bound_is_the_largest_value_of_its_slot():
    bounds = RTT.upper_bounds
    assert len(bounds) == RTT.slots - 1 == 137
    assert list(bounds) == sorted(set(bounds))
    for slot, bound in enumerate(bounds):
        assert RTT.slot_for(bound) == slot
        assert RTT.slot_for(bound + 1) == slot + 1
    # 8 per power of two: each bucket at most 1/8 of its lower bound wide above 2^min_exp.
    assert max((hi - lo) / lo for lo, hi in zip(bounds, bounds[1:])) == 0.125


@pytest.mark.parametrize("layout", [dict(sub_bits=3, min_exp=2, max_exp=20), dict(sub_bits=2, min_exp=5, max_exp=5),
                                    dict(sub_bits=5, min_exp=6, max_exp=20)])
def test_impossible_layouts_are_refused(layout):
    with pytest.raises(ValueError):
        histogram.BucketLayout(**layout)


def test_buckets_are_cumulative_in_seconds_with_exact_bounds():
    slots = [0] * RTT.slots
    slots[0], slots[1], slots[9], slots[-1] = 1, 3, 2, 4       # <=8µs, <=9µs, <=18µs, overflow
    hist = histogram.KernelHistogram(tuple(slots), sum=5 + 3 * 9 + 2 * 18 + 4 * 5_000_000)
    buckets, total = histogram.to_prometheus_buckets(hist, RTT, 1e-6)
    assert len(buckets) == RTT.slots
    assert buckets[0] == ("8e-06", 1)
    assert buckets[1] == ("9e-06", 4)
    assert buckets[9] == ("1.8e-05", 6)
    assert buckets[136] == ("1.048576", 6)
    assert buckets[-1] == ("+Inf", 10)
    assert total == pytest.approx(hist.sum * 1e-6)
    # Bounds print as short decimals, never 0.00013599999999999997.
    assert all(len(le) <= 12 for le, _ in buckets)


def test_histogram_value_round_trips_and_rejects_wrong_sizes():
    hist = histogram.KernelHistogram(tuple(range(RTT.slots)), 12345)
    assert histogram.parse_hist(histogram.encode_hist(hist, RTT), RTT) == hist
    with pytest.raises(ValueError, match=f"{RTT.value_size}.*make bpf"):
        histogram.parse_hist(b"\0" * 8, RTT)


def test_declared_layouts_match_the_bpf_sources():
    """The three layout numbers live in DECLARE_HIST(...) in the .bpf.c and in the .yaml
    beside it; a mismatch would put every sample in the wrong bucket."""
    import re

    from fabricscope.exporter.bpf_loader.objects import SOURCE_DIR

    in_c = {}
    for source in SOURCE_DIR.glob("*.bpf.c"):
        for name, *numbers in re.findall(r"^DECLARE_HIST\((\w+),\s*(\d+),\s*(\d+),\s*(\d+)\);",
                                         source.read_text(), re.M):
            in_c[name] = histogram.BucketLayout(*map(int, numbers))
    declared = {m.name: m.layout for decl in load_declarations() for m in decl.metrics if m.type == "histogram"}
    assert declared and set(declared) <= set(in_c)
    assert {name: in_c[name] for name in declared} == declared


def test_a_histogram_declaration_without_its_layout_is_refused():
    decl = {"object": "tcp", "programs": ["p"], "metrics": [{"name": "fabric_x_seconds", "type": "histogram"}]}
    with pytest.raises(ValueError, match="fabric_x_seconds: a histogram needs buckets"):
        parse_declaration(decl)
    decl["metrics"][0]["buckets"] = {"sub_bits": 3, "min_exp": 1, "max_exp": 20}
    with pytest.raises(ValueError, match="fabric_x_seconds: need sub_bits <= min_exp"):
        parse_declaration(decl)


# ---- key decoders ------------------------------------------------------------------

@pytest.mark.parametrize("raw, label", [
    (b"python\0\0\0\0\0\0\0\0\0\0", "python"),
    (b"\0" * 16, "other"),
    (b"pt_main_thread\0\0", "pt_main_thread"),
    (b"bad\nname\x01\0\0\0\0\0\0\0\0", "bad?name?"),
])
def test_decode_comm(raw, label):
    assert decoders.decode_comm(raw) == label


@pytest.mark.parametrize("op, label", [(0, "mmap"), (1, "munmap"), (2, "mremap"), (7, "unknown")])
def test_decode_mmap_op(op, label):
    assert decoders.decode_mmap_op(struct.pack("<I", op)) == label


def test_peer_decoder_maps_known_hosts_and_bounds_the_rest():
    peer = decoders.peer_decoder({"10.0.0.2": "gpu-node-1", "fd00::7": "gpu-node-6", "::ffff:10.0.0.9": "gpu-node-8"})
    v4 = lambda a: b"\0" * 10 + b"\xff\xff" + bytes(map(int, a.split(".")))   # noqa: E731
    assert peer.decode(v4("10.0.0.2")) == "gpu-node-1"
    assert peer.decode(v4("10.0.0.9")) == "gpu-node-8"
    assert peer.decode(bytes.fromhex("fd00" + "00" * 13 + "07")) == "gpu-node-6"
    assert peer.decode(v4("93.184.216.34")) == "other"
    with pytest.raises(ValueError, match="not an IP"):
        decoders.peer_decoder({"gpu-node-1": "x"})


def test_decode_key_checks_the_key_size():
    ds = [decoders.STATIC_DECODERS["comm"], decoders.STATIC_DECODERS["mmap_op"]]
    assert decoders.decode_key(b"python".ljust(16, b"\0") + struct.pack("<I", 1), ds) == ("python", "munmap")
    with pytest.raises(ValueError, match="20"):
        decoders.decode_key(b"short", ds)


# ---- counters --------------------------------------------------------------------

def test_label_counters_survive_eviction_and_merge_keys():
    c = LabelCounters()
    assert c.update([(b"a", ("other",), 5), (b"b", ("other",), 3), (b"h", ("host",), 1)]) == \
        {("other",): 8, ("host",): 1}
    # b evicted from the LRU map: "other" must not go backwards.
    assert c.update([(b"a", ("other",), 6), (b"h", ("host",), 1)])[("other",)] == 9
    # b comes back from zero; a recreated with a smaller value counts from that value.
    assert c.update([(b"a", ("other",), 2), (b"b", ("other",), 1), (b"h", ("host",), 4)]) == \
        {("other",): 12, ("host",): 4}


# ---- declarations ----------------------------------------------------------------

def test_every_program_has_a_declaration_and_every_declaration_a_program():
    decls = {d.object: d for d in load_declarations()}
    bpf_dir = Path(__file__).resolve().parent.parent / "exporter" / "bpf"
    assert set(decls) >= {"tcp", "sched", "syscalls"}
    for name, decl in decls.items():
        source = (bpf_dir / f"{name}.bpf.c").read_text()
        for program in decl.programs:
            assert f" {program}(" in source or f"({program}," in source, program
        maps = [m.name for m in decl.metrics] + [m.other_map for m in decl.metrics if m.other_map]
        for name in maps:
            assert f"}} {name} SEC(\".maps\")" in source or f"DECLARE_HIST({name}," in source \
                or f"DECLARE_COUNTER({name})" in source, name


def test_metric_names_are_in_the_metrics_contract():
    contract = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    for decl in load_declarations():
        for metric in decl.metrics:
            assert metric.name in contract


@pytest.mark.parametrize("bad, match", [
    ([], "mapping"),
    ({"object": "x", "programs": []}, "malformed"),
    ({"object": "x", "programs": [], "metrics": [{"name": "m", "type": "gauge"}]}, "type"),
])
def test_malformed_declaration_is_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_declaration(bad, "x.yaml")


# ---- process discovery -------------------------------------------------------------

DEVICES = """Character devices:
  1 mem
  4 tty
195 nvidia-frontend
195 nvidia
234 nvidia-uvm
235 nvidia-caps

Block devices:
259 blkext
196 nvidia-fake-block
"""


def test_parse_char_majors_reads_only_character_devices():
    assert processes.parse_char_majors(DEVICES) == [195, 234, 235]
    assert processes.parse_char_majors("") == []
    assert processes.parse_char_majors("garbage\n:::\n") == []


def test_scan_finds_allow_listed_processes_only(tmp_path):
    def proc(pid, comm):
        d = tmp_path / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
    proc(10, "python")
    proc(12, "tritonserver")
    (tmp_path / "14").mkdir()                       # vanished mid-scan: no comm
    (tmp_path / "self").mkdir()
    assert processes.scan_named_processes(tmp_path, frozenset({"tritonserver"})) == {12: "tritonserver"}
    assert processes.scan_named_processes(tmp_path, frozenset()) == {}
    assert processes.scan_named_processes(tmp_path / "absent", frozenset({"python"})) == {}


# ---- the collector on the simulated maps (the demo path) ---------------------------

def _cluster(nodes=3):
    specs = tuple(NodeSpec(f"gpu-node-{i}", i, 8, 4, Path("/nonexistent")) for i in range(nodes))
    return ClusterSpec("test", specs, seed=7)


def _sim_collector(source):
    return COLLECTORS["ebpf"](Context(node="gpu-node-0", sources={"bpf": source}))


def _samples(collector):
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _p99(buckets: list[tuple[float, float]]) -> float:
    """Prometheus histogram_quantile(0.99) over (le, cumulative increase) pairs, +Inf last:
    the exporter's own (window_quantile.py, checked against promtool's)."""
    return bucket_quantile(0.99, [le for le, _ in buckets[:-1]], [count for _, count in buckets])


def _rtt_buckets(registry, name="fabric_tcp_rtt_excess_seconds"):
    out = []
    for metric in registry.collect():
        if metric.name == name:
            for s in metric.samples:
                if s.name.endswith("_bucket"):
                    out.append((float(s.labels["le"]), s.value))
    return out


def test_demo_maps_go_through_the_same_conversion():
    cluster = _cluster()
    source = sim_bpf.make_source(cluster.nodes[0], cluster, random.Random(1))
    collector = _sim_collector(source)
    for t in range(1, 61):
        source.step(float(t), [])
    reg = _samples(collector)
    get = reg.get_sample_value
    assert get("fabric_ebpf_available", {"reason": "ok"}) == 1
    assert get("fabric_ebpf_program_attached", {"program": "sys_enter"}) == 1
    assert get("fabric_ebpf_program_run_count_total", {"program": "tcp_probe"}) > 0
    assert 0 < get("fabric_sched_context_switches_total") and 0 < get("fabric_sched_migrations_total")
    assert get("fabric_process_syscalls_total", {"comm": "python"}) > get("fabric_gpu_driver_ioctls_total",
                                                                          {"comm": "python"}) > 0
    assert get("fabric_process_mmap_calls_total", {"comm": "other", "op": "munmap"}) > 0
    count = get("fabric_tcp_rtt_seconds_count")
    mean = get("fabric_tcp_rtt_seconds_sum") / count
    assert 20e-6 < mean < 80e-6
    assert get("fabric_tcp_rtt_seconds_bucket", {"le": "+Inf"}) == count
    # Every sample is counted by kind; next-request and possibly delayed ACKs stay out of the excess.
    kinds = {k: get("fabric_tcp_rtt_samples_total", {"kind": k})
             for k in ("several_segments", "reply", "next_request", "delayed_ack")}
    assert sum(kinds.values()) == count and all(kinds.values())
    assert get("fabric_tcp_rtt_excess_seconds_count") == kinds["several_segments"] + kinds["reply"]
    # Retransmit peers decode to the simulated cluster's hosts, never to addresses.
    peers = {m.labels["peer"] for fam in reg.collect() if fam.name == "fabric_tcp_retransmits"
             for m in fam.samples}
    assert peers <= {"gpu-node-1", "gpu-node-2", "other"}


def test_demo_microburst_pushes_p99_over_three_times_its_5m_average():
    cluster = _cluster()
    node = cluster.nodes[1]
    source = sim_bpf.make_source(node, cluster, random.Random(3))
    reg = _samples(_sim_collector(source))
    burst = Fault("microburst", node.name, start=360.0, end=420.0)
    history = {}
    for t in range(1, 421, 1):
        source.step(float(t), [burst] if burst.start <= t < burst.end else [])
        if t % 15 == 0:
            history[t] = _rtt_buckets(reg)

    def p99_1m(t):   # node:fabric_tcp_rtt_excess_seconds:p99_1m at t (rate over [t-60, t])
        now, before = history[t], history[t - 60]
        return _p99([(le, c - b) for (le, c), (_, b) in zip(now, before)])

    healthy = [p99_1m(t) for t in range(120, 361, 15)]
    assert all(10e-6 < v < 200e-6 for v in healthy), healthy
    # node:fabric_tcp_rtt_excess_seconds_p99:avg5m at 420: avg_over_time(p99_1m[5m] offset 1m).
    window = range(75, 361, 15)
    baseline = sum(p99_1m(t) for t in window) / len(window)
    during = p99_1m(420)
    assert during > 3 * baseline
    assert during > 0.001     # the rules' microburstMinP99Seconds floor


def test_demo_source_is_deterministic_per_seed():
    cluster = _cluster()
    a = sim_bpf.make_source(cluster.nodes[0], cluster, random.Random(5))
    b = sim_bpf.make_source(cluster.nodes[0], cluster, random.Random(5))
    for t in (1.0, 2.0, 3.5):
        a.step(t, [])
        b.step(t, [])
    assert a.read_map("tcp", "fabric_tcp_rtt_seconds") == b.read_map("tcp", "fabric_tcp_rtt_seconds")


def test_undecodable_map_becomes_a_read_error_not_a_crash():
    class Broken:
        def read_map(self, obj, name):
            if name == "fabric_tcp_rtt_seconds":
                return [(b"\0" * 4, b"short")]
            if obj == "tcp":
                return []
            raise KeyError(name)
    converter = MapConverter(load_declarations())
    families = {f.name: f for f in converter.families(Broken())}
    assert "fabric_tcp_rtt_seconds" not in families
    assert "fabric_tcp_retransmits" in families
    assert [s.value for s in families["fabric_ebpf_map_read_errors"].samples
            if s.labels["map"] == "fabric_tcp_rtt_seconds"] == [1]


def test_exporter_serves_ebpf_metrics_over_http(port):
    cluster = _cluster()
    source = sim_bpf.make_source(cluster.nodes[0], cluster, random.Random(1))
    source.step(5.0, [])
    running = start_exporter(Context(node="gpu-node-0", sources={"bpf": source}), ["ebpf"], f"127.0.0.1:{port}")
    try:
        body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        running.stop()
    assert 'fabric_ebpf_available{node="gpu-node-0",reason="ok"} 1.0' in body
    assert 'fabric_tcp_rtt_seconds_bucket{le="6.4e-05",node="gpu-node-0"}' in body
    assert 'fabric_scrape_collector_success{collector="ebpf",node="gpu-node-0"} 1.0' in body


# ---- unavailable: cheap and explicit ------------------------------------------------

def test_host_without_btf_exports_only_availability_zero(tmp_path):
    collector = COLLECTORS["ebpf"](Context(sysfs=tmp_path, procfs=tmp_path, node=""))
    families = list(collector.collect())
    collector.close()
    assert [f.name for f in families] == ["fabric_ebpf_available"]
    (sample,) = families[0].samples
    assert sample.value == 0
    assert sample.labels["reason"] == ("no_btf" if os.geteuid() == 0 else "not_root")

