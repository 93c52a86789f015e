"""What a scenario pages, and when: runs the whole stack (`fabricscope stack`'s own
start-up, in this process) over a scenario, on the real clock or a compressed one
(--time-scale), and records

- every notification of the `pager` and `ticket` receivers (given a webhook to a local
  receiver: in the stack they have no integration);
- every alert Alertmanager holds, polled from its API each second, with when it was first
  and last held (its resolution in Alertmanager, notified or not);
- at the end, the sidecar's firing alerts and Alertmanager's, once the sidecar has had a
  reconciliation to catch up.

`analyse` then attributes each alert to the scripted fault that explains it and answers,
per fault: when it first notified, when its last alert resolved after the fault ended,
and how many pages each incident (Alertmanager group) sent. Times are scenario seconds
(on a compressed clock, real seconds times the scale). bench/demo_timeline.py writes
docs/demo.md from this; tests/test_alert_timeline.py asserts the bounds on it."""
from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests
import yaml

from fabricscope.demo.scenario import parse_duration

from .binaries import free_port
from .configs import ALERTMANAGER_CONFIG
from .webhook import WebhookReceiver

# The documented bounds (docs/alertmanager.md, Lifecycles; docs/demo.md), in scenario
# seconds with the stack's fast alerts: a fault's first notification comes within
# FIRST_NOTIFICATION_BOUND of its start (the longest fast for: is 1m, plus windows
# filling, evaluation and group_wait); its alerts resolve within RESOLVE_BOUND of its end
# (the 5-minute signal bound, plus evaluation and scrape).
FIRST_NOTIFICATION_BOUND = 150.0
RESOLVE_BOUND = 360.0
# Alerts whose documented resolution is not the 5-minute signal bound: a per-hour
# threshold stays raised for the hour it counts (FabricInfinibandPreFailureBER resolves
# when the hour's count is back to the boundary: at most the rule's 1h window after the
# errors stop, plus evaluation and scrape).
ALERT_RESOLVE_BOUNDS = {"FabricInfinibandPreFailureBER": 3600.0 + 60.0}


def resolve_bound(alertname: str) -> float:
    return ALERT_RESOLVE_BOUNDS.get(alertname, RESOLVE_BOUND)


def notified_resolve_bound(receiver: str, config: Path = ALERTMANAGER_CONFIG) -> float:
    """How long after a fault's end its resolution reaches `receiver`: the alert resolves
    within RESOLVE_BOUND, and Alertmanager sends a group's resolution at the group's next
    flush, up to the receiver's group_interval later (alertmanager/alertmanager.yml)."""
    return RESOLVE_BOUND + receiver_group_interval(receiver, config)


def receiver_group_interval(receiver: str, config: Path = ALERTMANAGER_CONFIG) -> float:
    """The group_interval (seconds) of the first route that sends to `receiver`."""
    def walk(route: dict, inherited: str) -> str | None:
        interval = route.get("group_interval", inherited)
        if route.get("receiver") == receiver and route is not tree:
            return interval
        for child in route.get("routes") or []:
            found = walk(child, interval)
            if found is not None:
                return found
        return None
    tree = yaml.safe_load(Path(config).read_text())["route"]
    found = walk(tree, tree.get("group_interval", "5m"))
    if found is None:
        raise ValueError(f"{config}: no route sends to receiver {receiver!r}")
    return parse_duration(found, f"group_interval of {receiver}")

# Which alerts each kind of fault can raise: alert names, then the labels that must point
# at the fault's target.
FAULT_ALERTS: dict[str, tuple[str, Callable[[Any, dict], bool]]] = {
    "mlx5_fatal": (r"FabricKernelLog.*", lambda f, lab: lab.get("node") == f.node),
    "symbol_error_storm": (r"FabricInfiniband.*",
                           lambda f, lab: lab.get("node") == f.node and lab.get("device") == f.target.get("device")),
    "link_flap": (r"FabricInfiniband.*|FabricKernelLogNonFatal", lambda f, lab: lab.get("node") == f.node and (
        lab.get("device") == f.target.get("device") or "pattern" in lab)),
    "link_down": (r"FabricInfiniband.*|FabricKernelLogNonFatal", lambda f, lab: lab.get("node") == f.node and (
        lab.get("device") == f.target.get("device") or "pattern" in lab)),
    "microburst": (r"FabricTcp.*", lambda f, lab: lab.get("node") == f.node),
    "nccl_hang": (r"FabricNccl.*", lambda f, lab: True),
    "straggler_rank": (r"FabricNccl.*", lambda f, lab: True),
    "nvlink_down": (r"Fabric(Nvlink|GpuXid).*", lambda f, lab: lab.get("node") == f.node),
}
PAGER, TICKET = "pager", "ticket"


@dataclass
class HeldAlert:
    """An alert episode as Alertmanager's API showed it."""
    fingerprint: str
    labels: dict[str, str]
    first_seen: float
    last_seen: float
    suppressed: bool = False     # inhibited or silenced at some poll


@dataclass
class Notification:
    t: float                     # scenario seconds at receipt
    receiver: str
    group_key: str
    alerts: list[dict]


@dataclass
class Recording:
    scenario: Any                # fabricscope.demo.scenario.Scenario (on the scenario clock)
    time_scale: float
    duration: float
    notifications: list[Notification] = field(default_factory=list)
    held: dict[tuple[str, str], HeldAlert] = field(default_factory=dict)
    sidecar_firing: set[str] = field(default_factory=set)
    alertmanager_firing: set[str] = field(default_factory=set)


def record(scenario_path: str | Path | None, duration: float, workdir: Path, time_scale: float = 1.0,
           nodes: int | None = None, settle: float = 60.0) -> Recording:
    """Run the stack for `duration` scenario seconds and record it (see the module doc).
    `settle`: real seconds at most to wait, at the end, for the sidecar to agree."""
    from fabricscope.demo.scenario import default_scenario_path, load_scenario

    from .cli import Stack, add_arguments, start_stack
    import argparse

    receivers = WebhookReceiver(path="/receivers").start()
    ports = [free_port() for _ in range(3)]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--workdir", str(workdir), "--time-scale", f"{time_scale:g}", "--receivers-url", receivers.url,
         "--prometheus-port", str(ports[0]), "--alertmanager-port", str(ports[1]), "--sidecar-port", str(ports[2])]
        + (["--scenario", str(scenario_path)] if scenario_path else []) + (["--nodes", str(nodes)] if nodes else []))
    stack = Stack()
    try:
        start_stack(args, stack, out=io.StringIO())
        scenario = load_scenario(scenario_path or default_scenario_path())
        if nodes:
            scenario = scenario.with_nodes(nodes)
        rec = Recording(scenario, time_scale, duration)
        t0 = time.time() - stack.cluster.now()

        def clock(wall: float | None = None) -> float:
            return ((wall if wall is not None else time.time()) - t0) * time_scale

        alertmanager = f"http://127.0.0.1:{ports[1]}"
        while clock() < duration:
            _poll_alertmanager(alertmanager, clock(), rec)
            time.sleep(1.0)
        rec.sidecar_firing, rec.alertmanager_firing = _settled_states(stack, alertmanager, workdir, settle)
        for note in receivers.notifications:
            payload = note.payload
            rec.notifications.append(Notification(clock(note.received_at), str(payload.get("receiver", "")),
                                                  str(payload.get("groupKey", "")), list(payload["alerts"])))
        return rec
    finally:
        stack.stop()
        receivers.stop()


def _poll_alertmanager(url: str, now: float, rec: Recording) -> None:
    try:
        alerts = requests.get(url + "/api/v2/alerts", timeout=5).json()
    except (requests.RequestException, ValueError):
        return
    for alert in alerts:
        key = (alert["fingerprint"], alert["startsAt"])
        held = rec.held.setdefault(key, HeldAlert(alert["fingerprint"], alert["labels"], now, now))
        held.last_seen = now
        held.suppressed |= alert.get("status", {}).get("state") == "suppressed"


def _settled_states(stack, alertmanager: str, workdir: Path, settle: float) -> tuple[set[str], set[str]]:
    """The sidecar's firing fingerprints and Alertmanager's, once equal (or at `settle`)."""
    key = (workdir / "sidecar" / "demo-key").read_text().strip()
    ca = str(stack.sidecar.certs.ca)
    deadline = time.monotonic() + settle
    while True:
        held = {a["fingerprint"] for a in requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()}
        rows = requests.get(stack.sidecar.url + "/alerts", params={"status": "firing", "limit": 5000},
                            headers={"Authorization": f"Bearer {key}"}, verify=ca, timeout=10).json()["alerts"]
        firing = {row["fingerprint"] for row in rows}
        if firing == held or time.monotonic() > deadline:
            return firing, held
        time.sleep(1.0)


# ----------------------------------------------------------------- analysis

def fault_end(fault) -> float:
    """When a fault stops acting: its end, or a flap's last cycle."""
    if fault.end is not None:
        return fault.end
    if fault.kind == "link_flap":
        return fault.start + fault.params.get("count", 3) * fault.params.get("period_seconds", 20)
    return float("inf")


def cause(name: str, labels: dict, t: float, faults: list) -> Any | None:
    """The latest fault started at or before `t` whose kind can raise this alert on these
    labels and that has not been over for longer than the resolve bound."""
    candidates = [f for f in faults if f.start <= t <= fault_end(f) + resolve_bound(name)
                  and re.fullmatch(FAULT_ALERTS[f.kind][0], name) and FAULT_ALERTS[f.kind][1](f, labels)]
    return max(candidates, key=lambda f: f.start, default=None)


@dataclass
class FaultOutcome:
    fault: Any
    end: float
    first: tuple[float, str, str] | None = None          # (t, alertname, severity) of the first notification
    notified: list[tuple[float, str, str, str]] = field(default_factory=list)   # (t, receiver, alertname, severity)
    resolved_at: float | None = None                     # last of its alerts gone from Alertmanager
    resolved: dict[str, float] = field(default_factory=dict)   # alertname -> its last resolution in Alertmanager
    still_held: list[str] = field(default_factory=list)  # alerts Alertmanager still held at the end, past their bound
    # Alerts held at the end whose own bound (ALERT_RESOLVE_BOUNDS) runs past it: alertname -> latest allowed end.
    held_within_bound: dict[str, float] = field(default_factory=dict)
    resolution_notified: dict[str, float] = field(default_factory=dict)   # receiver -> last resolution notified
    pages: dict[str, list[str]] = field(default_factory=dict)   # group key -> critical alerts paged


@dataclass
class Analysis:
    faults: list[FaultOutcome]
    unexplained: list[tuple[float, str, dict]]           # notified or held alerts no fault explains


def analyse(rec: Recording) -> Analysis:
    faults = sorted(rec.scenario.faults, key=lambda f: f.start)
    outcomes = {id(f): FaultOutcome(f, fault_end(f)) for f in faults}
    unexplained: list[tuple[float, str, dict]] = []
    seen: set[tuple[str, str, str]] = set()
    episodes: dict[tuple[str, str, str], Any] = {}       # notified firing episode -> its fault
    for note in sorted(rec.notifications, key=lambda n: n.t):
        for alert in note.alerts:
            labels = alert.get("labels", {})
            name, severity = labels.get("alertname", ""), labels.get("severity", "")
            episode = (note.receiver, alert.get("fingerprint", ""), alert.get("startsAt", ""))
            if alert.get("status") == "resolved":
                fault = episodes.get(episode)
                if fault is not None:
                    outcome = outcomes[id(fault)]
                    outcome.resolution_notified[note.receiver] = max(
                        note.t, outcome.resolution_notified.get(note.receiver, note.t))
                continue
            if episode in seen:
                continue   # a group's repeat of an alert already notified
            seen.add(episode)
            fault = cause(name, labels, note.t, faults)
            if fault is None:
                unexplained.append((note.t, name, labels))
                continue
            episodes[episode] = fault
            outcome = outcomes[id(fault)]
            outcome.notified.append((note.t, note.receiver, name, severity))
            if outcome.first is None:
                outcome.first = (note.t, name, severity)
            if note.receiver == PAGER:
                outcome.pages.setdefault(note.group_key, []).append(name)
    for held in rec.held.values():
        name = held.labels.get("alertname", "")
        fault = cause(name, held.labels, held.first_seen, faults)
        if fault is None:
            unexplained.append((held.first_seen, name, held.labels))
            continue
        outcome = outcomes[id(fault)]
        if held.last_seen >= rec.duration - 5 * rec.time_scale:
            allowed = outcome.end + resolve_bound(name)
            if allowed > rec.duration:
                outcome.held_within_bound[name] = allowed
            else:
                outcome.still_held.append(name)
        else:
            outcome.resolved[name] = max(held.last_seen, outcome.resolved.get(name, held.last_seen))
            if outcome.resolved_at is None or held.last_seen > outcome.resolved_at:
                outcome.resolved_at = held.last_seen
    return Analysis([outcomes[id(f)] for f in faults], sorted(unexplained, key=lambda u: u[0]))
