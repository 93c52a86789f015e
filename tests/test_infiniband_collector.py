"""The infiniband collector end to end over a mutable copy of the node fixture.

Each test copies the fixture's InfiniBand devices and PCI tree to tmp, scrapes, mutates the
files the way the kernel would (counters move, ports go down, devices vanish) and scrapes
again with an injected clock, so velocity windows are exercised without sleeping.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from fabricscope.exporter.collectors.infiniband import InfiniBandCollector
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import build_collectors, load_collector_modules
from fabricscope.exporter.schema import ConfigError
from fabricscope.exporter.main import start_exporter

FIXTURE_SYS = Path(__file__).parent / "fixtures" / "node" / "sys"
ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
BOOT_A = "6f1d2c3b-1111-4a5b-9c8d-0123456789ab"
BOOT_B = "6f1d2c3b-2222-4a5b-9c8d-0123456789ab"


class _Snapshot:
    """One collect() frozen in a registry, so each query does not trigger another scrape."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.state_dir = root / "state"
        self.now = 1_000_000.0
        shutil.copytree(FIXTURE_SYS / "class" / "infiniband", self.sys / "class" / "infiniband", symlinks=True)
        shutil.copytree(FIXTURE_SYS / "devices", self.sys / "devices", symlinks=True)
        (self.sys / "class" / "net" / "eth2").mkdir(parents=True)
        self.write_net("eth2", "carrier_changes", 3)
        self.default_route("eth0")
        self.boot(BOOT_A)
        self.config: dict = {}

    def write_net(self, netdev, name, value):
        (self.sys / "class" / "net" / netdev / name).write_text(f"{value}\n")

    def default_route(self, iface):
        (self.proc / "net").mkdir(parents=True, exist_ok=True)
        (self.proc / "net" / "route").write_text(
            ROUTE_HEADER + f"{iface}\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n")

    def boot(self, boot_id):
        path = self.proc / "sys" / "kernel" / "random" / "boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(boot_id + "\n")

    def port(self, device, number=1) -> Path:
        return self.sys / "class" / "infiniband" / device / "ports" / str(number)

    def counter(self, device, name, value, hw=False):
        (self.port(device) / ("hw_counters" if hw else "counters") / name).write_text(f"{value}\n")

    def state(self, device, state, phys):
        (self.port(device) / "state").write_text(state + "\n")
        (self.port(device) / "phys_state").write_text(phys + "\n")

    def collector(self) -> InfiniBandCollector:
        ctx = Context(sysfs=self.sys, procfs=self.proc, state_dir=self.state_dir, node="n", config=self.config)
        return InfiniBandCollector(ctx, clock=lambda: self.now)

    def scrape(self, collector, advance=1.0) -> CollectorRegistry:
        self.now += advance
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(list(collector.collect())))
        return registry


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def value(registry, name, **labels):
    return registry.get_sample_value(name, {k: str(v) for k, v in labels.items()})


def port1(device):
    return {"device": device, "port": 1}


def test_fixture_scrape_maps_every_struct(node):
    r = node.scrape(node.collector())
    info = {"device": "mlx5_0", "board_id": "MT_0000000970", "fw_version": "28.39.1002", "hca_type": "MT4129",
            "node_guid": "a088:c203:0000:3e10", "role": "compute", "numa_node": "0"}
    assert value(r, "fabric_infiniband_device_info", **info) == 1
    roles = {s.labels["device"]: s.labels["role"] for f in r.collect() if f.name == "fabric_infiniband_device_info"
             for s in f.samples}
    assert roles == {"mlx5_0": "compute", "mlx5_1": "compute", "mlx5_2": "compute", "mlx5_3": "compute",
                     "mlx5_4": "storage"}                      # mlx5_5 is a VF: skipped
    assert value(r, "fabric_infiniband_port_info", device="mlx5_4", port=1, link_layer="Ethernet", netdev="eth2") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4
    assert value(r, "fabric_infiniband_port_phys_state", **port1("mlx5_0"), phys_state="LinkUp") == 5
    assert value(r, "fabric_infiniband_port_rate_bytes_per_second", **port1("mlx5_0")) == 50e9
    assert value(r, "fabric_infiniband_port_receive_bytes_total", **port1("mlx5_0")) == 9_221_483_771_052 * 4
    assert value(r, "fabric_infiniband_port_transmit_bytes_total", **port1("mlx5_0")) == 9_118_300_112_944 * 4
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_0"), counter="link_downed") == 1
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_0"), counter="port_rcv_data") is None
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_4"), counter="VL15_dropped") is None
    assert value(r, "fabric_infiniband_port_hw_counter_total", **port1("mlx5_4"), counter="np_cnp_sent") == 412
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_5")) is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_0"), severity="baseline") == 1
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_0"), counter="link_downed",
                 severity="fatal") is None
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_0"), counter="roce_slow_restart",
                 severity="non_fatal") is None            # no such counter on an IB port: no series
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="missing") == 1
    assert not [s for f in r.collect() if f.name == "fabric_infiniband_device_read_errors" for s in f.samples]


def test_malformed_device_does_not_hide_healthy_ones(node):
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_1", "symbol_error", "N/A (no PMA)")
    node.counter("mlx5_1", "port_xmit_wait", "")
    node.counter("mlx5_1", "port_rcv_errors", "garbage")
    bad = node.port("mlx5_1") / "counters" / "link_downed"
    bad.unlink()
    bad.mkdir()    # EISDIR: how a file we may not read is simulated when tests run as root
    r = node.scrape(col)
    for reason in ("no_pma", "empty", "not_a_number", "not_a_file"):
        assert value(r, "fabric_infiniband_device_read_errors", device="mlx5_1", reason=reason) == 1
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_1"), counter="symbol_error") is None
    assert value(r, "fabric_infiniband_port_counter_total", **port1("mlx5_1"), counter="port_xmit_discards") == 0
    assert value(r, "fabric_infiniband_port_receive_bytes_total", **port1("mlx5_1")) is not None
    for device in ("mlx5_0", "mlx5_2", "mlx5_3", "mlx5_4"):
        assert value(r, "fabric_infiniband_port_counter_total", **port1(device), counter="symbol_error") == 0
        assert value(r, "fabric_infiniband_port_state", **port1(device), state="ACTIVE") == 4
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_1")) == 0


def test_delta_fatal_breach_latches_and_recovers_on_admin_reset(node):
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_2", "link_downed", 2)
    r = node.scrape(col)
    labels = dict(port1("mlx5_2"), counter="link_downed", severity="fatal")
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) == 1
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_2")) == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_2"), severity="fatal") == 1
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_3")) == 0
    r = node.scrape(col, advance=600)
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) == 1     # latched while quiet
    node.counter("mlx5_2", "link_downed", 0)                                      # perfquery -x
    node.counter("mlx5_2", "port_rcv_data", 12)
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_resets_total", **port1("mlx5_2"), counter="port_rcv_data") == 1
    assert value(r, "fabric_infiniband_port_counter_resets_total", **port1("mlx5_3"), counter="port_rcv_data") is None
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) is None
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_2")) == 0
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_2"), severity="recovery") == 1
    assert value(r, "fabric_infiniband_port_counter_resets_total", **port1("mlx5_2"), counter="link_downed") == 1


def test_hw_counter_delta_and_carrier_changes_through_the_netdev(node):
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_4", "rnr_nak_retry_err", 1, hw=True)
    node.write_net("eth2", "carrier_changes", 6)      # +3 in one interval, over the 2 allowed
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_4"), counter="rnr_nak_retry_err",
                 severity="fatal") == 1
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_4"), counter="carrier_changes",
                 severity="non_fatal") == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_4"), severity="non_fatal") == 1


def test_velocity_window_below_above_and_not_judged_early(node):
    col = node.collector()
    node.scrape(col)
    labels = dict(port1("mlx5_0"), counter="symbol_error", severity="non_fatal")
    node.counter("mlx5_0", "symbol_error", 30)
    r = node.scrape(col, advance=0.5)      # 60/s if extrapolated, but only half a window
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) is None
    node.counter("mlx5_0", "symbol_error", 38)
    r = node.scrape(col, advance=0.5)      # a full second: 38 errors > 10/s
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) == 1
    node.counter("mlx5_0", "symbol_error", 50)
    r = node.scrape(col, advance=0.5)      # still storming: flagged, no second event
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_0"), severity="non_fatal") == 1
    # The storm stops: recovered once a full window is back under the limit.
    r = node.scrape(col, advance=0.5)
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) == 1
    r = node.scrape(col, advance=0.5)
    assert value(r, "fabric_infiniband_port_counter_breached", **labels) is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_0"), severity="recovery") == 1
    # Below the threshold: 5 errors a second on another port never breaches.
    for step in range(1, 5):
        node.counter("mlx5_1", "symbol_error", step * 5)
        r = node.scrape(col)
        assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_1"), counter="symbol_error",
                     severity="non_fatal") is None


def test_symbol_errors_are_not_fatal_by_default(node):
    """121 symbol errors in an hour is the BER boundary, judged by the rules
    (FabricInfinibandPreFailureBER, a warning); the exporter calls no port fatal for it."""
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_3", "symbol_error", 121)
    node.scrape(col, advance=1800)
    r = node.scrape(col, advance=1800)
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_3"), counter="symbol_error",
                 severity="fatal") is None
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_3")) == 0


def test_configured_velocity_per_hour(node):
    node.config = {"infiniband": {"thresholds": [
        {"counter": "symbol_error", "type": "velocity", "threshold": 120, "unit": "hour", "severity": "fatal"}]}}
    col = node.collector()
    node.scrape(col)
    fatal = dict(port1("mlx5_3"), counter="symbol_error", severity="fatal")
    node.counter("mlx5_3", "symbol_error", 121)
    r = node.scrape(col, advance=1800)
    assert value(r, "fabric_infiniband_port_counter_breached", **fatal) is None     # half an hour: not judged
    r = node.scrape(col, advance=1800)
    assert value(r, "fabric_infiniband_port_counter_breached", **fatal) == 1     # 121 in an hour > 120
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_3")) == 1


def test_configured_threshold_applies(node):
    node.config = {"infiniband": {"thresholds": [
        {"counter": "port_xmit_wait", "type": "delta", "threshold": 1000, "severity": "fatal"}]}}
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_0", "port_xmit_wait", 1_220_331 + 1001)
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_0"), counter="port_xmit_wait",
                 severity="fatal") == 1


def test_bad_threshold_config_is_a_clear_startup_error(node):
    node.config = {"infiniband": {"thresholds": [{"counter": "x", "type": "rate", "threshold": 1}]}}
    with pytest.raises(ConfigError, match=r"infiniband\.thresholds\[0\]\.type: input should be 'delta' or 'velocity'"):
        node.collector()
    load_collector_modules()
    ctx = Context(sysfs=node.sys, procfs=node.proc, state_dir=node.state_dir, config=node.config)
    (broken,) = build_collectors(ctx, ["infiniband"])
    with pytest.raises(RuntimeError, match="could not start"):
        list(broken.collect())


def test_management_nic_is_never_fatal(node):
    node.default_route("eth2")
    col = node.collector()
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_device_info", device="mlx5_4", board_id="MT_0000000838",
                 fw_version="28.39.1002", hca_type="MT4129", node_guid="a088:c203:0004:3e14",
                 role="management", numa_node="1") == 1
    node.counter("mlx5_4", "link_downed", 5)
    node.state("mlx5_4", "1: DOWN", "3: Disabled")
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_4"), counter="link_downed",
                 severity="non_fatal") == 1
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_4"), counter="link_downed",
                 severity="fatal") is None
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_4")) == 0
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_4"), severity="fatal") is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_4"), severity="non_fatal") == 2


def test_uncabled_port_and_homogeneity_anomalies(node):
    col = node.collector()
    node.scrape(col)
    node.state("mlx5_3", "1: DOWN", "2: Polling")
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_anomaly", **port1("mlx5_3"), check="uncabled") == 1
    assert value(r, "fabric_infiniband_port_anomaly", **port1("mlx5_3"), check="homogeneity") == 1
    assert value(r, "fabric_infiniband_port_anomaly", **port1("mlx5_2"), check="uncabled") is None
    assert value(r, "fabric_infiniband_port_anomaly", **port1("mlx5_2"), check="homogeneity") is None
    assert value(r, "fabric_infiniband_port_fatal", **port1("mlx5_3")) == 1
    assert value(r, "fabric_infiniband_port_down_transitions_total", **port1("mlx5_3")) == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_3"), severity="fatal") == 1
    node.state("mlx5_3", "4: ACTIVE", "5: LinkUp")
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_port_anomaly", **port1("mlx5_3"), check="uncabled") is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_3"), severity="recovery") == 1


def test_down_transitions_and_latches_survive_an_exporter_restart(node):
    col = node.collector()
    node.scrape(col)
    node.state("mlx5_1", "1: DOWN", "3: Disabled")
    node.counter("mlx5_1", "local_link_integrity_errors", 1)
    node.scrape(col)
    restarted = node.collector()
    r = node.scrape(restarted)
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="missing") == 0
    assert value(r, "fabric_infiniband_port_down_transitions_total", **port1("mlx5_1")) == 1
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_1"),
                 counter="local_link_integrity_errors", severity="fatal") == 1
    # No new baseline after a plain restart: the port was already known.
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_0"), severity="baseline") is None


def test_state_is_written_only_when_it_changes(node):
    col = node.collector()
    node.scrape(col)
    path = node.state_dir / "infiniband.json"
    # An atomic rewrite gives the name a new inode. A hard link keeps the written inode
    # alive, so the filesystem cannot hand its number to the next rewrite (ext4 does reuse
    # a freed number at once) and `samefile` tells a rewrite apart from no write.
    written = node.root / "written"
    os.link(path, written)
    node.scrape(col)
    node.scrape(col)
    assert path.samefile(written)                # quiet scrapes: no rewrite
    node.counter("mlx5_0", "symbol_error", 1)
    node.scrape(col)
    assert path.samefile(written)                # a counter that merely moved waits for the next snapshot
    node.counter("mlx5_0", "symbol_error", 2)
    node.scrape(col, advance=60.0)
    assert not path.samefile(written)
    assert json.loads(path.read_text())["counters"]["mlx5_0/1"]["symbol_error"]["v"] == 2
    written.unlink()
    os.link(path, written)
    node.counter("mlx5_0", "link_downed", 5)     # a fatal breach latches: persisted at once
    node.scrape(col)
    assert not path.samefile(written)


def test_boot_id_change_clears_state_and_emits_baselines(node):
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_0", "link_downed", 9)
    node.state("mlx5_2", "1: DOWN", "3: Disabled")
    node.scrape(col)
    node.boot(BOOT_B)
    # After the reboot the counters start from zero; mlx5_2 is still down.
    node.counter("mlx5_0", "link_downed", 0)
    r = node.scrape(col)
    assert value(r, "fabric_node_boot_id_changes_total", collector="infiniband") == 1
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_0"), counter="link_downed",
                 severity="fatal") is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_0"), severity="baseline") == 2
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_2"), severity="fatal") == 2
    assert value(r, "fabric_infiniband_port_down_transitions_total", **port1("mlx5_2")) is None
    assert value(r, "fabric_infiniband_port_counter_resets_total", **port1("mlx5_0"), counter="link_downed") is None
    assert json.loads((node.state_dir / "infiniband.json").read_text())["boot_id"] == BOOT_B


def test_boot_id_change_across_a_restart_is_detected(node):
    node.scrape(node.collector())
    node.boot(BOOT_B)
    r = node.scrape(node.collector())
    assert value(r, "fabric_node_boot_id_changes_total", collector="infiniband") == 1
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_1"), severity="baseline") == 1


def test_device_disappearance_is_fatal_and_remembered(node):
    col = node.collector()
    node.scrape(col)
    (node.sys / "class" / "infiniband" / "mlx5_2").unlink()
    r = node.scrape(col)
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_2") == 1
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_0") is None
    assert value(r, "fabric_infiniband_port_health_events_total", **port1("mlx5_2"), severity="fatal") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4
    r = node.scrape(node.collector())            # a restarted exporter still knows it had mlx5_2
    assert value(r, "fabric_infiniband_device_missing", device="mlx5_2") == 1


def test_corrupt_state_file_is_reported_and_replaced(node):
    node.state_dir.mkdir()
    path = node.state_dir / "infiniband.json"
    path.write_text('{"boot_id": "6f1d2c3b-1111')
    r = node.scrape(node.collector())
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="corrupt") == 1
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="missing") == 0
    assert json.loads(path.read_text())["boot_id"] == BOOT_A
    assert list(node.state_dir.glob("infiniband.json.corrupt-*"))


@pytest.mark.parametrize("stored", [
    '{"known_devices": ["mlx5_0"], "ports": 5}',
    '{"ports": {"mlx5_0": {"state": "ACTIVE"}}}',                     # no port number
    '{"down_transitions": {"mlx5_0/x1": 2}}',
    '{"known_devices": {"mlx5_0": {"ports": ["1"], "role": "compute"}}}',
])
def test_state_file_of_the_wrong_shape_is_corrupt(node, stored):
    node.state_dir.mkdir()
    (node.state_dir / "infiniband.json").write_text(stored)
    r = node.scrape(node.collector())
    assert value(r, "fabric_state_file_problem", collector="infiniband", problem="corrupt") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4


def test_state_file_keys_are_the_device_slash_port_texts(node):
    """Ports and thresholds are typed keys in memory and the same texts as before on disk,
    so a state file written by an earlier version still restores."""
    col = node.collector()
    node.scrape(col)
    node.counter("mlx5_1", "link_downed", 9)
    node.state("mlx5_0", "1: DOWN", "3: Disabled")
    node.scrape(col)
    stored = json.loads((node.state_dir / "infiniband.json").read_text())
    assert stored["counters"]["mlx5_1/1"]["link_downed"]["latched"] == ["link_downed:fatal"]
    assert stored["down_transitions"] == {"mlx5_0/1": 1}
    assert stored["ports"]["mlx5_0/1"] == {"state": "DOWN", "fatal": True}
    r = node.scrape(node.collector())                 # restored from those texts
    assert value(r, "fabric_infiniband_port_counter_breached", **port1("mlx5_1"), counter="link_downed",
                 severity="fatal") == 1
    assert value(r, "fabric_infiniband_port_down_transitions_total", **port1("mlx5_0")) == 1


def test_unwritable_state_dir_is_counted_not_fatal(node):
    node.state_dir.write_text("a file where the state directory should be")
    r = node.scrape(node.collector())
    assert value(r, "fabric_state_file_write_errors_total", collector="infiniband") == 1
    assert value(r, "fabric_infiniband_port_state", **port1("mlx5_0"), state="ACTIVE") == 4


def test_served_over_http(node, port):
    ctx = Context(sysfs=node.sys, procfs=node.proc, state_dir=node.state_dir, node="gpu-node-0")
    exporter = start_exporter(ctx, ["infiniband"], f"127.0.0.1:{port}")
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        exporter.stop()
    assert ('fabric_infiniband_port_state{device="mlx5_0",node="gpu-node-0",port="1",state="ACTIVE"} 4.0'
            in text)
    assert 'fabric_scrape_collector_success{collector="infiniband",node="gpu-node-0"} 1.0' in text


def test_unchanged_series_are_served_again_and_render_as_a_fresh_exposition(node):
    """The collector hands back the same Sample for a series whose value did not move (the
    renderer then reuses its line); what is served is still exactly this scrape's values."""
    from fabricscope.exporter.exposition import Renderer, render

    col = node.collector()
    renderer = Renderer({"node": "n"})
    samples = lambda families: {(s.name, tuple(s.labels.items())): s for f in families for s in f.samples}  # noqa: E731
    first = list(col.collect())
    renderer.render(first)
    before = samples(first)       # taken now: the family objects are served again, with new samples
    node.counter("mlx5_1", "symbol_error", 77)
    second = list(col.collect())
    assert renderer.render(second) == render(second, {"node": "n"})
    after = samples(second)
    moved = [key for key in after if key[0].startswith("fabric_infiniband") and after[key] is not before.get(key)]
    assert [dict(labels)["counter"] for _, labels in moved] == ["symbol_error"]
    assert after[moved[0]].value == 77
