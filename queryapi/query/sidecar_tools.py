"""The Python functions behind the registry's `tool:` queries that read the sidecar's
own store or Prometheus in ways one PromQL expression cannot."""
from __future__ import annotations

import ipaddress
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

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
    trace = params.get("trace")
    found = state.storage.correlations(trace_id=trace, since_ms=None if trace else _since_ms("1d"), limit=5000)
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
    from fabricscope.chaos.blast import unknown_device
    topology = _chaos_service(caller).topology.engine().topology
    device = params["device"]
    if device not in topology:
        raise unknown_device(topology, device)
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
    from fabricscope.chaos.blast import initial_failures
    service = _chaos_service(caller)
    engine = service.topology.engine()
    # Validated before the budget is spent: a request naming an unknown device costs nothing.
    initial_failures(engine.topology, params["device"], params["failure_type"])
    if caller.key is not None:
        retry_after = service.spend(caller.key.id)
        if retry_after is not None:
            raise QueryBudgetExceeded(service.budget_message(caller.key.id), retry_after)
    result = engine.simulate(params["device"], params["failure_type"], include_jobs=True).to_dict()
    kinds = {name: kind for name, kind in engine.topology.graph.nodes(data="kind")}
    rows = [{"labels": {"device": step["device"], "kind": kinds.get(step["device"], "")},
             "value": None, "via": step["via"], "reason": step["reason"]} for step in result["path"]]
    summary = {k: result[k] for k in ("impact_score", "affected_device_count", "total_devices", "affected_jobs",
                                      "affected_job_count", "total_active_jobs", "affected_by_kind",
                                      "topology_version", "path_truncated")}
    return {"results": rows, "summary": summary}


@tool_handler("event_history")
def event_history(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """event_history (the sidecar's cluster question): alert episodes in the window."""
    from ..cluster.questions import event_history as history
    end = time.time()
    episodes = history(state.prom, end - duration_seconds(params["window"]), end, node=params.get("host"),
                       rank=str(params["rank"]) if params.get("rank") is not None else None)
    return [{"labels": {"alertname": e["alertname"], **e["labels"]}, "value": None, "severity": e["severity"],
             "start": e["start"], "end": e["end"]} for e in episodes]


# -- stragglers: the sidecar's cluster questions (queryapi/cluster/questions.py) ------------
def _straggler_row(rank: dict[str, Any]) -> dict[str, Any]:
    labels = {k: rank[k] for k in ("cluster", "comm", "rank", "node")}
    return {"labels": labels, "value": rank["lag_seconds"],
            **{k: v for k, v in rank.items() if k not in labels and k != "lag_seconds"}}


@tool_handler("outliers")
def outliers(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """find_outlier_ranks: arrival lag more than `threshold` robust z-scores (1.4826 x MAD)
    above the communicator's median, slowest first."""
    from ..cluster.questions import find_outlier_ranks
    return [_straggler_row(asdict(o)) for o in
            find_outlier_ranks(state.prom, comm=params.get("comm"), threshold=params["threshold"])]


@tool_handler("cost")
def cost(state, params: dict[str, Any], caller) -> dict[str, Any]:
    """get_cost: what the straggler ranks cost their communicators, per hour and over the
    window, at the sidecar's default GPU-hour rate."""
    from ..cluster.questions import get_cost
    answer = get_cost(state.prom, state.config.gpu_hour_rates, comm=params.get("comm"),
                      window_seconds=int(duration_seconds(params["window"])))
    ranks = answer.pop("ranks")
    return {"results": [{**_straggler_row(r), "value": r["dollars_per_hour"], "lag_seconds": r["lag_seconds"]}
                        for r in ranks], "summary": answer}
