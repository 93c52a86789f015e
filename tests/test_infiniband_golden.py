"""Golden exposition: the exporter on the node fixture, scraped over HTTP, against a committed file.

Regenerate after an intended change with FABRIC_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import os
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from fabricscope.exporter.context import Context
from fabricscope.exporter.main import start_exporter

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "ib" / "expected_infiniband.prom"


def _stable(text: str) -> str:
    # The scrape duration is the one value that differs from run to run.
    return "".join(line + "\n" for line in text.splitlines()
                   if "fabric_scrape_collector_duration_seconds" not in line)


def _canonical(text: str) -> list[str]:
    """Families and samples, independent of formatting (1 vs 1.0, label order, family order)."""
    lines = []
    for family in text_string_to_metric_families(text):
        lines.append(f"# {family.name} {family.type} {family.documentation}")
        for sample in family.samples:
            labels = ",".join(f"{k}={v!r}" for k, v in sorted(sample.labels.items()))
            lines.append(f"{sample.name}{{{labels}}} {sample.value!r}")
    return sorted(lines)


def test_exposition_matches_golden(tmp_path, port):
    ctx = Context(sysfs=FIXTURES / "node" / "sys", procfs=FIXTURES / "ib" / "proc", state_dir=tmp_path,
                  node="gpu-node-0")
    exporter = start_exporter(ctx, ["infiniband"], f"127.0.0.1:{port}")
    try:
        response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    finally:
        exporter.stop()
    assert response.status_code == 200
    actual = _stable(response.text)
    if os.environ.get("FABRIC_UPDATE_GOLDEN"):
        GOLDEN.write_text(actual)
    assert _canonical(actual) == _canonical(GOLDEN.read_text())
