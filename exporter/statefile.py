"""Persistent local state (JSON), written atomically and durably.

A crash mid-write leaves either the old or the new state, never a torn one
(fabricscope.atomicfile, fsynced); temporary files a killed writer left are removed at
load. A corrupt file is moved aside (kept for forensics) and replaced; it is reported,
not fatal.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fabricscope.atomicfile import remove_orphans, write_atomically

log = logging.getLogger("fabricscope.exporter.state")

# Why a load returned no stored state; every stateful collector exports all three, 0 or 1.
LOAD_PROBLEMS = ("missing", "corrupt", "unreadable")


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Why the last load did not return stored state: None, "missing" or "corrupt".
        self.load_problem: str | None = None
        self.write_errors = 0

    def load(self) -> dict[str, Any]:
        for orphan in remove_orphans(self.path):
            log.info("removed %s, left by a write that was interrupted", orphan)
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self.load_problem = "missing"
            return {}
        except OSError as exc:
            log.error("cannot read state file %s: %s; starting from empty state", self.path, exc)
            self.load_problem = "unreadable"
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("top level is not an object")
        except ValueError as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error("state file %s is corrupt (%s); moved to %s and starting from empty state", self.path, exc, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            self.load_problem = "corrupt"
            return {}
        self.load_problem = None
        return data

    def save(self, data: dict[str, Any]) -> bool:
        try:
            write_atomically(self.path, json.dumps(data, separators=(",", ":"), sort_keys=True),
                             mode=0o600, durable=True)
            return True
        except OSError as exc:
            self.write_errors += 1
            log.error("cannot write state file %s: %s", self.path, exc)
            return False


def state_metrics(collector: str, load_problem: str | None, write_errors: int, boot_id_changes: int) -> list[Metric]:
    """The families every stateful collector exports about its state (same names, help
    and labels everywhere, so the framework merges them into one block per name)."""
    problem = GaugeMetricFamily("fabric_state_file_problem",
                                "1 when the collector's persistent state could not be loaded at start.",
                                labels=["collector", "problem"])
    for name in LOAD_PROBLEMS:
        problem.add_metric([collector, name], 1.0 if load_problem == name else 0.0)
    writes = CounterMetricFamily("fabric_state_file_write_errors", "Failed atomic state writes.",
                                 labels=["collector"])
    writes.add_metric([collector], write_errors)
    boots = CounterMetricFamily("fabric_node_boot_id_changes",
                                "Boot-ID changes the collector saw (its state cleared or cursor reset).",
                                labels=["collector"])
    boots.add_metric([collector], boot_id_changes)
    return [problem, writes, boots]
