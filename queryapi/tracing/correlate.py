"""Correlation of SLO violations with network anomalies (seed 000 §14.4).

For a violating span, every device on its network_path is looked up in Prometheus at the
span's end time: a firing alert of the fabric's anomaly families (TCP microburst, NCCL,
InfiniBand, NVLink) carrying that device as its `node`, or a rank named by an NCCL hang
(`fabric_nccl_hang_culprit`). The judgement of what is anomalous stays in the rules; this
only reads it.

    matched_anomaly_count = devices on the path with at least one anomaly
    confidence = min(1, matched_anomaly_count / len(network_path))

and a correlation is kept when confidence >= 0.25. Violations are queued in storage at
ingest and correlated by a background worker, so ingest never waits on Prometheus and a
restart resumes where it stopped.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..prom import PrometheusClient, PrometheusError
from ..promql import equals_any
from ..storage import Storage
from ..storage.base import Correlation

log = logging.getLogger("fabricscope.sidecar.correlation")

MIN_CONFIDENCE = 0.25
# Alert families that describe the network/fabric a request crosses; pipeline alerts
# (exporter down, collector failing) say nothing about the path.
ANOMALY_ALERTS = "FabricTcp.*|FabricNccl.*|FabricInfiniband.*|FabricNvlink.*"
DEVICE_LABEL = "node"
BATCH = 100
# Labels that say nothing about the anomaly itself.
_BOOKKEEPING_LABELS = {"__name__", "alertname", "alertstate", DEVICE_LABEL, "job", "instance"}


def anomaly_query(devices: list[str]) -> str:
    devices_re = equals_any(devices)
    return (f'ALERTS{{alertstate="firing",alertname=~"{ANOMALY_ALERTS}",{DEVICE_LABEL}=~{devices_re}}}'
            f' or (fabric_nccl_hang_culprit{{{DEVICE_LABEL}=~{devices_re}}} > 0)')


def anomalies_on_path(prom: PrometheusClient, path: list[str], at_seconds: float) -> dict[str, list[dict]]:
    """device -> the anomalies Prometheus shows on it at `at_seconds`."""
    found: dict[str, list[dict]] = {}
    if not path:
        return found
    for sample in prom.query(anomaly_query(path), at=at_seconds):
        labels = sample.labels
        device = labels.get(DEVICE_LABEL)
        if device is None:
            continue
        detail = {k: v for k, v in labels.items() if k not in _BOOKKEEPING_LABELS}
        anomaly = {"device": device, "kind": labels.get("alertname") or "NcclHangCulprit", "labels": detail}
        found.setdefault(device, []).append(anomaly)
    return found


def correlate_one(prom: PrometheusClient, span: dict[str, Any]) -> Correlation | None:
    path = span["network_path"]
    if not path:
        return None
    found = anomalies_on_path(prom, path, span["end_ms"] / 1000.0)
    matched = sum(1 for device in set(path) if device in found)
    confidence = min(1.0, matched / len(path))
    if confidence < MIN_CONFIDENCE:
        return None
    anomalies = [a for device in dict.fromkeys(path) for a in found.get(device, [])]
    return Correlation(span_pk=span["pk"], trace_id=span["trace_id"], span_id=span["span_id"],
                       service=span["service"], operation=span["operation"], span_end_ms=span["end_ms"],
                       duration_ms=span["duration_ms"], slo_ms=span["slo_ms"], matched_anomaly_count=matched,
                       path_length=len(path), confidence=round(confidence, 4), anomalies=anomalies)


class Correlator:
    """Drains the queue of violations: claim a batch, correlate each, save the results.
    When Prometheus fails the claims are released and the batch is retried later."""

    def __init__(self, storage: Storage, prom: PrometheusClient, metrics) -> None:
        self.storage = storage
        self.prom = prom
        self.metrics = metrics
        # Checked between spans: on shutdown the rest of a backlog waits for the next start
        # (its claims released) instead of holding SIGTERM for as long as it takes.
        self.stopping: Callable[[], bool] = lambda: False

    def run_once(self) -> int:
        """Correlate until the queue is empty or Prometheus fails; returns violations done."""
        done_total = 0
        while not self.stopping():
            batch = self.storage.claim_pending_violations(BATCH)
            if not batch:
                break
            done, results = [], []
            try:
                for span in batch:
                    if self.stopping():
                        break
                    started = time.perf_counter()
                    correlation = correlate_one(self.prom, span)
                    self.metrics.correlation_seconds.observe(time.perf_counter() - started)
                    done.append(span["pk"])
                    if correlation is not None:
                        results.append(correlation)
                        self.metrics.correlations.labels(*self.metrics.slo_pair(span["service"],
                                                                                span["operation"])).inc()
                        self.metrics.correlation_runs.labels("correlated").inc()
                    else:
                        self.metrics.correlation_runs.labels("no_anomaly").inc()
            except PrometheusError as exc:
                self.metrics.correlation_runs.labels("prometheus_error").inc()
                log.warning("correlation paused: %s", exc)
                self.storage.save_correlations(done, results)
                self.storage.release_claims([s["pk"] for s in batch if s["pk"] not in set(done)])
                done_total += len(done)
                break
            self.storage.save_correlations(done, results)
            if len(done) < len(batch):
                self.storage.release_claims([s["pk"] for s in batch[len(done):]])
            done_total += len(done)
        self.metrics.pending_correlations.set(self.storage.count_pending_violations())
        return done_total
