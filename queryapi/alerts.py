"""The Alertmanager webhook receiver: the one receiver the stack's Alertmanager posts to.

Every alert of a notification is recorded, deduplicated by fingerprint and episode
(startsAt): Alertmanager repeats an unresolved alert every repeat_interval, and those
repeats update the row (status, endsAt, receive count) instead of adding rows. Chaos
enrichment and dashboards read the records (GET /alerts)."""
from __future__ import annotations

import time
from typing import Any

from apiflask import APIBlueprint
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .auth import require_scope
from .context import sidecar

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


@bp.post(WEBHOOK_PATH)
@require_scope("write")
@bp.input(WebhookIn)
@bp.output(WebhookOut)
@bp.doc(summary="Alertmanager webhook receiver: records alerts, deduplicated by fingerprint and episode")
def webhook(json_data: WebhookIn):
    state = sidecar()
    alerts = [a.model_dump() for a in json_data.alerts]
    new, repeats = state.storage.record_alerts(alerts, int(time.time() * 1000), json_data.receiver)
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
