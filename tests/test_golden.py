"""Golden end-to-end test: the real exporter process on the committed fixture tree,
scraped over HTTP, diffed against tests/golden/node.prom.

Regenerate after an intended change with:
    FABRIC_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py
and review the diff like code.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import requests

from conftest import free_port

ROOT = Path(__file__).resolve().parent
FIXTURE = ROOT / "fixtures" / "node"
GOLDEN = ROOT / "golden" / "node.prom"
# Host-independent collectors only: ebpf, nccl and nvlink read the live kernel/GPUs.
COLLECTORS = ["infiniband", "netdev", "tcp", "kmsg"]

# Values that legitimately differ run to run.
_VOLATILE = re.compile(r"^(fabric_scrape_collector_duration_seconds\{[^}]*\}) .*$", re.M)
_VERSION = re.compile(r'version="[^"]*"')


def normalise(exposition: str) -> str:
    text = _VOLATILE.sub(r"\1 0.0", exposition)
    return _VERSION.sub('version="<version>"', text)


def scrape_fixture(tmp_path: Path) -> str:
    # Work on a copy: the collectors persist state and the kmsg cursor.
    tree = tmp_path / "node"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    port = free_port()
    disabled = []
    from fabricscope.exporter.framework import load_collector_modules

    for name in load_collector_modules():
        if name not in COLLECTORS:
            disabled.append(f"--no-collector.{name}")
    cmd = [sys.executable, "-m", "fabricscope.cli", "exporter",
           f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={tree}/sys",
           f"--path.procfs={tree}/proc", f"--path.rootfs={tree}", f"--path.kmsg={tree}/kmsg",
           f"--path.state={tmp_path}/state", "--node-name=golden-node", *disabled]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                break
            except requests.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"exporter did not start:\n{proc.stdout.read() if proc.poll() is not None else ''}")
                time.sleep(0.1)
        assert response.status_code == 200
        return response.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_exposition_matches_golden(tmp_path):
    actual = normalise(scrape_fixture(tmp_path))
    if os.environ.get("FABRIC_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(actual)
    expected = GOLDEN.read_text()
    assert actual == expected, "exposition differs from tests/golden/node.prom (FABRIC_UPDATE_GOLDEN=1 to regenerate)"


def test_every_collector_succeeded_on_fixture(tmp_path):
    text = scrape_fixture(tmp_path)
    for name in COLLECTORS:
        assert f'fabric_scrape_collector_success{{collector="{name}",node="golden-node"}} 1.0' in text
