"""Blast radius on small hand-built topologies, and the traversal against brute force."""
from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from fabricscope.chaos.blast import FAILURE_TYPES, BlastRadiusEngine, ChaosInputError, impact_score, initial_failures
from fabricscope.chaos.model import POWER, Job, Rank, Topology
from fabricscope.chaos.reference import NetworkxBlastRadius


def simulate(topology: Topology, device: str, failure_type: str = "device_failure"):
    """The compact engine's answer, checked against the networkx reference on the way."""
    result = BlastRadiusEngine(topology).simulate(device, failure_type)
    affected, jobs = NetworkxBlastRadius(topology).affected(device, failure_type)
    assert set(result.affected_devices) == affected
    assert set(result.affected_jobs) == jobs
    return result


def small_fabric(dual_homed: bool = False) -> Topology:
    """core <- spine x2 <- leaf x2; host-0 on leaf-0 (and leaf-1 when dual-homed), host-1 on
    leaf-1; each host has one GPU; two PDUs per rack; a job per host."""
    t = Topology("small")
    for rack in ("r0", "r1", "rnet"):
        t.add_device(f"pdu-{rack}-a", "pdu", rack=rack)
        t.add_device(f"pdu-{rack}-b", "pdu", rack=rack)
    t.add_device("core", "core_switch", rack="rnet")
    for name in ("spine-0", "spine-1"):
        t.add_device(name, "spine_switch", rack="rnet")
        t.add_link(name, "core", "infiniband")
    for name in ("leaf-0", "leaf-1"):
        t.add_device(name, "leaf_switch", rack="rnet")
        t.add_link(name, "spine-0", "infiniband")
        t.add_link(name, "spine-1", "infiniband")
    for i in range(2):
        host, rack = f"host-{i}", f"r{i}"
        t.add_device(host, "gpu_server", rack=rack)
        t.add_power_feed(f"pdu-{rack}-a", host)
        t.add_power_feed(f"pdu-{rack}-b", host)
        t.add_device(f"{host}/gpu0", "gpu", host=host, rack=rack)
        t.add_link(f"{host}/gpu0", host, "pcie")
    for switch in ("core", "spine-0", "spine-1", "leaf-0", "leaf-1"):
        t.add_power_feed("pdu-rnet-a", switch)
    t.add_link("host-0", "leaf-0", "infiniband")
    if dual_homed:
        t.add_link("host-0", "leaf-1", "infiniband")
    t.add_link("host-1", "leaf-1", "infiniband")
    t.add_job(Job("job-a", [Rank(0, "host-0/gpu0", "host-0")]))
    t.add_job(Job("job-b", [Rank(0, "host-1/gpu0", "host-1")]))
    return t


def test_device_failure_takes_the_server_components_and_its_job():
    result = simulate(small_fabric(), "host-0")
    assert result.removed_devices == ["host-0", "host-0/gpu0"]
    assert result.affected_jobs == ["job-a"]
    assert result.path[0] == {"device": "host-0", "via": None, "reason": "failed"}
    assert result.path[1] == {"device": "host-0/gpu0", "via": "host-0", "reason": "contained"}


def test_switch_failure_cuts_single_homed_hosts_and_spares_dual_homed_ones():
    single = simulate(small_fabric(), "leaf-0", "switch_failure")
    assert set(single.affected_devices) == {"leaf-0", "host-0", "host-0/gpu0"}
    assert single.disconnected_devices == {"host-0": ["default"], "host-0/gpu0": ["default"]}
    assert single.affected_jobs == ["job-a"]
    dual = simulate(small_fabric(dual_homed=True), "leaf-0", "switch_failure")
    assert dual.affected_devices == ["leaf-0"]
    assert dual.affected_jobs == []
    # Losing the second leaf too leaves no path: it is reported by the second leaf's failure.
    t = small_fabric(dual_homed=True)
    t.set_link_state("host-0", "leaf-0", "down")
    t.set_link_state("leaf-0", "host-0", "down")
    assert simulate(t, "leaf-1", "switch_failure").affected_jobs == ["job-a", "job-b"]


def test_switch_failure_on_a_spine_is_absorbed_by_the_other_spine():
    result = simulate(small_fabric(), "spine-0", "switch_failure")
    assert result.affected_devices == ["spine-0"]
    assert result.impact_score == pytest.approx(0.4 * 1 / result.total_devices)


def test_switch_failure_needs_a_switch():
    with pytest.raises(ChaosInputError) as err:
        BlastRadiusEngine(small_fabric()).simulate("host-0", "switch_failure")
    assert err.value.field == "device"
    assert "leaf_switch" in err.value.choices and "gpu_server" in str(err.value)


def test_power_failure_darkens_what_loses_every_feed():
    t = small_fabric()
    # One PDU of a dual-fed rack: nothing goes dark.
    assert simulate(t, "pdu-r0-a").affected_devices == ["pdu-r0-a"]
    # The power domain of host-0: both of its PDUs.
    result = simulate(t, "host-0", "power_failure")
    assert result.removed_devices[:2] == ["pdu-r0-a", "pdu-r0-b"]
    assert set(result.affected_devices) == {"pdu-r0-a", "pdu-r0-b", "host-0", "host-0/gpu0"}
    # A GPU's power domain is its server's.
    assert simulate(t, "host-0/gpu0", "power_failure").removed_devices[:2] == ["pdu-r0-a", "pdu-r0-b"]
    # The network rack's switches hang off PDU A alone: losing it cuts everyone.
    result = simulate(t, "pdu-rnet-a")
    assert {"core", "leaf-0", "host-1/gpu0"} <= set(result.affected_devices)
    assert result.affected_jobs == ["job-a", "job-b"]


def test_power_failure_needs_a_feed():
    with pytest.raises(ChaosInputError, match="no power feed"):
        BlastRadiusEngine(_without_feeds()).simulate("lonely", "power_failure")


def _without_feeds() -> Topology:
    t = Topology()
    t.add_device("lonely", "server")
    return t


def test_rack_failure_by_device_or_by_rack_name():
    t = small_fabric()
    by_device = simulate(t, "host-1/gpu0", "rack_failure")
    by_name = simulate(t, "r1", "rack_failure")
    assert set(by_device.affected_devices) == set(by_name.affected_devices) == {
        "host-1", "host-1/gpu0", "pdu-r1-a", "pdu-r1-b"}
    assert by_device.path[0]["reason"] == "rack"
    network = simulate(t, "rnet", "rack_failure")
    assert network.affected_jobs == ["job-a", "job-b"]
    with pytest.raises(ChaosInputError, match="in no rack"):
        BlastRadiusEngine(_without_feeds()).simulate("lonely", "rack_failure")


def test_vlan_boundaries_are_not_crossed():
    """host-a (VLAN 10) and host-b (VLAN 20) are both cabled to leaf-1, which carries VLAN 10
    only, so host-b's VLAN 20 path is leaf-2's. Failing leaf-2 cuts host-b although a
    physical path through leaf-1 remains; failing leaf-1 cuts host-a only."""
    t = Topology("vlans")
    t.add_device("core", "core_switch")
    t.add_device("leaf-1", "leaf_switch", partitions=["vlan10"])
    t.add_device("leaf-2", "leaf_switch")
    t.add_device("host-a", "server", partitions=["vlan10"])
    t.add_device("host-b", "server", partitions=["vlan20"])
    t.add_link("leaf-1", "core", "ethernet", partition="vlan10")
    t.add_link("leaf-2", "core", "ethernet", partition="vlan20")
    t.add_link("host-a", "leaf-1", "ethernet", partition="vlan10")
    t.add_link("host-b", "leaf-1", "ethernet", partition="vlan20")
    t.add_link("host-b", "leaf-2", "ethernet", partition="vlan20")
    assert simulate(t, "leaf-2").affected_devices == ["host-b", "leaf-2"]
    assert simulate(t, "leaf-1").affected_devices == ["host-a", "leaf-1"]


def test_a_device_in_two_partitions_does_not_bridge_them():
    """A GPU reaches the fabric through its own HCA only; the host's other NIC is in
    another partition and cannot stand in for it."""
    t = Topology()
    t.add_device("core", "core_switch")
    t.add_device("leaf-c", "leaf_switch")
    t.add_device("leaf-s", "leaf_switch")
    t.add_device("host", "gpu_server")
    t.add_device("host/gpu0", "gpu", host="host")
    t.add_device("host/hca0", "hca", host="host")
    t.add_device("host/nic", "nic", host="host")
    t.add_link("leaf-c", "core", "infiniband", partition="compute")
    t.add_link("leaf-s", "core", "ethernet", partition="storage")
    t.add_link("host/gpu0", "host/hca0", "pcie", partition="compute")
    t.add_link("host/hca0", "leaf-c", "infiniband", partition="compute")
    t.add_link("host/nic", "leaf-s", "ethernet", partition="storage")
    t.add_link("host", "host/nic", "pcie", partition="storage")
    t.add_link("host", "host/gpu0", "pcie", partition="storage")   # a miswired partition: still no bridge
    result = simulate(t, "leaf-c")
    assert result.disconnected_devices == {"host/gpu0": ["compute"], "host/hca0": ["compute"]}


def test_directed_link_state():
    """host dual-homed, but its link to leaf-2 only transmits: with leaf-1 gone it can
    send but not receive, so it is cut off."""
    t = Topology()
    t.add_device("core", "core_switch")
    for leaf in ("leaf-1", "leaf-2"):
        t.add_device(leaf, "leaf_switch")
        t.add_link(leaf, "core", "infiniband")
    t.add_device("host", "server")
    t.add_link("host", "leaf-1", "infiniband")
    t.add_link("host", "leaf-2", "infiniband", state="up", reverse_state="down")
    assert simulate(t, "leaf-1").affected_devices == ["host", "leaf-1"]
    t.set_link_state("leaf-2", "host", "up")
    assert simulate(t, "leaf-1").affected_devices == ["leaf-1"]
    # A device cut off before the failure is not the failure's doing.
    t.set_link_state("host", "leaf-1", "down")
    t.set_link_state("host", "leaf-2", "down")
    assert simulate(t, "leaf-1").affected_devices == ["leaf-1"]


def test_job_impact_and_the_score_formula():
    t = small_fabric()
    t.add_job(Job("job-both", [Rank(0, "host-0/gpu0", "host-0"), Rank(1, "host-1/gpu0", "host-1")]))
    t.add_job(Job("job-idle", [Rank(0, "host-0/gpu0", "host-0")], active=False))
    result = simulate(t, "host-0/gpu0")
    assert result.affected_jobs == ["job-a", "job-both"]
    assert result.total_active_jobs == 3
    assert result.affected_device_count == 1
    expected = 0.4 * 1 / result.total_devices + 0.6 * 2 / 3
    assert result.impact_score == pytest.approx(expected, abs=1e-6)
    assert impact_score(0, 10, 0, 0) == 0.0
    assert impact_score(10, 10, 4, 4) == pytest.approx(1.0)
    assert impact_score(5, 10, 1, 4) == pytest.approx(0.2 + 0.15)


def test_include_jobs_false_keeps_the_count_and_drops_the_names():
    result = BlastRadiusEngine(small_fabric()).simulate("host-0", include_jobs=False)
    assert result.affected_jobs is None and result.affected_job_count == 1


def test_path_is_in_bfs_order_from_the_failed_device():
    result = simulate(small_fabric(), "leaf-0", "switch_failure")
    seen = set()
    for step in result.path:
        assert step["via"] is None or step["via"] in seen
        seen.add(step["device"])
    assert seen == set(result.affected_devices)
    assert result.path[1] == {"device": "host-0", "via": "leaf-0", "reason": "lost default (infiniband link)"}


def test_bad_requests_name_the_valid_choices():
    engine = BlastRadiusEngine(small_fabric())
    with pytest.raises(ChaosInputError) as err:
        engine.simulate("leaf-9")
    assert err.value.field == "device" and "leaf-0" in err.value.choices
    with pytest.raises(ChaosInputError) as err:
        engine.simulate("leaf-0", "meteor_strike")
    assert err.value.field == "failure_type" and err.value.choices == list(FAILURE_TYPES)


def test_anchors_default_to_the_top_tier_of_each_partition():
    t = small_fabric()
    assert t.anchors() == {"default": {"core"}}
    t2 = Topology()
    t2.add_device("a", "server", anchor=True)
    t2.add_device("b", "core_switch")
    t2.add_link("a", "b", "ethernet")
    assert t2.anchors() == {"default": {"a"}}


# ---- property: the traversal equals brute-force reachability ---------------------------------

def brute_force_affected(t: Topology, failed: list[str]) -> tuple[set[str], set[str]]:
    graph = t.graph
    removed = set(failed)
    changed = True
    while changed:              # fixed point, no queue: as plain as it gets
        changed = False
        for name, data in graph.nodes(data=True):
            if name in removed:
                continue
            feeds = t.power_feeds(name)
            if data["host"] in removed or (feeds and all(f in removed for f in feeds)):
                removed.add(name)
                changed = True
    members = t.memberships()
    anchors = t.anchors(members)

    def connected(gone: set[str]) -> set[tuple[str, str]]:
        out = set()
        for part, roots in anchors.items():
            g = nx.DiGraph()
            g.add_nodes_from(n for n in graph if part in members[n] and n not in gone)
            g.add_edges_from((a, b) for a, b, d in graph.edges(data=True)
                             if d["kind"] != POWER and d["partition"] == part and d["state"] == "up"
                             and a in g and b in g)
            live = [r for r in roots if r in g]
            for node in g:
                if any(nx.has_path(g, r, node) for r in live) and any(nx.has_path(g, node, r) for r in live):
                    out.add((node, part))
        return out

    lost = {d for d, _ in connected(set()) - connected(removed)}
    affected = removed | lost
    jobs = {j.name for j in t.active_jobs() if j.devices() & affected}
    return affected, jobs


@st.composite
def random_topologies(draw):
    kinds = ["server", "gpu_server", "gpu", "leaf_switch", "spine_switch", "core_switch", "pdu"]
    n = draw(st.integers(2, 9))
    t = Topology("random")
    names = []
    for i in range(n):
        kind = draw(st.sampled_from(kinds))
        hosts = [m for m in names if t.kind(m) == "gpu_server"]
        host = draw(st.sampled_from([None, *hosts])) if kind in ("gpu", "server") and hosts else None
        parts = draw(st.sampled_from([None, None, ["a"], ["b"], ["a", "b"]]))
        t.add_device(f"d{i}", kind, host=host, partitions=parts, rack=draw(st.sampled_from([None, "r0", "r1"])),
                     anchor=draw(st.booleans()) if draw(st.integers(0, 5)) == 0 else False)
        names.append(f"d{i}")
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    for a, b in pairs:
        a, b = names[a], names[b]
        if a == b or t.graph.has_edge(a, b) or t.graph.has_edge(b, a):
            continue
        if t.kind(a) == "pdu" and t.kind(b) != "pdu" and draw(st.booleans()):
            t.add_power_feed(a, b)
            continue
        t.add_link(a, b, "ethernet", partition=draw(st.sampled_from(["a", "b"])),
                   state=draw(st.sampled_from(["up", "up", "down"])),
                   reverse_state=draw(st.sampled_from(["up", "up", "down"])))
    for j in range(draw(st.integers(0, 3))):
        members = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        t.add_job(Job(f"job{j}", [Rank(k, None, m) for k, m in enumerate(members)],
                      active=draw(st.booleans())))
    return t


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bfs_equals_brute_force_reachability(data):
    t = data.draw(random_topologies())
    device = data.draw(st.sampled_from(sorted(t.graph)))
    note(f"nodes={dict(t.graph.nodes(data=True))} edges={list(t.graph.edges(data=True))} "
         f"jobs={t.jobs}")
    engine = BlastRadiusEngine(t)
    reference = NetworkxBlastRadius(t)
    for failure_type in FAILURE_TYPES:
        try:
            result = engine.simulate(device, failure_type)
        except ChaosInputError:
            continue
        expected, jobs = brute_force_affected(t, initial_failures(t, device, failure_type))
        assert set(result.affected_devices) == expected, failure_type
        assert set(result.affected_jobs) == jobs
        assert reference.affected(device, failure_type) == (expected, jobs)
        assert result.impact_score == pytest.approx(
            impact_score(len(expected), len(t), len(jobs), len(t.active_jobs())), abs=1e-6)
