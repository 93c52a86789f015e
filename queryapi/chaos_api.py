"""Chaos simulations over HTTP (seed 000 §14.5), on the live topology.

    POST /graph/chaos-simulate        {device, failure_type, include_jobs} -> 202 {simulation_id, status}
    GET  /graph/chaos-results/<id>    202 while running, 200 when done, 404 unknown
    GET  /graph/chaos-topology        the topology simulations run on: version, counts, live merge
    GET  /graph/chaos-devices         device names (optionally of one kind) to simulate
    GET  /graph/chaos-alerts          recent critical alerts with the blast radius of their device

The query layer's `blast_radius` and `neighbors` tools (queryapi/query/sidecar_tools.py)
use the same service (the Sidecar's `chaos`), with the same per-key budget.

Simulations run on a small thread pool, never on the request thread; every state is in
the sidecar store (simulation_results), so a result outlives the process that computed it.
Each API key may start `chaos_simulations_per_minute` (default 5) simulations a minute;
the next gets 429 with Retry-After. The topology is the `chaos_topology` inventory merged
with the live metrics every `chaos_refresh_seconds` (chaos/live.py); each result names the
topology version it ran on.

Only a valid request spends the budget: one refused with 422 (unknown device, failure
type that cannot apply) costs nothing.

Alert enrichment: every critical alert the Alertmanager webhook records (storage.alerts)
gets the blast radius of the device its labels name (an HCA, NIC, GPU or host, see
chaos.live.DeviceIndex) computed once per alert episode and kept beside it in the store
(simulation id `alert-<hash of fingerprint and startsAt>`), for dashboards to read. The
worker pages through the alerts oldest first with a cursor that moves only past alerts it
handled, so a storm of 1,500 alerts delays the last ones instead of skipping them. It has a
budget of its own (`chaos_alert_simulations_per_minute`), and a result is reused for every
alert naming the same device on the same topology version: a storm on one switch costs one
simulation. The simulations a webhook post will need are also charged, when it is posted,
to the key that posted it (`chaos_alert_simulations_per_key_per_minute`, one per device not
simulated yet): an alert past that key's budget is stored as `over_budget` and never
simulated, so one write key cannot spend the budget every other poster shares.
"""
from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from apiflask import APIBlueprint
from pydantic import BaseModel, ConfigDict, Field

from fabricscope.chaos.blast import FAILURE_TYPES, BlastRadiusEngine, ChaosInputError, initial_failures
from fabricscope.chaos.inventory import InventoryError, load_topology
from fabricscope.chaos.live import DeviceIndex, LiveTopology
from fabricscope.chaos.model import DEVICE_KINDS

from .auth import current_key, require_scope
from .config import ConfigError
from .context import sidecar
from .errors import ApiError
from .ratelimit import RateLimiter
from .workers import PeriodicWorker

log = logging.getLogger("fabricscope.sidecar.chaos")
bp = APIBlueprint("chaos", __name__, tag="Chaos")
# A simulation takes milliseconds; one still "running" this long after it was submitted
# belonged to a sidecar that stopped before finishing it.
STALE_SECONDS = 300
SIMULATION_THREADS = 2
ALERT_SCAN_SECONDS = 5.0
ALERT_LOOKBACK_MS = 3600 * 1000     # on start, alerts of the last hour get their blast radius
ALERT_PAGE = 100


class SimulateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str = Field(min_length=1, max_length=256, description="device (or rack, for rack_failure) that fails")
    failure_type: Literal[FAILURE_TYPES] = "device_failure"  # type: ignore[valid-type]
    include_jobs: bool = True


class SubmittedOut(BaseModel):
    simulation_id: str
    status: str


class DevicesQuery(BaseModel):
    kind: Literal[DEVICE_KINDS] | None = None  # type: ignore[valid-type]
    limit: int = Field(1000, ge=1, le=100_000)


class ChaosService:
    name = "chaos-simulations"

    def __init__(self, topology: LiveTopology, per_minute: int) -> None:
        self.topology = topology
        self.per_minute = per_minute
        self.limiter = RateLimiter()
        self.executor = ThreadPoolExecutor(SIMULATION_THREADS, thread_name_prefix="chaos-simulation")
        self.instance = uuid.uuid4().hex
        self.alerts: AlertBlastRadius | None = None

    # Listed among the sidecar's workers so shutdown waits for running simulations before
    # the store closes under them.
    def start(self) -> None:
        """Nothing to start: pool threads start with the first simulation."""

    def spend(self, key_id: str) -> float | None:
        """Take one simulation from the key's budget: None if allowed, else the seconds
        until the next one is."""
        allowed, retry_after = self.limiter.allow(key_id, self.per_minute / 60.0, self.per_minute)
        return None if allowed else retry_after

    def budget_message(self, key_id: str) -> str:
        return f"chaos simulations are limited to {self.per_minute} per minute per API key (key {key_id!r})"

    def stop(self, timeout: float = 10.0) -> None:
        self.executor.shutdown(wait=True, cancel_futures=False)

    def run(self, storage, sim_id: str, record: dict, engine: BlastRadiusEngine) -> None:
        body = record["request"]
        try:
            result = engine.simulate(body["device"], body["failure_type"], body["include_jobs"])
            storage.save_simulation(sim_id, "complete", {**record, "finished_ms": _now_ms(),
                                                         "result": result.to_dict()})
        except Exception as exc:  # recorded for the poller; the pool thread lives on
            log.exception("simulation %s failed", sim_id)
            storage.save_simulation(sim_id, "failed", {**record, "finished_ms": _now_ms(),
                                                       "error": f"{type(exc).__name__}: {exc}"})


def alert_simulation_id(fingerprint: str, starts_at: str) -> str:
    return "alert-" + hashlib.sha256(f"{fingerprint}|{starts_at}".encode()).hexdigest()[:32]


class AlertBlastRadius:
    """Stores the blast radius of the device each critical alert names, once per alert
    episode, oldest alert first, under its own simulation budget."""
    name = "chaos-alerts"

    def __init__(self, service: ChaosService, storage, per_minute: int, per_key_per_minute: int = 20) -> None:
        self.service = service
        self.storage = storage
        self.per_minute, self.per_key_per_minute = per_minute, per_key_per_minute
        self.limiter = RateLimiter()
        self._charge_lock = threading.Lock()          # request threads share the device index
        # (last_received_ms, fingerprint, starts_at) of the last alert handled.
        self.cursor: tuple[int, str, str] = (_now_ms() - ALERT_LOOKBACK_MS, "", "")
        self._index: tuple[str, DeviceIndex] | None = None
        self._results: dict[str, dict] = {}          # device -> result, on the version of _index
        self.worker = PeriodicWorker(self.name, ALERT_SCAN_SECONDS, self.run_once)

    def _device_index(self, engine: BlastRadiusEngine) -> DeviceIndex:
        if self._index is None or self._index[0] != engine.version:
            self._index = (engine.version, DeviceIndex(engine.topology))
            self._results.clear()
        return self._index[1]

    def charge(self, key_id: str, alerts: list[dict]) -> int:
        """At the webhook: one simulation of the posting key's budget for each device the
        new critical firing alerts name that has no result yet. Alerts past the budget are
        stored `over_budget` (the worker then skips them); how many were."""
        engine = self.service.topology.engine()
        charged: set[str] = set()
        refused = 0
        with self._charge_lock:
            index = DeviceIndex(engine.topology) if self._index is None or self._index[0] != engine.version \
                else self._index[1]
            for alert in alerts:
                if alert["status"] != "firing" or alert["labels"].get("severity") != "critical":
                    continue
                sim_id = alert_simulation_id(alert["fingerprint"], alert["startsAt"])
                device = index.device_for_labels(alert["labels"])
                if device is None or device in charged or self.storage.load_simulation(sim_id) is not None:
                    continue
                allowed, _ = self.limiter.allow(f"key:{key_id}", self.per_key_per_minute / 60.0,
                                                self.per_key_per_minute)
                if allowed:
                    charged.add(device)
                    continue
                refused += 1
                record = {"alertname": alert["labels"].get("alertname", ""), "fingerprint": alert["fingerprint"],
                          "starts_at": alert["startsAt"], "labels": alert["labels"]}
                self.storage.save_simulation(sim_id, "over_budget", {"alert": record, "submitted_ms": _now_ms(),
                                                                      "key_id": key_id})
        return refused

    def run_once(self) -> int:
        """Handle alerts past the cursor until none is left or the budget runs out (the
        cursor then stays on the first alert not handled, for the next pass)."""
        attached = 0
        while True:
            rows = self.storage.alerts_after(self.cursor, status="firing", limit=ALERT_PAGE)
            for row in rows:
                if (row["labels"] or {}).get("severity") == "critical":
                    done = self.attach(row)
                    if done is None:
                        return attached
                    attached += done
                self.cursor = (row["last_received_ms"], row["fingerprint"], row["starts_at"])
            if len(rows) < ALERT_PAGE:
                return attached

    def attach(self, row: dict) -> int | None:
        """1 if a blast radius was stored, 0 if there was nothing to do, None if the budget
        is spent for now."""
        sim_id = alert_simulation_id(row["fingerprint"], row["starts_at"])
        if self.storage.load_simulation(sim_id) is not None:
            return 0
        engine = self.service.topology.engine()
        device = self._device_index(engine).device_for_labels(row["labels"])
        alert = {"alertname": row["alertname"], "fingerprint": row["fingerprint"], "starts_at": row["starts_at"],
                 "labels": row["labels"]}
        if device is None:
            self.storage.save_simulation(sim_id, "no_device", {"alert": alert, "submitted_ms": _now_ms()})
            return 0
        result = self._results.get(device)
        if result is None:
            allowed, _ = self.limiter.allow("alerts", self.per_minute / 60.0, self.per_minute)
            if not allowed:
                return None
            result = self._results[device] = engine.simulate(device, "device_failure").to_dict()
        self.storage.save_simulation(sim_id, "complete", {"alert": alert, "submitted_ms": _now_ms(),
                                                          "topology_version": engine.version, "result": result})
        return 1


def _now_ms() -> int:
    return int(time.time() * 1000)


def setup(app, state) -> None:
    config = state.config
    if config.chaos_topology is None:
        state.chaos = None
        return
    path = config.chaos_topology
    query = state.prom.query if config.chaos_refresh_seconds > 0 else None
    topology = LiveTopology(lambda: load_topology(path), query)
    try:
        topology.refresh(merge_live=False)     # a bad inventory stops start-up, naming the key
    except InventoryError as exc:
        raise ConfigError(f"chaos_topology: {exc}") from None
    service = ChaosService(topology, config.chaos_simulations_per_minute)
    state.chaos = service
    state.workers.append(service)
    service.alerts = AlertBlastRadius(service, state.storage, config.chaos_alert_simulations_per_minute,
                                      config.chaos_alert_simulations_per_key_per_minute)
    state.workers.append(service.alerts.worker)
    if query is not None:
        state.workers.append(PeriodicWorker("chaos-topology", config.chaos_refresh_seconds, topology.refresh))
    state.capabilities.add("chaos_simulation")


def _service() -> ChaosService:
    service = sidecar().chaos
    if service is None:
        # 404, not 5xx: nothing is broken, this sidecar simply has no topology to simulate on.
        raise ApiError(404, "no cluster topology is configured for chaos simulations: start the sidecar with "
                            "--chaos-topology FILE (docs/chaos.md)", code="chaos_no_topology")
    return service


@bp.post("/graph/chaos-simulate")
@require_scope("write")
@bp.input(SimulateIn)
@bp.output(SubmittedOut, status_code=202)
@bp.doc(summary="Start a blast-radius simulation; poll GET /graph/chaos-results/{simulation_id}",
        responses={422: "unknown device or failure type (the valid choices are named)",
                   429: "more than the per-key simulations per minute"})
def simulate(json_data: SimulateIn):
    service = _service()
    engine = service.topology.engine()
    try:
        # Checked now, so a bad request is a 422 here rather than a failed simulation later.
        initial_failures(engine.topology, json_data.device, json_data.failure_type)
    except ChaosInputError as exc:
        raise ApiError(422, str(exc), code=f"chaos_invalid_{exc.field}",
                       detail={"field": exc.field, "choices": exc.choices,
                               "failure_types": list(FAILURE_TYPES)}) from None
    key = current_key()
    retry_after = service.spend(key.id)
    if retry_after is not None:
        raise ApiError(429, service.budget_message(key.id), code="chaos_rate_limited",
                       headers={"Retry-After": str(max(1, math.ceil(retry_after)))})
    state = sidecar()
    sim_id = uuid.uuid4().hex
    record = {"request": json_data.model_dump(), "key_id": key.id, "instance": service.instance,
              "submitted_ms": _now_ms(), "topology_version": engine.version}
    state.storage.save_simulation(sim_id, "running", record)
    service.executor.submit(service.run, state.storage, sim_id, record, engine)
    return {"simulation_id": sim_id, "status": "running"}, 202, {"Location": f"/graph/chaos-results/{sim_id}"}


@bp.get("/graph/chaos-results/<simulation_id>")
@require_scope("read")
@bp.doc(summary="A simulation's state: 202 while running, 200 with impact_score, affected_devices, "
                "affected_jobs and the BFS path when complete",
        responses={202: "still running", 404: "no such simulation"})
def results(simulation_id: str):
    row = sidecar().storage.load_simulation(simulation_id) if len(simulation_id) <= 64 else None
    if row is None:
        raise ApiError(404, f"no simulation {simulation_id!r}", code="simulation_not_found")
    data, status = row["data"], row["status"]
    head = {"simulation_id": simulation_id, "status": status, "request": data.get("request"),
            "submitted_ms": data.get("submitted_ms"), "topology_version": data.get("topology_version")}
    if status == "running":
        if _now_ms() - data.get("submitted_ms", row["created_ms"]) > STALE_SECONDS * 1000:
            return {**head, "status": "failed", "error": "interrupted: the sidecar running it stopped first"}, 200
        return head, 202
    if "result" not in data:      # failed, or an alert whose labels name no device
        error = data.get("error") or "the alert names no device of the topology"
        return {**head, "finished_ms": data.get("finished_ms"), "error": error}, 200
    return {**head, "finished_ms": data.get("finished_ms"), **data["result"]}, 200


@bp.get("/graph/chaos-topology")
@require_scope("read")
@bp.doc(summary="The topology simulations run on: version, device counts, when the live metrics were merged")
def topology():
    service = _service()
    service.topology.engine()
    return service.topology.status()


@bp.get("/graph/chaos-devices")
@require_scope("read")
@bp.input(DevicesQuery, location="query")
@bp.doc(summary="Device names (optionally of one kind) that a simulation can fail")
def devices(query_data: DevicesQuery):
    graph = _service().topology.engine().topology.graph
    names = [{"name": name, "kind": kind, "rack": rack} for name, kind, rack in
             ((n, d["kind"], d["rack"]) for n, d in graph.nodes(data=True))
             if query_data.kind is None or kind == query_data.kind]
    return {"devices": names[:query_data.limit], "total": len(names)}


class AlertsQuery(BaseModel):
    minutes: float = Field(60.0, gt=0, le=7 * 24 * 60)
    limit: int = Field(100, ge=1, le=500)


@bp.get("/graph/chaos-alerts")
@require_scope("read")
@bp.input(AlertsQuery, location="query")
@bp.doc(summary="Critical alerts of the last `minutes` with the blast radius of the device each names "
                "(affected jobs, impact score), for dashboards")
def alerts(query_data: AlertsQuery):
    _service()
    storage = sidecar().storage
    rows = storage.alerts(since_ms=_now_ms() - int(query_data.minutes * 60_000), limit=500)
    out = []
    for row in rows:
        if (row["labels"] or {}).get("severity") != "critical":
            continue
        stored = storage.load_simulation(alert_simulation_id(row["fingerprint"], row["starts_at"]))
        result = (stored or {}).get("data", {}).get("result")
        out.append({"alertname": row["alertname"], "status": row["status"], "starts_at": row["starts_at"],
                    "labels": row["labels"],
                    "blast_radius": None if result is None else {
                        key: result[key] for key in ("device", "impact_score", "affected_jobs", "affected_job_count",
                                                     "affected_device_count", "total_devices", "total_active_jobs",
                                                     "topology_version", "affected_by_kind")},
                    "blast_radius_state": "pending" if stored is None else stored["status"]})
        if len(out) >= query_data.limit:
            break
    return {"alerts": out}

