"""Prometheus HTTP API client (`/api/v1/query`, `query_range`, `series`, `label/<name>/values`).

Only the HTTP API is used, so the same code reads Prometheus, Thanos Query, Mimir or
VictoriaMetrics. Every call has a timeout; any failure is a `PrometheusError` whose
`reason` is one of `unreachable`, `timeout`, `bad_response` or `query_error`, which the
app turns into a 503/502 JSON error with that code.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import requests


class PrometheusError(Exception):
    """`str()` names the Prometheus URL, for logs and the command line; `public_message`
    does not, for answers to API clients (the URL is an internal address)."""

    def __init__(self, reason: str, message: str, public_message: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.public_message = public_message or message


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp: float


class PrometheusClient:
    def __init__(self, base_url: str, timeout: float = 5.0, metrics=None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._metrics = metrics
        self._local = threading.local()   # requests.Session is not shared across threads

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _fail(self, reason: str, message: str) -> PrometheusError:
        if self._metrics is not None:
            self._metrics.prometheus_errors.labels(reason).inc()
        return PrometheusError(reason, message, message.replace(f" at {self.base_url}", ""))

    def _call(self, path: str, params: dict[str, Any] | list[tuple[str, Any]], method: str = "POST") -> Any:
        url = self.base_url + path
        try:
            # POST form-encoded where the API accepts it (Prometheus and its compatibles
            # do for query, query_range and series): long matchers never hit URL limits.
            if method == "POST":
                response = self._session().post(url, data=params, timeout=self.timeout)
            else:
                response = self._session().get(url, params=params, timeout=self.timeout)
        except requests.Timeout:
            raise self._fail("timeout", f"Prometheus at {self.base_url} did not answer within {self.timeout:g}s") \
                from None
        except requests.RequestException as exc:
            raise self._fail("unreachable", f"Prometheus at {self.base_url} is unreachable: "
                                            f"{type(exc).__name__}") from None
        try:
            body = response.json()
        except ValueError:
            raise self._fail("bad_response", f"Prometheus at {self.base_url} answered HTTP {response.status_code} "
                                             "with a non-JSON body") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise self._fail("query_error", f"Prometheus refused the query: {error or response.status_code}")
        return body.get("data")

    def query(self, promql: str, at: float | None = None, timeout: float | None = None) -> list[Sample]:
        """`timeout` also bounds Prometheus' own evaluation (its `timeout` parameter), so a
        heavy query stops there instead of running on after the client gave up."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        if timeout is not None:
            # Prometheus durations take whole units: milliseconds.
            params["timeout"] = f"{max(1, int(min(timeout, self.timeout) * 1000))}ms"
        data = self._call("/api/v1/query", params)
        return _vector(data)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._call("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise self._fail("bad_response", "query_range did not return a matrix")
        return [{"labels": item.get("metric", {}),
                 "values": [(float(t), _float(v)) for t, v in item.get("values", [])]}
                for item in data.get("result", [])]

    def series(self, matchers: list[str], start: float | None = None, end: float | None = None) -> list[dict]:
        params: list[tuple[str, Any]] = [("match[]", m) for m in matchers]
        if start is not None:
            params.append(("start", f"{start:.3f}"))
        if end is not None:
            params.append(("end", f"{end:.3f}"))
        data = self._call("/api/v1/series", params)
        return list(data or [])

    def label_values(self, label: str, matchers: list[str] | None = None) -> list[str]:
        params = [("match[]", m) for m in matchers or []]
        # GET: /api/v1/label/<name>/values takes no POST form.
        data = self._call(f"/api/v1/label/{requests.utils.quote(label, safe='')}/values", params, method="GET")
        return list(data or [])

    def ready(self) -> bool:
        try:
            self.query("1")
            return True
        except PrometheusError:
            return False


def _float(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _vector(data: Any) -> list[Sample]:
    if not isinstance(data, dict):
        raise PrometheusError("bad_response", "query answer has no data")
    kind = data.get("resultType")
    result = data.get("result") or []
    if kind == "scalar":
        t, v = result
        return [Sample({}, _float(v), float(t))]
    if kind != "vector":
        raise PrometheusError("bad_response", f"expected an instant vector, got {kind}")
    return [Sample(item.get("metric", {}), _float(item["value"][1]), float(item["value"][0])) for item in result]
