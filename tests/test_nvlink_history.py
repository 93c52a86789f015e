"""Each NVLink's last active and inactive sightings, kept node-side (exporter/nvml/history.py):
the nvlink collector over the demo's simulated NVML, its state file on disk, restarts."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import nvml as demo_nvml
from fabricscope.exporter.collectors.nvlink import NvlinkCollector
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import ScrapeCollector
from fabricscope.exporter.nvml.history import PERSIST_ACTIVE_SECONDS, RETENTION_SECONDS

ACTIVE, INACTIVE = "fabric_nvlink_last_active_timestamp_seconds", "fabric_nvlink_last_inactive_timestamp_seconds"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Node:
    """One simulated node's NVML and an exporter's nvlink collector over it; restart()
    starts a new collector on the same state dir, as a restarted exporter does."""

    def __init__(self, state_dir: Path, gpus: int = 4) -> None:
        spec = NodeSpec("gpu-node-0", 0, gpus, 2, Path("/nonexistent"))
        self.source = demo_nvml.NvmlSimSource(spec, ClusterSpec("test", (spec,), 3), random.Random(1),
                                              costs=demo_nvml.FREE)
        self.state_dir, self.clock, self.collector = state_dir, Clock(), None
        self.faults: list[Fault] = []
        self.restart()

    def restart(self) -> None:
        if self.collector is not None:
            self.collector.close()
        # A long interval: every round here is one the test asks for (refresh).
        self.collector = NvlinkCollector(Context(node="gpu-node-0", state_dir=self.state_dir,
                                                 sources={"nvml": self.source},
                                                 config={"nvlink": {"sample_interval_seconds": 600}}), self.clock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ScrapeCollector([self.collector], node=""))

    def at(self, seconds: float, faults: list[Fault] | None = None) -> dict[str, dict[tuple[str, str], float]]:
        """Scenario time `seconds` (the clock moves with it), a fresh round of every GPU,
        then one scrape: {metric: {(gpu, link): value}} of the two sighting families and
        the state file's figures."""
        self.clock.now = 1_800_000_000.0 + seconds
        self.source.step(seconds, faults if faults is not None else self.faults)
        assert self.collector.refresh(), "a GPU sample timed out"
        found: dict[str, dict] = {ACTIVE: {}, INACTIVE: {}, "problem": {}, "write_errors": {}, "state": {}}
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name in (ACTIVE, INACTIVE, "fabric_nvlink_state"):
                    found[{"fabric_nvlink_state": "state"}.get(s.name, s.name)][(s.labels["gpu"], s.labels["link"])] \
                        = s.value
                elif s.labels.get("collector") == "nvlink" and s.name == "fabric_state_file_problem":
                    found["problem"][s.labels["problem"]] = s.value
                elif s.labels.get("collector") == "nvlink" and s.name == "fabric_state_file_write_errors_total":
                    found["write_errors"]["total"] = s.value
        return found

    def close(self) -> None:
        self.collector.close()


@pytest.fixture
def node(tmp_path):
    made = Node(tmp_path / "state")
    yield made
    made.close()


def link_down(gpu=2, link=5, start=10.0, end=1e9):
    return Fault("nvlink_down", "gpu-node-0", start, end, target={"gpu": gpu, "link": link},
                 params={"precursor_seconds": 0})


T0 = 1_800_000_000.0


def test_a_healthy_node_exports_no_sightings_and_a_link_down_gets_its_two_at_the_next_scrape(node):
    healthy = node.at(1.0)
    assert len(healthy["state"]) == 4 * 18 and not healthy[ACTIVE] and not healthy[INACTIVE]
    assert healthy["problem"] == {"missing": 1, "corrupt": 0, "unreadable": 0}
    down = node.at(20.0, [link_down()])
    assert down["state"][("2", "5")] == 0
    assert down[INACTIVE] == {("2", "5"): T0 + 20}            # only the link that went down
    assert down[ACTIVE] == {("2", "5"): T0 + 1}               # the round before it did
    still = node.at(80.0, [link_down()])
    assert still[INACTIVE] == {("2", "5"): T0 + 80} and still[ACTIVE] == {("2", "5"): T0 + 1}
    back = node.at(90.0, [])                                  # fault over: active again, history kept
    assert back[ACTIVE] == {("2", "5"): T0 + 90} and back[INACTIVE] == {("2", "5"): T0 + 80}


def test_a_link_that_never_was_active_has_no_active_sighting(node):
    first = node.at(20.0, [link_down(start=0.0)])
    assert first[INACTIVE] == {("2", "5"): T0 + 20} and first[ACTIVE] == {}


def test_an_exporter_restarted_under_a_down_link_keeps_its_last_active_time(node):
    node.at(1.0)
    node.at(20.0, [link_down()])
    stored = json.loads((node.state_dir / "nvlink.json").read_text())
    assert stored["gpus"]["2"]["links"]["5"] == [T0 + 1, T0 + 20]
    node.restart()
    after = node.at(3600.0, [link_down()])
    assert after[ACTIVE] == {("2", "5"): T0 + 1}               # from before the restart
    assert after[INACTIVE] == {("2", "5"): T0 + 3600}
    assert after["problem"] == {"missing": 0, "corrupt": 0, "unreadable": 0}


def test_a_healthy_node_writes_its_last_active_times_once_a_minute_not_every_round(node):
    node.at(1.0)
    path = node.state_dir / "nvlink.json"
    written = path.stat().st_mtime_ns, path.read_text()
    node.at(30.0)
    assert (path.stat().st_mtime_ns, path.read_text()) == written
    node.at(61.0)
    assert json.loads(path.read_text())["gpus"]["0"]["links"]["0"] == [T0 + 61, None]
    node.restart()                                            # a link down while it was stopped
    after = node.at(600.0, [link_down()])
    # GPU 2's last-active as of the latest write, at most the refresh period older than its round at 61 s.
    assert T0 + 61 - PERSIST_ACTIVE_SECONDS <= after[ACTIVE][("2", "5")] <= T0 + 61


def test_a_link_back_up_for_longer_than_the_retention_is_forgotten(node):
    node.at(1.0)
    node.at(20.0, [link_down()])
    node.at(30.0, [])
    kept = node.at(30.0 + RETENTION_SECONDS - 60, [])
    assert kept[INACTIVE] == {("2", "5"): T0 + 20}
    gone = node.at(30.0 + RETENTION_SECONDS + 60, [])
    assert gone[INACTIVE] == {} and gone[ACTIVE] == {}
    assert json.loads((node.state_dir / "nvlink.json").read_text())["gpus"]["2"]["links"]["5"][1] is None


@pytest.mark.parametrize("damage, problem", [
    (lambda path: path.write_text('{"version": 1, "gpus": {"2": {"uuid": "x", "links": {"5": [1'), "corrupt"),
    (lambda path: path.write_text('{"version": 1, "gpus": {"2": {"uuid": "x", "links": {"5": "up"}}}}'), "corrupt"),
    (lambda path: path.write_text('{"version": 7, "gpus": {}}'), "corrupt"),
    (lambda path: os.mkfifo(path), "unreadable"),
])
def test_a_damaged_state_file_is_reported_and_sampling_goes_on(tmp_path, damage, problem):
    state = tmp_path / "state"
    state.mkdir()
    damage(state / "nvlink.json")
    node = Node(state)
    try:
        seen = node.at(1.0)
        assert seen["problem"][problem] == 1 and sum(seen["problem"].values()) == 1
        assert len(seen["state"]) == 4 * 18                    # the links are read and served all the same
        down = node.at(20.0, [link_down()])
        assert down[INACTIVE] == {("2", "5"): T0 + 20} and down[ACTIVE] == {("2", "5"): T0 + 1}
        if problem == "corrupt":
            assert list(state.glob("nvlink.json.corrupt-*"))   # kept for forensics, replaced by a good one
            assert json.loads((state / "nvlink.json").read_text())["gpus"]["2"]["links"]["5"] == [T0 + 1, T0 + 20]
    finally:
        node.close()


def test_a_state_dir_that_cannot_be_written_counts_write_errors_and_serves_the_sightings(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    node = Node(blocker / "state")
    try:
        node.at(1.0)
        down = node.at(20.0, [link_down()])
        assert down[INACTIVE] == {("2", "5"): T0 + 20}
        assert down["write_errors"]["total"] >= 2
    finally:
        node.close()


def test_a_gpu_replaced_at_its_index_starts_without_its_predecessors_history(node):
    node.at(1.0)
    node.at(20.0, [link_down()])
    path = node.state_dir / "nvlink.json"
    node.close()
    stored = json.loads(path.read_text())
    stored["gpus"]["2"]["uuid"] = "GPU-another-board"
    path.write_text(json.dumps(stored))
    node.restart()
    after = node.at(30.0, [])
    assert after[INACTIVE] == {} and after[ACTIVE] == {}
