"""Demo scenarios: durations, validation messages, the fault clock, the default scenario."""
from __future__ import annotations

import pytest

from fabricscope.demo.scenario import (FILESYSTEM_FAULTS, SOURCE_FAULTS, ScenarioError, default_scenario_path,
                                    load_scenario, parse_duration)


def scenario(*faults, **top):
    return {"seed": 1, "cluster": {"name": "t", "nodes": 2, "gpus_per_node": 8, "hcas_per_node": 8},
            "faults": list(faults), **top}


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("2m30s", 150), ("2.5s", 2.5), ("500ms", 0.5), ("1m500ms", 60.5), (45, 45), (0, 0),
])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m", "ms", "1x", "-5s", "s5", "5ms3s", None, True, [1]])
def test_bad_durations_are_rejected_with_the_field_named(text):
    with pytest.raises(ScenarioError, match="^at: "):
        parse_duration(text, "at")


@pytest.mark.parametrize("fault, message", [
    ({"kind": "meteor_strike", "at": "1s"}, r"fault 0: unknown kind 'meteor_strike' \(known: .*link_flap"),
    ({"kind": "microburst", "node": 0, "at": "soon"}, r"fault 0 \(microburst\): at: bad duration 'soon'"),
    ({"kind": "microburst", "node": 0, "at": -3}, r"fault 0 \(microburst\): at must not be negative"),
    ({"kind": "microburst", "node": 0, "at": "-3s"}, r"fault 0 \(microburst\): at: bad duration '-3s'"),
    ({"kind": "microburst", "node": 2, "at": "1s"}, r"fault 0 \(microburst\): node 2 is out of range \(cluster has 2 nodes: 0\.\.1\)"),
    ({"kind": "microburst", "node": "gpu-node-7", "at": "1s"}, r"node 'gpu-node-7' is out of range"),
    ({"kind": "microburst", "node": "node7", "at": "1s"}, r"node 'node7' is neither an index nor a name like gpu-node-0"),
    ({"kind": "microburst", "node": 0}, r"fault 0 \(microburst\): missing 'at'"),
    ({"kind": "microburst", "node": 0, "at": "1s", "duration": "0s"}, r"duration must be positive"),
    ({"kind": "microburst", "node": 0, "at": "1s", "when": 3}, r"unknown keys \['when'\]"),
    ({"kind": "symbol_error_storm", "at": "1s"}, r"fault 0 \(symbol_error_storm\): symbol_error_storm needs a node"),
    ({"kind": "symbol_error_storm", "node": 0, "at": "1s", "target": {"device": "mlx5_9"}},
     r"target device 'mlx5_9' does not exist \(mlx5_0\.\.mlx5_8\)"),
    ({"kind": "link_down", "node": 0, "at": "1s", "target": {"device": "mlx5_1", "port": 2}}, r"target port 2 does not exist"),
    ({"kind": "link_flap", "node": 0, "at": "1s", "params": {"count": 0}}, r"params.count must be a positive integer"),
    ({"kind": "link_flap", "node": 0, "at": "1s", "params": {"period_seconds": 1}}, r"params.period_seconds must be a number >= 2"),
    ({"kind": "symbol_error_storm", "node": 0, "at": "1s", "params": {"rate_per_second": -1}},
     r"params.rate_per_second must be a non-negative number"),
    ({"kind": "nccl_hang", "at": "1s"}, r"fault 0 \(nccl_hang\): nccl_hang needs target rank from 0 to 15, got None"),
    ({"kind": "straggler_rank", "at": "1s", "target": {"rank": 16}}, r"needs target rank from 0 to 15, got 16"),
    ({"kind": "nvlink_down", "node": 1, "at": "1s", "target": {"gpu": 8}}, r"target gpu 8 does not exist \(0\.\.7\)"),
    ({"kind": "nvlink_down", "node": 1, "at": "1s", "target": {"gpu": 1, "link": 18}}, r"target link 18 does not exist"),
    ("microburst", r"fault 0: expected a mapping, got str"),
])
def test_fault_validation_names_the_fault_and_the_problem(fault, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(scenario(fault))


def test_the_failing_fault_index_is_reported():
    good = {"kind": "microburst", "node": 0, "at": "1s"}
    with pytest.raises(ScenarioError, match=r"^fault 2 \(link_down\): "):
        load_scenario(scenario(good, good, {"kind": "link_down", "node": 9, "at": "1s"}))


@pytest.mark.parametrize("top, message", [
    ({"seed": "abc"}, r"seed must be an integer"),
    ({"tick_seconds": 0}, r"tick_seconds: must be between 0.05 and 60"),
    ({"repeat": "0s"}, r"repeat: must be positive"),
    ({"colour": "red"}, r"unknown keys \['colour'\]"),
    ({"faults": {"kind": "microburst"}}, r"faults must be a list"),
    ({"cluster": {"nodes": 0}}, r"cluster.nodes: expected an integer from 1 to 64, got 0"),
    ({"cluster": {"gpus_per_node": 9}}, r"cluster.gpus_per_node: expected an integer from 1 to 8"),
    ({"cluster": {"racks": 2}}, r"unknown cluster keys \['racks'\]"),
])
def test_top_level_validation(top, message):
    data = scenario()
    data.update(top)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(data)


def test_fault_beyond_the_repeat_window_is_rejected():
    with pytest.raises(ScenarioError, match=r"fault 0 \(microburst\): at 600s is not inside the repeat window of 300s"):
        load_scenario(scenario({"kind": "microburst", "node": 0, "at": "10m"}, repeat="5m"))


def test_file_errors_are_specific(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ScenarioError, match="top level must be a mapping, got list"):
        load_scenario(bad)


def test_faults_are_normalised():
    loaded = load_scenario(scenario(
        {"kind": "link_flap", "node": "gpu-node-1", "at": "1m", "target": {"device": 3},
         "params": {"count": 2, "period_seconds": 10}},
        {"kind": "nccl_hang", "at": 5, "duration": "30s", "target": {"rank": 3}}))
    flap, hang = loaded.faults
    assert (flap.node, flap.start, flap.end, flap.target) == ("gpu-node-1", 60, 80, {"device": "mlx5_3", "port": 1})
    assert (hang.node, hang.start, hang.end) == (None, 5, 35)


def test_repeat_shifts_faults_into_the_current_cycle():
    loaded = load_scenario(scenario({"kind": "microburst", "node": 0, "at": "10s", "duration": "5s"}, repeat="60s"))
    assert loaded.active_faults(9) == []
    assert [f.start for f in loaded.active_faults(10)] == [10]
    assert loaded.active_faults(15) == []
    second = loaded.active_faults(72)
    # Sources compute "time into the fault" as now - start: it must be 2 s, not 62 s.
    assert [(f.start, f.end) for f in second] == [(70, 75)]


def test_without_repeat_the_timeline_plays_once():
    loaded = load_scenario(scenario({"kind": "microburst", "node": 0, "at": "10s"}))
    assert len(loaded.active_faults(10)) == 1 and len(loaded.active_faults(10_000)) == 1
    assert loaded.active_faults(5) == []


def test_with_nodes_drops_faults_on_missing_nodes_and_keeps_job_faults():
    loaded = load_scenario(scenario({"kind": "microburst", "node": 1, "at": "1s"},
                                    {"kind": "nccl_hang", "at": "1s", "target": {"rank": 0}}))
    smaller = loaded.with_nodes(1)
    assert smaller.nodes == 1 and [f.kind for f in smaller.faults] == ["nccl_hang"]
    with pytest.raises(ScenarioError):
        loaded.with_nodes(0)


def test_default_scenario_tells_the_whole_story():
    loaded = load_scenario(default_scenario_path())
    assert (loaded.nodes, loaded.gpus_per_node, loaded.hcas_per_node) == (4, 8, 8)
    kinds = {f.kind for f in loaded.faults}
    assert {"symbol_error_storm", "link_flap", "link_down", "microburst", "nccl_hang", "straggler_rank",
            "nvlink_down"} <= kinds
    assert kinds <= FILESYSTEM_FAULTS | SOURCE_FAULTS
    first = min(f.start for f in loaded.faults)
    last_end = max(f.end for f in loaded.faults)
    # A healthy start long enough to show a quiet cluster, short enough that the first
    # page (a rule without `for:`) arrives within about 90 s of `make run`.
    assert 30 <= first <= 60, "a short healthy phase before the first fault"
    assert min(loaded.faults, key=lambda f: f.start).kind == "mlx5_fatal"
    assert 15 * 60 <= last_end - first <= 25 * 60, "a ~20 minute fault sequence"
    assert loaded.repeat and loaded.repeat > last_end, "healthy again before the timeline repeats"
    assert loaded.active_faults(loaded.repeat + first) != [], "the timeline repeats"


def test_source_plugins_can_declare_their_own_fault_kinds(monkeypatch):
    import types

    plugin = types.SimpleNamespace(make_source=lambda *a: None, FAULT_KINDS=("gpu_thermal_throttle",))
    monkeypatch.setattr("fabricscope.demo.sim_sources.discover_source_modules", lambda: {"thermal": plugin})
    loaded = load_scenario(scenario({"kind": "gpu_thermal_throttle", "node": 0, "at": "1s", "params": {"gpu": 2}}))
    assert loaded.faults[0].kind == "gpu_thermal_throttle" and loaded.faults[0].params == {"gpu": 2}
