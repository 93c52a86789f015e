"""The Alertmanager webhook receiver: the one receiver the stack's Alertmanager posts to.

Every alert of a notification is recorded, deduplicated by fingerprint and episode
(startsAt): Alertmanager repeats an unresolved alert every repeat_interval, and those
repeats update the row (status, endsAt, receive count) instead of adding rows. Chaos
enrichment and dashboards read the records (GET /alerts).

Notifications alone cannot keep the records true: an alert that resolves while it is
inhibited or silenced sends no resolution, and one inhibited from its start is never
sent. With `alertmanager_url` set, the records are reconciled with Alertmanager's own
list (GET /api/v2/alerts) every `alertmanager_reconcile_seconds` and on
POST /alerts/reconcile, so the firing records are exactly the alerts Alertmanager holds."""
from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import requests

from apiflask import APIBlueprint
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .auth import current_key, require_scope
from .context import sidecar
from .errors import ApiError
from .workers import PeriodicWorker

log = logging.getLogger("fabricscope.sidecar.alerts")

bp = APIBlueprint("alerts", __name__, tag="Alerts")

WEBHOOK_PATH = "/alerts/webhook"
MAX_ALERTS = 1000
# No NUL in stored text: PostgreSQL's TEXT cannot hold it (SQLite could, the two must agree).
NO_NUL = r"^[^\x00]*$"


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str = Field(pattern="^(firing|resolved)$")
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = Field(min_length=1, max_length=64, pattern=NO_NUL)
    endsAt: str | None = Field(None, max_length=64, pattern=NO_NUL)
    generatorURL: str | None = Field(None, max_length=4096, pattern=NO_NUL)
    fingerprint: str = Field(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z]+$")

    @model_validator(mode="after")
    def _no_nul_in_labels(self) -> "WebhookAlert":
        for where, mapping in (("labels", self.labels), ("annotations", self.annotations)):
            if any("\x00" in key or "\x00" in value for key, value in mapping.items()):
                raise ValueError(f"{where} contain a NUL character")
        return self


class WebhookIn(BaseModel):
    """Alertmanager's webhook payload (version 4)."""
    model_config = ConfigDict(extra="allow")
    version: str = Field("4", max_length=8)
    receiver: str = Field("", max_length=256, pattern=NO_NUL)
    status: str | None = Field(None, max_length=16)
    alerts: list[WebhookAlert] = Field(max_length=MAX_ALERTS)


class WebhookOut(BaseModel):
    recorded: int = Field(description="alert episodes seen for the first time")
    repeats: int = Field(description="alerts already recorded (Alertmanager re-sends)")


def setup(app, state) -> None:
    state.capabilities.add("alertmanager_webhook")
    if state.config.alertmanager_url:
        state.capabilities.add("alertmanager_reconcile")
        state.workers.append(PeriodicWorker("alert-reconcile", state.config.alertmanager_reconcile_seconds,
                                            lambda: reconcile(state)))


class AlertmanagerUnavailable(Exception):
    pass


def alertmanager_alerts(url: str, timeout: float) -> list[dict]:
    """Every alert Alertmanager holds: active, inhibited, silenced and not yet processed
    (its API leaves resolved alerts out)."""
    try:
        response = requests.get(url + "/api/v2/alerts", timeout=timeout,
                                params={"active": "true", "silenced": "true", "inhibited": "true",
                                        "unprocessed": "true"})
        response.raise_for_status()
        alerts = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise AlertmanagerUnavailable(f"GET {url}/api/v2/alerts: {exc}") from None
    if not isinstance(alerts, list) or not all(
            isinstance(a, dict) and isinstance(a.get("fingerprint"), str) and isinstance(a.get("startsAt"), str)
            for a in alerts):
        raise AlertmanagerUnavailable(f"GET {url}/api/v2/alerts: not a list of alerts")
    return alerts


def reconcile(state) -> dict[str, int]:
    """One reconciliation; an unreachable Alertmanager changes nothing (an empty answer
    from a healthy one resolves every record, as it should)."""
    config = state.config
    current = alertmanager_alerts(config.alertmanager_url, min(10.0, config.alertmanager_reconcile_seconds))
    now = dt.datetime.now(dt.timezone.utc)
    counts = state.storage.reconcile_alerts(current, now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                            int(now.timestamp() * 1000))
    for action in ("resolved", "added"):
        state.metrics.alerts_reconciled.labels(action).inc(counts[action])
    if counts["resolved"] or counts["added"]:
        log.info("alerts reconciled with Alertmanager: %(resolved)d resolved, %(added)d added, %(firing)d firing",
                 counts)
    return counts


class ReconcileOut(BaseModel):
    resolved: int = Field(description="firing records Alertmanager no longer holds, now resolved")
    added: int = Field(description="alerts Alertmanager holds that no notification carried (inhibited or "
                                   "silenced since they started), now recorded with receive_count 0")
    firing: int = Field(description="firing records after the reconciliation")


@bp.post("/alerts/reconcile")
@require_scope("write")
@bp.output(ReconcileOut)
@bp.doc(summary="Reconcile the recorded alerts with Alertmanager's API now")
def reconcile_now():
    state = sidecar()
    if not state.config.alertmanager_url:
        raise ApiError(404, "no Alertmanager is configured: start the sidecar with --alertmanager-url",
                       code="alertmanager_not_configured")
    try:
        return reconcile(state)
    except AlertmanagerUnavailable as exc:
        raise ApiError(502, str(exc), code="alertmanager_unavailable") from None


@bp.post(WEBHOOK_PATH)
@require_scope("write")
@bp.input(WebhookIn)
@bp.output(WebhookOut)
@bp.doc(summary="Alertmanager webhook receiver: records alerts, deduplicated by fingerprint and episode")
def webhook(json_data: WebhookIn):
    state = sidecar()
    alerts = [a.model_dump() for a in json_data.alerts]
    new, repeats = state.storage.record_alerts(alerts, int(time.time() * 1000), json_data.receiver)
    if state.chaos is not None and current_key() is not None:
        # The blast radii these alerts will need, charged to the key that posted them.
        state.chaos.alerts.charge(current_key().id, alerts)
    for alert in json_data.alerts:
        state.metrics.alerts_received.labels(alert.status).inc()
    return {"recorded": new, "repeats": repeats}


class AlertsQuery(BaseModel):
    status: str | None = Field(None, pattern="^(firing|resolved)$")
    alertname: str | None = Field(None, max_length=256, pattern=NO_NUL)
    since_ms: int | None = Field(None, ge=0, le=4_102_444_800_000,
                                 description="only alerts received (first or again) since this Unix ms time")
    limit: int = Field(500, ge=1, le=5000)


class AlertOut(BaseModel):
    fingerprint: str
    starts_at: str
    alertname: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ends_at: str | None
    generator_url: str | None
    first_received_ms: int
    last_received_ms: int
    receive_count: int
    receiver: str


class AlertsOut(BaseModel):
    alerts: list[AlertOut]


@bp.get("/alerts")
@require_scope("read")
@bp.input(AlertsQuery, location="query")
@bp.output(AlertsOut)
@bp.doc(summary="Alerts received from Alertmanager, most recently received first")
def list_alerts(query_data: AlertsQuery) -> dict[str, Any]:
    rows = sidecar().storage.alerts(since_ms=query_data.since_ms, status=query_data.status,
                                    alertname=query_data.alertname, limit=query_data.limit)
    return {"alerts": rows}
