"""The alerting thresholds, read from the one place they are defined.

Threshold lines on panels (BER 120/hour, microburst 3x, hang 3x ...) must be the numbers
the alerts use, so they are read from rules/mixin/config.libsonnet with the same Debian
`jsonnet` binary that renders the rules, at dashboard build time.
"""
from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MIXIN_CONFIG = REPO_ROOT / "rules" / "mixin" / "config.libsonnet"


class MixinConfigError(Exception):
    """jsonnet is missing or the mixin config cannot be evaluated."""


@functools.lru_cache(maxsize=1)
def mixin_config() -> dict:
    binary = shutil.which("jsonnet") or "/usr/bin/jsonnet"
    if not Path(binary).exists():
        raise MixinConfigError("jsonnet not found; install the Debian package `jsonnet` (make setup)")
    if not MIXIN_CONFIG.exists():
        raise MixinConfigError(f"{MIXIN_CONFIG} not found: dashboards are built from the repository checkout")
    result = subprocess.run([binary, "-e", f"(import '{MIXIN_CONFIG}')._config"],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise MixinConfigError(f"evaluating {MIXIN_CONFIG}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def thresholds() -> dict:
    return mixin_config()["thresholds"]
