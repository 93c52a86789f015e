"""The sidecar's own metrics, in a private registry served at /metrics."""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# service/operation come from clients; past this many pairs new ones count as "other",
# keeping the sidecar's own target bounded.
MAX_SLO_PAIRS = 200


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("fabric_sidecar_requests_total", "HTTP requests answered, by endpoint and status.",
                                ["endpoint", "method", "status"], registry=r)
        self.request_seconds = Histogram("fabric_sidecar_request_duration_seconds",
                                         "Time to answer a request, by endpoint.", ["endpoint"], registry=r,
                                         buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        # No key id label: /metrics is open, and key ids are for the audit log.
        self.rate_limited = Counter("fabric_sidecar_rate_limited_total", "Requests refused with 429 for a key's "
                                    "request rate.", registry=r)
        self.spans_received = Counter("fabric_sidecar_spans_received_total",
                                      "Spans accepted and stored, by ingest format.", ["format"], registry=r)
        self.spans_rejected = Counter("fabric_sidecar_spans_rejected_total",
                                      "Spans refused by per-span validation, by ingest format.", ["format"],
                                      registry=r)
        self.spans_evaluated = Counter("fabric_sidecar_spans_evaluated_total",
                                       "Accepted spans checked against their (service, operation) SLO; "
                                       "with fabric_sidecar_slo_violations_total gives the burn rate.",
                                       ["service", "operation"], registry=r)
        self.slo_violations = Counter("fabric_sidecar_slo_violations_total",
                                      "Spans whose duration exceeded their (service, operation) SLO.",
                                      ["service", "operation"], registry=r)
        self.correlations = Counter("fabric_sidecar_correlations_total",
                                    "SLO violations correlated with network anomalies (confidence >= 0.25).",
                                    ["service", "operation"], registry=r)
        self.correlation_runs = Counter("fabric_sidecar_correlation_evaluations_total",
                                        "SLO violations evaluated against Prometheus, by outcome.",
                                        ["outcome"], registry=r)
        self.correlation_seconds = Histogram("fabric_sidecar_correlation_duration_seconds",
                                             "Time to correlate one SLO violation (Prometheus query included).",
                                             registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, 1))
        self.pending_correlations = Gauge("fabric_sidecar_pending_correlations",
                                          "SLO violations waiting to be correlated.", registry=r)
        self.alerts_received = Counter("fabric_sidecar_alerts_received_total",
                                       "Alertmanager webhook alerts recorded, by status.", ["status"], registry=r)
        self.alerts_reconciled = Counter("fabric_sidecar_alerts_reconciled_total",
                                         "Alert records changed to match Alertmanager's API (resolved: ended "
                                         "unnotified; added: never notified).", ["action"], registry=r)
        self.prometheus_errors = Counter("fabric_sidecar_prometheus_errors_total",
                                         "Prometheus HTTP API calls that failed, by reason.", ["reason"], registry=r)
        self.key_reload_failures = Gauge("fabric_sidecar_key_file_reload_failures",
                                         "Times a changed API key file could not be loaded (old keys kept).",
                                         registry=r)
        self._pairs: set[tuple[str, str]] = set()
        self._pairs_lock = threading.Lock()

    def slo_pair(self, service: str, operation: str) -> tuple[str, str]:
        pair = (service, operation)
        with self._pairs_lock:
            if pair in self._pairs:
                return pair
            if len(self._pairs) < MAX_SLO_PAIRS:
                self._pairs.add(pair)
                return pair
        return ("other", "other")
