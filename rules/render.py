"""Render the rule files with config overrides, for harnesses that need fast variants.

    from rules.render import render
    paths = render({"for": {"ncclHang": "10s"}}, outdir)

`overrides` is deep-merged into rules/mixin/config.libsonnet's `_config` (the same
mechanism as `jsonnet --tla-code overrides=...` and rules/render-with.sh). Unknown keys
and wrongly typed values raise RenderError with jsonnet's message. The Debian `jsonnet`
binary renders, exactly as `make -C rules render` does, so output is byte-identical to
the committed files when `overrides` is empty.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent
RENDER_ENTRY = RULES_DIR / "render.jsonnet"
RENDERED_FILES = ("fabricscope-recording.yaml", "fabricscope-alerts.yaml")


class RenderError(Exception):
    """jsonnet is missing, or refused the mixin or the overrides."""


def jsonnet_binary() -> str:
    found = shutil.which("jsonnet") or ("/usr/bin/jsonnet" if Path("/usr/bin/jsonnet").exists() else None)
    if not found:
        raise RenderError("jsonnet not found on PATH; install the Debian package `jsonnet` (make setup)")
    return found


def render(overrides: dict | None, outdir: str | Path) -> list[Path]:
    """Render both rule files into `outdir` (created if needed); return their paths."""
    if overrides is not None and not isinstance(overrides, dict):
        raise RenderError(f"overrides must be a dict, got {type(overrides).__name__}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    command = [jsonnet_binary(), "-S", "-m", str(outdir),
               "--tla-code", "overrides=" + json.dumps(overrides or {}), str(RENDER_ENTRY)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RenderError(f"rendering rules failed: {result.stderr.strip().splitlines()[0] if result.stderr.strip() else result.returncode}")
    return [outdir / name for name in RENDERED_FILES]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} <overrides.json> <outdir>", file=sys.stderr)
        return 2
    try:
        overrides = json.loads(Path(argv[1]).read_text())
        for path in render(overrides, argv[2]):
            print(path)
    except (OSError, ValueError, RenderError) as exc:
        print(f"{argv[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
