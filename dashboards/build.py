"""Render the dashboards to the committed JSON Grafana provisions, or check it is current.

    python -m fabricscope.dashboards.build            # rewrite dashboards/json/*.json
    python -m fabricscope.dashboards.build --check    # exit 1 naming each stale file

The JSON is generated, never edited: the Python modules beside this file are the source.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from . import chaos, fleet, infiniband, node_network, nvlink_nccl, tracing

JSON_DIR = Path(__file__).resolve().parent / "json"

# file stem -> builder; the stem is also the dashboard's module, hence its uid.
DASHBOARDS: dict[str, Callable[[], g.Dashboard]] = {
    "fleet": fleet.dashboard,
    "node_network": node_network.dashboard,
    "infiniband": infiniband.dashboard,
    "nvlink_nccl": nvlink_nccl.dashboard,
    "tracing": tracing.dashboard,
    "chaos": chaos.dashboard,
}


def render(name: str) -> str:
    data = DASHBOARDS[name]().to_json_data()
    # Through the encoder once, so every grafanalib object becomes plain JSON.
    plain = json.loads(json.dumps(data, cls=DashboardEncoder))
    return json.dumps(plain, indent=2, sort_keys=True) + "\n"


def render_all() -> dict[str, str]:
    return {f"{name}.json": render(name) for name in DASHBOARDS}


def stale_files(json_dir: Path = JSON_DIR) -> list[str]:
    """Files under json_dir that differ from a fresh render, are missing, or are extra."""
    wanted = render_all()
    stale = [name for name, text in wanted.items()
             if not (json_dir / name).exists() or (json_dir / name).read_text() != text]
    stale += sorted(p.name for p in json_dir.glob("*.json") if p.name not in wanted)
    return stale


def write_all(json_dir: Path = JSON_DIR) -> list[Path]:
    json_dir.mkdir(parents=True, exist_ok=True)
    wanted = render_all()
    for extra in json_dir.glob("*.json"):
        if extra.name not in wanted:
            extra.unlink()
    paths = []
    for name, text in wanted.items():
        path = json_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.dashboards.build", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed JSON is current")
    parser.add_argument("--out", type=Path, default=JSON_DIR, help=f"JSON directory (default {JSON_DIR})")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"out of date in {args.out}: {', '.join(stale)}; run `make dashboards`", file=sys.stderr)
            return 1
        return 0
    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
