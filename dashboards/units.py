"""Grafana unit ids, formatted the way Grafana shows them, for the rendered report."""
from __future__ import annotations

import math

_PREFIXES = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_SMALL = [(1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]
_RATE_SUFFIX = {"Bps": "B/s", "pps": "p/s", "ops": "ops/s", "eps": "/s", "short": "", "none": ""}


def _si(value: float, suffix: str) -> str:
    magnitude = abs(value)
    for factor, prefix in _PREFIXES:
        if magnitude >= factor:
            return f"{value / factor:.3g} {prefix}{suffix}".rstrip()
    return f"{value:.3g} {suffix}".rstrip()


def _seconds(value: float) -> str:
    magnitude = abs(value)
    if magnitude == 0:
        return "0 s"
    if magnitude >= 1:
        return f"{value:.3g} s"
    for factor, prefix in _SMALL:
        if magnitude >= factor:
            return f"{value / factor:.3g} {prefix}s"
    return f"{value:.3g} s"


def format_value(value: float | None, unit: str) -> str:
    """`value` in `unit` (a Grafana unit id such as s, Bps, percentunit, currencyUSD,
    suffix:x), as a short human string."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if unit == "s":
        return _seconds(value)
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "percent":
        return f"{value:.3g}%"
    if unit == "currencyUSD":
        return f"${value:,.2f}"
    if unit.startswith("suffix:"):
        return f"{value:.3g}{unit.removeprefix('suffix:')}"
    return _si(value, _RATE_SUFFIX.get(unit, unit))
