"""The one way the rule files are rendered from the mixin.

    python -m fabricscope.rules.render OUTDIR                      # what `make -C rules render` runs
    python -m fabricscope.rules.render --overrides fast.json OUTDIR
    python -m fabricscope.rules.render --exporter-config exporter.yaml OUTDIR

    from fabricscope.rules.render import render
    paths = render({"for": {"ncclHang": "10s"}}, outdir)

`overrides` is deep-merged into mixin/config.libsonnet's `_config` (render.jsonnet's
top-level argument). Unknown keys and wrongly typed values raise RenderError with
jsonnet's message. The Debian `jsonnet` binary renders; with no overrides the output is
the committed fabricscope-*.yaml, byte for byte.

A quantile the exporter computes over a window of its own (window_quantile in
exporter/bpf/*.yaml) is defined there only: `exporter_windows` reads it and passes it to
the mixin, whose rules select the exporter's gauge and offset their baseline by the same
window. An exporter config that shortens it (`ebpf.window_seconds`, for a compressed demo
timeline) is given here too (`exporter_config`), so the two cannot differ.
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
# The mixin's name of each exporter window -> the histogram whose window_quantile it is.
EXPORTER_WINDOWS = {"tcpRttExcess": "fabric_tcp_rtt_excess_seconds"}


class RenderError(Exception):
    """jsonnet is missing, or refused the mixin or the overrides."""


def jsonnet_binary() -> str:
    found = shutil.which("jsonnet") or ("/usr/bin/jsonnet" if Path("/usr/bin/jsonnet").exists() else None)
    if not found:
        raise RenderError("jsonnet not found on PATH; install the Debian package `jsonnet` (make setup)")
    return found


def exporter_windows(exporter_config: dict | None = None) -> dict[str, dict]:
    """{mixin name: {seconds, quantile, gauge}} of each exporter window the rules read: the
    declaration's, or the exporter config's `ebpf.window_seconds` (validated by the
    exporter's own schema)."""
    from fabricscope.exporter.bpf_loader.declarations import load_declarations
    from fabricscope.exporter.config import section
    from fabricscope.exporter.schema import ConfigError

    try:
        ebpf = section(exporter_config or {}, "ebpf", "exporter config")
    except ConfigError as exc:
        raise RenderError(str(exc)) from None
    chosen = ebpf.get("window_seconds") or {}
    declared = {m.name: m for d in load_declarations() for m in d.metrics if m.window_quantile}
    windows = {}
    for key, name in EXPORTER_WINDOWS.items():
        if name not in declared:
            raise RenderError(f"the rules read {name}'s window_quantile, which no exporter/bpf/*.yaml declares")
        metric = declared[name]
        windows[key] = {"seconds": chosen.get(name, metric.window_quantile.window_seconds),
                        "quantile": metric.window_quantile.label, "gauge": metric.window_gauge_name}
    return windows


def render(overrides: dict | None, outdir: str | Path, exporter_config: dict | None = None) -> list[Path]:
    """Render both rule files into `outdir` (created if needed); return their paths.
    `exporter_config`: the exporters' config where it changes a window (exporter_windows)."""
    if overrides is not None and not isinstance(overrides, dict):
        raise RenderError(f"overrides must be a dict, got {type(overrides).__name__}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    command = [jsonnet_binary(), "-S", "-m", str(outdir),
               "--tla-code", "overrides=" + json.dumps(overrides or {}),
               "--tla-code", "exporterWindows=" + json.dumps(exporter_windows(exporter_config)), str(RENDER_ENTRY)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RenderError(f"rendering rules failed: {result.stderr.strip().splitlines()[0] if result.stderr.strip() else result.returncode}")
    return [outdir / name for name in RENDERED_FILES]


def yaml_error() -> type[Exception]:
    import yaml

    return yaml.YAMLError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.rules.render",
                                     description="Render the rule files from the mixin into OUTDIR.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--overrides", type=Path, default=None,
                        help="JSON object deep-merged into the mixin's _config")
    parser.add_argument("--exporter-config", type=Path, default=None,
                        help="the exporters' --config.file, where its ebpf.window_seconds changes a window")
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.overrides.read_text()) if args.overrides else {}
        exporter_config = None
        if args.exporter_config:
            import yaml   # only for this option

            exporter_config = yaml.safe_load(args.exporter_config.read_text())
        for path in render(overrides, args.outdir, exporter_config):
            print(path)
    except OSError as exc:
        print(f"{parser.prog}: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except (ValueError, RenderError, yaml_error()) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
