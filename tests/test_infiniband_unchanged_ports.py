"""The health tracker's shortcut for ports read exactly as on the last scrape
(HealthTracker._unchanged_port) must never change a verdict. A tracker that judges every
port on every scrape and one that takes the shortcut are fed the same random scrapes
(quiet stretches, error bursts, counter resets, unreadable counters, a device that vanishes
and returns, link state changes, the clock stepping back, traffic on counters no threshold
judges and their resets) and must agree on everything
they export and persist, after every scrape."""
from __future__ import annotations

import copy
import random

import pytest

from fabricscope.exporter.health.thresholds import DEFAULT_THRESHOLDS
from fabricscope.exporter.health.tracker import HealthTracker
from fabricscope.exporter.parsers.infiniband import CodedState, InfiniBandDevice, InfiniBandPort, PortCounters
from fabricscope.exporter.statefile import StateFile

ACTIVE, DOWN = CodedState(4, "ACTIVE"), CodedState(1, "DOWN")
LINK_UP, POLLING = CodedState(5, "LinkUp"), CodedState(2, "Polling")
MONITORED = sorted({t.counter for t in DEFAULT_THRESHOLDS} - {"carrier_changes"})
COUNTER_FIELDS = set(PortCounters.__dataclass_fields__) - {"other"}


class JudgesEveryPort(HealthTracker):
    def _unchanged_port(self, *args):
        return None


def _device(name: str, counters: dict[str, int | None], state: CodedState, phys: CodedState) -> InfiniBandDevice:
    port = InfiniBandPort(name, 1, state=state, phys_state=phys, link_layer="InfiniBand")
    known = {k: v for k, v in counters.items() if k in COUNTER_FIELDS and v is not None}
    port.counters = PortCounters(**known)
    port.hw_counters = {k: v for k, v in counters.items() if k not in COUNTER_FIELDS and v is not None}
    return InfiniBandDevice(name, ports=[port])


def _observable(tracker: HealthTracker, health) -> tuple:
    return (
        {key: (h.fatal, dict(h.breached), h.uncabled, h.inhomogeneous) for key, h in health.ports.items()},
        dict(health.missing), dict(tracker.events), tracker.reset_counts, copy.deepcopy(tracker.port_states),
        dict(tracker.down_transitions), tracker.monitor.persisted(),
        {port: {c: (t.runs, sorted(t.latched)) for c, t in tracks.items()}
         for port, tracks in tracker.monitor._ports.items()},
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_shortcut_for_unchanged_ports_agrees_with_judging_every_port(tmp_path, seed):
    rng = random.Random(seed)
    clock = [1_000_000.0]
    trackers = [cls(StateFile(tmp_path / f"{cls.__name__}.json"), DEFAULT_THRESHOLDS, tmp_path / "proc",
                    lambda: clock[0]) for cls in (JudgesEveryPort, HealthTracker)]
    names = ["mlx5_0", "mlx5_1", "mlx5_2"]
    values = {n: {c: 0 for c in [*MONITORED, "port_rcv_data"]} for n in names}
    link = {n: (ACTIVE, LINK_UP) for n in names}
    shortcuts = 0
    for step in range(400):
        clock[0] += rng.choice([1, 5, 15, 15, 15, 60, 700]) if rng.random() > 0.02 else -30
        gone = set()
        for name in names:
            roll = rng.random()
            counters = values[name]
            if roll < 0.04:
                counter = rng.choice(MONITORED)
                if counters[counter] is not None:
                    counters[counter] += rng.choice([1, 3, 40, 5000])
            elif roll < 0.06:
                counter = rng.choice(MONITORED)
                counters[counter] = 0 if counters[counter] else None     # cleared, or unreadable
            elif roll < 0.07:
                counter = rng.choice(MONITORED)
                if counters[counter] is None:
                    counters[counter] = 7                                  # readable again
            elif roll < 0.09:
                link[name] = (DOWN, POLLING) if link[name][0] is ACTIVE else (ACTIVE, LINK_UP)
            elif roll < 0.10:
                gone.add(name)
            elif roll < 0.40:
                counters["port_rcv_data"] += 100                          # traffic, judged by nobody
            elif roll < 0.42:
                counters["port_rcv_data"] = 0                             # cleared (perfquery -x): a reset
        devices = [_device(n, values[n], *link[n]) for n in names if n not in gone]
        roles = {n: "management" if n == "mlx5_2" else "compute" for n in names}
        before = len(trackers[1]._last_judged)
        results = [_observable(t, t.update(copy.deepcopy(devices), roles)) for t in trackers]
        shortcuts += before > 0 and sum(1 for d in devices if trackers[1]._last_judged.get(d.ports[0].key))
        assert results[0] == results[1], f"seed {seed}, scrape {step}"
    assert shortcuts > 100   # the shortcut was taken, not only the full judgement
