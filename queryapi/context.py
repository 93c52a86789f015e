"""What a blueprint reaches through `sidecar()`: the configuration, storage, the
Prometheus client, the metrics and the background workers of the running app."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import Logger
from typing import TYPE_CHECKING, Any

from flask import current_app

from .config import SidecarConfig
from .keys import KeyStore
from .metrics import SidecarMetrics
from .prom import PrometheusClient
from .ratelimit import RateLimiter
from .storage import Storage

# How long shutdown waits for the background workers: SIGTERM is done within about this
# and a second, so a restart right after it finds the port and the database free.
STOP_SECONDS = 2.5

if TYPE_CHECKING:     # types only: the areas import this module, never the other way
    from .chaos_api import ChaosService
    from .query.api import QueryArea
    from .tracing.correlate import Correlator
    from .workers import PeriodicWorker

# The one key the app keeps its Sidecar under (Flask's extensions); everything else is a
# typed field of the Sidecar.
EXTENSION = "fabricscope"


@dataclass
class Sidecar:
    config: SidecarConfig
    storage: Storage
    prom: PrometheusClient
    metrics: SidecarMetrics
    keys: KeyStore
    limiter: RateLimiter
    audit: Logger
    # Background workers (correlator, retention); started by start_background().
    workers: list[Any] = field(default_factory=list)
    # Named features the blueprints add (GET /api/versions lists them), e.g. "tracing".
    capabilities: set[str] = field(default_factory=set)
    # The areas' services, set by each area's setup (None while an area is off).
    chaos: ChaosService | None = None              # chaos_api: simulations on the live topology
    correlator: Correlator | None = None           # tracing: spans -> network anomalies
    correlation_worker: PeriodicWorker | None = None
    query: QueryArea | None = None                 # query layer: NL, MeshQL, tools, MCP

    def start_background(self) -> None:
        for worker in self.workers:
            worker.start()

    def request_stop(self) -> None:
        """Tell the workers to stop, without waiting (shutdown overlaps their last runs
        with the server's own stop)."""
        for worker in self.workers:
            request_stop = getattr(worker, "request_stop", None)
            if request_stop is not None:
                request_stop()

    def stop_background(self, timeout: float = STOP_SECONDS) -> None:
        """Tell every worker to stop, then wait for them, `timeout` seconds in all: a worker
        still inside a slow call after that is left to the process's exit (its claimed work
        is a lease that runs out and is done again after the next start)."""
        self.request_stop()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.stop(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self.stop_background()
        self.storage.close()


def sidecar() -> Sidecar:
    return current_app.extensions[EXTENSION]
