"""Threshold config and the delta/velocity counter monitor, driven by an injected clock."""
from __future__ import annotations

import pytest

from fabricscope.exporter.health.counter_monitor import CounterMonitor
from fabricscope.exporter.config import section
from fabricscope.exporter.schema import ConfigError
from fabricscope.exporter.health.thresholds import (DEFAULT_THRESHOLDS, CounterThreshold,
                                        load_thresholds)


def by_key(thresholds):
    return {str(t.key): t for t in thresholds}


def test_defaults_match_the_design():
    defaults = by_key(DEFAULT_THRESHOLDS)
    assert defaults["link_downed:fatal"] == CounterThreshold("link_downed", "delta", 0, "fatal")
    # Symbol errors are non-fatal; their 120/hour BER boundary lives in the rules only.
    assert "symbol_error:fatal" not in defaults
    assert defaults["symbol_error:non_fatal"] == CounterThreshold("symbol_error", "velocity", 10, "non_fatal", 1)
    assert defaults["link_error_recovery:non_fatal"].unit_seconds == 60
    assert defaults["carrier_changes:non_fatal"].kind == "delta"
    assert {t.counter for t in DEFAULT_THRESHOLDS if t.severity == "fatal"} == {
        "link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors", "rnr_nak_retry_err"}


def test_config_overrides_adds_and_disables():
    thresholds = by_key(load_thresholds({"thresholds": [
        {"counter": "symbol_error", "type": "velocity", "threshold": 50, "unit": "1m", "severity": "non_fatal"},
        {"counter": "symbol_error", "type": "velocity", "threshold": 1000, "unit": "hour", "severity": "fatal"},
        {"counter": "port_xmit_wait", "severity": "non_fatal", "enabled": False},
        {"counter": "req_cqe_error", "type": "delta", "threshold": 3, "severity": "fatal"},
    ]}))
    assert thresholds["symbol_error:non_fatal"].limit == 50 and thresholds["symbol_error:non_fatal"].unit_seconds == 60
    assert thresholds["symbol_error:fatal"].limit == 1000         # an operator may still add one
    assert "port_xmit_wait:non_fatal" not in thresholds
    assert thresholds["req_cqe_error:fatal"].kind == "delta"
    only = load_thresholds({"replace_default_thresholds": True,
                            "thresholds": [{"counter": "link_downed", "type": "delta", "threshold": 2}]})
    assert [t.key for t in only] == [("link_downed", "non_fatal")]


@pytest.mark.parametrize("entry, message", [
    ({"counter": "x", "type": "rate", "threshold": 1}, "[0].type: input should be 'delta' or 'velocity', got 'rate'"),
    ({"counter": "x", "type": "delta", "threshold": -1}, "[0].threshold: input should be greater than or equal to 0"),
    ({"counter": "x", "type": "delta", "threshold": "10"}, "[0].threshold: input should be a valid number, got '10'"),
    ({"counter": "x", "type": "velocity", "threshold": 1, "unit": "day"}, "[0].unit: input should be 'second'"),
    ({"counter": "x", "type": "delta", "threshold": 1, "unit": "second"}, "only applies to velocity"),
    ({"counter": "x", "type": "delta", "threshold": 1, "severity": "critical"},
     "[0].severity: input should be 'fatal' or 'non_fatal'"),
    ({"type": "delta", "threshold": 1}, "[0].counter: required key is missing"),
    ({"counter": "../etc/passwd", "type": "delta", "threshold": 1}, "[0].counter: string should match pattern"),
    ({"counter": "x", "type": "delta", "threshold": 1, "isFatal": True}, "[0].isFatal: unknown key"),
    ({"counter": "x", "threshold": 1}, "`type` (delta or velocity) is required"),
    ("symbol_error", "[0]: input should be a valid dictionary"),
])
def test_config_errors_are_specific(entry, message):
    with pytest.raises(ConfigError) as info:
        section({"infiniband": {"thresholds": [entry]}}, "infiniband", "c.yml")
    assert str(info.value).startswith("c.yml: infiniband.thresholds[0]") and message in str(info.value)


def monitor(*thresholds):
    return CounterMonitor(thresholds, clock=lambda: 0.0)


DELTA = CounterThreshold("link_downed", "delta", 0, "fatal")
PER_SECOND = CounterThreshold("symbol_error", "velocity", 10, "non_fatal", 1)
PER_HOUR = CounterThreshold("symbol_error", "velocity", 120, "fatal", 3600)


def test_delta_breach_latches_until_counter_reset():
    m = monitor(DELTA)
    assert m.observe("p", {"link_downed": 3}, 0).latched == []          # first sample: baseline only
    verdict = m.observe("p", {"link_downed": 4}, 1)
    assert verdict.breaches == [DELTA] and verdict.latched == [DELTA]
    assert m.observe("p", {"link_downed": 4}, 2).latched == [DELTA]     # quiet, still flagged
    verdict = m.observe("p", {"link_downed": 0}, 3)                     # perfquery -x
    assert verdict.resets == ["link_downed"] and verdict.recoveries == ["link_downed"] and verdict.latched == []
    assert m.reset_counts[("p", "link_downed")] == 1
    assert m.observe("p", {"link_downed": 0}, 4).latched == []


def test_velocity_not_judged_before_a_full_window():
    m = monitor(PER_SECOND)
    m.observe("p", {"symbol_error": 0}, 0.0)
    # 50 errors in half a second would be 100/s extrapolated: not judged, the window is not full.
    assert m.observe("p", {"symbol_error": 50}, 0.5).breaches == []
    assert m.observe("p", {"symbol_error": 50}, 1.0).breaches == [PER_SECOND]   # 50 over a full second


def test_velocity_below_threshold_is_not_a_breach():
    m = monitor(PER_SECOND)
    for step in range(6):
        verdict = m.observe("p", {"symbol_error": step * 5}, step * 0.5)    # 10/s exactly: not > 10
    assert verdict.latched == []


def test_velocity_per_hour_and_recovery_after_a_quiet_window():
    m = monitor(PER_HOUR)
    m.observe("p", {"symbol_error": 0}, 0)
    assert m.observe("p", {"symbol_error": 200}, 1800).latched == []     # half an hour: not judged
    assert m.observe("p", {"symbol_error": 200}, 3599).latched == []
    assert m.observe("p", {"symbol_error": 200}, 3600).breaches == [PER_HOUR]   # 200 in one hour > 120
    assert m.observe("p", {"symbol_error": 200}, 5000).latched == [PER_HOUR]    # window still holds errors
    verdict = m.observe("p", {"symbol_error": 200}, 1800 + 3600)                 # a full quiet hour
    assert verdict.recoveries == ["symbol_error"] and verdict.latched == []


def test_burst_after_a_long_quiet_period_is_not_diluted():
    m = monitor(PER_SECOND)
    for second in range(3601):
        m.observe("p", {"symbol_error": 0}, float(second))
    assert m.observe("p", {"symbol_error": 11}, 3601.0).breaches == [PER_SECOND]


def test_absent_value_keeps_history_and_latch():
    m = monitor(DELTA)
    m.observe("p", {"link_downed": 1}, 0)
    m.observe("p", {"link_downed": 2}, 1)
    assert m.observe("p", {"link_downed": None}, 2).latched == [DELTA]
    assert m.observe("p", {"link_downed": 2}, 3).latched == [DELTA]


def test_routine_counter_movement_is_persisted_at_most_once_a_minute():
    m = monitor(PER_SECOND)
    m.observe("p", {"symbol_error": 0}, 0)
    assert m.take_changed(0)                     # first sighting: write
    m.observe("p", {"symbol_error": 1}, 1)       # moved, under every threshold
    assert not m.take_changed(1)                 # not worth an fsync on this scrape
    m.observe("p", {"symbol_error": 2}, 59)
    assert not m.take_changed(59)
    m.observe("p", {"symbol_error": 3}, 60)
    assert m.take_changed(60)                    # a minute on: the snapshot catches up
    assert m.persisted()["p"]["symbol_error"]["v"] == 3
    m.observe("p", {"symbol_error": 0}, 61)      # a reset is persisted at once
    assert m.take_changed(61)


def test_persisted_snapshot_restores_latch_and_baseline():
    m = monitor(DELTA, PER_SECOND)
    m.observe("p", {"link_downed": 1, "symbol_error": 0}, 0)
    m.observe("p", {"link_downed": 2, "symbol_error": 0}, 1)
    assert m.take_changed()
    m.observe("p", {"link_downed": 2, "symbol_error": 0}, 2)
    assert not m.take_changed()                  # nothing moved: no state write needed
    restored = monitor(DELTA, PER_SECOND)
    restored.restore(m.persisted())
    assert restored.observe("p", {"link_downed": 2, "symbol_error": 0}, 3).latched == [DELTA]
    # A link_downed that moved while the exporter was not running is still seen.
    fresh = monitor(DELTA)
    fresh.restore({"p": {"link_downed": {"t": 0, "v": 2, "latched": []}}})
    assert fresh.observe("p", {"link_downed": 3}, 10).breaches == [DELTA]
    junk = monitor(DELTA)
    junk.restore({"p": {"link_downed": {"t": "x"}}, "q": 5})
    assert junk.persisted() == {}


def test_wall_clock_stepping_back_judges_nothing():
    m = monitor(DELTA, PER_SECOND)
    m.observe("p", {"link_downed": 0, "symbol_error": 0}, 100.0)
    verdict = m.observe("p", {"link_downed": 1, "symbol_error": 500}, 50.0)     # NTP step backwards
    assert verdict.breaches == [] and verdict.latched == []
    # Once time passes the last sample again, judging resumes against the kept history.
    assert m.observe("p", {"link_downed": 2, "symbol_error": 500}, 101.0).breaches == [DELTA, PER_SECOND]
