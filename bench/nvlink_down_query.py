"""The NVLink questions' evaluation on VictoriaMetrics, with links down and with none.

    .venv/bin/python bench/nvlink_down_query.py [--nodes 1000] [--down 10] [--runs 5]

A VictoriaMetrics of its own (nothing else in it) is given --nodes 8-GPU nodes of 18 links:
every link's fabric_nvlink_state and the per-remote-end fabric_nvlink_remote_links the
exporter writes for them (exporter/nvml/remotes.py), 10 minutes of it 30 s apart, with
--down links inactive (one each on --down nodes) or none. Then the registered questions
(`nvlink_links_down`, `fleet_summary`, default parameters) and the per-link forms they
replaced are each asked --runs times at the last round (`nocache=1`); printed: rows and
seconds. What it shows: VictoriaMetrics evaluates the right side of `and` first and reads
the left only for the nodes it names, so nvlink_links_down reads the states of the nodes
with a link down alone, and, thanks to its `or` term, none when no link is down.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.stack.binaries import free_ports  # noqa: E402
from fabricscope.exporter.nvml import LinkReading  # noqa: E402
from fabricscope.exporter.nvml.remotes import remote_link_counts  # noqa: E402
from fabricscope.queryapi.query.registry import default_registry  # noqa: E402

# An HGX board: GPU links 0-4 to NVSwitch 0, 5-8 to 1, 9-12 to 2, 13-17 to 3.
SWITCH_OF_LINK = [0] * 5 + [1] * 4 + [2] * 4 + [3] * 5
REPLACED = {
    "nvlink_links_down, per link (before)": 'fabric_nvlink_state{ node!="", cluster=~".*", gpu!="" } == 0',
    "fleet_summary's nvlinks_down, per link (before)": 'count(fabric_nvlink_state{ cluster=~".*" } == 0) or vector(0)',
    # Why nvlink_links_down has its `or` term: without it, an empty right side (no link down)
    # pushes no filter down, and VictoriaMetrics 1.79 reads every state to find none.
    "nvlink_links_down without its `or` term": 'fabric_nvlink_state{ node!="", cluster=~".*", gpu!="" } == 0 and on '
                                               '(node, gpu) fabric_nvlink_remote_links{state="inactive", node!="", '
                                               'cluster=~".*", gpu!="" }',
}


def round_lines(nodes: int, down: set[int], at_ms: int) -> str:
    lines = []
    for node in range(nodes):
        labels = f'cluster="fleet",instance="fleet:9",job="fabricscope",node="gpu-node-{node}"'
        for gpu in range(8):
            readings = []
            for link, switch in enumerate(SWITCH_OF_LINK):
                active = not (node in down and gpu == 3 and link == 7)
                bus = f"00000000:C{switch}:00.0"
                readings.append(LinkReading(link, active, remote_pci_bus_id=bus, remote_type="switch"))
                lines.append(f'fabric_nvlink_state{{{labels},gpu="{gpu}",link="{link}"}} {int(active)} {at_ms}')
            for (bus, kind, state), count in remote_link_counts(readings).items():
                lines.append(f'fabric_nvlink_remote_links{{{labels},gpu="{gpu}",remote_pci_bus_id="{bus}",'
                             f'remote_type="{kind}",state="{state}"}} {count} {at_ms}')
    return "\n".join(lines) + "\n"


def ask(base: str, promql: str, at: int) -> tuple[float, int]:
    began = time.perf_counter()
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": at, "nocache": "1"})
    with urllib.request.urlopen(url, timeout=120) as answer:
        rows = json.load(answer)["data"]["result"]
    return time.perf_counter() - began, len(rows)


def measure(nodes: int, down: int, runs: int) -> list[tuple[str, int, list[float]]]:
    (port,) = free_ports(1, "127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="nvlink-down-query-") as data:
        store = subprocess.Popen(["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
                                  "-loggerLevel=ERROR"])
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"{base}/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.5)
            now = int(time.time())
            down_nodes = set(range(0, nodes, max(1, nodes // down))[:down]) if down else set()
            for at in range(now - 600, now + 1, 30):
                body = round_lines(nodes, down_nodes, at * 1000).encode()
                request = urllib.request.Request(f"{base}/api/v1/import/prometheus", data=body, method="POST")
                urllib.request.urlopen(request, timeout=600).read()
            urllib.request.urlopen(f"{base}/internal/force_flush", timeout=60).read()
            time.sleep(2)
            registry = default_registry()
            queries = {name: registry.render(name, registry.validate(name, {}))
                       for name in ("nvlink_links_down", "fleet_summary")}
            rows = []
            for label, promql in {**queries, **REPLACED}.items():
                asked = [ask(base, promql, now) for _ in range(runs)]
                rows.append((label, asked[-1][1], [t for t, _ in asked]))
            return rows
        finally:
            store.terminate()
            store.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--down", type=int, default=10, help="links down in the first pass (one a node)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True,
                             text=True).stdout.strip()
    print(f"{args.nodes} nodes x 8 GPUs x 18 links ({args.nodes * 144:,} states), commit {commit}, "
          f"VictoriaMetrics {version or '(version unknown)'} (Debian), {os.cpu_count()} CPUs shared, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    for down in (args.down, 0):
        rows = measure(args.nodes, down, args.runs)
        print(f"\n{down} links down; seconds of each of {args.runs} runs:")
        for label, count, times in rows:
            print(f"  {label:50s} {count:5d} rows  " + " ".join(f"{t:.3f}" for t in times))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
