"""What the HTTP server itself costs per request: fabricscope's server (fabricscope/httpserver.py)
running a WSGI application that answers a fixed body at once, in a process of its own,
scraped over one kept-alive connection as Prometheus does. Prints the server process's CPU
(user + system) per request, in rounds, and the same for Debian's node_exporter with every
collector off (its HTTP path and registry alone), side by side.

    .venv/bin/python bench/http_overhead.py [--requests 3000] [--rounds 5] [--body-bytes 40000]

The server's own cost is what every scrape pays before any collector runs: on the 8-HCA
tree of bench/scrape_latency.py it is a fifth of the exporter's CPU per scrape.
"""
from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.stack.binaries import free_ports  # noqa: E402
from measure import stat_cpu_seconds  # noqa: E402
from scrape_latency import node_exporter_version, scrape, source_version, wait_ready  # noqa: E402

# The server process: a fixed answer, nothing else on the request path.
SERVER = """
import sys, time
sys.path.insert(0, {repo!r})
from fabricscope.httpserver import HttpServer, respond
body = b"x" * {body_bytes}
def app(environ, start_response):
    return respond(start_response, 200, body, "text/plain")
HttpServer(app, "127.0.0.1", {port}, threads=4).start()
time.sleep(86400)
"""


def cpu_per_request(proc: subprocess.Popen, conn: http.client.HTTPConnection, requests: int) -> float:
    before = stat_cpu_seconds(f"/proc/{proc.pid}/stat")
    for _ in range(requests):
        scrape(conn)
    return (stat_cpu_seconds(f"/proc/{proc.pid}/stat") - before) / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--body-bytes", type=int, default=40000, help="about a full node's exposition")
    args = parser.parse_args()
    print(f"{source_version()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    ports = dict(zip(("fabricscope", "node_exporter"), free_ports(2)))
    procs = {"fabricscope": subprocess.Popen(
        [sys.executable, "-c", SERVER.format(repo=str(REPO), body_bytes=args.body_bytes, port=ports["fabricscope"])])}
    node_exporter = shutil.which("prometheus-node-exporter")
    if node_exporter:
        procs["node_exporter"] = subprocess.Popen(
            [node_exporter, f"--web.listen-address=127.0.0.1:{ports['node_exporter']}",
             "--collector.disable-defaults", "--web.disable-exporter-metrics"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for name, proc in procs.items():
            wait_ready(ports[name], proc)
        conns = {name: http.client.HTTPConnection("127.0.0.1", ports[name], timeout=30) for name in procs}
        for conn in conns.values():
            for _ in range(200):
                scrape(conn)
        rounds: dict[str, list[float]] = {name: [] for name in procs}
        for _ in range(args.rounds):                    # alternated: both see the same machine
            for name, proc in procs.items():
                rounds[name].append(cpu_per_request(proc, conns[name], args.requests))
        for name, values in rounds.items():
            label = name if name == "fabricscope" else f"node_exporter {node_exporter_version(node_exporter)}"
            body = f"{args.body_bytes}-byte body" if name == "fabricscope" else "no collectors"
            print(f"{label:<22} CPU per request: median {statistics.median(values) * 1e6:6.0f} us  rounds "
                  f"{' '.join(f'{v * 1e6:.0f}' for v in values)}  ({args.requests} requests a round, {body})")
        return 0
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
