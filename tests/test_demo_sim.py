"""The simulated node filesystem: Linux-shaped, deterministic, and faults that the real
collectors see (read through the collectors, not by peeking at the simulation)."""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.demo.cluster import DemoEngine
from fabricscope.demo.plugin import ClusterSpec, NodeSpec
from fabricscope.demo.scenario import load_scenario
from fabricscope.demo.sim_files import TreeWriter
from fabricscope.demo.sim_node import NodeRootError, prepare_root
from fabricscope.demo.sim_sources import NodeSources, discover_source_modules
from fabricscope.demo.sim_sysfs import HW_COUNTERS, PORT_COUNTERS
from fabricscope.exporter.framework import ScrapeCollector


def small(*faults, nodes=1, gpus=2, hcas=2, seed=7, tick=1):
    return load_scenario({"seed": seed, "cluster": {"name": "t", "nodes": nodes, "gpus_per_node": gpus,
                                                    "hcas_per_node": hcas},
                          "tick_seconds": tick, "faults": list(faults)})


_open_engines: list[DemoEngine] = []


@pytest.fixture(autouse=True)
def close_engines():
    yield
    while _open_engines:
        _open_engines.pop().close()    # tmpfs-backed trees are memory: give it back


def engine_at(tmp_path: Path, scenario, ticks: int = 0) -> DemoEngine:
    engine = DemoEngine(scenario, tmp_path)
    _open_engines.append(engine)
    engine.build()
    for _ in range(ticks):
        engine.step()
    return engine


def snapshot(engine: DemoEngine) -> dict[str, str]:
    """Every file's bytes and every symlink's target in every node tree, by node/relative path."""
    out = {}
    for node in engine.nodes:
        for dirpath, dirnames, filenames in os.walk(node.root):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                rel = f"{node.spec.name}/{path.relative_to(node.root)}"
                if path.is_symlink():
                    out[rel] = "-> " + os.readlink(path)
                elif path.is_file():
                    out[rel] = path.read_bytes().hex()
    return out


# ----------------------------------------------------------------- the tree itself

def test_tree_looks_like_a_real_hgx_node(tmp_path):
    engine = engine_at(tmp_path, small(gpus=8, hcas=8), ticks=1)
    sysfs = engine.nodes[0].sysfs_root
    ib = sysfs / "class" / "infiniband"
    assert sorted(p.name for p in ib.iterdir()) == [f"mlx5_{i}" for i in range(9)]
    for i in range(9):
        device = ib / f"mlx5_{i}"
        assert device.is_symlink() and not os.path.isabs(os.readlink(device))
        port = device / "ports" / "1"
        assert sorted(p.name for p in (port / "counters").iterdir()) == sorted(PORT_COUNTERS)
        assert sorted(p.name for p in (port / "hw_counters").iterdir()) == sorted(HW_COUNTERS)
        assert (port / "state").read_text() == "4: ACTIVE\n"
        assert (port / "phys_state").read_text() == "5: LinkUp\n"
        pci = Path(os.path.realpath(device / "device"))
        assert (pci / "vendor").read_text() == "0x15b3\n"
        # Compute HCAs: root complex/root port/switch up/switch down/bdf; storage: root port/bdf.
        assert pci.parents[3 if i < 8 else 1].name.startswith("pci0000:")
        assert (sysfs / "bus" / "pci" / "devices" / pci.name).resolve() == pci
    # GPU i sits under the same PCIe switch as mlx5_i; the storage NIC has no GPU near.
    for i in range(8):
        hca = Path(os.path.realpath(ib / f"mlx5_{i}" / "device"))
        switch = hca.parent.parent
        gpus = [p for p in switch.glob("*/*") if (p / "class").exists() and (p / "class").read_text() == "0x030200\n"]
        assert len(gpus) == 1 and (gpus[0] / "vendor").read_text() == "0x10de\n"
    storage = ib / "mlx5_8"
    assert (storage / "ports/1/link_layer").read_text() == "Ethernet\n"
    assert (storage / "device/class").read_text() == "0x020000\n"
    assert (storage / "device/numa_node").read_text() == "3\n"
    assert (ib / "mlx5_0/ports/1/rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (ib / "mlx5_0/device/class").read_text() == "0x020700\n"
    net = sysfs / "class" / "net"
    assert sorted(p.name for p in net.iterdir()) == ["eth0", "eth1", "lo"]
    assert os.path.realpath(net / "eth1" / "device") == os.path.realpath(storage / "device")
    route = (engine.nodes[0].procfs_root / "net" / "route").read_text().splitlines()
    assert route[1].split("\t")[:3] == ["eth0", "00000000", "0100100A"] and all(len(line) == 127 for line in route)
    boot_id = (engine.nodes[0].procfs_root / "sys/kernel/random/boot_id").read_text().strip()
    assert len(boot_id) == 36 and boot_id.count("-") == 4
    kmsg = engine.nodes[0].kmsg_path.read_text().splitlines()
    assert kmsg[0].startswith("6,0,") and all(line.split(",", 3)[1] == str(n) for n, line in enumerate(kmsg))


def test_counters_grow_like_a_loaded_ndr_port(tmp_path):
    engine = engine_at(tmp_path, small())
    counters = engine.nodes[0].sysfs_root / "class/infiniband/mlx5_0/ports/1/counters"
    before = {p.name: int(p.read_text()) for p in counters.iterdir()}
    for _ in range(10):
        engine.step()
    after = {p.name: int(p.read_text()) for p in counters.iterdir()}
    bytes_per_second = (after["port_xmit_data"] - before["port_xmit_data"]) * 4 / 10
    assert 15e9 < bytes_per_second < 50e9
    assert after["port_xmit_packets"] > before["port_xmit_packets"]
    assert after["link_downed"] == before["link_downed"] == 0


def test_same_seed_same_bytes_different_seed_different(tmp_path):
    faults = [{"kind": "symbol_error_storm", "node": 0, "at": 2, "target": {"device": "mlx5_1"}},
              {"kind": "link_flap", "node": 0, "at": 3, "target": {"device": "mlx5_0"},
               "params": {"count": 2, "period_seconds": 4}},
              {"kind": "nvlink_down", "node": 1, "at": 5, "target": {"gpu": 1, "link": 2}}]
    a = engine_at(tmp_path / "a", small(*faults, nodes=2), ticks=12)
    b = engine_at(tmp_path / "b", small(*faults, nodes=2), ticks=12)
    c = engine_at(tmp_path / "c", small(*faults, nodes=2, seed=8), ticks=12)
    tree_a, tree_b, tree_c = snapshot(a), snapshot(b), snapshot(c)
    assert len(tree_a) > 500
    assert tree_a == tree_b
    assert tree_a != tree_c
    assert a.tick_index == b.tick_index == c.tick_index == 12


def test_tree_is_the_same_on_disk_and_on_tmpfs(tmp_path):
    faults = [{"kind": "link_down", "node": 0, "at": 2, "target": {"device": "mlx5_0"}}]
    on_disk = DemoEngine(small(*faults), tmp_path / "disk", use_tmpfs=False)
    _open_engines.append(on_disk)
    on_disk.build()
    for _ in range(4):
        on_disk.step()
    assert on_disk.home is None and not (tmp_path / "disk" / "gpu-node-0").is_symlink()
    default = engine_at(tmp_path / "default", small(*faults), ticks=4)
    if default.home is not None:
        link = tmp_path / "default" / "gpu-node-0"
        assert link.is_symlink() and link.resolve() == default.nodes[0].root.resolve()
    assert snapshot(on_disk) == snapshot(default)


def test_catching_up_without_writes_ends_on_the_same_tree(tmp_path):
    faults = [{"kind": "microburst", "node": 0, "at": 2, "duration": 3}]
    written = engine_at(tmp_path / "a", small(*faults), ticks=8)
    skipped = engine_at(tmp_path / "b", small(*faults))
    for tick in range(8):
        skipped.step(write=tick == 7)
    assert snapshot(written) == snapshot(skipped)


def test_only_changed_files_are_rewritten_and_no_staging_leftovers(tmp_path):
    engine = engine_at(tmp_path, small())
    node = engine.nodes[0]
    static = node.sysfs_root / "class/infiniband/mlx5_0/board_id"
    inode = os.stat(static).st_ino
    writes = node.writer.writes
    engine.step()
    changed = node.writer.writes - writes
    total = sum(1 for _ in node.root.rglob("*") if _.is_file())
    assert 0 < changed < total / 4
    assert os.stat(static).st_ino == inode
    assert list((node.root / ".staging").iterdir()) == []


def test_tree_writer_replaces_atomically_and_skips_identical(tmp_path):
    writer = TreeWriter(tmp_path)
    assert writer.write("a/b/value", "1\n") is True
    first = os.stat(tmp_path / "a/b/value").st_ino
    assert writer.write("a/b/value", "1\n") is False
    assert writer.write("a/b/value", "2\n") is True
    assert (tmp_path / "a/b/value").read_text() == "2\n"
    assert os.stat(tmp_path / "a/b/value").st_ino != first, "replaced by rename, never rewritten in place"
    writer.symlink("link", "a/b/value")
    assert os.readlink(tmp_path / "link") == "a/b/value" and (tmp_path / "link").read_text() == "2\n"


def test_a_foreign_directory_is_never_wiped(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("years of work")
    with pytest.raises(NodeRootError, match="was not created by the demo"):
        prepare_root(tmp_path / "precious")
    assert (tmp_path / "precious" / "thesis.tex").exists()


# ----------------------------------------------------------------- sources

def test_every_source_module_is_discovered():
    modules = discover_source_modules()
    from fabricscope.demo import sources

    expected = {info.name for info in __import__("pkgutil").iter_modules(sources.__path__)
                if hasattr(__import__(f"fabricscope.demo.sources.{info.name}", fromlist=["x"]), "make_source")}
    assert set(modules) == expected


def test_failing_sources_are_isolated(tmp_path, caplog):
    calls = []

    class Good:
        key = "good"

        def step(self, now, faults):
            calls.append((now, [f.kind for f in faults]))

    class Stumbles:
        key = "stumbles"

        def step(self, now, faults):
            raise RuntimeError("simulated backend fell over")

    def broken_make_source(node, cluster, rng):
        raise ValueError("cannot build")

    modules = {"a_broken": types.SimpleNamespace(make_source=broken_make_source),
               "b_stumbles": types.SimpleNamespace(make_source=lambda n, c, r: Stumbles()),
               "c_good": types.SimpleNamespace(make_source=lambda n, c, r: Good())}
    node = NodeSpec("n-0", 0, 1, 1, tmp_path)
    sources = NodeSources(node, ClusterSpec("t", (node,), 1), modules)
    assert set(sources.by_key) == {"stumbles", "good"}
    for now in (1.0, 2.0):
        sources.step(now, [])
    assert calls == [(1.0, []), (2.0, [])]
    assert sources.failures == {"a_broken": 1, "b_stumbles": 2}
    assert "a_broken could not start" in caplog.text and "b_stumbles failed to step" in caplog.text


def test_sources_get_a_deterministic_rng_per_node_and_module(tmp_path):
    seen = {}

    def make(name):
        def make_source(node, cluster, rng):
            seen[(name, node.index)] = rng.random()
            return types.SimpleNamespace(key=f"{name}{node.index}", step=lambda now, faults: None)
        return make_source

    nodes = tuple(NodeSpec(f"n-{i}", i, 1, 1, tmp_path) for i in range(2))
    cluster = ClusterSpec("t", nodes, 5)
    modules = {"x": types.SimpleNamespace(make_source=make("x")), "y": types.SimpleNamespace(make_source=make("y"))}
    for n in nodes:
        NodeSources(n, cluster, modules)
    first = dict(seen)
    seen.clear()
    for n in nodes:
        NodeSources(n, cluster, modules)
    assert seen == first
    assert len(set(first.values())) == 4, "each (node, module) pair has its own stream"


def test_engine_steps_sources_before_the_files_with_node_faults(tmp_path, monkeypatch):
    order = []

    class Recorder:
        key = "recorder"

        def __init__(self, node):
            self.node = node

        def step(self, now, faults):
            order.append(("source", self.node.name, now, sorted(f.kind for f in faults)))

    module = types.SimpleNamespace(make_source=lambda node, cluster, rng: Recorder(node))
    monkeypatch.setattr("fabricscope.demo.cluster.discover_source_modules", lambda: {"recorder": module})
    scenario = small({"kind": "microburst", "node": 1, "at": 1},
                     {"kind": "nccl_hang", "at": 1, "target": {"rank": 0}}, nodes=2)
    engine = DemoEngine(scenario, tmp_path)
    engine.build()
    for node in engine.nodes:
        original = node.tick

        def tick(now, dt, faults, write=True, _node=node, _original=original):
            order.append(("files", _node.spec.name, now))
            _original(now, dt, faults, write)
        node.tick = tick
    order.clear()
    engine.step()
    assert order == [("source", "gpu-node-0", 1.0, ["nccl_hang"]), ("files", "gpu-node-0", 1.0),
                     ("source", "gpu-node-1", 1.0, ["microburst", "nccl_hang"]), ("files", "gpu-node-1", 1.0)]
    assert isinstance(engine.context(1).sources["recorder"], Recorder)


# ----------------------------------------------------------------- through the real collectors

class Scraper:
    """One node's collectors on a private registry, with the scenario clock as their clock."""

    def __init__(self, engine: DemoEngine, names: list[str], index: int = 0):
        from fabricscope.exporter.framework import COLLECTORS, load_collector_modules

        load_collector_modules()
        ctx = engine.context(index)
        built = []
        for name in names:
            cls = COLLECTORS[name]
            try:
                built.append(cls(ctx, clock=lambda: 1_000_000 + engine.now()))
            except TypeError:
                built.append(cls(ctx))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ScrapeCollector(built, node=engine.nodes[index].spec.name))
        self.node = engine.nodes[index].spec.name

    def value(self, name: str, **labels) -> float | None:
        return self.registry.get_sample_value(name, {**labels, "node": self.node})

    def samples(self, name: str) -> list:
        return [s for family in self.registry.collect() for s in family.samples if s.name == name]


def symbol_errors(scraper, device):
    return scraper.value("fabric_infiniband_port_counter_total", device=device, port="1", counter="symbol_error")


def test_healthy_node_breaches_nothing_for_ten_minutes(tmp_path):
    engine = engine_at(tmp_path, small())
    scraper = Scraper(engine, ["infiniband", "netdev", "kmsg"])
    for _ in range(40):
        for tick in range(15):   # a scrape every 15 s; the files only need to be current then
            engine.step(write=tick == 14)
        breached = [s for s in scraper.samples("fabric_infiniband_port_counter_breached") if s.value]
        fatal = [s for s in scraper.samples("fabric_infiniband_port_fatal") if s.value]
        assert breached == [] and fatal == [], (engine.now(), breached, fatal)
    assert [s for s in scraper.samples("fabric_kernel_log_events_total") if s.value] == []
    assert scraper.value("fabric_infiniband_port_health_events_total", device="mlx5_0", port="1",
                         severity="non_fatal") in (None, 0)
    roles = {s.labels["device"]: s.labels["role"] for s in scraper.samples("fabric_infiniband_device_info")}
    assert roles == {"mlx5_0": "compute", "mlx5_1": "compute", "mlx5_2": "storage"}
    assert scraper.value("fabric_netdev_up", interface="eth1") == 1


def test_symbol_error_storm_hits_the_target_port_only_and_breaches(tmp_path):
    storm = {"kind": "symbol_error_storm", "node": 0, "at": 5, "duration": 60, "target": {"device": "mlx5_1"}}
    engine = engine_at(tmp_path, small(storm, hcas=3, gpus=3))
    scraper = Scraper(engine, ["infiniband"])
    for _ in range(4):
        engine.step()
    before = {d: symbol_errors(scraper, d) for d in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")}
    for _ in range(30):
        engine.step()
        scraper.samples("fabric_infiniband_port_counter_breached")   # the tracker sees every second
    after = {d: symbol_errors(scraper, d) for d in before}
    assert after["mlx5_1"] - before["mlx5_1"] >= 30 * 10, "well above 10/s"
    for other in ("mlx5_0", "mlx5_2", "mlx5_3"):
        assert after[other] - before[other] <= 1
    breach = dict(device="mlx5_1", port="1", counter="symbol_error")
    assert scraper.value("fabric_infiniband_port_counter_breached", **breach, severity="non_fatal") == 1
    assert scraper.value("fabric_infiniband_port_counter_breached", device="mlx5_0", port="1",
                         counter="symbol_error", severity="non_fatal") is None     # exported only while raised


def test_link_flap_toggles_state_counts_downs_and_logs(tmp_path):
    flap = {"kind": "link_flap", "node": 0, "at": 2, "target": {"device": "mlx5_0"},
            "params": {"count": 3, "period_seconds": 4, "down_seconds": 2}}
    engine = engine_at(tmp_path, small(flap))
    scraper = Scraper(engine, ["infiniband", "kmsg"])
    states = []
    for _ in range(16):
        engine.step()
        states.append(scraper.value("fabric_infiniband_port_state", device="mlx5_0", port="1", state="DOWN") is not None)
    # Down at t=2,3 / 6,7 / 10,11; up otherwise.
    assert states == [False, True, True, False, False, True, True, False, False, True, True] + [False] * 5
    counter = dict(device="mlx5_0", port="1")
    assert scraper.value("fabric_infiniband_port_counter_total", **counter, counter="link_downed") == 3
    assert scraper.value("fabric_infiniband_port_counter_total", **counter, counter="link_error_recovery") == 3
    assert scraper.value("fabric_infiniband_port_down_transitions_total", **counter) == 3
    assert scraper.value("fabric_kernel_log_events_total", source="mlx5_core", pattern="cable_unplugged",
                         severity="non_fatal") == 3
    assert scraper.value("fabric_infiniband_port_counter_total", device="mlx5_1", port="1", counter="link_downed") == 0


def test_link_down_on_the_storage_nic_takes_its_netdev_down(tmp_path):
    down = {"kind": "link_down", "node": 0, "at": 2, "duration": 5, "target": {"device": "mlx5_2"}}
    engine = engine_at(tmp_path, small(down))
    scraper = Scraper(engine, ["infiniband", "netdev"])
    for _ in range(3):
        engine.step()
    port = dict(device="mlx5_2", port="1")
    assert scraper.value("fabric_infiniband_port_phys_state", **port, phys_state="Disabled") == 3
    assert scraper.value("fabric_infiniband_port_fatal", **port) == 1
    assert scraper.value("fabric_netdev_up", interface="eth1") == 0
    rx = scraper.value("fabric_infiniband_port_receive_bytes_total", **port)
    engine.step()
    assert scraper.value("fabric_infiniband_port_receive_bytes_total", **port) == rx, "no traffic on a dead link"
    for _ in range(5):
        engine.step()
    assert scraper.value("fabric_infiniband_port_state", **port, state="ACTIVE") == 4
    assert scraper.value("fabric_netdev_up", interface="eth1") == 1
    assert scraper.value("fabric_netdev_carrier_changes_total", interface="eth1") == 3   # boot up, down, up
    assert scraper.value("fabric_infiniband_port_counter_total", **port, counter="link_downed") == 1


def test_microburst_raises_tcp_retransmits_and_timeouts(tmp_path):
    burst = {"kind": "microburst", "node": 0, "at": 11, "duration": 10}
    engine = engine_at(tmp_path, small(burst))
    scraper = Scraper(engine, ["tcp"])

    def rates():
        start = (scraper.value("fabric_tcp_retransmitted_segments_total"), scraper.value("fabric_tcp_timeouts_total"),
                 scraper.value("fabric_tcp_out_segments_total"))
        for _ in range(10):
            engine.step()
        end = (scraper.value("fabric_tcp_retransmitted_segments_total"), scraper.value("fabric_tcp_timeouts_total"),
               scraper.value("fabric_tcp_out_segments_total"))
        return [(b - a) for a, b in zip(start, end)]

    quiet_retrans, quiet_timeouts, quiet_out = rates()
    burst_retrans, burst_timeouts, burst_out = rates()
    assert quiet_retrans / quiet_out < 0.002 and quiet_timeouts <= 3
    assert burst_retrans / burst_out > 0.02 and burst_timeouts >= 100
    assert scraper.value("fabric_tcp_established") > 0


def test_kernel_faults_reach_the_kmsg_collector(tmp_path):
    faults = [{"kind": "nvlink_down", "node": 0, "at": 2, "target": {"gpu": 1, "link": 5}},
              {"kind": "mlx5_fatal", "node": 0, "at": 3, "duration": 2, "target": {"device": "mlx5_1"}}]
    engine = engine_at(tmp_path, small(*faults))
    scraper = Scraper(engine, ["kmsg"])
    for _ in range(6):
        engine.step()
    assert scraper.value("fabric_kernel_log_xid_events_total", xid="74", severity="fatal") == 1
    assert scraper.value("fabric_kernel_log_events_total", source="mlx5_core", pattern="command_timeout",
                         severity="fatal") == 1
    lines = engine.nodes[0].kmsg_path.read_text().splitlines()
    xid = next(line for line in lines if "Xid" in line)
    gpu_bus = engine.nodes[0].topology.gpu_bdfs[1].rsplit(".", 1)[0]
    assert f"NVRM: Xid (PCI:{gpu_bus}): 74," in xid and "link 5(" in xid
    assert xid.split(",")[2] == str(round((engine.nodes[0].uptime + 2) * 1e6))


def test_gpu_bus_ids_agree_with_the_simulated_nvml(tmp_path):
    from fabricscope.demo.sources import nvml
    engine = engine_at(tmp_path, small(gpus=8, hcas=8))
    source = engine.context(0).sources.get("nvml")
    assert source is not None, json.dumps(engine.sources[0].failures)
    nvml_ids = [g.pci_bus_id.lower().replace("00000000:", "0000:") for g in source.gpus()]
    assert nvml_ids == list(engine.nodes[0].topology.gpu_bdfs)
    assert isinstance(source, nvml.NvmlSimSource)   # built by the module the engine discovered


def test_plugin_faults_with_nested_targets_do_not_disturb_the_nodes(tmp_path, monkeypatch):
    plugin = types.SimpleNamespace(make_source=lambda n, c, r: types.SimpleNamespace(key="k", step=lambda *a: None),
                                   FAULT_KINDS=("partition",))
    monkeypatch.setattr("fabricscope.demo.sim_sources.discover_source_modules", lambda: {"p": plugin})
    monkeypatch.setattr("fabricscope.demo.cluster.discover_source_modules", lambda: {"p": plugin})
    engine = engine_at(tmp_path, small({"kind": "partition", "at": 1, "target": {"ranks": [0, 1], "zone": {"a": 1}}}))
    before = engine.nodes[0].writer.writes
    for _ in range(3):
        engine.step()
    assert engine.tick_index == 3 and engine.nodes[0].writer.writes > before


def test_a_repaired_port_gets_its_counters_cleared_and_its_fatal_breach_recovers(tmp_path):
    """counters_cleared_after: the latched link_downed breach (fatal) of a port that went
    down clears through the exporter's own reset handling once the repair clears the
    counters; without the param it stays latched, as on a real HCA."""
    repaired = {"kind": "link_down", "node": 0, "at": 2, "duration": 4, "target": {"device": "mlx5_0"},
                "params": {"counters_cleared_after": 2}}
    latched = {"kind": "link_down", "node": 0, "at": 2, "duration": 4, "target": {"device": "mlx5_1"}}
    engine = engine_at(tmp_path, small(repaired, latched))
    scraper = Scraper(engine, ["infiniband"])
    breach = dict(port="1", counter="link_downed", severity="fatal")
    for _ in range(7):
        engine.step()
        scraper.samples("fabric_infiniband_port_counter_breached")
    assert scraper.value("fabric_infiniband_port_counter_breached", device="mlx5_0", **breach) == 1, "up, not yet cleared"
    for _ in range(3):
        engine.step()
        scraper.samples("fabric_infiniband_port_counter_breached")
    assert scraper.value("fabric_infiniband_port_counter_total", device="mlx5_0", port="1", counter="link_downed") == 0
    assert scraper.value("fabric_infiniband_port_counter_breached", device="mlx5_0", **breach) is None   # cleared
    assert scraper.value("fabric_infiniband_port_health_events_total", device="mlx5_0", port="1",
                         severity="recovery") >= 1
    assert scraper.value("fabric_infiniband_port_counter_breached", device="mlx5_1", **breach) == 1


def test_counters_cleared_after_is_for_port_faults_only():
    from fabricscope.demo.scenario import ScenarioError, load_scenario

    with pytest.raises(ScenarioError, match="counters_cleared_after applies to port faults only"):
        load_scenario({"cluster": {"nodes": 1}, "faults": [
            {"kind": "microburst", "node": 0, "at": 1, "params": {"counters_cleared_after": 5}}]})
    with pytest.raises(ScenarioError, match="counters_cleared_after must be a non-negative number"):
        load_scenario({"cluster": {"nodes": 1}, "faults": [
            {"kind": "link_down", "node": 0, "at": 1, "params": {"counters_cleared_after": -1}}]})
