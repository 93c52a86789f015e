"""Persistent local state (JSON), written atomically and durably.

A crash mid-write leaves either the old or the new state, never a torn one
(fabricscope.atomicfile, fsynced); temporary files a killed writer left are removed at
load. A corrupt file is moved aside (kept for forensics) and replaced; it is reported,
not fatal.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fabricscope.atomicfile import remove_orphans, write_atomically

from .framework import SampleCache
from .parsers.files import ReadProblem, read_text

log = logging.getLogger("fabricscope.exporter.state")

# Why a load returned no stored state; every stateful collector exports all three, 0 or 1.
LOAD_PROBLEMS = ("missing", "corrupt", "unreadable")


# No value the exporter stores is beyond 64 bits or non-finite: a number that is (1e400,
# NaN, a 400-digit integer) means the file was damaged or written by something else, and
# restoring it would fail later, far from the cause.
_LIMIT = 1 << 64


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > 21 or abs(value := int(text)) >= _LIMIT:
        raise ValueError(f"integer out of range: {text[:40]}")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid state value")


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Why the last load did not return stored state: None, "missing" or "corrupt".
        self.load_problem: str | None = None
        self.write_errors = 0

    def load(self) -> dict[str, Any]:
        for orphan in remove_orphans(self.path):
            log.info("removed %s, left by a write that was interrupted", orphan)
        # The exporter's own file, but read like any other: a FIFO or a device node put in
        # its place must not block start-up.
        text = read_text(self.path)
        if isinstance(text, ReadProblem):
            if text.reason == "absent":
                self.load_problem = "missing"
            elif text.reason in ("empty", "too_large"):
                self.set_aside(text.reason)
            else:
                log.error("cannot read state file %s: %s; starting from empty state", self.path, text.reason)
                self.load_problem = "unreadable"
            return {}
        try:
            data = json.loads(text, parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_no_constant)
            if not isinstance(data, dict):
                raise ValueError("top level is not an object")
        except (ValueError, RecursionError) as exc:
            self.set_aside(str(exc))
            return {}
        self.load_problem = None
        return data

    def set_aside(self, why: str) -> None:
        """Keep an unusable file for forensics under another name and report it as corrupt;
        the next save starts a fresh one. Callers use it for valid JSON of the wrong shape."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        log.error("state file %s is corrupt (%s); moved to %s and starting from empty state", self.path, why, aside)
        try:
            os.replace(self.path, aside)
        except OSError:
            pass
        self.load_problem = "corrupt"

    def save(self, data: dict[str, Any]) -> bool:
        try:
            write_atomically(self.path, json.dumps(data, separators=(",", ":"), sort_keys=True),
                             mode=0o600, durable=True)
            return True
        except OSError as exc:
            self.write_errors += 1
            log.error("cannot write state file %s: %s", self.path, exc)
            return False


def state_metrics(collector: str, load_problem: str | None, write_errors: int, boot_id_changes: int | None,
                  cache: SampleCache) -> list[Metric]:
    """The families every stateful collector exports about its state (same names, help
    and labels everywhere, so the framework merges them into one block per name), through
    the collector's SampleCache. boot_id_changes None: the collector's state survives a
    reboot (no boot-ID check), and the family is left out."""
    families = [cache.family(GaugeMetricFamily, "fabric_state_file_problem",
                             "1 when the collector's persistent state could not be loaded at start.",
                             ("collector", "problem"),
                             [((collector, name), 1.0 if load_problem == name else 0.0) for name in LOAD_PROBLEMS]),
                cache.family(CounterMetricFamily, "fabric_state_file_write_errors", "Failed atomic state writes.",
                             ("collector",), (((collector,), write_errors),))]
    if boot_id_changes is not None:
        families.append(cache.family(CounterMetricFamily, "fabric_node_boot_id_changes",
                                     "Boot-ID changes the collector saw (its state cleared or cursor reset).",
                                     ("collector",), (((collector,), boot_id_changes),)))
    return families
