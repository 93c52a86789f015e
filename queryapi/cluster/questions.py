"""The cluster questions as plain functions over the Prometheus client, so the HTTP
endpoints and a tool registry can both call them.

Arrival lag (CONTRACTS: `comm_rank:fabric_nccl_arrival_lag_seconds:mean5m`, labels
cluster, node, comm, rank) is how late a rank enters each collective compared with the
earliest rank of its communicator; durations cannot show a straggler (every rank of a
synchronous loop has the same period), arrival lag does.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from ..prom import PrometheusClient
from ..promql import quote

ARRIVAL_LAG = "comm_rank:fabric_nccl_arrival_lag_seconds:mean5m"
# Which job each rank belongs to (label `job_id`, absent when unknown), from the exporter.
RANK_INFO = "fabric_nccl_rank_info"
# Collectives per second per rank (point-to-point Send/Recv excluded), recorded by the NCCL rules.
COLLECTIVE_RATE = "comm_rank:fabric_nccl_collectives:rate1m"
# Robust z-score scale: 1.4826 x MAD estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826


@dataclass
class OutlierRank:
    cluster: str
    comm: str
    rank: str
    node: str
    lag_seconds: float
    median_lag_seconds: float
    mad_seconds: float
    excess_seconds: float        # lag above the communicator's median
    score: float | None          # excess / (1.4826 x MAD), the robust z-score; None when MAD is 0
    nranks: int


def selector(**labels: str | None) -> str:
    matchers = [f"{name}={quote(value)}" for name, value in labels.items() if value]
    return "{" + ",".join(matchers) + "}"


def arrival_lags(prom: PrometheusClient, cluster: str | None, comm: str | None,
                 window_seconds: int | None = None, at: float | None = None,
                 job: str | None = None) -> dict[tuple[str, str], dict]:
    """(cluster, comm) -> {rank: (node, lag)}; averaged over the window when given; only the
    communicators with a rank in `job` when given."""
    series = ARRIVAL_LAG + selector(cluster=cluster, comm=comm)
    query = f"avg_over_time({series}[{int(window_seconds)}s])" if window_seconds else series
    if job:
        query = f"({query}) and on (cluster, comm) {RANK_INFO}{selector(cluster=cluster, job_id=job)}"
    groups: dict[tuple[str, str], dict] = {}
    for sample in prom.query(query, at=at):
        if math.isnan(sample.value):
            continue
        labels = sample.labels
        key = (labels.get("cluster", ""), labels.get("comm", ""))
        groups.setdefault(key, {})[labels.get("rank", "")] = (labels.get("node", ""), sample.value)
    return groups


def find_outlier_ranks(prom: PrometheusClient, cluster: str | None = None, comm: str | None = None,
                       threshold: float = 3.0, min_lag_seconds: float = 0.001,
                       window_seconds: int | None = None, at: float | None = None,
                       job: str | None = None) -> list[OutlierRank]:
    """Ranks whose arrival lag exceeds their communicator's median by more than
    `threshold` robust standard deviations (1.4826 x MAD) and by at least
    `min_lag_seconds` (with identical healthy ranks MAD is 0, and any jitter would
    otherwise be infinitely many deviations away). Slowest first."""
    outliers = []
    for (cluster_name, comm_name), ranks in arrival_lags(prom, cluster, comm, window_seconds, at, job).items():
        if len(ranks) < 3:
            continue    # a median of two says nothing about which one is slow
        lags = [lag for _, lag in ranks.values()]
        median = statistics.median(lags)
        mad = statistics.median(abs(lag - median) for lag in lags)
        spread = MAD_TO_SIGMA * mad
        for rank, (node, lag) in ranks.items():
            excess = lag - median
            if excess < min_lag_seconds:
                continue
            score = excess / spread if spread > 0 else None
            # MAD 0: every other rank arrives together, so any excess past the floor stands out.
            if score is None or score > threshold:
                outliers.append(OutlierRank(cluster_name, comm_name, rank, node, lag, median, mad, excess,
                                            score, len(ranks)))
    outliers.sort(key=lambda o: o.lag_seconds, reverse=True)
    return outliers


def collective_rates(prom: PrometheusClient, cluster: str | None, comm: str | None,
                     window_seconds: int) -> dict[tuple[str, str, str], float]:
    """(cluster, comm, rank) -> collectives per second, averaged over the window."""
    query = (f"avg by (cluster, comm, rank) (avg_over_time("
             f"{COLLECTIVE_RATE}{selector(cluster=cluster, comm=comm)}[{window_seconds}s]))")
    return {(s.labels.get("cluster", ""), s.labels.get("comm", ""), s.labels.get("rank", "")): s.value
            for s in prom.query(query) if not math.isnan(s.value)}


def get_cost(prom: PrometheusClient, rates: dict[str, float], rate_class: str = "default",
             cluster: str | None = None, comm: str | None = None, window_seconds: int = 3600,
             threshold: float = 3.0, min_lag_seconds: float = 0.001, job: str | None = None) -> dict[str, Any]:
    """Dollar cost of the straggler ranks.

    While a straggler is `excess` seconds late into a collective, the other nranks-1
    GPUs of its communicator wait. At `ops` collectives per second they spend
    min(1, excess x ops) of their time waiting, so the straggler costs
    (nranks - 1) x min(1, excess x ops) x (price of a GPU-hour) dollars per hour, and
    that times the window's hours for the window (lag averaged over the window)."""
    if rate_class not in rates:
        raise KeyError(rate_class)
    price = rates[rate_class]
    window_seconds = max(10, int(window_seconds))
    outliers = find_outlier_ranks(prom, cluster, comm, threshold, min_lag_seconds, window_seconds, job=job)
    ops = collective_rates(prom, cluster, comm, window_seconds) if outliers else {}
    ranks = []
    for outlier in outliers:
        per_second = ops.get((outlier.cluster, outlier.comm, outlier.rank), 0.0)
        waiting_fraction = min(1.0, outlier.excess_seconds * per_second)
        gpu_hours_per_hour = (outlier.nranks - 1) * waiting_fraction
        ranks.append({**asdict(outlier), "collectives_per_second": per_second,
                      "waiting_fraction": waiting_fraction, "idle_gpus": gpu_hours_per_hour,
                      "dollars_per_hour": gpu_hours_per_hour * price,
                      "dollars_in_window": gpu_hours_per_hour * price * window_seconds / 3600})
    return {"rate_class": rate_class, "dollars_per_gpu_hour": price, "window_seconds": window_seconds,
            "dollars_per_hour": sum(r["dollars_per_hour"] for r in ranks),
            "dollars_in_window": sum(r["dollars_in_window"] for r in ranks), "ranks": ranks}


def event_history(prom: PrometheusClient, start: float, end: float, cluster: str | None = None,
                  node: str | None = None, rank: str | None = None, op: str | None = None,
                  alertname: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """Alert episodes (firing intervals of Prometheus' ALERTS series) in [start, end],
    filtered by labels. An episode still firing at `end` has `end: null`."""
    step = max(1.0, (end - start) / 1000.0)
    labels = {"alertstate": "firing", "cluster": cluster, "node": node, "rank": rank, "op": op,
              "alertname": alertname}
    events = []
    for series in prom.query_range("ALERTS" + selector(**labels), start, end, step):
        times = [t for t, v in series["values"] if not math.isnan(v)]
        episode_start = previous = None
        for t in times:
            if episode_start is None:
                episode_start = previous = t
            elif t - previous > 2 * step:
                events.append(_episode(series["labels"], episode_start, previous, closed=True))
                episode_start = t
            previous = t
        if episode_start is not None:
            events.append(_episode(series["labels"], episode_start, previous, closed=previous < end - 2 * step))
    events.sort(key=lambda e: e["start"], reverse=True)
    return events[:limit]


def _episode(labels: dict[str, str], start: float, last: float, closed: bool) -> dict[str, Any]:
    detail = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
    return {"alertname": detail.pop("alertname", ""), "severity": detail.get("severity"), "labels": detail,
            "start": start, "end": last if closed else None}
