"""The fat-tree generator and inventory files (YAML/JSON) with their error messages."""
from __future__ import annotations

import json

import pytest

from fabricscope.chaos.blast import BlastRadiusEngine
from fabricscope.chaos.generator import FatTreeSpec, generate_fat_tree
from fabricscope.chaos.inventory import InventoryError, load_topology


def test_generator_builds_scalable_units_with_one_leaf_per_rail():
    t = generate_fat_tree(FatTreeSpec(hosts=64, job_hosts=32))
    kinds = t.summary()["kinds"]
    assert kinds["gpu_server"] == 64 and kinds["gpu"] == 512 and kinds["hca"] == 512
    leaves = [n for n in t.graph if n.startswith("leaf-su")]
    assert sorted(leaves)[:2] == ["leaf-su0-r0", "leaf-su0-r1"] and len(leaves) == 2 * 8
    # Each rail leaf serves the 32 hosts of its SU, one HCA each.
    hcas = [n for n in t.graph.pred["leaf-su1-r5"] if t.kind(n) == "hca"]
    assert len(hcas) == 32 and all(n.endswith("/mlx5_5") for n in hcas)
    assert {n.split("/")[0] for n in hcas} == {f"gpu-node-{i}" for i in range(32, 64)}
    assert sorted(t.jobs) == ["job-0", "job-1"] and len(t.jobs["job-1"].ranks) == 256
    assert t.jobs["job-1"].ranks[0].gpu == "gpu-node-32/gpu0"
    assert t.anchors()["compute"] == {f"core-{j}" for j in range(4)}


def test_generated_rail_leaf_failure_cuts_one_gpu_per_host_and_their_jobs():
    t = generate_fat_tree(FatTreeSpec(hosts=64, job_hosts=32))
    result = BlastRadiusEngine(t).simulate("leaf-su1-r5", "switch_failure")
    assert result.affected_by_kind == {"gpu": 32, "hca": 32, "leaf_switch": 1}
    assert result.affected_jobs == ["job-1"]
    assert result.disconnected_devices["gpu-node-40/gpu5"] == ["compute"]


def test_generated_storage_and_management_are_dual_homed():
    t = generate_fat_tree(FatTreeSpec(hosts=8))
    engine = BlastRadiusEngine(t)
    for leaf in ("storage-leaf-su0-a", "mgmt-leaf-su0-b"):
        assert engine.simulate(leaf, "switch_failure").affected_devices == [leaf]
    t.set_link_state("gpu-node-3/mlx5_8", "storage-leaf-su0-b", "down")
    result = BlastRadiusEngine(t).simulate("storage-leaf-su0-a", "switch_failure")
    assert result.disconnected_devices == {"gpu-node-3": ["storage"], "gpu-node-3/mlx5_8": ["storage"]}


def test_generated_power_and_racks():
    t = generate_fat_tree(FatTreeSpec(hosts=8, job_hosts=4))
    engine = BlastRadiusEngine(t)
    assert engine.simulate("pdu-rack-su0-1-a").affected_devices == ["pdu-rack-su0-1-a"]
    power = engine.simulate("gpu-node-5", "power_failure")
    rack = engine.simulate("gpu-node-5", "rack_failure")
    assert set(power.affected_devices) == set(rack.affected_devices)
    assert {f"gpu-node-{i}" for i in range(4, 8)} <= set(rack.affected_devices)
    assert rack.affected_jobs == ["job-1"]


def test_generated_nvl_domain_shares_nvswitch_trays_across_hosts():
    t = generate_fat_tree(FatTreeSpec(hosts=8, nvl_domain_hosts=4, gpus_per_host=4, rails=4, nvswitch_trays=2))
    trays = [n for n in t.graph if t.kind(n) == "nvswitch"]
    assert sorted(trays) == ["nvl-0-tray0", "nvl-0-tray1", "nvl-1-tray0", "nvl-1-tray1"]
    assert len([n for n in t.graph.pred["nvl-1-tray0"] if t.kind(n) == "gpu"]) == 16
    engine = BlastRadiusEngine(t)
    assert engine.simulate("nvl-0-tray0").affected_devices == ["nvl-0-tray0"]
    t.set_link_state("gpu-node-2/gpu1", "nvl-0-tray1", "down")
    result = BlastRadiusEngine(t).simulate("nvl-0-tray0")
    assert result.disconnected_devices == {"gpu-node-2/gpu1": ["nvlink"]}
    assert t.graph.nodes["gpu-node-2"]["rack"] == t.graph.nodes["nvl-0-tray0"]["rack"]


def test_generator_rejects_bad_shapes():
    with pytest.raises(ValueError, match="hosts must be at least 1"):
        generate_fat_tree(FatTreeSpec(hosts=0))
    with pytest.raises(ValueError, match="must divide hosts_per_su"):
        generate_fat_tree(FatTreeSpec(hosts=8, nvl_domain_hosts=5))


INVENTORY = """
name: lab
devices:
  - {name: core, kind: core_switch, rack: r0, power: [pdu-a]}
  - {name: leaf, kind: leaf_switch, rack: r0, power: [pdu-a]}
  - {name: pdu-a, kind: pdu, rack: r0}
  - {name: host-1/gpu0, kind: gpu, host: host-1}     # a component before its server
  - {name: host-1, kind: gpu_server, rack: r1, power: [pdu-a]}
links:
  - {a: leaf, b: core, kind: infiniband, partition: compute}
  - {a: host-1/gpu0, b: leaf, kind: infiniband, partition: compute, state: up, reverse_state: down}
jobs:
  - name: train
    ranks: [{rank: 0, gpu: host-1/gpu0}]
"""


def test_yaml_and_json_inventories_load(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY)
    t = load_topology(path)
    assert t.jobs["train"].ranks[0].host == "host-1"
    assert t.graph["leaf"]["host-1/gpu0"]["state"] == "down"
    result = BlastRadiusEngine(t).simulate("pdu-a", "power_failure")
    assert result.affected_jobs == ["train"]
    import yaml
    as_json = tmp_path / "lab.json"
    as_json.write_text(json.dumps(yaml.safe_load(INVENTORY)))
    assert load_topology(as_json).version == t.version


def test_inventory_can_extend_a_generated_cluster(tmp_path):
    path = tmp_path / "gen.yaml"
    path.write_text("name: gen\ngenerate: {hosts: 4, job_hosts: 2}\n"
                    "devices: [{name: login, kind: server, rack: rack-su0-0, power: [pdu-rack-su0-0-a]}]\n"
                    "links: [{a: login, b: mgmt-leaf-su0-a, kind: ethernet, partition: mgmt}]\n")
    t = load_topology(path)
    assert "login" in t and sorted(t.jobs) == ["job-0", "job-1"]
    assert "login" in BlastRadiusEngine(t).simulate("mgmt-leaf-su0-a", "switch_failure").disconnected_devices


@pytest.mark.parametrize("text, message", [
    ("devices: [{name: a, kind: toaster}]", "devices[0].kind: Input should be 'gpu_server'"),
    ("devices: [{name: a, kind: server, colour: red}]", "devices[0].colour: Extra inputs are not permitted"),
    ("devices: [{name: a, kind: server}, {name: a, kind: server}]", "devices[1].name: 'a' is already defined at devices[0]"),
    ("devices: [{name: a, kind: server}]\nlinks: [{a: a, b: nope, kind: ethernet}]", "links[0].b: unknown device 'nope'"),
    ("devices: [{name: a, kind: server}, {name: b, kind: server}]\n"
     "links: [{a: a, b: b, kind: ethernet, state: flaky}]", "links[0].state: Input should be 'up' or 'down'"),
    ("devices: [{name: a, kind: server}, {name: b, kind: server, power: [a]}]",
     "devices[1].power[0]: power feed a->b: 'a' is a server, not a pdu"),
    ("devices: [{name: a, kind: gpu, host: b}, {name: b, kind: gpu, host: a}]", "is housed, directly or not"),
    ("devices: [{name: a, kind: gpu, host: ghost}]", "devices[0].host: unknown device 'ghost'"),
    ("devices: [{name: h, kind: server}]\njobs: [{name: j, ranks: [{rank: 0, gpu: h}]}]",
     "jobs[0].ranks[0].gpu: 'h' is a server, not a gpu"),
    ("devices: [{name: h, kind: server}]\njobs: [{name: j, ranks: [{rank: 0, host: h}, {rank: 0, host: h}]}]",
     "jobs[0].ranks[1].rank: rank 0 appears twice"),
    ("generate: {hosts: 0}", "generate.hosts: Input should be greater than or equal to 1"),
    ("devices: [{name: a, kind: server}\n", "invalid YAML"),
    ("- just a list", "expected a mapping at the top level"),
])
def test_inventory_errors_name_the_key_path(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as err:
        load_topology(path)
    assert message in str(err.value)
    assert str(err.value).startswith(str(path))


def test_missing_inventory_file(tmp_path):
    with pytest.raises(InventoryError, match="cannot read"):
        load_topology(tmp_path / "nope.yaml")


def test_an_inventory_that_is_a_fifo_is_refused_not_waited_for(tmp_path):
    import os

    from fabricscope.chaos.inventory import read_inventory_file

    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError, match="not a regular file"):
        read_inventory_file(fifo)
