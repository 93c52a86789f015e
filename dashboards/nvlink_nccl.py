"""NVLink & NCCL: per-link NVLink throughput, errors and state, the GPU-to-NVSwitch
topology, then the job's collectives per communicator and rank: rate, bytes, enqueue time,
operations in flight against the hang line, and the ranks that arrive late (stragglers)
with their median-absolute-deviation score."""
from __future__ import annotations

from grafanalib import core as g

from fabricscope.exporter.nccl.tracker import DEFAULT_HANG_MULTIPLIER, DEFAULT_WINDOW

from . import common as c
from .mixin_config import thresholds

TITLE = "fabricscope / NVLink & NCCL"
UID = c.uid_for(__file__)

GPU_SEL = c.matchers("cluster", "job", "node", "gpu")
NCCL_SEL = c.matchers("cluster", "job", "node", "comm", "rank")
RANK = "comm, rank"
RANK_LEGEND = "comm {{comm}} rank {{rank}}"

# The straggler statistics are the recording rules the FabricNcclStragglerRank alert is
# built on (rules/): one home for the judgement, the panels only show it.
COMM_SEL = c.matchers("cluster", "comm")
LAG = f"comm_rank:fabric_nccl_arrival_lag_seconds:mean1m{{{COMM_SEL}}}"
DEVIATION = f"comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m{{{COMM_SEL}}}"
MAD = f"comm:fabric_nccl_arrival_lag_seconds:mad1m{{{COMM_SEL}}}"
MAD_SCORE = f"{DEVIATION} / on (cluster, comm) group_left () ({MAD} > 0)"
# Late by / step time lost with a hang's culprit counted (it never arrives: late by its
# peers' wait, all of their time lost), and the culprits themselves.
LATENESS = f"comm_rank:fabric_nccl_lateness_seconds{{{COMM_SEL}}}"
LOST_SHARE = f"comm_rank:fabric_nccl_lateness:step_share{{{COMM_SEL}}}"
CULPRITS = f"max by (cluster, node, comm, rank) (comm_rank:fabric_nccl_hang_culprit{{{COMM_SEL}}})"


def gpu_variable() -> g.Template:
    return c.label_variable("gpu", "fabric_gpu_info", ["cluster", "job", "node"], title="GPU")


def comm_variable() -> g.Template:
    return c.label_variable("comm", "fabric_nccl_comm_info", ["cluster", "job", "node"], title="Communicator")


def rank_variable() -> g.Template:
    return c.label_variable("rank", "fabric_nccl_comm_info", ["cluster", "job", "node", "comm"])


def link_rate(metric: str) -> str:
    return f"rate({metric}{{{GPU_SEL}}}[{c.RATE}])"


# The topology graph: GPUs and the NVSwitches (or peer GPUs) their links reach, per node.
# Node ids are node/PCI address, so the same bus id on two hosts stays two graph nodes.
TOPOLOGY_NODES = f"""
  label_join(label_join(label_replace(max by (node, gpu, pci_bus_id) (fabric_gpu_info{{{GPU_SEL}}}),
    "device", "GPU $1", "gpu", "(.*)"), "title", " ", "node", "device"), "id", "/", "node", "pci_bus_id")
  or label_join(label_join(count by (node, remote_pci_bus_id, remote_type) (fabric_nvlink_info{{{GPU_SEL}, remote_type!="gpu"}}),
    "title", " ", "node", "remote_type", "remote_pci_bus_id"), "id", "/", "node", "remote_pci_bus_id")"""
TOPOLOGY_EDGES = f"""
  label_join(label_join(label_join(
    sum by (node, gpu, pci_bus_id, remote_pci_bus_id) (
      fabric_nvlink_state{{{GPU_SEL}}}
      * on (cluster, node, gpu, link) group_left (remote_pci_bus_id) fabric_nvlink_info{{{GPU_SEL}}}
      * on (cluster, node, gpu) group_left (pci_bus_id) fabric_gpu_info{{{GPU_SEL}}}),
    "source", "/", "node", "pci_bus_id"), "target", "/", "node", "remote_pci_bus_id"),
    "id", "-", "source", "target")"""


def dashboard() -> g.Dashboard:
    limits = thresholds()
    # The exporter's tracker judges a hang; the line shows its default multiplier.
    hang = DEFAULT_HANG_MULTIPLIER
    mad = limits["stragglerMadMultiplier"]
    panels = [
        c.row("NVLink"),
        c.timeseries("NVLink throughput per link", [c.prom(
            f"sum by (node, gpu, link) ({link_rate('fabric_nvlink_bytes_total')})",
            legend="{{node}} GPU {{gpu}} link {{link}}")], "Bps",
            "Transmit + receive bytes per second on each NVLink link (NVML throughput counters)."),
        c.timeseries("NVLink errors", [c.prom(
            f"sum by (node, gpu, link, type) ({link_rate('fabric_nvlink_errors_total')}) > 0",
            legend="{{node}} GPU {{gpu}} link {{link}} {{type}}")], "eps",
            "CRC (flit, data), replay and recovery errors per second, links with errors only."),
        c.timeseries("Inactive NVLink links per GPU", [c.prom(
            f"count by (node, gpu) (fabric_nvlink_state{{{GPU_SEL}}} == 0)", legend="{{node}} GPU {{gpu}}")],
            "none", "Links NVML reports inactive; a healthy HGX GPU has all 18 up.",
            thresholds=[(None, "green"), (1, "red")]),
        c.table("NVLink links down", [c.prom(
            f"""(fabric_nvlink_state{{{GPU_SEL}}} == 0)
                * on (cluster, node, gpu, link) group_left (remote_pci_bus_id, remote_type) fabric_nvlink_info{{{GPU_SEL}}}""",
            instant=True, table=True)], "none",
            "Links that are down now, with the device at their far end.",
            hidden=("Time", "__name__", "job", "instance", "Value")),
        c.node_graph("GPU-to-GPU topology", c.prom(TOPOLOGY_NODES, instant=True, table=True, ref="nodes"),
                     c.prom(TOPOLOGY_EDGES, instant=True, table=True, ref="edges"),
                     "GPUs and the NVSwitches their NVLink links reach; an edge's value is the number of "
                     "active links between the two.", "none", size=c.Size(24, 12)),
        c.row("NCCL collectives"),
        c.timeseries("Collectives per second", [c.prom(
            f"sum by ({RANK}, op) (rate(fabric_nccl_calls_total{{{NCCL_SEL}}}[{c.RATE}]))",
            legend=RANK_LEGEND + " {{op}}")], "ops", "NCCL calls per second by communicator, rank and operation."),
        c.timeseries("Collective bytes per second", [c.prom(
            f"sum by ({RANK}, op) (rate(fabric_nccl_bytes_total{{{NCCL_SEL}}}[{c.RATE}]))",
            legend=RANK_LEGEND + " {{op}}")], "Bps", "Payload bytes per second handed to NCCL."),
        c.timeseries("Enqueue time p99", [c.prom(
            f"""histogram_quantile(0.99, sum by ({RANK}, le) (
                  rate(fabric_nccl_enqueue_seconds_bucket{{{NCCL_SEL}}}[{c.RATE}])))""", legend=RANK_LEGEND)], "s",
            "Time inside the NCCL call (entry to return: enqueue, not completion; calls are asynchronous)."),
        c.timeseries("Mean operation duration", [c.prom(
            f"""sum by ({RANK}, op) (rate(fabric_nccl_operation_duration_seconds_sum{{{NCCL_SEL}}}[{c.RATE}]))
                / (sum by ({RANK}, op) (rate(fabric_nccl_operation_duration_seconds_count{{{NCCL_SEL}}}[{c.RATE}])) > 0)""",
            legend=RANK_LEGEND + " {{op}}")], "s",
            "Call-to-call duration of completed operations. Every rank of a synchronous job shows the same "
            "period, a late one included: stragglers show in arrival lag, below."),
        c.row("Hangs"),
        c.timeseries(f"In flight against the hang line ({hang:g}× average)", [
            c.prom(f"max by ({RANK}, op) (fabric_nccl_inflight_elapsed_seconds{{{NCCL_SEL}}})",
                   legend=RANK_LEGEND + " {{op}} in flight"),
            c.prom(f"{hang:g} * max by ({RANK}, op) (fabric_nccl_completed_average_seconds{{{NCCL_SEL}}})",
                   legend=RANK_LEGEND + " {{op}} hang line")], "s",
            f"How long the current operation has been in flight, and {hang:g}× (the exporter's default "
            f"hang_multiplier) the average of the last {DEFAULT_WINDOW} completed ones: past that line "
            f"(and {limits['ncclHangMinElapsedSeconds']:g} s) the operation hangs (FabricNcclHang). Log scale: a "
            "line of milliseconds and a hang of minutes both show.", log_scale=True),
        c.table("Hanging operations", [c.prom(
            f"comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging{{{c.matchers('cluster', 'node', 'comm', 'rank')}}}",
            instant=True, table=True)], "s",
            "Ranks whose current operation is in flight past the hang line, with how long (recording rule).",
            hidden=("Time", "__name__", "job", "instance"), renames={"Value": "in flight"}),
        c.table("Hang culprits", [c.prom(
            f"comm_rank:fabric_nccl_hang_culprit{{{c.matchers('cluster', 'comm')}}}", instant=True, table=True)],
            "none", "The ranks a hang is waiting for: not_entered (it never called the collective its peers are "
            "in) or stuck_in_call (recording rule, across nodes).",
            hidden=("Time", "__name__", "job", "instance", "Value"), size=c.Size(24, 6)),
        c.row("Stragglers"),
        c.timeseries("Arrival lag per rank (1m mean)", [c.prom(LAG, legend=RANK_LEGEND)], "s",
                     "How late each rank enters its collectives relative to the comm's first rank in. A straggler "
                     "is late to every collective; the others wait for it."),
        c.timeseries(f"Straggler score (MADs from the median, alert at {mad:g})", [c.prom(MAD_SCORE, legend=RANK_LEGEND)],
                     "suffix: MAD",
                     "(lag − median lag of the communicator) / median absolute deviation of the lags.",
                     thresholds=[(None, "green"), (mad, "red")]),
        c.timeseries("Step time lost waiting for each rank", [c.prom(LOST_SHARE, legend=RANK_LEGEND)], "percentunit",
                     "Share of the job's time the other ranks spend waiting for this one: its lag past the median "
                     "times collectives per second; all of it (100 %) for a rank a hang waits for."),
        c.table("Straggler ranks", [
            c.prom(f"{LATENESS} and on (cluster, comm, rank) ({MAD_SCORE} > {mad:g} or {CULPRITS})",
                   instant=True, table=True),
            c.prom(f"{LOST_SHARE} and on (cluster, comm, rank) ({MAD_SCORE} > {mad:g} or {CULPRITS})",
                   instant=True, table=True),
            c.prom(f"{MAD_SCORE} > {mad:g}", instant=True, table=True)], "s",
            f"Ranks more than {mad:g} median absolute deviations late, and the ranks a hang waits for: how much "
            "later than the median they enter (a hang's culprit: how long its peers have waited), the share of "
            "step time the others lose to them (all of it during a hang), and the MAD score.",
            hidden=("Time", "__name__", "job", "instance"),
            renames={"Value #A": "late by", "Value #B": "step time lost", "Value #C": "MAD score"},
            column_units={"step time lost": "percentunit", "MAD score": "suffix: MAD"}, size=c.Size(12, 8)),
    ]
    return c.dashboard(__file__, TITLE, "NVLink links and topology, NCCL collectives, hangs and straggler ranks.",
                       c.fleet_variables(c.node_variable(), gpu_variable(), comm_variable(), rank_variable()),
                       panels, annotation_scope=("cluster", "node"))
