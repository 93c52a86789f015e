"""A fleet of simulated 8-GPU nodes on Prometheus and on VictoriaMetrics, side by side.

    .venv/bin/python bench/fleet_scale.py --nodes 1000 --minutes 5

One process serves the fleet (`fabricscope demo --fleet`: node 0 simulated in full, the
rest its copies under their own node labels, docs/demo.md#fleet-mode). Each backend in
turn scrapes it every --scrape-interval with the committed rules (production intervals):
Prometheus alone, then vmagent -> VictoriaMetrics <- vmalert (docs/scale.md), both
alerting one Alertmanager. After a warm-up of two scrape rounds, for --minutes:

- series held and samples ingested per second (the backend's own metrics);
- resident memory of the backend's processes at the end;
- disk: the data directory's growth over the window, per day (Prometheus' WAL before
  compaction, VictoriaMetrics' compressed parts: an upper bound for Prometheus);
- each rule group's last evaluation time against its interval.

Everything runs on this machine (fleet, backend, rules), so the figures include that
contention; run it on a quiet host for figures to compare across machines. The printed
table and the projection to 12,500 nodes go into docs/scale.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fabricscope.demo.cluster import DemoCluster  # noqa: E402
from fabricscope.demo.fleet import Fleet  # noqa: E402
from fabricscope.demo.scenario import load_scenario  # noqa: E402
from fabricscope.demo.stack import alertmanager_config, free_port, prometheus_config, rule_files, write_yaml  # noqa: E402
from fabricscope.demo.stack.processes import start_alertmanager, start_prometheus  # noqa: E402
from fabricscope.demo.stack.victoria import (start_victoria_metrics, start_vmagent, start_vmalert,  # noqa: E402
                                        vmagent_scrape_config, vmalert_rules)

HOST = "127.0.0.1"


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=60) as answer:
        return json.load(answer)["data"]["result"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def scrape_metrics(url: str) -> dict[str, float]:
    """A server's own /metrics as {series: value} (vmalert's rule-group timings)."""
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def total(metrics: dict[str, float], name: str) -> float:
    """The sum of a metric's series in a /metrics page."""
    return sum(value for key, value in metrics.items() if key == name or key.startswith(name + "{"))


def targets_up(base: str) -> float:
    """Fleet targets whose last scrape succeeded (NaN when the query API does not answer)."""
    try:
        result = query(base, 'count(up{job="fabricscope"} == 1)')
    except (OSError, ValueError, KeyError):
        return float("nan")
    return float(result[0]["value"][1]) if result else 0.0


def live_blast_radius(base: str, scenario, nodes: int) -> dict:
    """The sidecar's chaos engine on the fleet's generated fat tree, merged with the live
    metrics through this backend's query API (chaos/live.py), then a rail leaf switch
    failing: how long the merge and the simulation take, and what it cuts."""
    from fabricscope.chaos.live import LiveTopology
    from fabricscope.demo.topology import demo_topology

    fleet_scenario = scenario.with_nodes(nodes)
    live = LiveTopology(lambda: demo_topology(fleet_scenario), lambda expr: query(base, expr))
    began = time.perf_counter()
    engine = live.refresh()
    merged = time.perf_counter() - began
    began = time.perf_counter()
    result = engine.simulate("leaf-su0-r3", "switch_failure", include_jobs=True)
    return {"merge_seconds": merged, "simulate_seconds": time.perf_counter() - began,
            "live_error": live.live_error, "affected_devices": result.affected_device_count,
            "total_devices": result.total_devices, "affected_jobs": result.affected_job_count}


def expensive_questions(base: str, runs: int = 5, top: int = 3) -> list[tuple[str, float]]:
    """The sidecar's registered PromQL questions (queryapi/query/queries.yaml, with their
    default parameters; bench/sidecar_scale.py), each asked `runs` times of this backend's
    query API: the `top` slowest by their p99 (with 5 runs, the slowest run)."""
    from sidecar_scale import percentile, registered_questions, timed

    times = {name: [timed(base, promql)[0] for _ in range(runs)] for name, promql in registered_questions().items()}
    p99 = {name: percentile(values, 0.99) for name, values in times.items()}
    return sorted(p99.items(), key=lambda item: -item[1])[:top]


def measure(name: str, metrics_url: str, pids: list[int], data_dir: Path, minutes: float, interval: float,
            series_metric: str, samples_metric: str, groups, blast=None, questions: bool = True) -> dict:
    """Read from the server's own /metrics page, not through its query API: on a loaded
    host its self-scrapes and queries are the first to fall behind."""
    time.sleep(3 * interval)                    # warm-up: targets found, two rounds scraped
    disk0, t0, samples0 = du(data_dir), time.monotonic(), total(scrape_metrics(metrics_url), samples_metric)
    time.sleep(minutes * 60)
    end = scrape_metrics(metrics_url)
    elapsed = time.monotonic() - t0
    return {"backend": name, "series": total(end, series_metric),
            "samples_per_second": (total(end, samples_metric) - samples0) / elapsed,
            "rss_bytes": sum(rss_bytes(pid) for pid in pids),
            "disk_bytes_per_day": (du(data_dir) - disk0) / elapsed * 86400, "groups": groups(),
            "targets_up": targets_up(metrics_url.rsplit("/", 1)[0]),
            "blast_radius": blast() if blast else None,
            "expensive_questions": expensive_questions(metrics_url.rsplit("/", 1)[0]) if questions else None}


def prometheus_run(args, fleet, targets: Path, work: Path, alertmanager: str) -> dict:
    port = free_port(HOST)
    config = prometheus_config(fleet.cluster.scenario.cluster_name, targets, alertmanager, rule_files(),
                               scrape_interval=args.scrape_interval, evaluation_interval=args.scrape_interval,
                               self_address=f"{HOST}:{port}")
    path = write_yaml(work / "prometheus.yml", config)
    prom = start_prometheus(path, work / "prometheus-data", HOST, port, work / "prometheus.log")
    base = f"http://{HOST}:{port}"
    try:
        def groups():
            last = {r["metric"]["rule_group"]: float(r["value"][1])
                    for r in query(base, "prometheus_rule_group_last_duration_seconds")}
            every = {r["metric"]["rule_group"]: float(r["value"][1])
                     for r in query(base, "prometheus_rule_group_interval_seconds")}
            return {group.split(";")[-1]: (seconds, every.get(group)) for group, seconds in sorted(last.items())}
        return measure("Prometheus", f"{base}/metrics", [prom.process.pid], work / "prometheus-data", args.minutes,
                       seconds(args.scrape_interval), "prometheus_tsdb_head_series",
                       "prometheus_tsdb_head_samples_appended_total", groups,
                       lambda: live_blast_radius(base, fleet.cluster.scenario, args.nodes), args.questions)
    finally:
        prom.stop()


def victoria_run(args, fleet, targets: Path, work: Path, alertmanager: str) -> dict:
    vm_port, agent_port, alert_port = free_port(HOST), free_port(HOST), free_port(HOST)
    base = f"http://{HOST}:{vm_port}"
    config = prometheus_config(fleet.cluster.scenario.cluster_name, targets, alertmanager, [],
                               scrape_interval=args.scrape_interval, evaluation_interval=args.scrape_interval)
    scrape = vmagent_scrape_config(config)
    scrape["scrape_configs"] += [{"job_name": job, "static_configs": [{"targets": [f"{HOST}:{p}"]}]}
                                 for job, p in (("victoria-metrics", vm_port), ("vmagent", agent_port))]
    vm = start_victoria_metrics(work / "vm-data", HOST, vm_port, work / "victoria-metrics.log")
    agent = alert = None
    try:
        agent = start_vmagent(write_yaml(work / "vmagent.yml", scrape), work / "vmagent-data", HOST, agent_port,
                              f"{base}/api/v1/write", work / "vmagent.log")
        rules, _ = vmalert_rules(rule_files(), work / "vmalert-rules")
        alert = start_vmalert(rules, base, f"http://{alertmanager}", HOST, alert_port, work / "vmalert.log",
                              evaluation_interval=args.scrape_interval, labels={"cluster": "fleet"})

        def groups():
            metrics = scrape_metrics(f"http://{HOST}:{alert_port}/metrics")
            last, every = {}, {}
            for key, value in metrics.items():
                if key.startswith("vmalert_iteration_duration_seconds{") and 'quantile="0.99"' in key:
                    last[key.split('group="', 1)[1].split('"', 1)[0]] = value
            for path in rules:
                for group in yaml.safe_load(path.read_text())["groups"]:
                    every[group["name"]] = seconds(group.get("interval", args.scrape_interval))
            return {group: (value, every.get(group)) for group, value in sorted(last.items())}
        return measure("VictoriaMetrics", f"{base}/metrics", [vm.process.pid, agent.process.pid, alert.process.pid],
                       work / "vm-data", args.minutes, seconds(args.scrape_interval),
                       'vm_cache_entries{type="storage/hour_metric_ids"}', "vm_rows_inserted_total", groups,
                       lambda: live_blast_radius(base, fleet.cluster.scenario, args.nodes), args.questions)
    finally:
        for part in (alert, agent, vm):
            if part is not None:
                part.stop()


def seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if str(text).endswith(unit):
            return float(str(text)[: -len(unit)]) * units[unit]
    return float(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=5.0, help="measured window per backend")
    parser.add_argument("--scrape-interval", default="30s")
    parser.add_argument("--backends", default="prometheus,victoriametrics")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--no-questions", dest="questions", action="store_false",
                        help="skip the registered questions (~45 queries x 5: minutes on a loaded host)")
    args = parser.parse_args()
    scenario = load_scenario({"seed": 7, "tick_seconds": 1, "faults": [],
                              "cluster": {"name": "fleet", "nodes": 1, "gpus_per_node": 8, "hcas_per_node": 8}})
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        work = Path(tmp)
        with Fleet(DemoCluster(scenario, work / "demo"), args.nodes) as fleet:
            targets = fleet.write_targets_file(work / "targets.json")
            am_port = free_port(HOST)
            am = start_alertmanager(write_yaml(work / "alertmanager.yml",
                                               alertmanager_config(f"http://{HOST}:9/unused")),
                                    work / "am-data", HOST, am_port, work / "alertmanager.log")
            try:
                for backend in args.backends.split(","):
                    run = prometheus_run if backend == "prometheus" else victoria_run
                    (work / backend).mkdir()
                    rows.append(run(args, fleet, targets, work / backend, f"{HOST}:{am_port}"))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                am.stop()
    report(rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def report(rows: list[dict], args) -> None:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"\n{args.nodes} nodes x 8 GPUs, scrape and evaluation every {args.scrape_interval}, "
          f"{args.minutes:g} min measured per backend, commit {commit}, {os.cpu_count()} CPUs (shared)\n")
    print("| backend | targets up | series | samples/s | RSS | disk/day |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['backend']} | {row['targets_up']:,.0f} of {args.nodes:,} | {row['series']:,.0f} | "
              f"{row['samples_per_second']:,.0f} | "
              f"{row['rss_bytes'] / 2**30:.2f} GiB | {row['disk_bytes_per_day'] / 2**30:.1f} GiB |")
    print("\n| rule group | " + " | ".join(f"{r['backend']} eval / interval" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    names = sorted({g for r in rows for g in r["groups"]})
    for name in names:
        cells = []
        for row in rows:
            last, every = row["groups"].get(name, (None, None))
            cells.append("-" if last is None else f"{last * 1000:.0f} ms / {every:g} s = {100 * last / every:.1f}%"
                         if every else f"{last * 1000:.0f} ms")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nLive blast radius (rail leaf leaf-su0-r3 fails; topology merged with the backend's metrics):")
    for row in rows:
        b = row.get("blast_radius") or {}
        print(f"  {row['backend']}: merge {b.get('merge_seconds', float('nan')):.1f} s, simulate "
              f"{b.get('simulate_seconds', float('nan')) * 1000:.0f} ms, {b.get('affected_devices')} of "
              f"{b.get('total_devices')} devices and {b.get('affected_jobs')} jobs cut"
              + (f" (live merge failed: {b['live_error']})" if b.get("live_error") else ""))
    print("\nThe sidecar's three most expensive registered questions, p99 of 5 (their PromQL on the backend):")
    for row in rows:
        print(f"  {row['backend']}: " + ", ".join(f"{name} {seconds * 1000:,.0f} ms"
                                                  for name, seconds in row.get("expensive_questions") or []))
    print("\nProjection to 12,500 nodes (100k GPUs), linear in nodes from this run:")
    for row in rows:
        k = 12_500 / args.nodes
        print(f"  {row['backend']}: {row['series'] * k / 1e6:.1f} M series, {row['samples_per_second'] * k / 1e3:,.0f} k "
              f"samples/s, {row['rss_bytes'] * k / 2**30:,.0f} GiB RSS, {row['disk_bytes_per_day'] * k / 2**40:.2f} TiB/day")


if __name__ == "__main__":
    sys.exit(main())
