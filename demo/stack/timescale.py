"""A compressed clock for the whole stack: `fabricscope stack --time-scale K` runs the
scenario, the rules' windows, for: durations and group intervals, and Alertmanager's
group timings K times faster, so a 30-minute timeline and its 5-minute resolve bounds
play out in 30/K minutes. Thresholds, rates and the exporters' own judgement (a rate per
second, the NCCL tracker's hang floor) are not scaled: they are not times of the
timeline. Durations never go under one second (Prometheus and Alertmanager count whole
seconds), and a rate window keeps at least three 1 s scrapes."""
from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

from fabricscope.demo.scenario import parse_duration
from fabricscope.rules.render import EXPORTER_WINDOWS, RULES_DIR, RenderError, exporter_windows, jsonnet_binary

from .errors import StackError

# Scenario fields that are times of the timeline; fault params of that kind (rates,
# ratios, the straggler's lag per collective are not).
SCENARIO_TIMES = ("tick_seconds", "duration", "repeat")
FAULT_TIMES = ("at", "duration")
PARAM_TIMES = ("period_seconds", "down_seconds", "counters_cleared_after", "precursor_seconds")
# The simulation's tick is its cost: never faster than this.
MIN_TICK_SECONDS = 0.25
# Sections of the mixin's _config that hold durations of the timeline.
RULE_TIME_SECTIONS = ("windows", "for", "keepFiringFor", "intervals")
MIN_WINDOW_SECONDS = 3
ROUTE_TIMES = ("group_wait", "group_interval", "repeat_interval")


def seconds_text(seconds: float, floor: float = 1) -> str:
    return f"{max(floor, round(seconds))}s"


def scale_scenario(raw: dict[str, Any], scale: float) -> dict[str, Any]:
    """A parsed scenario mapping with every time of its timeline divided by `scale`."""
    scaled = copy.deepcopy(raw)
    for key in SCENARIO_TIMES:
        if scaled.get(key) is not None:
            floor = MIN_TICK_SECONDS if key == "tick_seconds" else 0
            scaled[key] = max(floor, parse_duration(scaled[key], key) / scale)
    for index, fault in enumerate(scaled.get("faults") or []):
        where = f"fault {index}"
        for key in FAULT_TIMES:
            if fault.get(key) is not None:
                fault[key] = parse_duration(fault[key], f"{where}: {key}") / scale
        params = fault.get("params") or {}
        for key in PARAM_TIMES:
            if isinstance(params.get(key), (int, float)) and not isinstance(params.get(key), bool):
                # A flap's period must stay >= 2 s (the scenario's own rule).
                params[key] = max(2.0 if key == "period_seconds" else 0.0, params[key] / scale)
    return scaled


def mixin_config() -> dict[str, Any]:
    """The mixin's `_config` (rules/mixin/config.libsonnet) as JSON."""
    try:
        result = subprocess.run([jsonnet_binary(), "-J", str(RULES_DIR), "-e",
                                 "(import 'mixin/mixin.libsonnet')._config"],
                                capture_output=True, text=True, timeout=60)
    except RenderError as exc:
        raise StackError(str(exc)) from None
    if result.returncode != 0:
        raise StackError(f"reading the mixin's config: {result.stderr.strip()}")
    return json.loads(result.stdout)


def scale_rule_overrides(overrides: dict[str, Any], scale: float) -> dict[str, Any]:
    """`overrides` (e.g. the fast alerts) plus every window, for:, keep_firing_for and
    group interval of the mixin, divided by `scale`."""
    config = mixin_config()
    scaled = copy.deepcopy(overrides)
    for section in RULE_TIME_SECTIONS:
        merged = {**config.get(section, {}), **overrides.get(section, {})}
        out = scaled.setdefault(section, {})
        for name, value in merged.items():
            if value in ("", None):
                continue   # '' leaves a group on the global evaluation interval
            floor = MIN_WINDOW_SECONDS if section == "windows" else (0 if section == "for" else 1)
            out[name] = seconds_text(parse_duration(value, f"{section}.{name}") / scale, floor)
    return scaled


def scale_exporter_config(scale: float) -> dict[str, Any]:
    """The demo exporters' config for a compressed clock: every window the exporter
    computes a quantile over (the rules' p99 window) divided by `scale`. Both the cluster
    and the rules' renderer take it, so they agree."""
    try:
        declared = exporter_windows()
    except RenderError as exc:
        raise StackError(str(exc)) from None
    return {"ebpf": {"window_seconds": {EXPORTER_WINDOWS[key]: max(MIN_WINDOW_SECONDS, round(window["seconds"] / scale))
                                        for key, window in declared.items()}}}


def scale_route_timing(config: dict[str, Any], scale: float) -> dict[str, Any]:
    """Alertmanager's config with each route's own group_wait, group_interval and
    repeat_interval divided by `scale` (children inherit what they do not set)."""
    def walk(route: dict[str, Any]) -> None:
        for key in ROUTE_TIMES:
            if key in route:
                route[key] = seconds_text(parse_duration(route[key], key) / scale)
        for child in route.get("routes") or []:
            walk(child)

    scaled = copy.deepcopy(config)
    walk(scaled["route"])
    return scaled
