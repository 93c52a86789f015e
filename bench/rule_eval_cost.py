"""Rule-evaluation cost of rules/*.yaml on a simulated 1,024-GPU cluster.

128 nodes x 8 GPUs (18 NVLinks each) x 8 HCAs; one 1,024-rank NCCL communicator (8 ranks
a node, AllReduce and AllGather); TCP RTT histograms per node; IB counters per port; kernel
log and pipeline self-metrics. A small HTTP server in this process serves each node's
exposition (counters advance with wall time, a few scripted faults so alert paths do
work), real Prometheus (/usr/bin/prometheus, 127.0.0.1, temp dir) scrapes all 128 targets
every 15s and evaluates the rendered rules at their production intervals. Prometheus' own
/metrics is polled for prometheus_rule_group_last_duration_seconds and
prometheus_rule_group_interval_seconds per group; the table prints each group's mean and
worst duration and the worst as a share of its interval. Figures, not assertions.

Caveat printed with the results: range windows longer than the run (the 6h "was active"
look-backs, 1h BER, 30m NVLink baseline) hold only the run's samples, so their cost is
below steady state; it grows with the samples in the window.

    .venv/bin/python bench/rule_eval_cost.py [--duration 180] [--nodes 128] [--keep]
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs

import requests
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricscope.demo import stack
from fabricscope.httpserver import HttpServer, respond
from fabricscope.exporter.bpf_loader.declarations import load_declarations
from fabricscope.exporter.bpf_loader.histogram import bucket_bounds
from fabricscope.exporter.bpf_loader.window_quantile import bucket_quantile

RULES = stack.rule_files()
CLUSTER = "bench"
GPUS_PER_NODE = 8
NVLINKS_PER_GPU = 18
HCAS_PER_NODE = 8
RANKS_PER_NODE = 8
NCCL_OPS = ("AllReduce", "AllGather")
# The bucket bounds the exporter really exposes (the BPF maps' declared layouts).
EBPF_BUCKETS = {m.name: [float(le) for le in bucket_bounds(m.layout, m.unit_seconds)]
                for decl in load_declarations() for m in decl.metrics if m.layout}
# The histograms whose quantile the exporter also exports over a window (the gauge the
# microburst rule reads): name -> the declaration.
WINDOWED = {m.name: m for decl in load_declarations() for m in decl.metrics if m.window_quantile}
NCCL_BUCKETS = [0.001 * 2 ** e for e in range(0, 12)]  # 1ms .. 2s
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
               "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_wait", "port_rcv_packets",
               "port_xmit_packets", "unicast_rcv_packets")
IB_HW_COUNTERS = ("rnr_nak_retry_err", "local_ack_timeout_err", "out_of_sequence", "packet_seq_err",
                  "implied_nak_seq_err", "duplicate_request", "roce_slow_restart", "np_cnp_sent",
                  "rp_cnp_handled", "req_cqe_error")
COLLECTORS = ("infiniband", "netdev", "tcp", "kmsg", "ebpf", "nccl", "nvlink")


class Series:
    """One exposition line whose value is base + rate x elapsed seconds."""
    __slots__ = ("text", "base", "rate")

    def __init__(self, name: str, labels: dict[str, str], base: float, rate: float = 0.0):
        inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
        self.text = f"{name}{{{inner}}} "
        self.base = base
        self.rate = rate


def histogram(name: str, labels: dict, buckets: list[float], per_second: float, typical: float) -> list[Series]:
    """Cumulative buckets for observations spread around `typical` (log-normal-ish)."""
    out, cumulative = [], 0.0
    for le in buckets:
        share = 0.5 * (1 + math.erf(math.log(le / typical) / 0.7 / math.sqrt(2)))
        cumulative = max(cumulative, share)
        out.append(Series(f"{name}_bucket", {**labels, "le": repr(le)}, 0, per_second * cumulative))
    out.append(Series(f"{name}_bucket", {**labels, "le": "+Inf"}, 0, per_second))
    out.append(Series(f"{name}_count", labels, 0, per_second))
    out.append(Series(f"{name}_sum", labels, 0, per_second * typical))
    if name in WINDOWED:
        # Its buckets grow at constant rates: the exporter's windowed quantile is constant.
        metric = WINDOWED[name]
        rates = [series.rate for series in out[:len(buckets) + 1]]
        out.append(Series(metric.window_gauge_name, {**labels, "quantile": metric.window_quantile.label},
                          bucket_quantile(metric.window_quantile.quantile, buckets, rates)))
    return out


def node_series(index: int) -> list[Series]:
    node = f"gpu-node-{index}"
    base = {"node": node}
    out: list[Series] = []
    # Framework and eBPF self-metrics.
    for collector in COLLECTORS:
        out.append(Series("fabric_scrape_collector_success", {**base, "collector": collector}, 1))
        out.append(Series("fabric_scrape_collector_duration_seconds", {**base, "collector": collector}, 0.01))
    out.append(Series("fabric_ebpf_available", {**base, "reason": "ok"}, 1))
    # TCP: RTT and connect histograms, procfs counters. Node 5 has a microburst profile.
    rtt = 0.0005 if index != 5 else 0.004
    out += histogram("fabric_tcp_rtt_seconds", base, EBPF_BUCKETS["fabric_tcp_rtt_seconds"], 2000, rtt)
    out += histogram("fabric_tcp_rtt_excess_seconds", base, EBPF_BUCKETS["fabric_tcp_rtt_excess_seconds"], 1500, rtt)
    out += histogram("fabric_tcp_connect_latency_seconds", base, EBPF_BUCKETS["fabric_tcp_connect_latency_seconds"],
                     5, 0.0002)
    for counter in ("retransmitted_segments", "out_segments", "in_segments", "in_errors", "out_resets",
                    "active_opens", "passive_opens", "timeouts", "syn_retransmits", "lost_retransmits"):
        out.append(Series(f"fabric_tcp_{counter}_total", base, 1000, 10))
    # InfiniBand: 8 HCAs, one port each.
    for hca in range(HCAS_PER_NODE):
        port = {**base, "device": f"mlx5_{hca}", "port": "1"}
        down = index == 7 and hca == 3
        out.append(Series("fabric_infiniband_device_info", {**base, "device": f"mlx5_{hca}", "board_id": "MT_0000000838",
                                                            "fw_version": "28.39.1002", "hca_type": "MT4129",
                                                            "node_guid": f"0000:{index:04x}:{hca:04x}",
                                                            "role": "compute", "numa_node": str(hca // 4)}, 1))
        out.append(Series("fabric_infiniband_device_missing", {**base, "device": f"mlx5_{hca}"}, 0))
        out.append(Series("fabric_infiniband_port_info", {**port, "link_layer": "InfiniBand", "netdev": f"ib{hca}"}, 1))
        out.append(Series("fabric_infiniband_port_state", {**port, "state": "DOWN" if down else "ACTIVE"}, 1 if down else 4))
        out.append(Series("fabric_infiniband_port_phys_state", {**port, "phys_state": "Polling" if down else "LinkUp"},
                          2 if down else 5))
        out.append(Series("fabric_infiniband_port_rate_bytes_per_second", port, 5e10))
        out.append(Series("fabric_infiniband_port_receive_bytes_total", port, 1e12, 2e10))
        out.append(Series("fabric_infiniband_port_transmit_bytes_total", port, 1e12, 2e10))
        out.append(Series("fabric_infiniband_port_fatal", port, 1 if down else 0))
        out.append(Series("fabric_infiniband_port_down_transitions_total", port, 1 if down else 0))
        for counter in IB_COUNTERS:
            rate = 0.05 if (counter == "symbol_error" and index == 9) else (1e5 if "packets" in counter else 0)
            out.append(Series("fabric_infiniband_port_counter_total", {**port, "counter": counter}, 0, rate))
        for counter in IB_HW_COUNTERS:
            out.append(Series("fabric_infiniband_port_hw_counter_total", {**port, "counter": counter}, 0))
        # Breach and anomaly flags exist only while raised (none here).
        for severity in ("fatal", "non_fatal", "recovery", "baseline"):
            out.append(Series("fabric_infiniband_port_health_events_total", {**port, "severity": severity},
                              1 if severity == "baseline" else 0))
    # NVLink: 8 GPUs x 18 links.
    for gpu in range(GPUS_PER_NODE):
        out.append(Series("fabric_gpu_info", {**base, "gpu": str(gpu), "uuid": f"GPU-{index:04d}-{gpu}",
                                              "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"0000:{gpu + 16:02x}:00.0"}, 1))
        for link in range(NVLINKS_PER_GPU):
            labels = {**base, "gpu": str(gpu), "link": str(link)}
            inactive = index == 11 and gpu == 2 and link == 4
            out.append(Series("fabric_nvlink_state", labels, 0 if inactive else 1))
            if inactive:                        # the exporter's sightings: links with a down history only
                out.append(Series("fabric_nvlink_last_inactive_timestamp_seconds", labels, 0, 1))   # base: start
                out.append(Series("fabric_nvlink_last_active_timestamp_seconds", labels, -600))     # 10 m before
            out.append(Series("fabric_nvlink_info", {**labels, "version": "4", "remote_pci_bus_id": "",
                                                     "remote_type": "nvswitch"}, 1))
            throughput = 0 if inactive else 2e10
            out.append(Series("fabric_nvlink_bytes_total", labels, 2e13, 2 * throughput))   # both directions
            if index == 13:                     # a link's error counters exist once they count
                out.append(Series("fabric_nvlink_errors_total", {**labels, "type": "replay"}, 1, 2.0))
        for kind in ("crc_flit", "crc_data", "replay", "recovery"):
            out.append(Series("fabric_nvlink_gpu_errors_total", {**base, "gpu": str(gpu), "type": kind}, 0,
                              2.0 * NVLINKS_PER_GPU if (index == 13 and kind == "replay") else 0))
    # NCCL: ranks 8i..8i+7 of one 1,024-rank communicator; rank 77 straggles.
    for rank in range(RANKS_PER_NODE * index, RANKS_PER_NODE * (index + 1)):
        for op in NCCL_OPS:
            labels = {**base, "comm": "0x5eed", "rank": str(rank), "op": op}
            typical = 0.02 * (2 if rank == 77 else 1)
            out.append(Series("fabric_nccl_comm_info", {**base, "comm": "0x5eed", "rank": str(rank), "nranks": "1024"}, 1))
            out.append(Series("fabric_nccl_calls_total", labels, 0, 10))
            out.append(Series("fabric_nccl_bytes_total", labels, 0, 10 * 2 ** 26))
            out += histogram("fabric_nccl_enqueue_seconds", labels, NCCL_BUCKETS, 10, 0.001)
            out += histogram("fabric_nccl_operation_duration_seconds", labels, NCCL_BUCKETS, 10, typical)
            out.append(Series("fabric_nccl_completed_average_seconds", labels, typical))
            out.append(Series("fabric_nccl_last_call_timestamp_seconds", labels, 0, 1))  # base set at start
    # Kernel log.
    for pattern, severity in (("cmd_exec timeout", "fatal"), ("health poll failed", "fatal"),
                              ("insufficient power", "non_fatal"), ("NETDEV WATCHDOG", "non_fatal")):
        out.append(Series("fabric_kernel_log_events_total", {**base, "source": "mlx5_core", "pattern": pattern,
                                                            "severity": severity}, 0))
    for xid, severity in (("79", "fatal"), ("48", "fatal"), ("13", "non_fatal")):
        out.append(Series("fabric_kernel_log_xid_events_total", {**base, "xid": xid, "severity": severity}, 0))
    out.append(Series("fabric_kernel_log_lines_total", base, 1000, 1))
    return out


class Cluster:
    def __init__(self, nodes: int):
        self.started = time.time()
        self.nodes = {f"gpu-node-{i}": node_series(i) for i in range(nodes)}
        for series in self.nodes.values():
            for s in series:
                if s.text.startswith("fabric_nccl_last_call_timestamp_seconds"):
                    s.base = self.started  # last call = now, advancing with wall time
                elif s.text.startswith("fabric_nvlink_last_"):
                    s.base += self.started  # the link's sightings, relative to the start
        self.series_count = sum(len(series) for series in self.nodes.values())

        # Constant series (states, info, flags) are formatted once; only the moving ones
        # are formatted per scrape, to keep this process from competing with Prometheus.
        self.constant = {node: "".join(f"{s.text}{s.base:.17g}\n" for s in series if s.rate == 0)
                         for node, series in self.nodes.items()}
        self.moving = {node: [s for s in series if s.rate != 0] for node, series in self.nodes.items()}

    def exposition(self, node: str) -> bytes | None:
        if node not in self.nodes:
            return None
        elapsed = time.time() - self.started
        return (self.constant[node]
                + "".join(f"{s.text}{s.base + s.rate * elapsed:.17g}\n" for s in self.moving[node])).encode()


def serve(cluster: Cluster) -> HttpServer:
    def app(environ, start_response):
        node = parse_qs(environ.get("QUERY_STRING", "")).get("node", [""])[0]
        body = cluster.exposition(node)
        if body is None:
            return respond(start_response, 404, b"unknown node\n", "text/plain")
        return respond(start_response, 200, body, "text/plain; version=0.0.4")

    return HttpServer(app, "127.0.0.1", 0, name="bench-exposition").start()


def prometheus_config(exporter_port: int, nodes: list[str]) -> dict:
    return {
        "global": {"scrape_interval": "15s", "scrape_timeout": "10s", "evaluation_interval": "30s",
                   "external_labels": {"cluster": CLUSTER}},
        "rule_files": [str(path) for path in RULES],
        "scrape_configs": [{
            "job_name": "fabricscope",
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"],
                                "labels": {"__param_node": node, "node": node, "instance": node,
                                           "cluster": CLUSTER}} for node in nodes],
        }],
    }


def rule_group_metrics(prometheus_url: str) -> dict[str, dict[str, float]]:
    """{rule_group: {metric: value}} from Prometheus' own /metrics."""
    text = requests.get(f"{prometheus_url}/metrics", timeout=10).text
    groups: dict[str, dict[str, float]] = {}
    wanted = {"prometheus_rule_group_last_duration_seconds", "prometheus_rule_group_interval_seconds",
              "prometheus_rule_group_iterations_missed", "prometheus_rule_group_iterations",
              "prometheus_rule_group_rules"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in wanted and "rule_group" in sample.labels:
                groups.setdefault(sample.labels["rule_group"], {})[name] = sample.value
    return groups


def self_metric(prometheus_url: str, name: str) -> float | None:
    text = requests.get(f"{prometheus_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def costliest_rules(prometheus_url: str, count: int) -> list[tuple[float, str, str]]:
    """(seconds, group, rule name) of the rules with the longest last evaluation."""
    groups = requests.get(f"{prometheus_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [(rule.get("evaluationTime", 0.0), group["name"], rule["name"] + (
        f" [{rule['labels']['severity']}]" if rule.get("labels", {}).get("severity") else ""))
        for group in groups for rule in group["rules"]]
    return sorted(rules, reverse=True)[:count]


def instant(prometheus_url: str, query: str) -> float | None:
    result = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=30).json()
    vector = result.get("data", {}).get("result", [])
    return float(vector[0]["value"][1]) if vector else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=180, help="seconds of rule evaluation to measure")
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--keep", action="store_true", help="keep the Prometheus directory")
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus",
                        help="Prometheus binary (default: from PATH)")
    args = parser.parse_args()

    binary = args.prometheus
    if not Path(binary).exists():
        print("prometheus not found: `make setup` installs the Debian package", file=sys.stderr)
        return 1
    if not RULES:
        print("no rules/*.yaml: run `make -C rules render`", file=sys.stderr)
        return 1

    began = time.perf_counter()
    cluster = Cluster(args.nodes)
    built = time.perf_counter() - began
    server = serve(cluster)
    sample = cluster.exposition("gpu-node-0")
    print(f"simulated cluster: {args.nodes} nodes, {args.nodes * GPUS_PER_NODE} GPUs, "
          f"{args.nodes * HCAS_PER_NODE} HCA ports, {args.nodes * RANKS_PER_NODE} NCCL ranks; "
          f"{cluster.series_count} series ({cluster.series_count // args.nodes} a node, "
          f"{len(sample) // 1024} KiB exposition a node); built in {built:.1f}s")

    workdir = Path(tempfile.mkdtemp(prefix="fabric-rule-bench-"))
    config = stack.write_yaml(workdir / "prometheus.yml",
                              prometheus_config(server.port, list(cluster.nodes)))
    port = stack.free_port()
    url = f"http://127.0.0.1:{port}"
    # stack's process handling (readiness wait, log tail on failure, reaping), with the
    # binary --prometheus names.
    process = stack.ManagedProcess(
        "prometheus", [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                       f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=2h",
                       "--log.level=warn"], f"{url}/-/ready", workdir / "prometheus.log")
    try:
        process.start(timeout=60)
        print(f"Prometheus {url} with {', '.join(p.name for p in RULES)}; measuring for {args.duration}s ...")

        durations: dict[str, list[float]] = {}
        end = time.time() + args.duration
        last: dict[str, dict[str, float]] = {}
        while time.time() < end:
            time.sleep(5)
            last = rule_group_metrics(url)
            for group, values in last.items():
                if values.get("prometheus_rule_group_iterations", 0) > 0:
                    durations.setdefault(group, [])
                    value = values.get("prometheus_rule_group_last_duration_seconds")
                    if value is not None and (not durations[group] or durations[group][-1] != value):
                        durations[group].append(value)

        head_series = self_metric(url, "prometheus_tsdb_head_series") or 0
        top_rules = costliest_rules(url, 6)
        scrape = instant(url, 'avg(scrape_duration_seconds{job="fabricscope"})') or 0
        up = instant(url, 'sum(up{job="fabricscope"})') or 0
        firing = requests.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    except stack.StackError as exc:   # Prometheus did not start; the message has its log's tail
        print(exc, file=sys.stderr)
        return 1
    finally:
        process.stop(timeout=30)
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"targets up {up:.0f}/{args.nodes}, head series {head_series:.0f}, mean scrape {scrape * 1000:.0f} ms; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work inflates the figures)\n")
    header = f"{'rule group':<28} {'rules':>5} {'interval':>8} {'evals':>5} {'mean':>9} {'worst':>9} {'worst/interval':>14} {'missed':>6}"
    print(header)
    print("-" * len(header))
    worst_ratio = 0.0
    for group in sorted(last):
        values = last[group]
        interval = values.get("prometheus_rule_group_interval_seconds", 0)
        seen = durations.get(group) or [values.get("prometheus_rule_group_last_duration_seconds", 0)]
        worst = max(seen)
        ratio = worst / interval if interval else float("nan")
        worst_ratio = max(worst_ratio, ratio)
        name = group.split(";")[-1]
        print(f"{name:<28} {values.get('prometheus_rule_group_rules', 0):>5.0f} {interval:>7.0f}s "
              f"{values.get('prometheus_rule_group_iterations', 0):>5.0f} {statistics.mean(seen) * 1000:>7.1f}ms "
              f"{worst * 1000:>7.1f}ms {ratio * 100:>13.2f}% {values.get('prometheus_rule_group_iterations_missed', 0):>6.0f}")
    print("\ncostliest rules (last evaluation):")
    for seconds, group, name in top_rules:
        print(f"  {seconds * 1000:>8.1f}ms  {group:<26} {name}")
    states: dict[str, int] = {}
    for alert in firing:
        key = f"{alert['labels']['alertname']} ({alert['state']})"
        states[key] = states.get(key, 0) + 1
    print(f"\nworst group used {worst_ratio * 100:.2f}% of its interval")
    print("alerts at the end: " + (", ".join(f"{k} x{v}" for k, v in sorted(states.items())) or "none"))
    print(f"note: the run covers {args.duration}s; windows longer than that (6h was-active look-backs, 1h BER, "
          "30m NVLink baseline) held only the run's samples, so their share grows in steady state.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
