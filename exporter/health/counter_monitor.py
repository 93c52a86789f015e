"""Delta and velocity evaluation of port counters, with latching, reset detection and recovery.

Per port and monitored counter the monitor keeps the observed history as runs of equal
value, [first_seen, last_seen, value], oldest first. A counter that does not move costs
one run however often it is scraped, and the value at any instant inside a run is known
exactly, so a velocity is measured between the newest sample and the value one full unit
earlier, never extrapolated from a short pair of samples:

  delta     judged on every scrape after the first: value - previous value > limit.
  velocity  judged only once the history spans a full unit (1 s, 1 min or 1 h): the
            increase since the latest known value at or before now - unit, scaled to one
            unit (the span is >= one unit, so scaling only ever averages down).

A breach latches: it stays flagged after the counter stops moving. It recovers when the
counter resets (value went down: an admin cleared it with `perfquery -x`, or the driver
reloaded), or, for a velocity threshold, when a full window is back at or under the limit.
A reset re-baselines the counter; nothing is judged on that scrape.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Mapping

from .thresholds import CounterThreshold, ThresholdKey


@dataclass(slots=True)
class _Track:
    runs: list[list[float]]                      # [first_seen, last_seen, value]
    latched: set[ThresholdKey] = field(default_factory=set)   # CounterThreshold.key of latched breaches


@dataclass(slots=True)
class CounterVerdict:
    """What one observation of one port's counters found."""
    latched: list[CounterThreshold] = field(default_factory=list)  # breaches flagged now
    breaches: list[CounterThreshold] = field(default_factory=list)  # newly breached this scrape
    recoveries: list[str] = field(default_factory=list)            # counters whose breaches cleared
    resets: list[str] = field(default_factory=list)                # counters that went down
    # False when a value was left unjudged because the wall clock stepped back behind its
    # last sample: it is judged on a later observation, so this one is not a baseline.
    complete: bool = True


class CounterMonitor:
    # A counter that merely moved (port_xmit_wait under load moves on every scrape) is
    # persisted at most this often; latches, recoveries, resets and history drops are
    # persisted at once. The state file is fsynced, which must not ride every scrape.
    SNAPSHOT_INTERVAL_SECONDS = 60.0

    def __init__(self, thresholds: Iterable[CounterThreshold], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.by_counter: dict[str, list[CounterThreshold]] = {}
        for threshold in thresholds:
            self.by_counter.setdefault(threshold.counter, []).append(threshold)
        self.by_key = {t.key: t for ts in self.by_counter.values() for t in ts}
        self._window = {c: max((t.unit_seconds for t in ts), default=0.0) for c, ts in self.by_counter.items()}
        # Port keys are whatever the caller identifies a port by (the tracker's PortKey).
        self._ports: dict[Hashable, dict[str, _Track]] = {}
        self.reset_counts: dict[tuple[Hashable, str], int] = {}
        self._persisted_changed = True
        self._values_moved = False          # only routine value changes since the last write
        self._last_taken: float | None = None

    def forget(self) -> None:
        """Drop all history (boot-ID change: counters restart from zero)."""
        self._ports.clear()
        self._persisted_changed = True

    def observe(self, port_key: Hashable, values: Mapping[str, int | None], now: float | None = None) -> CounterVerdict:
        now = self.clock() if now is None else now
        verdict = CounterVerdict()
        tracks = self._ports.setdefault(port_key, {})
        for counter, thresholds in self.by_counter.items():
            value = values.get(counter)
            track = tracks.get(counter)
            if track is None:
                if value is not None:
                    tracks[counter] = _Track([[now, now, value]])
                    self._persisted_changed = True
                continue
            if value is not None:   # absent or unreadable this scrape: keep what we know
                self._judge(port_key, counter, value, now, track, thresholds, verdict)
            # Latched keys are always keys of this monitor's thresholds (restore drops others).
            verdict.latched.extend(self.by_key[k] for k in sorted(track.latched))
        return verdict

    def hold_if_quiet(self, port_key: Hashable, now: float, absent: frozenset[str]) -> bool:
        """What observe() does for a port whose values equal those of its last observation,
        when none of its counters has moved in its window or is latched: every track's last
        run extends to `now` (but those of the `absent` counters, unread as before, and any
        the wall clock stepped back behind) and nothing can breach or recover. False, with
        nothing changed, when the port is not that quiet: observe() must judge it."""
        tracks = self._ports.get(port_key)
        if tracks is None:
            return False
        for track in tracks.values():
            if track.latched or len(track.runs) != 1:
                return False
        for counter, track in tracks.items():
            last = track.runs[0]
            if now >= last[1] and counter not in absent:
                last[1] = now
        return True

    def _judge(self, port_key, counter, value, now, track, thresholds, verdict) -> None:
        last = track.runs[-1]
        previous = last[2]
        if value < previous:
            # Counters only go down when they are cleared: re-baseline and recover.
            verdict.resets.append(counter)
            self.reset_counts[(port_key, counter)] = self.reset_counts.get((port_key, counter), 0) + 1
            if track.latched:
                verdict.recoveries.append(counter)
                track.latched.clear()
            track.runs = [[now, now, value]]
            self._persisted_changed = True
            return
        if now < last[1]:
            verdict.complete = False
            return  # wall clock stepped back: judge nothing until it passes the last sample
        if value == previous:
            last[1] = now
            if len(track.runs) == 1 and not track.latched:
                # Nothing moved in the whole window: every delta and velocity is 0, so
                # nothing can breach or recover. Most counters of most ports, every scrape.
                return
        else:
            track.runs.append([now, now, value])
            self._values_moved = True
        recovered = False
        for threshold in thresholds:
            if threshold.kind == "delta":
                breached = value - previous > threshold.limit
                if not breached:
                    continue  # a delta breach only clears on a counter reset
            else:
                rate = _velocity(track.runs, now, value, threshold.unit_seconds)
                if rate is None:
                    continue  # not a full window yet: not judged
                breached = rate > threshold.limit
            if breached and threshold.key not in track.latched:
                track.latched.add(threshold.key)
                verdict.breaches.append(threshold)
                self._persisted_changed = True
            elif not breached and threshold.key in track.latched:
                track.latched.discard(threshold.key)
                recovered = True
                self._persisted_changed = True
        if recovered:
            verdict.recoveries.append(counter)
        _prune(track.runs, now - self._window[counter])

    # Persistence: the newest run's first sample and the latched flags per counter. This
    # changes only when a monitored counter moves or a breach flips, so a quiet port does
    # not cause a state write on every scrape. Keys become text here and only here.
    def persisted(self) -> dict:
        return {str(port): {counter: {"t": t.runs[-1][0], "v": t.runs[-1][2],
                                      "latched": sorted(str(k) for k in t.latched)}
                            for counter, t in tracks.items()}
                for port, tracks in self._ports.items()}

    def take_changed(self, now: float | None = None) -> bool:
        """Whether the persisted snapshot should be written now (and mark it written)."""
        now = self.clock() if now is None else now
        due = self._values_moved and (self._last_taken is None
                                      or now - self._last_taken >= self.SNAPSHOT_INTERVAL_SECONDS)
        if not (self._persisted_changed or due):
            return False
        self._persisted_changed = self._values_moved = False
        self._last_taken = now
        return True

    def restore(self, data: dict, port_key: Callable[[str], Hashable] = str) -> None:
        """The state persisted() wrote; `port_key` turns a stored port back into its key
        (ValueError for one that is not a port's)."""
        self._ports.clear()
        keys = {str(k): k for k in self.by_key}
        for text, counters in (data or {}).items():
            if not isinstance(counters, dict):
                continue
            try:
                port = port_key(text)
            except ValueError:
                continue
            for counter, snap in counters.items():
                try:
                    t, v = float(snap["t"]), int(snap["v"])
                    latched = {keys[k] for k in snap.get("latched", []) if k in keys}
                except (TypeError, KeyError, ValueError):
                    continue   # one bad entry costs only that counter's history
                if counter in self.by_counter:
                    self._ports.setdefault(port, {})[counter] = _Track([[t, t, v]], latched)
        self._persisted_changed = False


def _velocity(runs: list[list[float]], now: float, value: int, unit: float) -> float | None:
    """Increase per `unit` over a span of at least one unit, or None if history is shorter."""
    target = now - unit
    for first, last, old in reversed(runs):
        if first <= target:
            anchor = min(last, target)
            return (value - old) * unit / (now - anchor)
    return None


def _prune(runs: list[list[float]], oldest_needed: float) -> None:
    # Keep the newest run that starts at or before the widest window; older ones can
    # never be an anchor again because targets only move forward.
    keep = 0
    for index in range(len(runs) - 1, -1, -1):
        if runs[index][0] <= oldest_needed:
            keep = index
            break
    if keep:
        del runs[:keep]
