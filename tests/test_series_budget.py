"""The per-node series budget: an 8-GPU demo node with every collector on at its defaults
exports at most 1,500 series, healthy and under faults, and keeps every series an alert
reads (about 10 s: one simulated node stepped through 90 s of scenario time, twice)."""
from __future__ import annotations

import re

import pytest

from fabricscope.demo.series import BEGIN, DOC, FAULTS, SERIES_BUDGET, measure_node_series


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series")
    return measure_node_series(tmp / "quiet"), measure_node_series(tmp / "faulted", FAULTS)


def test_an_eight_gpu_node_stays_within_the_series_budget(runs):
    quiet, faulted = runs
    for run in (quiet, faulted):
        assert run.total <= SERIES_BUDGET, run.by_collector
        # Every collector is on and exports: a budget met by a collector that failed or
        # was left out would be no budget.
        assert {"nvlink", "infiniband", "nccl", "ebpf", "netdev", "tcp", "kmsg"} <= set(run.by_collector)
        assert all(count > 0 for count in run.by_collector.values()), run.by_collector
        assert 'fabric_scrape_collector_success{collector="nvlink"' in run.exposition
        assert not re.search(r"^fabric_scrape_collector_success\{.*\} 0", run.exposition, re.M)
    # Faults add what they make appear (a link's error counters, breaches), nothing else.
    assert quiet.by_collector["nvlink"] < faulted.by_collector["nvlink"]
    assert quiet.by_collector["infiniband"] < faulted.by_collector["infiniband"]


def count(body: str, name: str) -> int:
    return len(re.findall(rf"^{name}\{{", body, re.M))


def test_the_faulted_node_keeps_every_alert_input(runs):
    quiet, faulted = runs
    body = faulted.exposition
    # NVLink: the erroring link's counters (the error-rate rule) and no healthy link's, every
    # GPU's totals, the per-link state (link down) and bytes (throughput collapse) of all 144.
    assert count(quiet.exposition, "fabric_nvlink_errors_total") == 0
    assert re.search(r'^fabric_nvlink_errors_total\{gpu="3",link="7",node="[^"]+",type="crc_flit"\} [1-9]', body, re.M)
    assert {m for m in re.findall(r'^fabric_nvlink_errors_total\{gpu="(\d+)",link="(\d+)"', body, re.M)} == {("3", "7")}
    assert count(body, "fabric_nvlink_gpu_errors_total") == 8 * 4
    assert count(body, "fabric_nvlink_state") == count(body, "fabric_nvlink_bytes_total") == 8 * 18
    assert re.search(r'^fabric_nvlink_state\{gpu="3",link="7",node="[^"]+"\} 0', body, re.M)
    # The link-down alert's input: the sightings of the link with a down history, of no other.
    for name in ("fabric_nvlink_last_active_timestamp_seconds", "fabric_nvlink_last_inactive_timestamp_seconds"):
        assert count(quiet.exposition, name) == 0
        assert re.findall(rf'^{name}\{{gpu="(\d+)",link="(\d+)"', body, re.M) == [("3", "7")]
    # The per-remote-end link counts the live topology and the fleet questions read: one per
    # GPU and NVSwitch, and an inactive one only where a link is down.
    assert count(quiet.exposition, "fabric_nvlink_remote_links") == 8 * 4
    assert re.findall(r'^fabric_nvlink_remote_links\{gpu="(\d+)",[^}]*state="inactive"\} (\S+)', body, re.M) == [
        ("3", "1.0")]
    # InfiniBand: the flapping port's latched breach; judged counters are always exported.
    assert re.search(r'^fabric_infiniband_port_counter_breached\{counter="link_downed",device="mlx5_5"', body, re.M)
    assert re.search(r'^fabric_infiniband_port_counter_total\{counter="symbol_error",device="mlx5_3"', body, re.M)
    # The TCP RTT excess histogram keeps the microburst rule's resolution; NCCL the straggler rule's input.
    assert count(body, "fabric_tcp_rtt_excess_seconds_bucket") == 122
    # ...and the rule reads the exporter's p99 of it: one series.
    assert count(body, "fabric_tcp_rtt_excess_window_seconds") == 1
    assert count(body, "fabric_nccl_arrival_lag_seconds_sum") == 8


def test_docs_list_the_series_per_collector():
    listed = DOC.read_text().split(BEGIN, 1)[1]
    assert "| `nvlink` |" in listed and "| **total** |" in listed
