"""The one way the rule files are rendered from the mixin.

    python -m fabricscope.rules.render OUTDIR                      # what `make -C rules render` runs
    python -m fabricscope.rules.render --overrides fast.json OUTDIR

    from fabricscope.rules.render import render
    paths = render({"for": {"ncclHang": "10s"}}, outdir)

`overrides` is deep-merged into mixin/config.libsonnet's `_config` (render.jsonnet's
top-level argument). Unknown keys and wrongly typed values raise RenderError with
jsonnet's message. The Debian `jsonnet` binary renders; with no overrides the output is
the committed fabricscope-*.yaml, byte for byte.
"""
from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.rules.render",
                                     description="Render the rule files from the mixin into OUTDIR.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--overrides", type=Path, default=None,
                        help="JSON object deep-merged into the mixin's _config")
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.overrides.read_text()) if args.overrides else {}
        for path in render(overrides, args.outdir):
            print(path)
    except OSError as exc:
        print(f"{parser.prog}: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except (ValueError, RenderError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
