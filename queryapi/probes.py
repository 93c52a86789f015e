"""Probes: capability and liveness endpoints, and the sidecar's own /metrics."""
from __future__ import annotations

from importlib import metadata

from apiflask import APIBlueprint
from flask import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .auth import current_key, open_endpoint
from .context import sidecar
from .prom import PrometheusError
from .schemas import HealthOut, VersionsOut

bp = APIBlueprint("probes", __name__, tag="Probes")

API_VERSIONS = ["v1"]


def full_version() -> str:
    try:
        return metadata.version("fabricscope")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def major_minor() -> str:
    return ".".join(full_version().split(".")[:2])


@bp.get("/api/versions")
@open_endpoint
@bp.output(VersionsOut)
@bp.doc(summary="Capability probe (no key needed): API versions and major.minor only")
def versions():
    # The exact patch version is for key holders only (/api/v1/health): scanners looking
    # for a vulnerable build learn less from an open probe.
    return {"api_versions": API_VERSIONS, "version": major_minor(),
            "capabilities": sorted(sidecar().capabilities)}


@bp.get("/api/v1/health")
@open_endpoint
@bp.output(HealthOut)
@bp.doc(summary="Liveness; with a valid key also the full version, schema and Prometheus reachability")
def health():
    if current_key() is None:
        return {"status": "ok"}
    state = sidecar()
    try:
        state.prom.query("1")
        prometheus = "reachable"
    except PrometheusError as exc:
        prometheus = exc.reason
    return {"status": "ok", "version": full_version(), "schema_version": state.storage.schema_version(),
            "storage": state.storage.dialect, "prometheus": prometheus}


@bp.get("/metrics")
@open_endpoint
@bp.doc(summary="The sidecar's own metrics (Prometheus text format)",
        responses={200: {"description": "Prometheus exposition",
                         "content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics():
    state = sidecar()
    state.metrics.key_reload_failures.set(state.keys.reload_failures)
    return Response(generate_latest(state.metrics.registry), mimetype=CONTENT_TYPE_LATEST)
