"""Token-path tracing & SLOs: the sidecar's span store seen two ways. Its own metrics,
scraped by Prometheus, give the SLO burn over time; the sidecar's HTTP API, read through
the Infinity datasource, lists the violating spans and the network anomalies each was
correlated with (confidence = devices with an anomaly / devices on the path)."""
from __future__ import annotations

from grafanalib import core as g

from . import common as c

TITLE = "fabricscope / Token-path tracing & SLOs"
UID = c.uid_for(__file__)

SEL = c.matchers("job", "service", "operation")
FLOW = "service, operation"
FLOW_LEGEND = "{{service}}/{{operation}}"
# The alert families the sidecar correlates violations with (queryapi/tracing/correlate.py).
ANOMALY_ALERTS = "FabricTcp.*|FabricNccl.*|FabricInfiniband.*|FabricNvlink.*"

# The dashboard's time range (epoch ms, as Grafana gives ${__from} and ${__to}): the
# sidecar lists only what ended inside it.
RANGE = [("from_ms", "${__from}"), ("to_ms", "${__to}")]

VIOLATIONS = c.InfinityTarget(
    url="/tracing/slo-violations", root_selector="violations",
    params=RANGE + [("limit", "500")],
    columns=[("end_ms", "End", "timestamp_epoch"), ("trace_id", "Trace", "string"),
             ("service", "Service", "string"), ("operation", "Operation", "string"),
             ("duration_ms", "Duration (ms)", "number"), ("slo_ms", "SLO (ms)", "number"),
             ("network_path", "Network path", "string")])
CORRELATIONS = c.InfinityTarget(
    url="/tracing/correlations", root_selector="correlations",
    params=RANGE + [("limit", "500")],
    columns=[("span_end_ms", "End", "timestamp_epoch"), ("trace_id", "Trace", "string"),
             ("service", "Service", "string"), ("operation", "Operation", "string"),
             ("duration_ms", "Duration (ms)", "number"), ("slo_ms", "SLO (ms)", "number"),
             ("confidence", "Confidence", "number"), ("matched_anomaly_count", "Devices with anomalies", "number"),
             ("path_length", "Path length", "number"), ("anomalies", "Anomalies", "string")])
SLOS = c.InfinityTarget(url="/tracing/slos", columns=[("default_ms", "Default SLO (ms)", "number"),
                                                      ("overrides", "Overrides (ms)", "string")])


def per_second(metric: str) -> str:
    return f"sum by ({FLOW}) (rate({metric}{{{SEL}}}[{c.RATE}]))"


def dashboard() -> g.Dashboard:
    variables = [
        c.datasource_variable(),
        c.sidecar_variable(),
        c.label_variable("job", "fabric_sidecar_requests_total", title="Sidecar job"),
        c.label_variable("service", "fabric_sidecar_spans_evaluated_total", ["job"]),
        c.label_variable("operation", "fabric_sidecar_spans_evaluated_total", ["job", "service"]),
    ]
    panels = [
        c.row("SLO burn (sidecar metrics)"),
        c.timeseries("SLO violations per second", [c.prom(per_second("fabric_sidecar_slo_violations_total"),
                                                          legend=FLOW_LEGEND)], "ops",
                     "Spans over their (service, operation) SLO per second."),
        c.timeseries("Violating share of spans", [c.prom(
            f"""{per_second('fabric_sidecar_slo_violations_total')}
                / ({per_second('fabric_sidecar_spans_evaluated_total')} > 0)""", legend=FLOW_LEGEND)],
            "percentunit", "Violations / spans evaluated: the burn rate of a p99 SLO is this over 1%.",
            thresholds=[(None, "green"), (0.01, "red")]),
        c.timeseries("Violations correlated with the network", [
            c.prom(per_second("fabric_sidecar_correlations_total"), legend=FLOW_LEGEND + " correlated"),
            c.prom(per_second("fabric_sidecar_slo_violations_total"), legend=FLOW_LEGEND + " violations")], "ops",
            "Violations the sidecar matched to a fabric anomaly on the span's path (confidence ≥ 0.25)."),
        c.timeseries("Fabric anomalies firing", [c.prom(
            f'count by (alertname) (ALERTS{{alertstate="firing", alertname=~"{ANOMALY_ALERTS}"}})',
            legend="{{alertname}}")], "none",
            "The alerts a violation can be correlated with: microbursts, NCCL, InfiniBand and NVLink faults.",
            stacked=True),
        c.row("Spans (sidecar API)"),
        c.table("Correlated SLO violations", [CORRELATIONS], "none",
                "Violations in the time range whose network path crossed a device with a firing anomaly, "
                "with the confidence and the anomalies found (GET /tracing/correlations).",
                datasource=c.SIDECAR, hidden=(), size=c.Size(24, 9)),
        c.table("SLO violations", [VIOLATIONS], "none",
                "Spans over their SLO in the time range (GET /tracing/slo-violations).",
                datasource=c.SIDECAR, hidden=(), size=c.Size(18, 9)),
        c.table("SLOs in force", [SLOS], "ms",
                "Default p99 SLO and the TRACING_SLO_<service>_<operation> overrides (GET /tracing/slos).",
                datasource=c.SIDECAR, hidden=(), size=c.Size(6, 9)),
    ]
    board = c.dashboard(__file__, TITLE, "SLO burn from the sidecar's metrics, and the violating spans with "
                        "their network correlations from the sidecar's API.", variables, panels,
                        annotation_scope=())
    board.refresh = "1m"
    return board
