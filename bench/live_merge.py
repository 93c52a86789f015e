"""The sidecar's live blast-radius merge (chaos/live.py) at fleet size, where the time goes.

    .venv/bin/python bench/live_merge.py --nodes 1000 [--profile 15] [--backend URL]

The series of the metrics chaos/live.py reads (chaos.live.METRICS) are taken from the
fleet's own exposition: the demo fleet's node 0 (bench/fleet_scale.py's scenario) rendered
once and its copies (docs/demo.md#fleet-mode), with the `instance` and `job` labels a
scrape adds. They are loaded into a real Prometheus with one scrape (nothing else in it:
no rules, no other series) and the merge's queries are asked of it, so each costs the
engine's evaluation and encoding, the transfer and the JSON decode; then observe() and
apply() run on the generated fat tree, then the compact engine. With --backend, the queries
go to that Prometheus-compatible API instead (it must hold the fleet).

Printed per phase: the inventory (demo_topology), observe() (the queries and their parse;
the queries' own times summed beside it, and what each answered), apply(), the engine
(BlastRadiusEngine), the whole first LiveTopology.refresh(), the next refresh with nothing
changed (the sidecar's periodic one in steady state), and a rail leaf switch failing on
the result. --profile N adds the N costliest functions (cumulative).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.chaos import live as live_mod  # noqa: E402
from fabricscope.chaos.blast import BlastRadiusEngine  # noqa: E402
from fabricscope.exporter.nvml.remotes import INACTIVE  # noqa: E402
from fabricscope.demo.cluster import DemoCluster  # noqa: E402
from fabricscope.demo.fleet import Fleet  # noqa: E402
from fabricscope.demo.scenario import load_scenario  # noqa: E402
from fabricscope.demo.topology import demo_topology  # noqa: E402

EDGES = "fabric_nvlink_remote_links"           # the NVLink series the merge reads
SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def fleet_answers(nodes: int, down_links: int = 0) -> tuple[object, dict[str, bytes]]:
    """The scenario, and for each query of chaos/live.py its API body over `nodes` nodes."""
    scenario = load_scenario({"seed": 7, "tick_seconds": 1, "faults": [],
                              "cluster": {"name": "fleet", "nodes": 1, "gpus_per_node": 8, "hcas_per_node": 8}})
    wanted = set(live_mod.METRICS)
    results: dict[str, list] = {name: [] for name in wanted}
    with tempfile.TemporaryDirectory(prefix="live-merge-") as tmp:
        with Fleet(DemoCluster(scenario, Path(tmp) / "demo"), nodes) as fleet:
            time.sleep(2.5)                      # a few ticks: NCCL communicators and ranks exist
            for index in range(nodes):
                node = scenario.node_name(index)
                if index < scenario.nodes:
                    text = fleet.cluster.exporters[index].render_metrics()
                else:
                    text = fleet.copies.exposition(index, node)
                for line in text.decode().splitlines():
                    match = SERIES.match(line)
                    if not match or match.group(1) not in wanted:
                        continue
                    labels = dict(LABEL.findall(match.group(2)))
                    labels.update({"__name__": match.group(1), "instance": f"{node}:9101", "job": "fabricscope"})
                    results[match.group(1)].append({"metric": labels, "value": [time.time(), match.group(3)]})
    # --down-links: that many NVLinks inactive, each on another node (spread over the fleet):
    # one link fewer on its edge's active count, and that edge's inactive count, as the
    # exporter writes them (exporter/nvml/remotes.py).
    edges = results[EDGES]
    step = max(1, len(edges) // max(1, down_links))
    for row in edges[::step][:down_links]:
        row["value"][1] = str(int(float(row["value"][1])) - 1)
        edges.append({"metric": {**row["metric"], "state": INACTIVE}, "value": [row["value"][0], "1"]})
    bodies = {name: json.dumps({"status": "success", "data": {"resultType": "vector", "result": rows}}).encode()
              for name, rows in results.items()}
    return scenario, bodies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--backend", default=None,
                        help="a Prometheus-compatible base URL holding the fleet, to query instead of loading one")
    parser.add_argument("--down-links", type=int, default=0,
                        help="NVLinks made inactive in the prepared series, each on another node (default 0: healthy)")
    parser.add_argument("--repeat", type=int, default=3, help="refreshes measured (the median is printed)")
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions of one refresh")
    args = parser.parse_args()

    began = time.perf_counter()
    scenario, bodies = fleet_answers(args.nodes, args.down_links)
    prepared = time.perf_counter() - began
    fleet_scenario = scenario.with_nodes(args.nodes)
    if args.backend:
        return measure(args, fleet_scenario, bodies, prepared)
    with loaded_prometheus(bodies) as url:
        args.backend = url
        return measure(args, fleet_scenario, bodies, prepared)


@contextlib.contextmanager
def loaded_prometheus(bodies: dict[str, bytes]):
    """A real Prometheus holding exactly the prepared series (scraped once from an
    exposition of them): the engine's own time to answer the queries, without the rest of
    a fleet's 1.6 M series or its rule load (a lower bound for a loaded server)."""
    from tests.procs import prometheus

    lines, expected = [], {}
    for name, body in bodies.items():
        rows = json.loads(body)["data"]["result"]
        expected[name] = len(rows)
        for row in rows:
            labels = ",".join(f'{k}="{v}"' for k, v in row["metric"].items() if k != "__name__")
            lines.append(f"{name}{{{labels}}} {row['value'][1]}\n")
    text = "".join(lines).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="live-merge-prom-") as tmp:
            config = {"global": {"scrape_interval": "60s", "scrape_timeout": "55s"},
                      "scrape_configs": [{"job_name": "fleet", "honor_labels": True,
                                          "static_configs": [{"targets": [f"127.0.0.1:{server.server_port}"]}]}]}
            with prometheus(config, Path(tmp)) as prom:
                deadline = time.time() + 300
                while time.time() < deadline:
                    try:
                        url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode(
                            {"query": f"count({EDGES})"})
                        with urllib.request.urlopen(url, timeout=60) as answer:
                            got = json.load(answer)["data"]["result"]
                        if got and int(float(got[0]["value"][1])) == expected[EDGES]:
                            break
                    except OSError:
                        pass
                    time.sleep(2)
                else:
                    raise SystemExit("Prometheus never held the prepared series")
                yield prom.url
    finally:
        server.shutdown()


def measure(args, fleet_scenario, bodies, prepared) -> int:
    spent: dict[str, float] = {}
    lock = threading.Lock()                      # chaos/live.py may ask the queries from threads
    asked: list[str] = []

    def add(key: str, seconds: float) -> None:
        with lock:
            spent[key] = spent.get(key, 0.0) + seconds

    answered: dict[str, tuple[int, int]] = {}    # query -> (rows, bytes) of its last answer

    def query(expr: str):
        t = time.perf_counter()
        asked.append(expr)
        url = f"{args.backend}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=120) as answer:
            body = answer.read()
        result = json.loads(body)["data"]["result"]
        answered[expr] = (len(result), len(body))
        add("queries", time.perf_counter() - t)
        return result

    def base():
        t = time.perf_counter()
        topology = demo_topology(fleet_scenario)
        add("inventory", time.perf_counter() - t)
        return topology

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                add(name, time.perf_counter() - t)
        return wrapper

    # Phases, each timed by wrapping the module's own functions (queries counted apart).
    live_mod.observe = timed("observe", live_mod.observe)
    live_mod.apply = timed("apply", live_mod.apply)
    live_mod.BlastRadiusEngine = timed("engine", BlastRadiusEngine)

    rows = []
    for _ in range(args.repeat):
        spent.clear()
        refresher = live_mod.LiveTopology(base, query)
        t = time.perf_counter()
        engine = refresher.refresh()
        total = time.perf_counter() - t
        t = time.perf_counter()
        result = engine.simulate("leaf-su0-r3", "switch_failure", include_jobs=True)
        simulate = time.perf_counter() - t
        row = dict(spent, refresh=total, simulate=simulate)
        # The next refresh with nothing changed: the sidecar's periodic one in steady state
        # (the merged version is the same, so the engine is reused, not rebuilt).
        t = time.perf_counter()
        refresher.refresh()
        row["steady"] = time.perf_counter() - t
        rows.append(row)
        if refresher.live_error:
            print("live merge failed:", refresher.live_error)
    report = refresher.report.to_dict() if refresher.report else {}

    def median(key):
        values = sorted(r.get(key, 0.0) for r in rows)
        return values[len(values) // 2]

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    series = {name: len(json.loads(body)["data"]["result"]) for name, body in bodies.items()}
    body_bytes = sum(len(b) for b in bodies.values())
    load = os.getloadavg()
    print(f"{args.nodes} nodes x 8 GPUs, commit {commit}, {os.cpu_count()} CPUs (shared, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end), answers from {args.backend} "
          f"(series prepared in {prepared:.1f} s)")
    print(f"{args.down_links} NVLinks inactive; series held per metric: " + ", ".join(f"{n} {c}" for n, c in sorted(series.items()))
          + f"; {body_bytes / 1e6:.1f} MB as the API's JSON")
    print(f"merged: {report.get('ports')} ports, {report.get('nvlinks')} NVLink edges, {report.get('jobs')} jobs, "
          f"{report.get('unmatched_count')} unmatched; {result.affected_device_count} of {result.total_devices} "
          f"devices and {result.affected_job_count} jobs cut by leaf-su0-r3")
    print("queries asked, each: times, rows and bytes of its answer")
    for expr in dict.fromkeys(asked):
        count, size = answered[expr]
        print(f"  {asked.count(expr)}x {expr}: {count} rows, {size / 1e6:.2f} MB")
    print(f"median of {len(rows)} refreshes, seconds:")
    labels = {"inventory": "inventory (demo_topology)",
              "observe": "observe(): the queries and their parse",
              "queries": "  the queries' own times, summed (they may overlap)",
              "apply": "apply()", "engine": "engine (BlastRadiusEngine)",
              "refresh": "refresh, first (the merge)",
              "steady": "refresh, next with nothing changed", "simulate": "simulate leaf-su0-r3 failing"}
    for key, label in labels.items():
        print(f"  {label:52s} {median(key):8.3f}")

    if args.profile:
        profiler = cProfile.Profile()
        refresher = live_mod.LiveTopology(base, query)
        profiler.enable()
        refresher.refresh()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
