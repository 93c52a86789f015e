"""The Python functions behind the registry's `tool:` queries that read the sidecar's
own store, its chaos topology or Prometheus in ways one PromQL expression cannot.
HANDLERS at the end is the one table of them, by the `tool:` names of queries.yaml; the
executor imports it (tests/test_query_escaping.py checks every `tool:` has one)."""
from __future__ import annotations

import ipaddress
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any
from urllib.parse import urlsplit

from .calls import QueryBudgetExceeded, ToolHandler, ToolUnavailable
from .params import duration_seconds


def _since_ms(window: str) -> int:
    return int((time.time() - duration_seconds(window)) * 1000)


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
def _chaos_service(state):
    service = getattr(state, "chaos", None)     # the command line's direct mode has no sidecar
    if service is None:
        raise ToolUnavailable("no cluster topology is configured for chaos simulations: start the sidecar with "
                              "--chaos-topology FILE (docs/chaos.md)")
    return service


def neighbors(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """The devices one link away, with the link's kind, partition and state."""
    from fabricscope.chaos.blast import unknown_device
    topology = _chaos_service(state).topology.engine().topology
    device = params["device"]
    if device not in topology:
        raise unknown_device(topology, device)
    rows = [{"labels": {"device": link.peer, "kind": link.kind, "link": link.link_kind,
                        "partition": link.partition}, "value": 1 if link.up else 0}
            for link in topology.neighbors(device)]
    return rows


def blast_radius(state, params: dict[str, Any], caller) -> dict[str, Any]:
    """The chaos engine's simulation, synchronously (milliseconds), under the same per-key
    simulation budget as POST /graph/chaos-simulate."""
    from fabricscope.chaos.blast import initial_failures
    service = _chaos_service(state)
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


def outliers(state, params: dict[str, Any], caller) -> list[dict[str, Any]]:
    """find_outlier_ranks: arrival lag more than `threshold` robust z-scores (1.4826 x MAD)
    above the communicator's median, slowest first."""
    from ..cluster.questions import find_outlier_ranks
    return [_straggler_row(asdict(o)) for o in
            find_outlier_ranks(state.prom, comm=params.get("comm"), threshold=params["threshold"])]


def cost(state, params: dict[str, Any], caller) -> dict[str, Any]:
    """get_cost: what the straggler ranks cost their communicators, per hour and over the
    window, at the sidecar's default GPU-hour rate."""
    from ..cluster.questions import get_cost
    answer = get_cost(state.prom, state.config.gpu_hour_rates, comm=params.get("comm"),
                      window_seconds=int(duration_seconds(params["window"])))
    ranks = answer.pop("ranks")
    return {"results": [{**_straggler_row(r), "value": r["dollars_per_hour"], "lag_seconds": r["lag_seconds"]}
                        for r in ranks], "summary": answer}


HANDLERS: dict[str, ToolHandler] = {
    "slo_violations": slo_violations,
    "correlations": correlations,
    "locate_ip": locate_ip,
    "neighbors": neighbors,
    "blast_radius": blast_radius,
    "event_history": event_history,
    "outliers": outliers,
    "cost": cost,
}
