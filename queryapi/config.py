"""Sidecar configuration: one pydantic model, filled from flags over environment over
defaults, validated before anything listens or opens a database.

A long-running process never runs half-configured: an unknown `FABRICSCOPE_SIDECAR_*`
variable, a wrong type or a bad value stops start-up with the name of the setting and
what was expected (`ConfigError`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "FABRICSCOPE_SIDECAR_"
# Seed 000 §14.4 names these variables itself: TRACING_SLO_<service>_<operation>=<ms>.
SLO_ENV_PREFIX = "TRACING_SLO_"
DEFAULT_PORT = 19500
DEFAULT_SLO_MS = 2000.0


class ConfigError(Exception):
    """A setting the operator must fix; the message names it and says what was expected."""


class RateLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_second: float = Field(50.0, gt=0, description="sustained requests per second per key")
    burst: int = Field(100, ge=1, description="requests a key may make at once before being limited")


class SidecarConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure_no_tls: bool = False
    keys_file: Path | None = None
    prometheus_url: str = "http://127.0.0.1:19090"
    prometheus_timeout_seconds: float = Field(5.0, gt=0, le=300)
    # A file path (SQLite, the default) or a postgresql:// URL.
    database: str = "var/sidecar/sidecar.db"
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    rate_limit: RateLimit = RateLimit()
    retention_hours: float = Field(24.0 * 7, gt=0)
    audit_log: Path | None = None          # None: the audit records go to stderr
    threads: int = Field(8, ge=1, le=256)
    # The TLS handshake, request line and headers must arrive within this many seconds,
    # each later read too; a connection idle this long is closed (fabricscope/httpserver.py).
    client_timeout_seconds: float = Field(10.0, gt=0, le=300)
    # What one client address may hold (fabricscope/httpadmission.py): connections, and
    # requests in progress (0: half the threads). Behind a load balancer every request
    # comes from its address: raise both to what the balancer sends one replica.
    max_connections_per_source: int = Field(64, ge=1)
    max_requests_per_source: int = Field(0, ge=0)
    # The scrapers' and dashboards' networks (CIDRs; comma-separated in the environment and
    # the flag): connection slots are kept for them when a crowd fills the rest.
    trusted_sources: tuple[str, ...] = ()
    slo_default_ms: float = Field(DEFAULT_SLO_MS, gt=0)
    # (service, operation) -> ms, from TRACING_SLO_<service>_<operation>; see slo_for().
    slo_overrides: dict[str, float] = Field(default_factory=dict)
    # GPU-hour price per rate class (e.g. {"default": 2.5, "h100": 4.0}) for get_cost.
    gpu_hour_rates: dict[str, float] = Field(default_factory=lambda: {"default": 2.0})
    correlation_interval_seconds: float = Field(1.0, gt=0)
    # Spans may end at most this far past the sidecar's clock (clock skew between hosts).
    span_max_future_skew_seconds: float = Field(300.0, ge=0)
    # Spans one key may ingest (both formats together): a sustained rate and a burst,
    # at least one full batch (10,000 spans).
    spans_per_second: float = Field(20_000.0, gt=0)
    span_burst: int = Field(50_000, ge=10_000)
    # Chaos simulations (chaos_api.py): the inventory file (YAML/JSON, docs/chaos.md); how
    # often the live metrics are merged over it (0: inventory only); the per-key budget.
    chaos_topology: Path | None = None
    chaos_refresh_seconds: float = Field(60.0, ge=0)
    chaos_simulations_per_minute: int = Field(5, ge=1)
    # Blast radii of critical alerts (a budget of their own, not any key's).
    chaos_alert_simulations_per_minute: int = Field(60, ge=1)
    # ... and charged, when posted, to the key that posted the alerts (its own budget).
    chaos_alert_simulations_per_key_per_minute: int = Field(20, ge=1)
    # Alertmanager's API (alerts.py): the recorded alerts are reconciled with its own
    # every this many seconds, so an alert resolved while inhibited or silenced (no
    # notification carries that resolution) is shown resolved. None: webhook only.
    alertmanager_url: str | None = None
    alertmanager_reconcile_seconds: float = Field(30.0, gt=0, le=3600)

    @field_validator("prometheus_url", "alertmanager_url")
    @classmethod
    def _http_url(cls, value: str | None, info) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s]+", value):
            example = "http://127.0.0.1:19093" if info.field_name == "alertmanager_url" else "http://127.0.0.1:19090"
            raise ValueError(f"must be an http:// or https:// URL, e.g. {example}")
        return value.rstrip("/")

    @field_validator("trusted_sources", mode="before")
    @classmethod
    def _cidrs(cls, value: Any) -> Any:
        from fabricscope.httpadmission import parse_cidr

        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            for part in value:
                if isinstance(part, str):
                    parse_cidr(part)                 # ValueError: named with the key path
        return value

    @field_validator("gpu_hour_rates")
    @classmethod
    def _rates(cls, value: dict[str, float]) -> dict[str, float]:
        if "default" not in value:
            raise ValueError("needs a 'default' rate class")
        if any(rate < 0 for rate in value.values()):
            raise ValueError("rates must be >= 0 (dollars per GPU-hour)")
        return value

    @model_validator(mode="after")
    def _tls(self) -> "SidecarConfig":
        if self.insecure_no_tls:
            return self
        if not (self.tls_cert and self.tls_key):
            raise ValueError("TLS is required: give --tls-cert and --tls-key, or run plaintext with the "
                             "explicit --insecure-no-tls (loopback/testing only)")
        for path in (self.tls_cert, self.tls_key):
            if not Path(path).is_file():
                raise ValueError(f"TLS file {path} does not exist")
        return self

    @property
    def uses_tls(self) -> bool:
        return not self.insecure_no_tls

    def slo_for(self, service: str, operation: str) -> float:
        return self.slo_overrides.get(slo_key(service, operation), self.slo_default_ms)


def slo_key(service: str, operation: str) -> str:
    """The TRACING_SLO_ suffix for a pair: non-alphanumerics become `_`, as in the seed's
    `TRACING_SLO_llm_inference_generate` for service llm-inference, operation generate."""
    return re.sub(r"[^A-Za-z0-9]", "_", f"{service}_{operation}")


def _env_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    fields = SidecarConfig.model_fields
    settings: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key == "rate_limit_per_second":
            settings.setdefault("rate_limit", {})["per_second"] = raw
        elif key == "rate_limit_burst":
            settings.setdefault("rate_limit", {})["burst"] = raw
        elif key in ("gpu_hour_rates",):
            settings[key] = _parse_rates(raw, name)
        elif key in fields and key != "slo_overrides":
            settings[key] = raw
        else:
            raise ConfigError(f"unknown environment variable {name}; known: "
                              + ", ".join(ENV_PREFIX + k.upper() for k in sorted(fields) if k != "slo_overrides"))
    overrides = {}
    for name, raw in environ.items():
        if name.startswith(SLO_ENV_PREFIX):
            try:
                overrides[name[len(SLO_ENV_PREFIX):]] = float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: expected a number of milliseconds") from None
            if overrides[name[len(SLO_ENV_PREFIX):]] <= 0:
                raise ConfigError(f"{name}={raw!r}: an SLO must be > 0 ms")
    if overrides:
        settings["slo_overrides"] = overrides
    return settings


def _parse_rates(raw: str, source: str) -> dict[str, float]:
    """`default=2.5,h100=4` -> {"default": 2.5, "h100": 4.0}."""
    rates = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, value = part.partition("=")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"{source}: {part!r} is not CLASS=DOLLARS_PER_GPU_HOUR") from None
        if not sep or not name.strip():
            raise ConfigError(f"{source}: {part!r} is not CLASS=DOLLARS_PER_GPU_HOUR")
    return rates


def load_config(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> SidecarConfig:
    """Defaults, then the environment, then flags that were given (None means not given)."""
    environ = os.environ if environ is None else environ
    settings = _env_settings(environ)
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key == "rate_limit":
            settings["rate_limit"] = {**settings.get("rate_limit", {}), **value}
        elif key == "gpu_hour_rates" and isinstance(value, str):
            settings[key] = _parse_rates(value, "--gpu-hour-rates")
        else:
            settings[key] = value
    try:
        return SidecarConfig.model_validate(settings)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "configuration"
        given = f" (got {error['input']!r})" if "input" in error and not isinstance(error["input"], dict) else ""
        lines.append(f"{where}: {error['msg']}{given}")
    return "invalid sidecar configuration: " + "; ".join(lines)
