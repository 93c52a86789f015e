"""Parsing /sys/class/infiniband: state/rate tables, malformed files, the node fixture."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fabricscope.exporter.parsers.infiniband import (CodedState, ParseError, StaticCache, parse_coded_state, parse_rate,
                                         read_infiniband)

FIXTURE_SYS = Path(__file__).parent / "fixtures" / "node" / "sys"


@pytest.mark.parametrize("text, expected", [
    ("4: ACTIVE", CodedState(4, "ACTIVE")),
    ("1: DOWN", CodedState(1, "DOWN")),
    ("5: ACTIVE_DEFER", CodedState(5, "ACTIVE_DEFER")),
    ("5: LinkUp", CodedState(5, "LinkUp")),
    ("2: Polling", CodedState(2, "Polling")),
    ("3: Disabled", CodedState(3, "Disabled")),
    ("7: Phy Test", CodedState(7, "Phy Test")),
])
def test_coded_state_table(text, expected):
    assert parse_coded_state(text) == expected


@pytest.mark.parametrize("text", ["ACTIVE", "4", "4:", "x: ACTIVE", ""])
def test_coded_state_malformed(text):
    with pytest.raises(ParseError):
        parse_coded_state(text)


@pytest.mark.parametrize("text, bytes_per_second", [
    ("400 Gb/sec (4X NDR)", 50e9),
    ("200 Gb/sec (2X NDR)", 25e9),
    ("100 Gb/sec (4X EDR)", 12.5e9),
    ("2.5 Gb/sec (1X SDR)", 0.3125e9),
    ("0 Gb/sec", 0.0),
])
def test_rate_table(text, bytes_per_second):
    assert parse_rate(text) == bytes_per_second


@pytest.mark.parametrize("text", ["fast", "400 Mb/sec (4X NDR)", "four Gb/sec", ""])
def test_rate_malformed(text):
    with pytest.raises(ParseError):
        parse_rate(text)


def copy_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE_SYS / "class" / "infiniband", root / "class" / "infiniband", symlinks=True)
    shutil.copytree(FIXTURE_SYS / "devices", root / "devices", symlinks=True)
    return root


def port_dir(root: Path, device: str) -> Path:
    return root / "class" / "infiniband" / device / "ports" / "1"


def test_fixture_devices_ports_and_counters(tmp_path):
    root = copy_fixture(tmp_path)
    devices = {d.name: d for d in read_infiniband(root)}
    assert sorted(devices) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"]
    mlx5_0 = devices["mlx5_0"]
    assert (mlx5_0.board_id, mlx5_0.fw_ver, mlx5_0.hca_type) == ("MT_0000000970", "28.39.1002", "MT4129")
    assert mlx5_0.pci.numa_node == 0 and not mlx5_0.pci.is_virtual_function
    assert mlx5_0.pci.path.endswith("0000:02:00.0/0000:03:00.0")
    port = mlx5_0.ports[0]
    assert (port.port, port.state, port.phys_state) == (1, CodedState(4, "ACTIVE"), CodedState(5, "LinkUp"))
    assert port.rate_bytes_per_second == 50e9 and port.link_layer == "InfiniBand"
    assert port.counters.link_downed == 1 and port.counters.port_rcv_data == 9_221_483_771_052
    assert port.hw_counters["rx_write_requests"] == 88_410_266 and "roce_slow_restart" not in port.hw_counters
    assert mlx5_0.problems == []

    roce = devices["mlx5_4"].ports[0]
    assert roce.link_layer == "Ethernet" and roce.netdev == "eth2"
    assert roce.counters.VL15_dropped is None          # absent file -> None, not 0
    assert roce.hw_counters["np_cnp_sent"] == 412
    assert roce.carrier_changes is None                 # no class/net in this tree

    vf = devices["mlx5_5"]
    assert vf.pci.is_virtual_function and vf.ports == []


def test_malformed_files_are_problems_not_exceptions(tmp_path):
    root = copy_fixture(tmp_path)
    port = port_dir(root, "mlx5_1")
    (port / "counters" / "symbol_error").write_text("N/A (no PMA)\n")
    (port / "counters" / "port_xmit_wait").write_text("")
    (port / "counters" / "port_rcv_errors").write_text("lots\n")
    # Permission denied cannot be produced with chmod as root; a directory where the file
    # belongs is a real filesystem condition that also makes the read fail (EISDIR).
    (port / "counters" / "link_downed").unlink()
    (port / "counters" / "link_downed").mkdir()
    (port / "rate").write_text("fast\n")
    (port / "state").write_text("ACTIVE\n")
    devices = {d.name: d for d in read_infiniband(root)}
    bad = devices["mlx5_1"]
    reasons = sorted((p.path.name, p.reason) for p in bad.problems)
    assert reasons == [("link_downed", "not_a_file"), ("port_rcv_errors", "not_a_number"),
                       ("port_xmit_wait", "empty"), ("rate", "malformed"), ("state", "malformed"),
                       ("symbol_error", "no_pma")]
    counters = bad.ports[0].counters
    assert counters.symbol_error is None and counters.link_downed is None and counters.port_xmit_wait is None
    assert counters.port_xmit_data is not None and bad.ports[0].phys_state == CodedState(5, "LinkUp")
    assert bad.ports[0].state is None and bad.ports[0].rate_bytes_per_second is None
    assert all(not devices[d].problems for d in ("mlx5_0", "mlx5_2", "mlx5_3", "mlx5_4"))


def test_static_attributes_are_cached_until_the_device_is_recreated(tmp_path):
    root = copy_fixture(tmp_path)
    cache = StaticCache()
    read_infiniband(root, cache)
    device_dir = (root / "class" / "infiniband" / "mlx5_0").resolve()
    (device_dir / "fw_ver").write_text("28.40.1000\n")
    assert {d.name: d.fw_ver for d in read_infiniband(root, cache)}["mlx5_0"] == "28.39.1002"
    # A firmware reset re-creates the device directory (a new inode): fresh read.
    fresh = device_dir.with_name("mlx5_0.new")
    shutil.copytree(device_dir, fresh, symlinks=True)
    shutil.rmtree(device_dir)
    fresh.rename(device_dir)
    assert {d.name: d.fw_ver for d in read_infiniband(root, cache)}["mlx5_0"] == "28.40.1000"


def test_no_infiniband_class_is_no_devices(tmp_path):
    assert read_infiniband(tmp_path) == []


def test_held_files_report_each_file(tmp_path):
    from fabricscope.exporter.parsers.files import ReadProblem
    from fabricscope.exporter.parsers.held import HeldDirectory

    (tmp_path / "ok").write_text("17\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "dir").mkdir()
    held = HeldDirectory(str(tmp_path), ("ok", "empty", "dir", "gone"))
    results = dict(held.read())
    held.close()
    assert results["ok"] == "17"
    assert {name: r.reason for name, r in results.items() if isinstance(r, ReadProblem)} == {
        "empty": "empty", "dir": "not_a_file", "gone": "absent"}
    missing_dir = dict(HeldDirectory(str(tmp_path / "nope"), ("a",)).read())
    assert missing_dir["a"].reason == "absent"
