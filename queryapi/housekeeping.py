"""Retention: spans, correlations, alerts, sessions and simulation results older than
`retention_hours` are deleted every few minutes, and on demand by an admin."""
from __future__ import annotations

import time

from apiflask import APIBlueprint

from .auth import require_scope
from .context import sidecar
from .workers import PeriodicWorker

bp = APIBlueprint("housekeeping", __name__, tag="Housekeeping")

PURGE_INTERVAL_SECONDS = 300.0


def purge_expired(state) -> dict[str, int]:
    cutoff = int((time.time() - state.config.retention_hours * 3600) * 1000)
    return state.storage.purge_before(cutoff)


def setup(app, state) -> None:
    state.workers.append(PeriodicWorker("retention", PURGE_INTERVAL_SECONDS, lambda: purge_expired(state)))


@bp.post("/api/v1/admin/retention/run")
@require_scope("admin")
@bp.doc(summary="Delete everything older than the retention window now; returns rows deleted per table")
def run_retention():
    state = sidecar()
    return {"deleted": purge_expired(state), "retention_hours": state.config.retention_hours}
