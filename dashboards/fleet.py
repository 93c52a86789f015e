"""Fleet overview: how many nodes are healthy, what is firing, where it hurts most, and
what the stragglers cost right now. Every table links down to the node and device views."""
from __future__ import annotations

from grafanalib import core as g

from . import common as c
from . import nvlink_nccl, node_network, infiniband

TITLE = "fabricscope / Fleet overview"
UID = c.uid_for(__file__)

SCOPE = c.matchers("cluster", "job")

# Node health in one number per node: 0 healthy, 1 degraded (a warning alert names the
# node), 2 fatal (a critical alert names it, or its exporter is down). The stats count
# this same expression, so the timeline and the counters can never disagree.
HEALTH = f"""max by (cluster, node) (
  (up{{{SCOPE}}} == bool 0) * 2
  or 1 * ALERTS{{alertstate="firing", severity="warning", node!="", cluster=~"$cluster"}}
  or 2 * ALERTS{{alertstate="firing", severity="critical", node!="", cluster=~"$cluster"}}
)"""
HEALTH_STATES = [(0, "healthy", "green"), (1, "degraded", "orange"), (2, "fatal", "red")]

# How much later than the median rank each rank enters its collectives (recorded by
# rules/, the statistic the straggler alert uses); a hang's culprit, which never enters,
# is late by the time its peers have waited (comm_rank:fabric_nccl_lateness_seconds).
LATENESS = f'comm_rank:fabric_nccl_lateness_seconds{{{c.matchers("cluster")}}}'

# What stragglers cost: per communicator, the GPUs idle on average waiting for late ranks
# (each rank's share of step time lost × the other ranks; every GPU of a hung comm), as
# recorded by rules/; times the operator's $/GPU-hour, dollars per hour.
IDLE_GPUS = f'comm:fabric_nccl_idle_gpus{{{c.matchers("cluster")}}}'
STRAGGLER_COST = f"sum({IDLE_GPUS}) * $gpu_hour_usd"

# Firing alerts as states: 2 critical, 1 warning, one row per alert name.
FIRING_STATES = [(1, "warning", "orange"), (2, "critical", "red")]
FIRING = ('max by (alertname) (2 * ALERTS{alertstate="firing", severity="critical", cluster=~"$cluster"} '
          'or ALERTS{alertstate="firing", severity="warning", cluster=~"$cluster"})')

IB_ERROR_COUNTERS = ("symbol_error|port_rcv_errors|link_downed|link_error_recovery|"
                     "local_link_integrity_errors|excessive_buffer_overrun_errors|port_rcv_remote_physical_errors")


def count_nodes(state: int) -> str:
    return f"count(({HEALTH}) == {state}) or vector(0)"


def firing(severity: str) -> str:
    return f'count(ALERTS{{alertstate="firing", severity="{severity}", cluster=~"$cluster"}}) or vector(0)'


def dashboard() -> g.Dashboard:
    gpu_hour = g.Template(name="gpu_hour_usd", label="$ per GPU-hour", query="2.50", type="textbox",
                          default="2.50")
    node_link = c.dashboard_link(node_network.UID, "Node network of ${__field.labels.node}",
                                 cluster="${cluster}", node="${__field.labels.node}")
    panels = [
        c.row("Health"),
        c.stat("Healthy nodes", [c.prom(count_nodes(0), instant=True)], "none",
               "Nodes with a running exporter and no firing alert naming them.",
               thresholds=[(None, "green")]),
        c.stat("Degraded nodes", [c.prom(count_nodes(1), instant=True)], "none",
               "Nodes named by a firing warning alert (and no critical one).",
               thresholds=[(None, "green"), (1, "orange")]),
        c.stat("Fatal nodes", [c.prom(count_nodes(2), instant=True)], "none",
               "Nodes named by a firing critical alert, or whose exporter is down.",
               thresholds=[(None, "green"), (1, "red")]),
        c.stat("Critical alerts firing", [c.prom(firing("critical"), instant=True)], "none",
               "Firing alerts with severity=critical (they page).", thresholds=[(None, "green"), (1, "red")]),
        c.stat("Warning alerts firing", [c.prom(firing("warning"), instant=True)], "none",
               "Firing alerts with severity=warning (they open tickets).",
               thresholds=[(None, "green"), (1, "orange")]),
        c.stat("Straggler cost now", [c.prom(STRAGGLER_COST, instant=True)], "currencyUSD",
               "Dollars per hour of GPU time spent waiting for late ranks: the share of step time the other "
               "ranks wait for each rank (lag past the median × collectives per second), times those ranks "
               "(every GPU of a hung communicator while the hang lasts), times the $ per GPU-hour variable.",
               thresholds=[(None, "green"), (10, "orange"), (100, "red")]),
        c.timeline("Node health", [c.prom(HEALTH, legend="{{node}}")],
                   "Per node: healthy, degraded (warning alert) or fatal (critical alert or exporter down). "
                   "Click a node for its network view.", HEALTH_STATES, size=c.Size(24, 7), links=[node_link]),
        c.row("Where it hurts"),
        c.table("Worst InfiniBand links", [c.prom(
            f"""topk(10, sum by (cluster, node, device, port) (
                  rate(fabric_infiniband_port_counter_total{{{SCOPE}, counter=~"{IB_ERROR_COUNTERS}"}}[{c.RATE}])
                ) > 0)""", instant=True, table=True)], "eps",
            "The ten ports counting the most link errors per second (symbol, receive, link-downed, "
            "recovery, integrity, overrun). Click a row for the port's fabric view.",
            size=c.Size(12, 8), renames={"Value": "errors/s"},
            links=[c.dashboard_link(infiniband.UID, "InfiniBand view of ${__data.fields.node} ${__data.fields.device}",
                                    cluster="${cluster}", node="${__data.fields.node}",
                                    device="${__data.fields.device}")]),
        c.table("Slowest ranks", [c.prom(f"topk(10, {LATENESS} > 0)", instant=True, table=True)], "s",
                "The ten ranks entering their collectives latest, relative to the median rank of their "
                "communicator (mean over 1 minute); a rank a hang waits for (it never entered the operation "
                "its peers are in) is late by the time they have waited. Click a row for that rank.",
                size=c.Size(12, 8), renames={"Value": "late by"},
                links=[c.dashboard_link(nvlink_nccl.UID, "NCCL view of comm ${__data.fields.comm} rank ${__data.fields.rank}",
                                        cluster="${cluster}", comm="${__data.fields.comm}",
                                        rank="${__data.fields.rank}")]),
        c.table("Worst NVLink links", [
            c.prom(f"""topk(10, sum by (cluster, node, gpu, link) (
                         rate(fabric_nvlink_errors_total{{{SCOPE}}}[{c.RATE}])) > 0)""", instant=True, table=True),
            c.prom(f"sum by (cluster, node, gpu, link) (fabric_nvlink_state{{{SCOPE}}}) == 0",
                   instant=True, table=True)], "none",
            "NVLink links counting errors (per second), and links that are down (state 0).",
            size=c.Size(12, 8), renames={"Value #A": "errors/s", "Value #B": "state (0 = down)"},
            column_units={"errors/s": "eps"},
            links=[c.dashboard_link(nvlink_nccl.UID, "NVLink view of ${__data.fields.node} GPU ${__data.fields.gpu}",
                                    cluster="${cluster}", node="${__data.fields.node}", gpu="${__data.fields.gpu}")]),
        c.timeseries("Idle GPUs waiting for stragglers", [c.prom(IDLE_GPUS, legend="comm {{comm}}")], "none",
                     "GPU-seconds per second spent waiting for late ranks of each communicator: "
                     "the number of GPUs idle on average (all of a hung communicator's).", size=c.Size(12, 8)),
        c.row("Alerts and exporters"),
        c.timeline("Firing alerts", [c.prom(FIRING, legend="{{alertname}}")],
                   "When each alert fired, one row per alert name: critical (pages) or warning (tickets).",
                   FIRING_STATES, size=c.Size(12, 8)),
        c.timeseries("Exporters up", [c.prom(f"sum by (cluster, job) (up{{{SCOPE}}})", legend="{{job}} up"),
                                      c.prom(f"count by (cluster, job) (up{{{SCOPE}}})", legend="{{job}} targets")],
                     "none", "Scrape targets answering, against all targets.", size=c.Size(6, 8)),
        c.timeseries("Failing collectors", [c.prom(
            f"count by (collector) (fabric_scrape_collector_success{{{SCOPE}}} == 0) or vector(0)",
            legend="{{collector}}")], "none",
            "Collectors whose last scrape failed, per collector (0: all collectors succeed).",
            size=c.Size(6, 8)),
    ]
    return c.dashboard(__file__, TITLE, "Healthy, degraded and fatal nodes, firing alerts, the worst links, "
                       "the slowest ranks and what stragglers cost.",
                       c.fleet_variables(gpu_hour), panels)
