"""NIC role classification from the PCIe tree, NUMA locality and the default route."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabricscope.exporter.health import nic_roles
from fabricscope.exporter.health.nic_roles import NicPlacement, classify, default_route_interfaces, find_gpus, gpu_proximity
FIXTURE_SYS = Path(__file__).parent / "fixtures" / "node" / "sys"

ROUTE_HEADER = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"


def write_route(procfs: Path, *lines: str) -> None:
    (procfs / "net").mkdir(parents=True, exist_ok=True)
    (procfs / "net" / "route").write_text(ROUTE_HEADER + "".join(line + "\n" for line in lines))


def placement(name: str, numa: int | None, netdevs=()) -> NicPlacement:
    root = FIXTURE_SYS / "class" / "infiniband" / name / "device"
    return NicPlacement(name, os.path.realpath(root), numa, tuple(netdevs))


def test_fixture_gpus_found_by_walking_devices():
    gpus = find_gpus(FIXTURE_SYS)
    assert len(gpus) == 4 and {g.numa_node for g in gpus} == {0, 1}


def test_bus_pci_devices_index_is_used_when_present(tmp_path):
    gpu = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    gpu.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("class", "0x030000"), ("numa_node", "-1")):
        (gpu / name).write_text(value + "\n")
    index = tmp_path / "bus" / "pci" / "devices"
    index.mkdir(parents=True)
    (index / "0000:01:00.0").symlink_to(os.path.relpath(gpu, index))
    assert [(g.path, g.numa_node) for g in find_gpus(tmp_path)] == [(str(gpu.resolve()), None)]


def test_switch_sharing_decides_compute_vs_storage():
    nics = [placement(f"mlx5_{i}", 0 if i < 2 else 1) for i in range(5)]
    near = gpu_proximity(nics, find_gpus(FIXTURE_SYS))
    # mlx5_4 is on NUMA 1 with GPUs, but the PCIe tree pairs NICs with GPUs on this host
    # and mlx5_4 shares no switch with one: it is not a compute NIC.
    assert near == {"mlx5_0": True, "mlx5_1": True, "mlx5_2": True, "mlx5_3": True, "mlx5_4": False}
    assert classify(nics[4], near["mlx5_4"], set(), has_active_port=True) == "storage"
    assert classify(nics[4], near["mlx5_4"], set(), has_active_port=False) == "unknown"


def test_flat_topology_falls_back_to_numa(tmp_path):
    # A VM-style flat bus: every function directly on the host bridge, nothing shared.
    host = tmp_path / "devices" / "pci0000:00"
    layout = {"0000:00:04.0": ("0x10de", "0x030200", 0), "0000:00:05.0": ("0x15b3", "0x020700", 0),
              "0000:00:06.0": ("0x15b3", "0x020700", 1), "0000:00:07.0": ("0x15b3", "0x020700", -1)}
    for bdf, (vendor, klass, numa) in layout.items():
        (host / bdf).mkdir(parents=True)
        for name, value in (("vendor", vendor), ("class", klass), ("numa_node", str(numa))):
            (host / bdf / name).write_text(value + "\n")
    nics = [NicPlacement("a", str((host / "0000:00:05.0").resolve()), 0, ()),
            NicPlacement("b", str((host / "0000:00:06.0").resolve()), 1, ()),
            NicPlacement("c", str((host / "0000:00:07.0").resolve()), None, ())]
    assert gpu_proximity(nics, find_gpus(tmp_path)) == {"a": True, "b": False, "c": None}


def test_no_gpus_means_unknown():
    nics = [placement("mlx5_0", 0)]
    assert gpu_proximity(nics, []) == {"mlx5_0": None}
    assert classify(nics[0], None, set(), has_active_port=True) == "unknown"


def test_default_route_makes_management_and_overrides_win(tmp_path):
    write_route(tmp_path, "eth2\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0",
                "eth0\t0002A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0",
                "garbage")
    assert default_route_interfaces(tmp_path) == {"eth2"}
    nic = placement("mlx5_4", 1, ["eth2"])
    assert classify(nic, True, {"eth2"}, has_active_port=True) == "management"
    assert classify(nic, True, {"eth2"}, has_active_port=True, override="storage") == "storage"
    assert default_route_interfaces(tmp_path / "nowhere") == set()


def test_role_overrides_are_validated():
    from fabricscope.exporter.config import section

    assert nic_roles.load_role_overrides(section({"infiniband": {"roles": {"mlx5_4": "storage"}}}, "infiniband")) \
        == {"mlx5_4": "storage"}
    with pytest.raises(ValueError, match=r"infiniband\.roles\.mlx5_4: input should be 'compute', 'storage'"):
        section({"infiniband": {"roles": {"mlx5_4": "backup"}}}, "infiniband")
    with pytest.raises(ValueError, match=r"infiniband\.roles: input should be a valid dictionary"):
        section({"infiniband": {"roles": ["mlx5_4"]}}, "infiniband")
