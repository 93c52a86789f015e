"""Node network: what the kernel sees of a node's traffic, without instrumenting anything.
eBPF TCP RTT and connect latency (heatmaps and quantiles, microbursts marked), retransmits,
run-queue latency, syscall / GPU-driver ioctl density and mmap churn; then the node's
interfaces, with links down to each InfiniBand port and GPU."""
from __future__ import annotations

from grafanalib import core as g

from . import common as c
from . import infiniband, nvlink_nccl
from .mixin_config import thresholds

TITLE = "fabricscope / Node network"
UID = c.uid_for(__file__)

SEL = c.matchers("cluster", "job", "node")


def histogram_rate(metric: str) -> str:
    return f"rate({metric}_bucket{{{SEL}}}[{c.RATE}])"


def quantiles(metric: str) -> list[g.Target]:
    return [c.prom(f"histogram_quantile({q}, sum by (node, le) ({histogram_rate(metric)}))",
                   legend=f"{{{{node}}}} p{label}")
            for q, label in ((0.5, "50"), (0.99, "99"), (0.999, "99.9"))]


def per_second(metric: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{{{SEL}{extra}}}[{c.RATE}]))"


def dashboard() -> g.Dashboard:
    limits = thresholds()
    microburst = limits["microburstMultiplier"]
    microburst_critical = limits["microburstCriticalMultiplier"]
    panels = [
        c.row("TCP latency (eBPF)"),
        c.heatmap("TCP round-trip time", c.prom(f"sum by (le) ({histogram_rate('fabric_tcp_rtt_seconds')})",
                                                legend="{{le}}", heatmap=True), "s",
                  "Smoothed RTT samples of the node's TCP sockets per bucket and second (tp_btf/tcp_probe)."),
        c.heatmap("TCP connect latency", c.prom(
            f"sum by (le) ({histogram_rate('fabric_tcp_connect_latency_seconds')})", legend="{{le}}", heatmap=True),
            "s", "Time from connect() to an established connection, per bucket and second."),
        c.timeseries("TCP RTT p50 / p99 / p99.9", quantiles("fabric_tcp_rtt_seconds"), "s",
                     "Quantiles of the smoothed-RTT histogram. On a request/response server it holds the "
                     "clients' think time, so no alert reads it."),
        c.timeseries("TCP RTT excess p50 / p99 / p99.9", quantiles("fabric_tcp_rtt_excess_seconds"), "s",
                     "Quantiles of RTT samples minus their connection's min RTT: queueing above the path's "
                     "floor. The microburst alert compares the p99 with its own 5-minute average."),
        c.timeseries("Microburst: p99 RTT excess / its 5-minute average", [c.prom(
            f"""node:fabric_tcp_rtt_excess_seconds:p99_1m{{{c.matchers('cluster', 'node')}}}
                / on (cluster, node) (node:fabric_tcp_rtt_excess_seconds_p99:avg5m{{{c.matchers('cluster', 'node')}}} > 0)""",
            legend="{{node}}")], "x",
            f"The ratio the FabricTcpMicroburst alert uses (recording rules): warning above {microburst:g}x, "
            f"critical above {microburst_critical:g}x. Blue markers: microburst alerts.",
            thresholds=[(None, "green"), (microburst, "orange"), (microburst_critical, "red")]),
        c.timeseries("TCP connect latency p50 / p99 / p99.9", quantiles("fabric_tcp_connect_latency_seconds"), "s",
                     "Quantiles of the connect-latency histogram."),
        c.timeseries("TCP retransmitted segments", [
            c.prom(per_second("fabric_tcp_retransmitted_segments_total", "node"), legend="{{node}} retransmitted"),
            c.prom(per_second("fabric_tcp_timeouts_total", "node"), legend="{{node}} RTO timeouts")], "pps",
            "Segments retransmitted and retransmission timeouts per second (/proc/net/snmp, netstat)."),
        c.row("TCP loss"),
        c.timeseries("Retransmitted share of sent segments", [c.prom(
            f"""{per_second('fabric_tcp_retransmitted_segments_total', 'node')}
                / ({per_second('fabric_tcp_out_segments_total', 'node')} > 0)""", legend="{{node}}")],
            "percentunit", "RetransSegs / OutSegs: the share of TCP segments sent twice.", size=c.Size(8, 8)),
        c.timeseries("Loss probes and lost retransmits", [
            c.prom(per_second("fabric_tcp_loss_probes_total", "node"), legend="{{node}} loss probes"),
            c.prom(per_second("fabric_tcp_lost_retransmits_total", "node"), legend="{{node}} lost retransmits")],
            "pps", "Tail-loss probes sent and retransmissions lost again, per second.", size=c.Size(8, 8)),
        c.timeseries("Listen overflows and drops", [
            c.prom(per_second("fabric_tcp_listen_overflows_total", "node"), legend="{{node}} overflows"),
            c.prom(per_second("fabric_tcp_listen_drops_total", "node"), legend="{{node}} drops")],
            "pps", "Connections refused because an accept queue was full.", size=c.Size(8, 8)),
        c.row("Scheduler and system calls (eBPF)"),
        c.heatmap("Run-queue latency", c.prom(
            f"sum by (le) ({histogram_rate('fabric_sched_runqueue_latency_seconds')})", legend="{{le}}", heatmap=True),
            "s", "Time runnable threads waited for a CPU (tp_btf/sched_wakeup → sched_switch)."),
        c.timeseries("Run-queue latency p50 / p99 / p99.9", quantiles("fabric_sched_runqueue_latency_seconds"), "s",
                     "Quantiles of the run-queue latency histogram: a data loader starved of CPU shows here."),
        c.timeseries("System calls per process", [c.prom(per_second("fabric_process_syscalls_total", "node, comm"),
                                                         legend="{{node}} {{comm}}")], "ops",
                     "System calls per second by process name (bounded allow-list; the rest count as other).",
                     size=c.Size(8, 8)),
        c.timeseries("GPU driver ioctls per process", [c.prom(
            per_second("fabric_gpu_driver_ioctls_total", "node, comm"), legend="{{node}} {{comm}}")], "ops",
            "ioctl() calls on /dev/nvidia* per second: contention on the GPU driver.", size=c.Size(8, 8)),
        c.timeseries("mmap churn", [c.prom(per_second("fabric_process_mmap_calls_total", "node, op"),
                                           legend="{{node}} {{op}}")], "ops",
                     "mmap/munmap calls per second: allocator churn that stalls training steps.", size=c.Size(8, 8)),
        c.timeseries("Context switches and migrations", [
            c.prom(per_second("fabric_sched_context_switches_total", "node"), legend="{{node}} context switches"),
            c.prom(per_second("fabric_sched_migrations_total", "node"), legend="{{node}} migrations")], "ops",
            "Context switches and thread migrations between CPUs per second."),
        c.row("Interfaces"),
        c.timeseries("Interface traffic", [
            c.prom(per_second("fabric_netdev_rx_bytes_total", "node, interface"), legend="{{node}} {{interface}} rx"),
            c.prom(per_second("fabric_netdev_tx_bytes_total", "node, interface"), legend="{{node}} {{interface}} tx")],
            "Bps", "Bytes per second per network interface (/sys/class/net statistics)."),
        c.timeseries("Interface drops and errors", [
            c.prom(f"""{per_second('fabric_netdev_rx_dropped_total', 'node, interface')}
                       + {per_second('fabric_netdev_tx_dropped_total', 'node, interface')}""",
                   legend="{{node}} {{interface}} dropped"),
            c.prom(f"""{per_second('fabric_netdev_rx_errors_total', 'node, interface')}
                       + {per_second('fabric_netdev_tx_errors_total', 'node, interface')}""",
                   legend="{{node}} {{interface}} errors")],
            "pps", "Dropped and errored packets per second, both directions."),
        c.table("InfiniBand ports", [c.prom(f"fabric_infiniband_port_rate_bytes_per_second{{{SEL}}}",
                                            instant=True, table=True)], "Bps",
                "The node's InfiniBand/RoCE ports and their link rate. Click a port for its fabric view.",
                hidden=("Time", "__name__", "job", "instance"), renames={"Value": "link rate"},
                links=[c.dashboard_link(infiniband.UID, "InfiniBand view of ${__data.fields.node} ${__data.fields.device}",
                                        cluster="${cluster}", node="${__data.fields.node}",
                                        device="${__data.fields.device}")]),
        c.table("GPUs", [c.prom(f"fabric_gpu_info{{{SEL}}}", instant=True, table=True)], "none",
                "The node's GPUs (NVML). Click a GPU for its NVLink view.",
                hidden=("Time", "__name__", "job", "instance", "Value"),
                links=[c.dashboard_link(nvlink_nccl.UID, "NVLink view of ${__data.fields.node} GPU ${__data.fields.gpu}",
                                        cluster="${cluster}", node="${__data.fields.node}",
                                        gpu="${__data.fields.gpu}")]),
    ]
    board = c.dashboard(__file__, TITLE, "eBPF TCP latency and loss, scheduler and system-call pressure, and "
                        "interfaces of the selected nodes.",
                        c.fleet_variables(c.node_variable()), panels, annotation_scope=("cluster", "node"))
    board.annotations.list.append({
        "datasource": c.PROMETHEUS, "enable": True, "hide": False, "iconColor": "blue", "name": "Microbursts",
        "expr": f'ALERTS{{alertname="FabricTcpMicroburst", alertstate="firing", {c.alert_matchers("cluster", "node")}}}',
        "step": "15s", "titleFormat": "Microburst on {{node}}", "textFormat": "{{severity}}",
        "tagKeys": "node,severity", "useValueForTime": False})
    return board
