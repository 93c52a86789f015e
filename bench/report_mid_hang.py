"""The report an on-call engineer reads in the middle of an NCCL hang: runs the stack
(`fabricscope stack`'s own start-up, fast alerts, real clock) over
bench/report_mid_hang.yaml, waits until FabricNcclHang has fired for `--firing-for`
seconds, renders `fabricscope report` (fleet overview first) from the start to that
moment, prints what the Fleet overview shows, and copies the chosen panels' PNGs to
docs/img/mid-hang/ (look at them before committing them).

    .venv/bin/python bench/report_mid_hang.py [--out docs/img/mid-hang] [--firing-for 60]

Takes about 5 minutes of wall time (the hang starts at 2m30s), so it is not part of
bench/run_all.py.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope import cli  # noqa: E402
from fabricscope.demo.stack.binaries import free_port  # noqa: E402
from fabricscope.demo.stack.cli import Stack, add_arguments, start_stack  # noqa: E402

SCENARIO = Path(__file__).with_suffix(".yaml")
# Dashboard -> panel titles copied (None: every panel of it).
PANELS: dict[str, list[str] | None] = {
    "fleet": None,
    "nvlink_nccl": ["In flight against the hang line", "Hanging operations", "Hang culprits", "Straggler ranks",
                    "Step time lost waiting for each rank"],
    "infiniband": ["Symbol errors per hour", "Error counter rates"],
    "tracing": ["Correlated SLO violations", "SLO violations"],
}


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60]


def wait_for_hang(prometheus: str, firing_for: float, deadline: float) -> float:
    """Wall time once FabricNcclHang has been firing for `firing_for` seconds."""
    first = None
    while time.time() < deadline:
        found = requests.get(prometheus + "/api/v1/query", timeout=10, params={
            "query": 'ALERTS{alertname="FabricNcclHang", alertstate="firing"}'}).json()["data"]["result"]
        first = (first or time.time()) if found else None
        if first and time.time() - first >= firing_for:
            return time.time()
        time.sleep(2)
    raise SystemExit("FabricNcclHang did not fire long enough before the deadline")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "mid-hang")
    parser.add_argument("--firing-for", type=float, default=60.0, help="seconds of FabricNcclHang firing (default 60)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabricscope-report-mid-hang-") as tmp:
        work = Path(tmp)
        stack_parser = argparse.ArgumentParser()
        add_arguments(stack_parser)
        stack_args = stack_parser.parse_args(
            ["--workdir", str(work / "stack"), "--scenario", str(SCENARIO), "--prometheus-port", str(free_port()),
             "--alertmanager-port", str(free_port()), "--sidecar-port", str(free_port())])
        stack = Stack()
        try:
            start_stack(stack_args, stack, out=io.StringIO())
            t0 = time.time() - stack.cluster.now()
            prometheus = f"http://127.0.0.1:{stack_args.prometheus_port}"
            end = wait_for_hang(prometheus, args.firing_for, t0 + 600)
            report = work / "report"
            code = cli.main(["report", "--prometheus-url", prometheus, "--from", str(t0), "--to", str(end),
                             "--scrape-interval", stack_args.scrape_interval, "--out", str(report),
                             "--dashboard", "fleet", *(f"--dashboard={name}" for name in PANELS if name != "fleet"),
                             "--sidecar-url", stack.sidecar.url, "--sidecar-ca", str(stack.sidecar.certs.ca),
                             "--sidecar-token-file", str(work / "stack" / "sidecar" / "demo-key")])
        finally:
            stack.stop()
        data = json.loads((report / "report.json").read_text())
        print(f"report exit {code}; drawn {end - t0:.0f} s after the start, hang since 150 s")
        fleet = {p["title"]: p for p in data["dashboards"]["fleet"]["panels"]}
        for title in ("Healthy nodes", "Degraded nodes", "Fatal nodes", "Critical alerts firing", "Straggler cost now"):
            print(f"  {title}: {fleet[title].get('shown')}")
        print(f"  Slowest ranks: {[(r.get('rank'), r.get('node'), r.get('late by')) for r in fleet['Slowest ranks'].get('shown', [])][:3]}")
        shutil.rmtree(args.out, ignore_errors=True)
        args.out.mkdir(parents=True)
        copied = 0
        for name, titles in PANELS.items():
            for panel in data["dashboards"][name]["panels"]:
                if panel["image"] and (titles is None or any(panel["title"].startswith(t) for t in titles)):
                    shutil.copy(report / panel["image"], args.out / f"{name}-{slug(panel['title'])}.png")
                    copied += 1
        print(f"{copied} panel images in {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
