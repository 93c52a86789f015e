"""The PromQL rules: the jsonnet mixin (mixin/, render.jsonnet), the rule files it renders
(fabricscope-*.yaml) and the one renderer (render.py). Installed as package data, so a
wheel carries everything `fabricscope stack` loads into Prometheus."""
from __future__ import annotations

from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent


def rule_files(rules_dir: Path = RULES_DIR) -> list[Path]:
    """The rendered rule files Prometheus loads: every *.yaml beside this module."""
    return sorted(path.resolve() for path in Path(rules_dir).glob("*.yaml"))
