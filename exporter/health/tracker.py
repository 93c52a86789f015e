"""Node-level InfiniBand health across scrapes, with persistent local state.

Kept in <state_dir>/infiniband.json (atomic StateFile) so an exporter restart neither
forgets a latched breach nor misses a link_downed that moved while it was down:

  boot_id        <procfs>/sys/kernel/random/boot_id at the last scrape
  known_devices  device -> {"ports": [...], "role": ...}   (disappearance detection)
  ports          "dev/port" -> {"state": name, "fatal": bool}  (transitions, recovery)
  down_transitions "dev/port" -> count of ACTIVE -> not ACTIVE
  counters       CounterMonitor snapshots and latched breach flags

In memory a port is a PortKey and a threshold a ThresholdKey; they become the "dev/port"
and "counter:severity" texts only in this file (_restore and _save, CounterMonitor's
persisted and restore).

A boot-ID change clears all of it (NICs may have been replaced during maintenance) and
every port gets a baseline event again: `baseline` when healthy, fatal/non_fatal when not.
Management NICs never produce fatal verdicts: their fatal conditions are downgraded to
non_fatal, because losing the management path does not fail the training job.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Mapping

from ..parsers.files import ReadProblem, read_small_text
from ..parsers.infiniband import InfiniBandDevice, InfiniBandPort, PortKey
from ..statefile import StateFile
from .counter_monitor import CounterMonitor
from .link_state import inhomogeneous_devices, is_active, is_link_healthy, is_state_fatal, uncabled_ports
from .thresholds import CounterThreshold, ThresholdKey


@dataclass(slots=True)
class PortHealth:
    fatal: bool = False
    # (counter, effective severity) -> 0/1 for every threshold whose counter was seen.
    breached: dict[ThresholdKey, int] = field(default_factory=dict)
    uncabled: bool = False
    inhomogeneous: bool = False


@dataclass(slots=True)
class _Judged:
    """What a port was judged on at the last scrape (_judged_on), and the verdict (before
    the node-wide uncabled and homogeneity checks, made on every scrape)."""
    inputs: tuple
    absent: frozenset[str]            # monitored counters that were not read
    health: PortHealth


def _judged_on(port: InfiniBandPort, management: bool, monitored_values: tuple) -> tuple:
    """Everything of a port its verdict depends on, besides the monitor's history: its role,
    link state and the values of the counters a threshold judges. Not the other counters:
    the data and packet counts of a busy port move on every scrape and judge nothing (their
    resets are counted on every scrape all the same, _count_other_resets)."""
    return (management, monitored_values, port.state, port.phys_state, port.carrier_changes)


@dataclass
class NodeHealth:
    ports: dict[PortKey, PortHealth]
    missing: dict[str, int]                                   # known device -> 0/1


def counter_value(port: InfiniBandPort, counter: str) -> int | None:
    if counter == "carrier_changes":
        return port.carrier_changes
    value = port.counters.get(counter)
    return port.hw_counters.get(counter) if value is None else value


class HealthTracker:
    def __init__(self, state_file: StateFile, thresholds: tuple[CounterThreshold, ...], procfs: Path | str,
                 clock: Callable[[], float]) -> None:
        self.state_file = state_file
        self.procfs = procfs
        self.clock = clock
        self.monitor = CounterMonitor(thresholds, clock)
        self.events: dict[tuple[PortKey, str], int] = {}      # (port, severity) -> count
        # Resets of counters without a threshold, seen against the previous scrape only
        # (not persisted: they are informational and would make every scrape a state write).
        self._last_counters: dict[PortKey, dict[str, int]] = {}
        self._counted_from: dict[PortKey, tuple] = {}   # the objects _last_counters was taken from
        self._other_resets: dict[tuple[PortKey, str], int] = {}
        # Per port seen on the last scrape: what it was judged on and the verdict (see
        # _unchanged_port). Rebuilt every scrape, so a port that vanished is judged afresh.
        self._last_judged: dict[PortKey, _Judged] = {}
        self.boot_id_changes = 0
        data = state_file.load()
        self.load_problem = state_file.load_problem
        try:
            self._restore(data)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            # Valid JSON of the wrong shape is as useless as torn JSON: set it aside, start clean.
            state_file.set_aside(f"wrong shape: {exc!r}")
            self.load_problem = state_file.load_problem
            self._restore({})
        self._dirty = self.load_problem is not None

    def _restore(self, data: dict) -> None:
        self.boot_id: str | None = data.get("boot_id")
        if self.boot_id is not None and not isinstance(self.boot_id, str):
            raise TypeError("boot_id")
        self.known_devices: dict[str, dict] = {str(k): dict(v) for k, v in data.get("known_devices", {}).items()}
        for info in self.known_devices.values():
            info["ports"] = [_port_number(p) for p in info.get("ports", [])]
        self.port_states: dict[PortKey, dict] = {PortKey.parse(k): dict(v) for k, v in data.get("ports", {}).items()}
        self.down_transitions: dict[PortKey, int] = {PortKey.parse(k): int(v)
                                                     for k, v in data.get("down_transitions", {}).items()}
        self.monitor.restore(data.get("counters", {}), PortKey.parse)

    def _count(self, key: PortKey, severity: str) -> None:
        event = (key, severity)
        self.events[event] = self.events.get(event, 0) + 1

    def _check_boot(self) -> None:
        boot = read_small_text(os.path.join(self.procfs, "sys", "kernel", "random", "boot_id"))
        if isinstance(boot, ReadProblem):
            return   # not Linux, or procfs not mounted: nothing to compare
        if self.boot_id is not None and boot != self.boot_id:
            self.boot_id_changes += 1
            self.known_devices.clear()
            self.port_states.clear()
            self.down_transitions.clear()
            self.monitor.forget()
            self._last_counters.clear()   # counters restart from zero after a reboot
            self._counted_from.clear()
            self._last_judged.clear()
        if boot != self.boot_id:
            self.boot_id = boot
            self._dirty = True

    def update(self, devices: list[InfiniBandDevice], roles: Mapping[str, str]) -> NodeHealth:
        now = self.clock()
        self._check_boot()
        ports: dict[PortKey, PortHealth] = {}
        monitored = tuple(self.monitor.by_counter)
        present = set()
        judged, self._last_judged = self._last_judged, {}
        for device in devices:
            present.add(device.name)
            role = roles.get(device.name, "unknown")
            management = role == "management"
            known = {"ports": [p.port for p in device.ports], "role": role}
            if self.known_devices.get(device.name) != known:
                self.known_devices[device.name] = known
                self._dirty = True
            for port in device.ports:
                ports[port.key] = (self._unchanged_port(port, management, judged.get(port.key), now, monitored)
                                   or self._update_port(port, management, monitored, now))
        missing = {}
        for name, info in self.known_devices.items():
            gone = name not in present
            missing[name] = int(gone)
            if gone:
                for number in info.get("ports", []):
                    key = PortKey(name, number)
                    entry = self.port_states.setdefault(key, {})
                    if not entry.get("fatal"):
                        entry["fatal"] = True
                        self._dirty = True
                        self._count(key, "non_fatal" if info.get("role") == "management" else "fatal")
        for device, number in uncabled_ports(devices, roles):
            ports[PortKey(device, number)].uncabled = True
        for name in inhomogeneous_devices(devices, roles):
            for key, health in ports.items():
                if key.device == name:
                    health.inhomogeneous = True
        self._save()
        return NodeHealth(ports, missing)

    def _unchanged_port(self, port: InfiniBandPort, management: bool, last: _Judged | None,
                        now: float, monitored: tuple[str, ...]) -> PortHealth | None:
        """Last scrape's verdict again, for a port judged on the same inputs as then (state,
        role, the judged counters: _judged_on) whose monitored counters have not moved in
        their windows and hold no breach: judging it once more would find what it found
        then, and costs most of the health check on a node whose error counters are quiet
        (busy or not). None when it must be judged."""
        if last is None:
            return None
        values = tuple([counter_value(port, counter) for counter in monitored])
        if (last.inputs != _judged_on(port, management, values)
                or not self.monitor.hold_if_quiet(port.key, now, last.absent)):
            return None
        self._count_other_resets(port.key, port, monitored)
        self._last_judged[port.key] = last
        return PortHealth(fatal=last.health.fatal, breached=dict(last.health.breached))

    def _update_port(self, port: InfiniBandPort, management: bool, monitored, now) -> PortHealth:
        key = port.key
        fatal_severity = "non_fatal" if management else "fatal"
        values = {c: counter_value(port, c) for c in monitored}
        verdict = self.monitor.observe(key, values, now)
        state_fatal = is_state_fatal(port)
        counter_fatal = any(t.severity == "fatal" for t in verdict.latched)
        health = PortHealth(fatal=(state_fatal or counter_fatal) and not management)
        for threshold in self.monitor.by_key.values():
            if values[threshold.counter] is None and threshold not in verdict.latched:
                continue
            severity = fatal_severity if threshold.severity == "fatal" else "non_fatal"
            label = ThresholdKey(threshold.counter, severity)
            health.breached[label] = max(health.breached.get(label, 0), int(threshold in verdict.latched))
        for threshold in verdict.breaches:
            self._count(key, fatal_severity if threshold.severity == "fatal" else "non_fatal")
        for _ in verdict.recoveries:
            self._count(key, "recovery")

        self._count_other_resets(key, port, values)

        state_name = port.state.name if port.state is not None else None
        previous = self.port_states.get(key)
        unhealthy = state_fatal or not is_link_healthy(port)
        if previous is None:
            # First sight of this port (fresh state or after a reboot): a baseline verdict.
            self._count(key, (fatal_severity if state_fatal else "non_fatal") if unhealthy else "baseline")
        else:
            if previous.get("state") in ("ACTIVE", "ACTIVE_DEFER") and state_name is not None and not is_active(port):
                self.down_transitions[key] = self.down_transitions.get(key, 0) + 1
            if state_fatal and not previous.get("fatal"):
                self._count(key, fatal_severity)
            elif previous.get("fatal") and is_link_healthy(port):
                self._count(key, "recovery")
        current = {"state": state_name if state_name is not None else (previous or {}).get("state"),
                   "fatal": state_fatal if state_name is not None else bool((previous or {}).get("fatal"))}
        if current != previous:
            self.port_states[key] = current
            self._dirty = True
        if verdict.complete:
            self._last_judged[key] = _Judged(_judged_on(port, management, tuple(values.values())),
                                             frozenset(c for c in monitored if values[c] is None),
                                             PortHealth(health.fatal, dict(health.breached)))
        return health

    def _count_other_resets(self, key: PortKey, port: InfiniBandPort, monitored: Collection[str]) -> None:
        sources = self._counted_from.get(key)
        if sources is not None and sources[0] is port.counters and sources[1] is port.hw_counters:
            return                           # the parser's very objects of last scrape: nothing moved
        self._counted_from[key] = (port.counters, port.hw_counters)
        current = dict(port.counters.items())
        current.update(port.hw_counters)
        before = self._last_counters.get(key)
        if before and current != before:     # (most scrapes: nothing moved, compared in C)
            for name, value in current.items():
                old = before.get(name)
                if old is not None and value < old and name not in monitored:
                    self._other_resets[(key, name)] = self._other_resets.get((key, name), 0) + 1
        self._last_counters[key] = current

    @property
    def reset_counts(self) -> dict[tuple[PortKey, str], int]:
        """(port, counter) -> resets seen, for every counter of every port."""
        return {**self._other_resets, **self.monitor.reset_counts}

    def _save(self) -> None:
        # At most one write per scrape, and none when nothing persisted has changed.
        if self.monitor.take_changed():
            self._dirty = True
        if not self._dirty:
            return
        ok = self.state_file.save({
            "boot_id": self.boot_id,
            "known_devices": self.known_devices,
            "ports": {str(k): v for k, v in self.port_states.items()},
            "down_transitions": {str(k): v for k, v in self.down_transitions.items()},
            "counters": self.monitor.persisted(),
        })
        self._dirty = not ok   # retry next scrape after a failed write


def _port_number(stored) -> int:
    """A port number as the state file holds it (an int; bool is not one)."""
    if stored.__class__ is not int:
        raise TypeError(f"port number {stored!r}")
    return stored
