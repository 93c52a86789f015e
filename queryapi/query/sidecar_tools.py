"""The Python functions behind the registry's `tool:` queries that read the sidecar's
own store or Prometheus in ways one PromQL expression cannot."""
from __future__ import annotations

import ipaddress
import statistics
import time
from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit

from ..promql import quote
from .executor import QueryBudgetExceeded, ToolUnavailable, tool_handler
from .params import duration_seconds


def _since_ms(window: str) -> int:
    return int((time.time() - duration_seconds(window)) * 1000)


@tool_handler("slo_violations")
def slo_violations(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """Violating spans per (service, operation) in the window, most first."""
    spans = state.storage.slo_violations(_since_ms(params["window"]), service=params.get("service"), limit=10_000)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for span in spans:
        key = (span["service"], span["operation"])
        group = groups.setdefault(key, {"labels": {"service": key[0], "operation": key[1]}, "value": 0,
                                        "slo_ms": span["slo_ms"], "worst_ms": 0.0, "last_trace_id": span["trace_id"]})
        group["value"] += 1
        group["worst_ms"] = max(group["worst_ms"], span["duration_ms"])
    return sorted(groups.values(), key=lambda g: (-g["value"], g["labels"]["service"]))


@tool_handler("correlations")
def correlations(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """Network anomalies matched to slow spans (the sidecar's correlator), per device."""
    found = state.storage.correlations(since_ms=_since_ms("1d"), limit=5000)
    service = params.get("service")
    per_device: dict[str, dict[str, Any]] = defaultdict(lambda: {"value": 0, "kinds": set(), "traces": set()})
    for row in found:
        if service and row["service"] != service:
            continue
        for anomaly in row.get("anomalies") or []:
            device = str(anomaly.get("device") or anomaly.get("node") or "?")
            entry = per_device[device]
            entry["value"] += 1
            entry["kinds"].add(str(anomaly.get("kind") or anomaly.get("alertname") or anomaly.get("type") or "?"))
            entry["traces"].add(row["trace_id"])
    rows = [{"labels": {"device": device}, "value": e["value"], "anomalies": sorted(e["kinds"]),
             "traces": len(e["traces"])} for device, e in per_device.items()]
    return sorted(rows, key=lambda r: (-r["value"], r["labels"]["device"]))


@tool_handler("locate_ip")
def locate_ip(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """Scrape targets whose address is the IP: compared as parsed addresses in Python, so
    the IP never goes into a regex matcher."""
    wanted = ipaddress.ip_address(params["ip"])
    rows = []
    for sample in state.prom.query("up", timeout=state.config.prometheus_timeout_seconds):
        host = urlsplit("//" + sample.labels.get("instance", "")).hostname
        try:
            if host and ipaddress.ip_address(host) == wanted:
                rows.append({"labels": sample.labels, "value": sample.value})
        except ValueError:
            continue
    return rows


# -- topology (fabricscope.chaos, through the sidecar's chaos service) ----------------------
CHAOS_EXTENSION = "fabricscope.chaos"   # queryapi/chaos_api.py keeps its ChaosService there


def _chaos_service(caller):
    service = caller.app.extensions.get(CHAOS_EXTENSION) if caller.app is not None else None
    if service is None:
        raise ToolUnavailable("no cluster topology is configured for chaos simulations: start the sidecar with "
                              "--chaos-topology FILE (docs/chaos.md)")
    return service


@tool_handler("neighbors")
def neighbors(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """The devices one link away, with the link's kind, partition and state."""
    from fabricscope.chaos.blast import ChaosInputError
    topology = _chaos_service(caller).topology.engine().topology
    device = params["device"]
    if device not in topology:
        raise ChaosInputError("device", f"unknown device {device!r} in topology {topology.name!r}")
    graph = topology.graph
    rows = []
    for peer in sorted(set(graph.successors(device)) | set(graph.predecessors(device))):
        edge = graph.edges[device, peer] if graph.has_edge(device, peer) else graph.edges[peer, device]
        up = all(graph.edges[a, b].get("state", "up") == "up" for a, b in ((device, peer), (peer, device))
                 if graph.has_edge(a, b))
        rows.append({"labels": {"device": peer, "kind": graph.nodes[peer]["kind"], "link": edge.get("kind", ""),
                                "partition": edge.get("partition", "")}, "value": 1 if up else 0})
    return rows


@tool_handler("blast_radius")
def blast_radius(state, params: dict[str, Any], caller) -> dict[str, Any]:
    """The chaos engine's simulation, synchronously (milliseconds), under the same per-key
    simulation budget as POST /graph/chaos-simulate."""
    service = _chaos_service(caller)
    if caller.key is not None:
        allowed, retry_after = service.limiter.allow(caller.key.id, service.per_minute / 60.0, service.per_minute)
        if not allowed:
            raise QueryBudgetExceeded(f"chaos simulations are limited to {service.per_minute} per minute per API "
                                      f"key (key {caller.key.id!r})", retry_after)
    engine = service.topology.engine()
    result = engine.simulate(params["device"], params["failure_type"], include_jobs=True).to_dict()
    kinds = {name: kind for name, kind in engine.topology.graph.nodes(data="kind")}
    rows = [{"labels": {"device": step["device"], "kind": kinds.get(step["device"], "")},
             "value": None, "via": step["via"], "reason": step["reason"]} for step in result["path"]]
    summary = {k: result[k] for k in ("impact_score", "affected_device_count", "total_devices", "affected_jobs",
                                      "affected_job_count", "total_active_jobs", "affected_by_kind",
                                      "topology_version", "path_truncated")}
    return {"results": rows, "summary": summary}


# -- stragglers: arrival lag (rules/: comm_rank:fabric_nccl_arrival_lag_seconds:mean5m) -----
ARRIVAL_LAG = "comm_rank:fabric_nccl_arrival_lag_seconds:mean5m"
# Collectives per second per rank (point-to-point excluded, as the arrival lag excludes them).
COLLECTIVE_RATE = 'sum by (cluster, comm, rank) (rate(fabric_nccl_calls_total{op!~"Send|Recv"%s}[5m]))'
MAD_SCALE = 1.4826          # MAD x 1.4826 estimates the standard deviation of normal data
MIN_DEVIATION = 0.001       # a rank under 1 ms off the median is not a straggler, whatever MAD says


def _comm_matcher(params: dict[str, Any]) -> str:
    return f", comm={quote(params['comm'])}" if params.get("comm") else ""


def _lags_by_comm(state, params: dict[str, Any]) -> dict[tuple[str, str], list[tuple[dict[str, str], float]]]:
    selector = f"{ARRIVAL_LAG}{{{_comm_matcher(params).lstrip(', ')}}}"
    by_comm: dict[tuple[str, str], list[tuple[dict[str, str], float]]] = defaultdict(list)
    for sample in state.prom.query(selector, timeout=state.config.prometheus_timeout_seconds):
        if sample.value == sample.value:      # NaN: no collective completed in the window
            by_comm[(sample.labels.get("cluster", ""), sample.labels.get("comm", ""))].append(
                (sample.labels, sample.value))
    return by_comm


def robust_outliers(lags: list[float], threshold: float) -> tuple[float, float, list[tuple[int, float]]]:
    """(median, MAD, [(index, robust z)]) of the lags above the median by more than
    `threshold` robust z-scores and MIN_DEVIATION seconds. With MAD 0 (all ranks but the
    outliers equal) any rank past MIN_DEVIATION is an outlier (z = inf)."""
    median = statistics.median(lags)
    mad = statistics.median(abs(lag - median) for lag in lags)
    found = []
    for index, lag in enumerate(lags):
        deviation = lag - median
        if deviation <= MIN_DEVIATION:
            continue
        z = deviation / (MAD_SCALE * mad) if mad > 0 else float("inf")
        if z > threshold:
            found.append((index, z))
    return median, mad, found


@tool_handler("outliers")
def outliers(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """Straggler ranks: arrival lag more than `threshold` robust z-scores above the median of
    their communicator's ranks (median absolute deviation), slowest first."""
    rows = []
    for (_, comm), members in _lags_by_comm(state, params).items():
        if len(members) < 3:
            continue        # a median of two ranks cannot say which one is off
        median, mad, found = robust_outliers([lag for _, lag in members], params["threshold"])
        for index, z in found:
            labels, lag = members[index]
            rows.append({"labels": {k: labels[k] for k in ("cluster", "comm", "rank", "node") if k in labels},
                         "value": lag, "deviation_seconds": lag - median, "median_seconds": median,
                         "mad_seconds": mad, "robust_z": None if z == float("inf") else round(z, 2),
                         "ranks": len(members)})
    return sorted(rows, key=lambda r: -r["value"])


@tool_handler("cost")
def cost(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """What stragglers cost, per communicator: every collective, each rank waits for the last
    to arrive, so the GPUs idle on average are collectives/s x sum over ranks of (slowest
    lag - own lag); times the default GPU-hour rate, per hour and over the window."""
    rate = state.config.gpu_hour_rates["default"]
    hours = duration_seconds(params["window"]) / 3600
    per_second: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sample in state.prom.query(COLLECTIVE_RATE % _comm_matcher(params),
                                   timeout=state.config.prometheus_timeout_seconds):
        per_second[(sample.labels.get("cluster", ""), sample.labels.get("comm", ""))].append(sample.value)
    rows = []
    for key, members in _lags_by_comm(state, params).items():
        rates = [r for r in per_second.get(key, []) if r == r]
        if len(members) < 2 or not rates:
            continue
        labels, slowest = max(members, key=lambda m: m[1])
        collectives = statistics.median(rates)
        idle_gpus = collectives * sum(slowest - lag for _, lag in members)
        rows.append({"labels": {k: labels[k] for k in ("cluster", "comm") if k in labels},
                     "value": round(idle_gpus * rate, 4), "slowest_rank": labels.get("rank"),
                     "slowest_node": labels.get("node"), "slowest_lag_seconds": slowest,
                     "idle_gpus": round(idle_gpus, 4), "ranks": len(members),
                     "collectives_per_second": round(collectives, 3), "gpu_hour_rate": rate,
                     "dollars_per_hour": round(idle_gpus * rate, 4),
                     "dollars_in_window": round(idle_gpus * rate * hours, 4), "window": params["window"]})
    return sorted(rows, key=lambda r: -r["value"])
