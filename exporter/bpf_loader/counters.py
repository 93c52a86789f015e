"""Monotonic label counters from kernel maps whose keys can vanish or merge.

Kernel maps are keyed finer than the labels (many peer addresses -> "other") and LRU
maps evict keys, so summing current values could go backwards and read as a counter
reset. Instead each key's growth since the last read is added to its label's total:
a key seen for the first time contributes its whole value, an evicted key keeps what it
already contributed, and a key whose value went down (recreated) restarts from it.
"""
from __future__ import annotations

import threading


class LabelCounters:
    def __init__(self) -> None:
        self._last: dict[bytes, int] = {}
        self._totals: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def update(self, readings: list[tuple[bytes, tuple[str, ...], int]]) -> dict[tuple[str, ...], int]:
        """readings: (map key, decoded labels, current value) for every key now in the map."""
        with self._lock:
            seen: dict[bytes, int] = {}
            for key, labels, value in readings:
                last = self._last.get(key, 0)
                delta = value - last if value >= last else value
                self._totals[labels] = self._totals.get(labels, 0) + delta
                seen[key] = value
            self._last = seen
            return dict(self._totals)
