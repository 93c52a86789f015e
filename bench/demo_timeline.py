"""What a newcomer's `make run` pages, and when: runs `fabricscope stack` (the default
scenario, default alert timing) for one pass of the timeline and prints, per scripted
fault, the notifications its alerts produced with their arrival times in scenario
seconds, then any notification that arrived while no fault was active.

    .venv/bin/python bench/demo_timeline.py [--duration 1800] [--out timeline.json]

Takes as long as --duration (the default timeline is 30 minutes), so it is not part of
bench/run_all.py. Times are measured from the moment the demo cluster starts (its
scenario second 0, within a second of the stack's own start) to the receipt of the
webhook notification, so they include scrape, rule-group interval, `for:` and
Alertmanager's group_wait. The docs/demo.md table is this script's output.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.scenario import default_scenario_path, load_scenario  # noqa: E402

LINE = re.compile(r"^\d\d:\d\d:\d\d \[(?P<receiver>[^\]]+)\] (?P<status>FIRING|RESOLVED) (?P<name>\S+) "
                  r"\((?P<severity>[^)]*)\) (?P<labels>.*?)(?: - (?P<summary>.*))?$")
# Which alerts can come from each kind of fault: alert names, then the labels that must
# point at the fault's target.
FAULT_ALERTS = {
    "mlx5_fatal": (r"FabricKernelLog.*", lambda f, lab: lab.get("node") == f.node),
    "symbol_error_storm": (r"FabricInfiniband.*",
                           lambda f, lab: lab.get("node") == f.node and lab.get("device") == f.target.get("device")),
    "link_flap": (r"FabricInfiniband.*|FabricKernelLogNonFatal", lambda f, lab: lab.get("node") == f.node and (
        lab.get("device") == f.target.get("device") or "pattern" in lab)),
    "link_down": (r"FabricInfiniband.*|FabricKernelLogNonFatal", lambda f, lab: lab.get("node") == f.node and (
        lab.get("device") == f.target.get("device") or "pattern" in lab)),
    "microburst": (r"FabricTcp.*", lambda f, lab: lab.get("node") == f.node),
    "nccl_hang": (r"FabricNccl.*", lambda f, lab: True),
    "straggler_rank": (r"FabricNccl.*", lambda f, lab: True),
    "nvlink_down": (r"Fabric(Nvlink|GpuXid).*", lambda f, lab: lab.get("node") == f.node),
}


def parse_labels(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def run_stack(duration: float, workdir: Path) -> tuple[list[dict], str]:
    command = [str(REPO / ".venv" / "bin" / "fabricscope"), "stack", "--duration", str(duration),
               "--workdir", str(workdir), "--prometheus-port", "0", "--alertmanager-port", "0"]
    t0 = time.time()
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events, banner = [], []

    def read() -> None:
        for line in child.stdout:
            received = time.time() - t0
            match = LINE.match(line.rstrip("\n"))
            if match:
                events.append({"t": round(received, 1), **match.groupdict(),
                               "labels": parse_labels(match.group("labels"))})
            else:
                banner.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    child.wait()
    reader.join(timeout=10)
    return events, "".join(banner)


def episodes(events: list[dict]) -> list[dict]:
    """The first FIRING line of each alert episode (name + labels, until RESOLVED); later
    FIRING lines of the same episode are the group's updates repeating it."""
    open_, out = set(), []
    for event in events:
        key = (event["name"], json.dumps(event["labels"], sort_keys=True))
        if event["status"] == "RESOLVED":
            open_.discard(key)
        elif key not in open_:
            open_.add(key)
            out.append(event)
    return out


def cause(alert: dict, faults: list) -> object | None:
    """The latest fault started before the alert that can explain it."""
    candidates = [f for f in faults if f.start <= alert["t"] and re.fullmatch(FAULT_ALERTS[f.kind][0], alert["name"])
                  and FAULT_ALERTS[f.kind][1](f, alert["labels"])]
    return max(candidates, key=lambda f: f.start, default=None)


def notifications(events: list[dict]) -> list[tuple[float, str]]:
    """Distinct notifications (one receipt time per receiver and second)."""
    return sorted({(e["t"], e["receiver"]) for e in events})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the raw events as JSON here")
    args = parser.parse_args()
    scenario = load_scenario(default_scenario_path())
    with tempfile.TemporaryDirectory(prefix="fabricscope-demo-timeline-") as tmp:
        events, banner = run_stack(args.duration, Path(tmp))
    if args.out:
        args.out.write_text(json.dumps(events, indent=1) + "\n")
    alerts = episodes(events)
    faults = sorted(scenario.faults, key=lambda f: f.start)
    by_fault: dict[int, list[dict]] = {}
    unexplained = []
    for alert in alerts:
        fault = cause(alert, faults)
        if fault is None:
            unexplained.append(alert)
        else:
            by_fault.setdefault(id(fault), []).append(alert)
    print(f"fault timeline of {scenario.source}, {len(events)} notification lines, "
          f"{len(notifications(events))} notifications\n")
    print("| scripted fault (window, s) | alerts notified (first notification: s after start, s after fault start) |")
    print("|---|---|")
    for fault in faults:
        cells, seen = [], {}
        for alert in by_fault.get(id(fault), []):
            key = (alert["name"], alert["severity"], alert["t"])
            seen[key] = seen.get(key, 0) + 1
        for (name, severity, t), count in seen.items():
            late = " (after the fault ended)" if fault.end is not None and t > fault.end else ""
            times = f" ×{count}" if count > 1 else ""
            cells.append(f"`{name}` {severity}{times} at {t:.0f} (+{t - fault.start:.0f}){late}")
        end = f"{fault.end:g}" if fault.end is not None else "end"
        print(f"| {fault.kind} {fault.node or 'cluster-wide'} {fault.start:g}–{end} | {'; '.join(cells) or 'nothing'} |")
    print("\nalerts no scripted fault explains:")
    for alert in unexplained or [{"t": 0, "name": "none", "severity": "", "labels": {}}]:
        print(f"  {alert['t']:7.1f}s {alert['name']} {alert['severity']} {alert['labels']}")
    healthy_end = faults[0].start
    early = [e for e in events if e["t"] < healthy_end]
    print(f"\nnotification lines before the first fault ({healthy_end:g}s): {len(early)}")
    if not events:
        print(banner, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
