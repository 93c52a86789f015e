"""The demo's scrape targets as a Prometheus file_sd file (the demo, its fleet mode and the
stack all write it)."""
from __future__ import annotations

import json
from pathlib import Path

from fabricscope.atomicfile import write_atomically


def file_sd_groups(targets: list[tuple[str, str]], cluster_name: str) -> list[dict]:
    """Prometheus file_sd JSON: one group per node so each target carries its node label."""
    return [{"targets": [address], "labels": {"node": node, "cluster": cluster_name}}
            for node, address in targets]


def write_targets_file(path: str | Path, targets: list[tuple[str, str]], cluster_name: str,
                       groups: list[dict] | None = None) -> Path:
    """Atomically, so a Prometheus watching the file never reads half of it; world-readable,
    so a Prometheus running as its own user can read it. `groups`: file_sd groups already
    made (a fleet's) instead of `targets`."""
    groups = file_sd_groups(targets, cluster_name) if groups is None else groups
    return write_atomically(path, json.dumps(groups, indent=2) + "\n", mode=0o644)
