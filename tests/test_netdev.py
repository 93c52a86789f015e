"""netdev collector: /sys/class/net fixture, broken files, include/exclude flags, real sysfs."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.collectors.netdev import DEFAULT_ETHTOOL_INCLUDE, NetdevCollector
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules
from fabricscope.exporter.parsers.netdev import (list_interfaces, parse_default_route_interfaces, read_ethtool_statistics,
                                     read_net_device)

FIXTURE = Path(__file__).parent / "fixtures" / "node"


def scrape(ctx: Context) -> CollectorRegistry:
    load_collector_modules()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(build_collectors(ctx, ["netdev"])))
    return registry


def fixture_ctx(root: Path = FIXTURE, **kwargs) -> Context:
    return Context(sysfs=root / "sys", procfs=root / "proc", node="", **kwargs)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A private copy of the class/net fixture (symlinks kept) that a test may break."""
    root = tmp_path / "node"
    shutil.copytree(FIXTURE / "sys" / "class" / "net", root / "sys" / "class" / "net", symlinks=True)
    shutil.copytree(FIXTURE / "proc" / "net", root / "proc" / "net")
    return root


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_fixture_interfaces_state_speed_and_statistics():
    registry = scrape(fixture_ctx(config={"netdev": {"device_exclude": "^veth"}}))   # lo too
    assert value(registry, "fabric_scrape_collector_success", collector="netdev") == 1
    assert value(registry, "fabric_netdev_info", interface="eth2", operstate="up", driver="mlx5_core",
                 address_family="ether") == 1
    assert value(registry, "fabric_netdev_info", interface="eth0", operstate="up", driver="ice",
                 address_family="ether") == 1
    assert value(registry, "fabric_netdev_info", interface="lo", operstate="unknown", driver="",
                 address_family="loopback") == 1
    assert value(registry, "fabric_netdev_up", interface="eth2") == 1
    assert value(registry, "fabric_netdev_up", interface="lo") == 0   # lo reports operstate "unknown"
    # 200000 Mb/s is 25 GB/s; lo has no speed file: absent, not 0.
    assert value(registry, "fabric_netdev_speed_bytes_per_second", interface="eth2") == 25e9
    assert value(registry, "fabric_netdev_speed_bytes_per_second", interface="eth0") == 3.125e9
    assert value(registry, "fabric_netdev_speed_bytes_per_second", interface="lo") is None
    assert value(registry, "fabric_netdev_mtu_bytes", interface="eth2") == 4200
    assert value(registry, "fabric_netdev_carrier_changes_total", interface="eth2") == 7
    assert value(registry, "fabric_netdev_rx_missed_errors_total", interface="eth2") == 42
    assert value(registry, "fabric_netdev_rx_dropped_total", interface="eth2") == 345
    assert value(registry, "fabric_netdev_rx_errors_total", interface="eth2") == 12
    assert value(registry, "fabric_netdev_rx_bytes_total", interface="eth2") == 88776655443322
    assert value(registry, "fabric_netdev_tx_window_errors_total", interface="eth0") is None   # half-duplex: left out
    assert value(registry, "fabric_netdev_default_route", interface="eth0") == 1
    assert value(registry, "fabric_netdev_default_route", interface="eth2") == 0
    assert value(registry, "fabric_netdev_read_errors", interface="eth2", reason="not_a_number") is None


def test_veth_and_loopback_excluded_by_default_and_flags_override():
    registry = scrape(fixture_ctx())
    assert value(registry, "fabric_netdev_up", interface="veth3f2a1c9") is None
    assert value(registry, "fabric_netdev_up", interface="lo") is None
    assert value(registry, "fabric_netdev_up", interface="eth0") == 1

    load_collector_modules()
    parser = argparse.ArgumentParser()
    NetdevCollector.add_arguments(parser)
    keep_all = parser.parse_args(["--collector.netdev.device-exclude", ""])
    registry = scrape(fixture_ctx(args=keep_all))
    assert value(registry, "fabric_netdev_up", interface="veth3f2a1c9") == 1

    only_eth2 = parser.parse_args(["--collector.netdev.device-include", "^eth2$"])
    registry = scrape(fixture_ctx(args=only_eth2))
    assert value(registry, "fabric_netdev_up", interface="eth2") == 1
    assert value(registry, "fabric_netdev_up", interface="eth0") is None


def test_every_statistics_file_when_asked():
    registry = scrape(fixture_ctx(config={"netdev": {"statistics_exclude": ""}}))
    assert value(registry, "fabric_netdev_tx_window_errors_total", interface="eth0") == 0
    assert value(registry, "fabric_netdev_rx_missed_errors_total", interface="eth2") == 42


def test_config_section_include_and_bad_regex_is_a_clear_start_error():
    ctx = fixture_ctx(config={"netdev": {"device_exclude": "^(lo|veth)"}})
    registry = scrape(ctx)
    assert value(registry, "fabric_netdev_up", interface="lo") is None
    assert value(registry, "fabric_netdev_up", interface="eth0") == 1

    with pytest.raises(ValueError, match=r"netdev\.device_include: not a regular expression"):
        NetdevCollector(fixture_ctx(config={"netdev": {"device_include": "(eth"}}))
    # Through the framework it is a failed collector, not a dead exporter.
    registry = scrape(fixture_ctx(config={"netdev": {"device_include": "(eth"}}))
    assert value(registry, "fabric_scrape_collector_success", collector="netdev") == 0


def test_malformed_files_are_skipped_and_reported_per_interface(tree):
    stats = tree / "sys" / "class" / "net" / "eth2" / "statistics"
    (stats / "rx_errors").write_text("twelve\n")
    (stats / "tx_errors").write_text("")
    (stats / "rx_crc_errors").unlink()
    (stats / "rx_crc_errors").mkdir()
    (tree / "sys" / "class" / "net" / "eth2" / "mtu").write_text("jumbo\n")
    registry = scrape(fixture_ctx(tree))

    assert value(registry, "fabric_scrape_collector_success", collector="netdev") == 1
    assert value(registry, "fabric_netdev_read_errors", interface="eth2", reason="not_a_number") == 2
    assert value(registry, "fabric_netdev_read_errors", interface="eth2", reason="empty") == 1
    assert value(registry, "fabric_netdev_read_errors", interface="eth2", reason="not_a_file") == 1
    assert value(registry, "fabric_netdev_rx_errors_total", interface="eth2") is None
    assert value(registry, "fabric_netdev_mtu_bytes", interface="eth2") is None
    # The rest of eth2, and every other interface, is still there.
    assert value(registry, "fabric_netdev_rx_missed_errors_total", interface="eth2") == 42
    assert value(registry, "fabric_netdev_up", interface="eth2") == 1
    assert value(registry, "fabric_netdev_rx_errors_total", interface="eth0") == 0
    assert value(registry, "fabric_netdev_read_errors", interface="eth0", reason="not_a_number") is None


def test_unknown_speed_and_missing_route_file(tree):
    (tree / "sys" / "class" / "net" / "eth0" / "speed").write_text("-1\n")
    (tree / "proc" / "net" / "route").unlink()
    registry = scrape(fixture_ctx(tree))
    assert value(registry, "fabric_netdev_speed_bytes_per_second", interface="eth0") is None
    assert value(registry, "fabric_netdev_read_errors", interface="eth0", reason="not_a_number") is None
    assert value(registry, "fabric_netdev_default_route", interface="eth0") is None
    assert value(registry, "fabric_netdev_mtu_bytes", interface="eth0") == 1500


def test_interface_that_vanished_is_not_reported_as_broken(tree):
    assert read_net_device(tree / "sys", "eth9") is None
    shutil.rmtree(tree / "sys" / "class" / "net" / "eth0")
    (tree / "sys" / "class" / "net" / "eth0").symlink_to("../../devices/virtual/net/eth0")   # dangling
    registry = scrape(fixture_ctx(tree))
    assert value(registry, "fabric_netdev_up", interface="eth0") is None
    assert registry.get_sample_value("fabric_netdev_read_errors", {"interface": "eth0", "reason": "absent"}) is None
    assert value(registry, "fabric_netdev_up", interface="eth2") == 1


def test_missing_class_net_fails_the_collector_visibly(tmp_path):
    registry = scrape(Context(sysfs=tmp_path, procfs=tmp_path, node=""))
    assert value(registry, "fabric_scrape_collector_success", collector="netdev") == 0
    assert list_interfaces(tmp_path).reason == "absent"


@pytest.mark.parametrize("text, expected", [
    ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
     "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
     "eth1\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", {"eth0"}),
    ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n", set()),
    ("", set()),
    ("garbage header\neth0 00000000 00000000\n", set()),
    ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\neth0\t00000000\n", set()),
])
def test_default_route_table(text, expected):
    assert parse_default_route_interfaces(text) == expected


def test_real_sysfs_loopback():
    if not os.path.isdir("/sys/class/net/lo"):
        pytest.skip("no /sys/class/net/lo on this host")
    device = read_net_device(Path("/sys"), "lo")
    assert device.mtu and device.mtu > 0
    assert device.address_family == "loopback"
    assert "rx_bytes" in device.statistics
    registry = scrape(Context(node="", config={"netdev": {"device_exclude": ""}}))
    assert value(registry, "fabric_netdev_mtu_bytes", interface="lo") == device.mtu


def test_ethtool_counters_only_for_the_real_sysfs():
    # A fixture root describes another machine: no ioctls on this one's interfaces.
    registry = scrape(fixture_ctx(config={"netdev": {"ethtool_include": "."}}))
    assert not [s for f in registry.collect() for s in f.samples if s.name.startswith("fabric_netdev_ethtool")]
    assert NetdevCollector(fixture_ctx()).ethtool_include is None


def _physical_interface_with_ethtool_stats() -> tuple[str, str] | None:
    for name in (list_interfaces(Path("/sys")) or []) if os.path.isdir("/sys/class/net") else []:
        device = read_net_device(Path("/sys"), name)
        if device is None or device.driver is None:
            continue
        counters = read_ethtool_statistics(name)
        if isinstance(counters, list) and counters:
            return name, counters[0][0]
    return None


def test_ethtool_counters_on_this_host():
    found = _physical_interface_with_ethtool_stats()
    if found is None:
        pytest.skip("no physical interface with ethtool statistics on this host")
    interface, counter = found
    registry = scrape(Context(node="", config={"netdev": {"ethtool_include": f"^{counter}$"}}))
    assert registry.get_sample_value("fabric_netdev_ethtool_counter_total",
                                     {"interface": interface, "counter": counter}) >= 0
    # The default allow-list keeps a virtio or e1000 NIC's per-queue counters out.
    registry = scrape(Context(node=""))
    exported = {s.labels["counter"] for f in registry.collect() for s in f.samples
                if s.name == "fabric_netdev_ethtool_counter_total"}
    assert all(re.match(DEFAULT_ETHTOOL_INCLUDE, name) for name in exported)


def test_ethtool_reader_agrees_with_pyroute2():
    from pyroute2.ethtool.ioctl import IoctlEthtool, NotSupportedError

    found = _physical_interface_with_ethtool_stats()
    if found is None:
        pytest.skip("no physical interface with ethtool statistics on this host")
    interface = found[0]
    reference = IoctlEthtool(interface)
    try:
        theirs = [(str(name), int(value)) for name, value in reference.get_statistics()]
    finally:
        reference.close()
    ours = read_ethtool_statistics(interface)
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    # Read after theirs: the packet and byte counters can only have grown.
    grown = [(o, t) for (name, o), (_, t) in zip(ours, theirs) if name.endswith(("packets", "bytes"))]
    assert grown and all(o >= t for o, t in grown)
    if os.path.isdir("/sys/class/net/lo"):
        with pytest.raises(NotSupportedError):
            IoctlEthtool("lo").get_statistics()


def test_ethtool_on_missing_and_virtual_interfaces():
    assert read_ethtool_statistics("fsnosuchif0").reason == "ethtool_failed"
    assert read_ethtool_statistics("a-name-longer-than-ifnamsiz").reason == "ethtool_failed"
    if os.path.isdir("/sys/class/net/lo"):
        assert read_ethtool_statistics("lo") is None   # loopback has no driver statistics


def test_host_collectors_over_http_pass_promtool_lint(tmp_path, port):
    """netdev, tcp and kmsg on the fixture node, scraped over HTTP and linted by promtool."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    from fabricscope.exporter.main import start_exporter

    promtool = shutil.which("promtool")
    ctx = Context(sysfs=FIXTURE / "sys", procfs=FIXTURE / "proc", kmsg=FIXTURE / "kmsg",
                  state_dir=tmp_path / "state", node="gpu-node-7")
    exporter = start_exporter(ctx, ["netdev", "tcp", "kmsg"], f"127.0.0.1:{port}")
    try:
        body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        exporter.stop()
    families = {family.name: family for family in text_string_to_metric_families(body)}
    for name in ("fabric_netdev_rx_missed_errors", "fabric_tcp_retransmitted_segments", "fabric_kernel_log_xid_events"):
        assert families[name].type == "counter"
    assert 'fabric_netdev_rx_missed_errors_total{interface="eth2",node="gpu-node-7"} 42.0' in body
    assert 'fabric_scrape_collector_success{collector="kmsg",node="gpu-node-7"} 1.0' in body
    if promtool is None:
        pytest.fail("promtool not installed; run `make setup`")
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
