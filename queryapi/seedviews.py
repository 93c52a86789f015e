"""The seed product's read API (seed 000 §14.2–14.3) as thin views over Prometheus, so
its users' scripts and panels keep working: nothing here is stored, every answer is a
few PromQL queries over what the exporters already expose."""
from __future__ import annotations

import math
import time
from typing import Any

from apiflask import APIBlueprint
from pydantic import BaseModel, Field

from .auth import require_scope
from .cluster.questions import selector
from .context import sidecar

bp = APIBlueprint("seed", __name__, tag="Seed read API")

# Rated bidirectional bandwidth of one NVLink by version, in GB/s.
NVLINK_GBYTES_PER_SECOND = {1: 40.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 100.0}


def setup(app, state) -> None:
    state.capabilities.add("seed_read_api")


def _num(value: float) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value


def _by(samples, *labels: str) -> dict[tuple, Any]:
    return {tuple(s.labels.get(label, "") for label in labels): s for s in samples}


class DeviceQuery(BaseModel):
    device: str | None = Field(None, max_length=256, description="a host (the `node` label)")


class EbpfMetric(BaseModel):
    host: str
    cluster: str
    timestamp: float
    p50_us: float | None
    p99_us: float | None
    p999_us: float | None
    retransmits_per_second: float | None


class EbpfMetricsOut(BaseModel):
    metrics: list[EbpfMetric]


@bp.get("/ebpf/metrics")
@require_scope("read")
@bp.input(DeviceQuery, location="query")
@bp.output(EbpfMetricsOut)
@bp.doc(summary="Latest TCP RTT percentiles (µs) and retransmit rate per host")
def ebpf_metrics(query_data: DeviceQuery):
    prom = sidecar().prom
    match = selector(node=query_data.device)
    hosts: dict[tuple, dict] = {}
    for name, q in (("p50_us", 0.5), ("p99_us", 0.99), ("p999_us", 0.999)):
        query = f"histogram_quantile({q}, sum by (cluster, node, le) (rate(fabric_tcp_rtt_seconds_bucket{match}[1m])))"
        for key, sample in _by(prom.query(query), "cluster", "node").items():
            entry = hosts.setdefault(key, {"host": key[1], "cluster": key[0], "timestamp": sample.timestamp})
            entry[name] = _num(sample.value * 1e6)
    query = f"sum by (cluster, node) (rate(fabric_tcp_retransmitted_segments_total{match}[1m]))"
    for key, sample in _by(prom.query(query), "cluster", "node").items():
        entry = hosts.setdefault(key, {"host": key[1], "cluster": key[0], "timestamp": sample.timestamp})
        entry["retransmits_per_second"] = _num(sample.value)
    out = []
    for entry in hosts.values():
        out.append({"p50_us": None, "p99_us": None, "p999_us": None, "retransmits_per_second": None, **entry})
    return {"metrics": sorted(out, key=lambda e: (e["cluster"], e["host"]))}


class EbpfEvent(BaseModel):
    host: str
    cluster: str
    type: str
    severity: str | None
    timestamp: float
    description: str | None


class EbpfEventsOut(BaseModel):
    events: list[EbpfEvent]


@bp.get("/ebpf/events")
@require_scope("read")
@bp.input(DeviceQuery, location="query")
@bp.output(EbpfEventsOut)
@bp.doc(summary="TCP anomaly events firing now (microburst and the other FabricTcp alerts) per host")
def ebpf_events(query_data: DeviceQuery):
    prom = sidecar().prom
    labels = selector(node=query_data.device)[1:-1]
    query = f'ALERTS{{alertstate="firing",alertname=~"FabricTcp.*"{"," + labels if labels else ""}}}'
    events = []
    for sample in prom.query(query):
        name = sample.labels.get("alertname", "")
        events.append({"host": sample.labels.get("node", ""), "cluster": sample.labels.get("cluster", ""),
                       "type": "microburst" if name == "FabricTcpMicroburst" else name,
                       "severity": sample.labels.get("severity"), "timestamp": sample.timestamp,
                       "description": None})
    return {"events": sorted(events, key=lambda e: (e["host"], e["type"], e["severity"] or ""))}


class NvlinkEdge(BaseModel):
    source_device: str
    source_gpu_id: int
    dest_device: str
    dest_gpu_id: int | None = Field(description="None when the link ends at an NVSwitch or an unknown peer")
    link_id: str
    bandwidth_gbps: float | None
    link_state: str = Field(description="active | inactive | error")
    p99_latency_us: float | None = Field(description="always null: no per-link latency signal exists")
    cluster: str
    remote_type: str | None


class NvlinkEdgesOut(BaseModel):
    edges: list[NvlinkEdge]


def nvlink_edges() -> list[dict]:
    prom = sidecar().prom
    info = prom.query("fabric_nvlink_info")
    states = _by(prom.query("fabric_nvlink_state"), "cluster", "node", "gpu", "link")
    erroring = _by(prom.query('ALERTS{alertstate="firing",alertname=~"FabricNvlink.*"}'), "cluster", "node", "gpu",
                   "link")
    gpus_by_bus = {(s.labels.get("cluster", ""), s.labels.get("node", ""), s.labels.get("pci_bus_id", "").lower()):
                   s.labels.get("gpu") for s in prom.query("fabric_gpu_info")}
    edges = []
    for sample in info:
        lab = sample.labels
        key = (lab.get("cluster", ""), lab.get("node", ""), lab.get("gpu", ""), lab.get("link", ""))
        peer = gpus_by_bus.get((key[0], key[1], lab.get("remote_pci_bus_id", "").lower()))
        state = states.get(key)
        if key in erroring:
            link_state = "error"
        elif state is not None and state.value == 1:
            link_state = "active"
        else:
            link_state = "inactive"
        try:
            version = int(float(lab.get("version", "")))
        except ValueError:
            version = None
        rated = NVLINK_GBYTES_PER_SECOND.get(version)
        edges.append({"source_device": key[1], "source_gpu_id": int(key[2]) if key[2].isdigit() else -1,
                      "dest_device": key[1], "dest_gpu_id": int(peer) if peer and peer.isdigit() else None,
                      "link_id": f"{key[1]}/gpu{key[2]}/nvlink{key[3]}",
                      "bandwidth_gbps": rated * 8 if rated else None, "link_state": link_state,
                      "p99_latency_us": None, "cluster": key[0], "remote_type": lab.get("remote_type")})
    return sorted(edges, key=lambda e: (e["cluster"], e["link_id"]))


@bp.get("/nvlink/edges")
@require_scope("read")
@bp.output(NvlinkEdgesOut)
@bp.doc(summary="NVLink edges of every GPU in the fleet (seed NVLinkEdgeModel fields)")
def edges():
    return {"edges": nvlink_edges()}


class IbPort(BaseModel):
    cluster: str
    device: str = Field(description="host (node label)")
    hca: str
    port: str
    state: str | None
    rate_gbps: float | None
    link_layer: str | None


class TopologyOut(BaseModel):
    nvlink_edges: list[NvlinkEdge]
    infiniband_ports: list[IbPort]


@bp.get("/nccl/topology/full")
@require_scope("read")
@bp.output(TopologyOut)
@bp.doc(summary="NVLink edges merged with the InfiniBand ports of every host")
def topology():
    prom = sidecar().prom
    keys = ("cluster", "node", "device", "port")
    states = _by(prom.query("fabric_infiniband_port_state"), *keys)
    rates = _by(prom.query("fabric_infiniband_port_rate_bytes_per_second"), *keys)
    layers = _by(prom.query("fabric_infiniband_port_info"), *keys)
    ports = []
    for key in sorted(set(states) | set(rates) | set(layers)):
        rate = rates.get(key)
        ports.append({"cluster": key[0], "device": key[1], "hca": key[2], "port": key[3],
                      "state": states[key].labels.get("state") if key in states else None,
                      "rate_gbps": _num(rate.value * 8 / 1e9) if rate else None,
                      "link_layer": layers[key].labels.get("link_layer") if key in layers else None})
    return {"nvlink_edges": nvlink_edges(), "infiniband_ports": ports}


class ActiveOperation(BaseModel):
    cluster: str
    node: str
    comm: str
    rank: str
    op: str
    elapsed_seconds: float
    rolling_average_seconds: float | None
    hanging: bool
    culprit: str | None = Field(description="not_entered | stuck_in_call when a hang names this rank")


class ActiveOut(BaseModel):
    timestamp: float
    operations: list[ActiveOperation]
    culprits: list[dict[str, str]]


@bp.get("/nccl/operations/active")
@require_scope("read")
@bp.output(ActiveOut)
@bp.doc(summary="NCCL operations in flight across the fleet, with hang status and the culprits a hang names")
def active_operations():
    prom = sidecar().prom
    keys = ("cluster", "node", "comm", "rank", "op")
    averages = _by(prom.query("fabric_nccl_completed_average_seconds"), *keys)
    hanging = _by(prom.query("fabric_nccl_hanging == 1"), *keys)
    culprit_samples = prom.query("fabric_nccl_hang_culprit == 1")
    culprit_of = {(s.labels.get("cluster", ""), s.labels.get("comm", ""), s.labels.get("rank", "")):
                  s.labels.get("reason") for s in culprit_samples}
    operations = []
    for sample in prom.query("fabric_nccl_inflight_elapsed_seconds"):
        key = tuple(sample.labels.get(k, "") for k in keys)
        average = averages.get(key)
        operations.append({**dict(zip(keys, key)), "elapsed_seconds": sample.value,
                           "rolling_average_seconds": _num(average.value) if average else None,
                           "hanging": key in hanging, "culprit": culprit_of.get((key[0], key[2], key[3]))})
    culprits = [{k: s.labels.get(k, "") for k in ("cluster", "node", "comm", "rank", "reason")}
                for s in culprit_samples]
    operations.sort(key=lambda o: (not o["hanging"], -o["elapsed_seconds"]))
    return {"timestamp": time.time(), "operations": operations, "culprits": culprits}
