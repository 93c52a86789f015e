"""Counter thresholds: the defaults from the NIC health design and their YAML overrides.

A threshold judges one counter, named as its file in ports/<n>/counters/ or
ports/<n>/hw_counters/ (or `carrier_changes`, read from the port's netdev):

  delta     breach when the increase since the previous scrape is > `threshold`
  velocity  breach when the increase per `unit` (second | minute | hour), measured over
            samples spanning at least one full unit, is > `threshold`

Config (`--config.file`, section `infiniband`):

    infiniband:
      replace_default_thresholds: false   # true: only the list below applies
      thresholds:
        - counter: symbol_error           # required
          type: velocity                  # delta | velocity (required)
          threshold: 50                   # required, >= 0
          unit: minute                    # velocity only: second | minute | hour (also 1s/1m/1h)
          severity: non_fatal             # fatal | non_fatal (default non_fatal)
        - counter: port_xmit_wait
          severity: non_fatal
          enabled: false                  # drop a default
      roles: {mlx5_4: storage}            # optional role overrides (see nic_roles)

An entry replaces the default with the same (counter, severity); `enabled: false`
removes it. A counter may carry one fatal and one non-fatal threshold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

Severity = Literal["fatal", "non_fatal"]

UNITS = {"second": 1.0, "1s": 1.0, "s": 1.0, "minute": 60.0, "1m": 60.0, "m": 60.0,
         "hour": 3600.0, "1h": 3600.0, "h": 3600.0}


class ThresholdKey(NamedTuple):
    """A threshold's identity: at most one per (counter, severity). It becomes the text
    "counter:severity" only in the state file (str())."""
    counter: str
    severity: str

    def __str__(self) -> str:
        return f"{self.counter}:{self.severity}"


@dataclass(frozen=True)
class CounterThreshold:
    counter: str
    kind: Literal["delta", "velocity"]
    limit: float                  # breach when the delta / per-unit velocity is > limit
    severity: Severity
    unit_seconds: float = 0.0     # velocity window; 0 for delta

    @property
    def key(self) -> ThresholdKey:
        return ThresholdKey(self.counter, self.severity)


def _delta(counter, limit, severity="non_fatal"):
    return CounterThreshold(counter, "delta", limit, severity)


def _velocity(counter, limit, unit, severity="non_fatal"):
    return CounterThreshold(counter, "velocity", limit, severity, UNITS[unit])


DEFAULT_THRESHOLDS: tuple[CounterThreshold, ...] = (
    # Fatal: the workload will fail or has failed.
    _delta("link_downed", 0, "fatal"),
    _delta("excessive_buffer_overrun_errors", 0, "fatal"),
    _delta("local_link_integrity_errors", 0, "fatal"),
    _delta("rnr_nak_retry_err", 0, "fatal"),
    # Non-fatal: degradation, the workload continues. Symbol errors are never fatal here
    # (an elevated rate is degradation, not failure); the IBTA BER boundary (120 an hour) is judged
    # once, by FabricInfinibandPreFailureBER over Prometheus' hour of samples
    # (rules/mixin/config.libsonnet, ibSymbolErrorsPerHour), not a second time here.
    _velocity("symbol_error", 10, "second"),
    _velocity("link_error_recovery", 5, "minute"),
    _velocity("port_rcv_errors", 10, "second"),
    _velocity("port_xmit_discards", 100, "second"),
    _velocity("port_xmit_wait", 10000, "second"),
    _velocity("out_of_sequence", 100, "second"),
    _velocity("local_ack_timeout_err", 1, "second"),
    _velocity("roce_slow_restart", 10, "second"),
    _delta("carrier_changes", 2),
)

def load_thresholds(section: dict[str, Any] | None) -> tuple[CounterThreshold, ...]:
    """Defaults merged with the `infiniband` section, already validated by the config
    schema (exporter/config.py: ThresholdEntry)."""
    section = section or {}
    replace = section.get("replace_default_thresholds", False)
    merged: dict[ThresholdKey, CounterThreshold | None] = {} if replace else {t.key: t for t in DEFAULT_THRESHOLDS}
    for entry in section.get("thresholds") or []:
        key = ThresholdKey(entry["counter"], entry.get("severity", "non_fatal"))
        severity = key.severity
        if not entry.get("enabled", True):
            merged[key] = None
            continue
        kind = entry["type"]
        unit_seconds = UNITS[entry.get("unit") or "second"] if kind == "velocity" else 0.0
        merged[key] = CounterThreshold(entry["counter"], kind, float(entry["threshold"]), severity, unit_seconds)
    return tuple(t for t in merged.values() if t is not None)
