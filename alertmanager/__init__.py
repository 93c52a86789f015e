"""Alertmanager routing (alertmanager.yml), its notification templates and examples.
Installed as package data, so a wheel carries the configuration `fabricscope stack` runs."""
from __future__ import annotations

from pathlib import Path

ALERTMANAGER_DIR = Path(__file__).resolve().parent
ALERTMANAGER_CONFIG = ALERTMANAGER_DIR / "alertmanager.yml"
