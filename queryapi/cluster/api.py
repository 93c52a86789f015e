"""HTTP endpoints for the cluster questions."""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from apiflask import APIBlueprint
from pydantic import BaseModel, Field

from ..auth import require_scope
from ..context import sidecar
from ..errors import ApiError
from . import questions

bp = APIBlueprint("cluster", __name__, tag="Cluster")

LABEL = dict(max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")


def setup(app, state) -> None:
    state.capabilities.update({"outlier_ranks", "straggler_cost", "event_history"})


class OutlierQuery(BaseModel):
    cluster: str | None = Field(None, **LABEL)
    comm: str | None = Field(None, **LABEL)
    job: str | None = Field(None, description="only communicators with a rank of this job (job_id of fabric_nccl_rank_info)",
                            **LABEL)
    threshold: float = Field(3.0, gt=0, le=1000, description="robust z-score (excess / (1.4826 x MAD)) to exceed")
    min_lag_seconds: float = Field(0.001, ge=0, le=3600, description="ignore ranks less late than this")
    window_seconds: int | None = Field(None, ge=10, le=31 * 86400, description="average the lag over this window")


class OutlierOut(BaseModel):
    cluster: str
    comm: str
    rank: str
    node: str
    lag_seconds: float
    median_lag_seconds: float
    mad_seconds: float
    excess_seconds: float
    score: float | None
    nranks: int


class OutliersOut(BaseModel):
    signal: str
    outliers: list[OutlierOut]


@bp.get("/api/v1/cluster/outlier-ranks")
@require_scope("read")
@bp.input(OutlierQuery, location="query")
@bp.output(OutliersOut)
@bp.doc(summary="find_outlier_ranks: ranks whose NCCL arrival lag is a MAD outlier in their communicator, "
                "slowest first")
def outlier_ranks(query_data: OutlierQuery):
    found = questions.find_outlier_ranks(sidecar().prom, query_data.cluster, query_data.comm, query_data.threshold,
                                         query_data.min_lag_seconds, query_data.window_seconds, job=query_data.job)
    return {"signal": questions.ARRIVAL_LAG, "outliers": [asdict(o) for o in found]}


class CostQuery(OutlierQuery):
    rate_class: str = Field("default", max_length=64)
    window_seconds: int = Field(3600, ge=10, le=31 * 86400)


class CostOut(BaseModel):
    rate_class: str
    dollars_per_gpu_hour: float
    window_seconds: int
    dollars_per_hour: float
    dollars_in_window: float
    ranks: list[dict[str, Any]]


@bp.get("/api/v1/cluster/cost")
@require_scope("read")
@bp.input(CostQuery, location="query")
@bp.output(CostOut)
@bp.doc(summary="get_cost: dollars per hour and over the window that straggler ranks cost their communicators")
def cost(query_data: CostQuery):
    state = sidecar()
    try:
        return questions.get_cost(state.prom, state.config.gpu_hour_rates, query_data.rate_class,
                                  query_data.cluster, query_data.comm, query_data.window_seconds,
                                  query_data.threshold, query_data.min_lag_seconds, job=query_data.job)
    except KeyError:
        raise ApiError(422, f"unknown rate class {query_data.rate_class!r}", code="unknown_rate_class",
                       detail={"known": sorted(state.config.gpu_hour_rates)}) from None


class EventsQuery(BaseModel):
    cluster: str | None = Field(None, **LABEL)
    node: str | None = Field(None, **LABEL)
    rank: str | None = Field(None, **LABEL)
    op: str | None = Field(None, **LABEL)
    alertname: str | None = Field(None, **LABEL)
    start: float | None = Field(None, ge=0, le=4_102_444_800, description="Unix seconds (default: end - 1 h)")
    end: float | None = Field(None, ge=0, le=4_102_444_800, description="Unix seconds (default: now)")
    limit: int = Field(1000, ge=1, le=10000)


class EventOut(BaseModel):
    alertname: str
    severity: str | None
    labels: dict[str, str]
    start: float
    end: float | None


class EventsOut(BaseModel):
    start: float
    end: float
    events: list[EventOut]


@bp.get("/api/v1/cluster/events")
@require_scope("read")
@bp.input(EventsQuery, location="query")
@bp.output(EventsOut)
@bp.doc(summary="event_history: alert episodes filtered by cluster, node, rank, op and time window")
def events(query_data: EventsQuery):
    end = query_data.end if query_data.end is not None else time.time()
    start = query_data.start if query_data.start is not None else end - 3600
    if start >= end:
        raise ApiError(422, "start must be before end", code="bad_time_window")
    if end - start > 31 * 86400:
        raise ApiError(422, "the window may span at most 31 days", code="bad_time_window")
    found = questions.event_history(sidecar().prom, start, end, query_data.cluster, query_data.node,
                                    query_data.rank, query_data.op, query_data.alertname, query_data.limit)
    return {"start": start, "end": end, "events": found}
