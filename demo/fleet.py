"""Fleet mode: one process serves many simulated nodes, each a target of its own.

A full simulated node (its file trees, sources and exporter) costs a tick and a scrape of
real collector work, which is what the demo's few nodes are for; a fleet of 1,000 such
nodes does not fit one machine. So the scenario's nodes run in full (the demo cluster,
faults and all), and the rest of the fleet are copies of node 0's exposition as its
exporter serves it at that moment: the same series and values under the copy's own `node`
label, its NCCL ranks renumbered into one fleet-wide job (rank r of copy i is r + i x
ranks per node, `nranks` the fleet's). The copies share one HTTP port, each at its own
path (`/nodes/<node>/metrics`, given to Prometheus and vmagent as `__metrics_path__` in
the file_sd targets), and node 0's exposition is rendered at most once a second for all
of them.

What copies are not: a fault only happens on a simulated node, and the copies' values are
node 0's (a rule comparing nodes sees them agree). Series counts, sample rates, scrape
and storage cost, rule-evaluation cost and the sidecar's query cost are those of the
fleet; bench/fleet_scale.py measures them.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .cluster import DemoCluster
from .targets import write_targets_file

log = logging.getLogger("fabricscope.demo.fleet")

RENDER_EVERY_SECONDS = 1.0
_RANK = re.compile(rb'rank="(\d+)"')


class FleetCopies:
    """Node 0's exposition, rewritten for each copy on request."""

    def __init__(self, render, template_node: str, ranks_per_node: int, fleet_ranks: int,
                 simulated_ranks: int) -> None:
        self._render = render
        self._node = f'node="{template_node}"'.encode()
        self._ranks_per_node = ranks_per_node
        self._nranks = (f'nranks="{simulated_ranks}"'.encode(), f'nranks="{fleet_ranks}"'.encode())
        self._lock = threading.Lock()
        self._rendered_at = 0.0
        self._plain = b""                   # lines without a rank label
        self._ranked: list[bytes] = []      # lines with one, rewritten per copy

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._rendered_at < RENDER_EVERY_SECONDS:
                return
            plain, ranked = [], []
            for line in self._render().splitlines(keepends=True):
                (ranked if b'rank="' in line else plain).append(line)
            self._plain, self._ranked = b"".join(plain), ranked
            self._rendered_at = time.monotonic()

    def exposition(self, copy_index: int, node: str) -> bytes:
        self._refresh()
        label = f'node="{node}"'.encode()
        offset = copy_index * self._ranks_per_node
        ranked = b"".join(_RANK.sub(lambda m: b'rank="%d"' % (int(m.group(1)) + offset), line)
                          for line in self._ranked)
        return (self._plain.replace(self._node, label)
                + ranked.replace(self._node, label).replace(*self._nranks))


class Fleet:
    """The demo cluster's nodes in full, plus copies up to `nodes` in all, on one port."""

    def __init__(self, cluster: DemoCluster, nodes: int, listen_host: str = "127.0.0.1", port: int = 0) -> None:
        scenario = cluster.scenario
        if nodes < scenario.nodes:
            raise ValueError(f"a fleet of {nodes} nodes is smaller than the scenario's {scenario.nodes}")
        self.cluster, self.nodes = cluster, nodes
        self.listen_host, self.port = listen_host, port
        self.copy_names = [scenario.node_name(i) for i in range(scenario.nodes, nodes)]
        self._index = {name: i for i, name in enumerate(self.copy_names, start=scenario.nodes)}
        self.server: ThreadingHTTPServer | None = None
        self.copies: FleetCopies | None = None

    def start(self) -> "Fleet":
        scenario = self.cluster.scenario
        self.cluster.start()
        ranks = scenario.gpus_per_node
        self.copies = FleetCopies(self.cluster.exporters[0].render_metrics, scenario.node_name(0), ranks,
                                  ranks * self.nodes, ranks * scenario.nodes)
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                parts = self.path.split("/")
                index = fleet._index.get(parts[2]) if len(parts) == 4 and parts[1] == "nodes" \
                    and parts[3] == "metrics" else None
                if index is None:
                    self.send_error(404, "no such node: /nodes/<node>/metrics")
                    return
                body = fleet.copies.exposition(index, parts[2])
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                # A scraper that gave up (its timeout) resets the connection: not news.
                log.debug("fleet: request from %s failed", client_address, exc_info=True)

        try:
            self.server = Server((self.listen_host, self.port), Handler)
        except OSError:
            self.cluster.stop()
            raise
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="fleet-http", daemon=True).start()
        log.info("fleet: %d simulated nodes, %d copies of %s on %s:%d", scenario.nodes, len(self.copy_names),
                 scenario.node_name(0), self.listen_host, self.port)
        return self

    def file_sd_groups(self) -> list[dict]:
        """Prometheus / vmagent file_sd: the simulated nodes' own exporters, then the copies
        at their paths on the fleet's port."""
        cluster_name = self.cluster.scenario.cluster_name
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        groups = [{"targets": [address], "labels": {"node": node, "cluster": cluster_name}}
                  for node, address in self.cluster.targets]
        groups += [{"targets": [f"{host}:{self.port}"],
                    "labels": {"node": name, "cluster": cluster_name, "__metrics_path__": f"/nodes/{name}/metrics"}}
                   for name in self.copy_names]
        return groups

    def write_targets_file(self, path: str | Path) -> Path:
        return write_targets_file(path, [], self.cluster.scenario.cluster_name, groups=self.file_sd_groups())

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.cluster.stop()

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
