"""`fabricscope chaos`: the demo topology by default, inventory files, clear errors."""
from __future__ import annotations

import json

from fabricscope.cli import main
from fabricscope.demo.scenario import default_scenario_path, load_scenario
from fabricscope.demo.topology import demo_job_name


def test_demo_leaf_failure_names_the_demo_job(capsys):
    assert main(["chaos", "simulate", "--device", "leaf-su0-r3", "--failure-type", "switch_failure"]) == 0
    out = capsys.readouterr().out
    job = demo_job_name(load_scenario(default_scenario_path()))
    assert f"affected jobs: {job}" in out
    assert "gpu-node-2/gpu3 <- gpu-node-2/mlx5_3: lost compute (pcie link)" in out


def test_json_output_and_rack_failure_of_a_demo_node(capsys):
    assert main(["chaos", "simulate", "--device", "gpu-node-1", "--failure-type", "rack_failure", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"gpu-node-0", "gpu-node-3", "pdu-rack-su0-0-a"} <= set(result["affected_devices"])
    assert result["path"][0]["reason"] == "rack"


def test_bad_device_and_bad_inventory_exit_2_with_the_reason(capsys, tmp_path):
    assert main(["chaos", "simulate", "--device", "gpu-node-9"]) == 2
    assert "unknown device 'gpu-node-9'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{name: a, kind: toaster}]\n")
    assert main(["chaos", "devices", "--topology", str(bad)]) == 2
    assert "devices[0].kind" in capsys.readouterr().err


def test_devices_lists_names_by_kind(capsys):
    assert main(["chaos", "devices", "--kind", "core_switch"]) == 0
    assert capsys.readouterr().out.split() == ["core-0", "core_switch", "core-1", "core_switch", "core-2",
                                               "core_switch", "core-3", "core_switch"]
