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
# Which labels of an alert point at the fault that caused it.
FAULT_MATCH = {
    "mlx5_fatal": lambda f, lab: lab.get("node") == f.node,
    "symbol_error_storm": lambda f, lab: lab.get("node") == f.node and lab.get("device") == f.target.get("device"),
    "link_flap": lambda f, lab: lab.get("node") == f.node and lab.get("device") == f.target.get("device"),
    "link_down": lambda f, lab: lab.get("node") == f.node and lab.get("device") == f.target.get("device"),
    "microburst": lambda f, lab: lab.get("node") == f.node and lab.get("device") is None,
    "nccl_hang": lambda f, lab: "comm" in lab,
    "straggler_rank": lambda f, lab: "comm" in lab,
    "nvlink_down": lambda f, lab: lab.get("node") == f.node and "device" not in lab,
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


def first_firing(events: list[dict]) -> list[dict]:
    """The first FIRING line of each distinct alert (name + labels); later lines repeat it
    in group updates."""
    seen, out = set(), []
    for event in events:
        if event["status"] != "FIRING":
            continue
        key = (event["name"], json.dumps(event["labels"], sort_keys=True))
        if key not in seen:
            seen.add(key)
            out.append(event)
    return out


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
    alerts = first_firing(events)
    claimed: set[int] = set()
    print(f"fault timeline of {scenario.source}, {len(events)} notification lines, "
          f"{len(notifications(events))} notifications\n")
    print("| scripted fault (window, s) | alerts, first notification (s after start; after fault start) |")
    print("|---|---|")
    for fault in sorted(scenario.faults, key=lambda f: f.start):
        end = fault.end if fault.end is not None else fault.start + float(
            fault.params.get("count", 1)) * float(fault.params.get("period_seconds", 0))
        mine = [i for i, a in enumerate(alerts) if i not in claimed and fault.start <= a["t"] <= end + 300
                and FAULT_MATCH[fault.kind](fault, a["labels"])]
        claimed.update(mine)
        cells = [f"`{alerts[i]['name']}` {alerts[i]['severity']} at {alerts[i]['t']:.0f} (+{alerts[i]['t'] - fault.start:.0f})"
                 + (" after the fault ended" if alerts[i]["t"] > end else "") for i in mine]
        where = fault.node or "cluster-wide"
        print(f"| {fault.kind} {where} {fault.start:g}–{end:g} | {'; '.join(cells) or 'nothing'} |")
    quiet = [a for i, a in enumerate(alerts) if i not in claimed]
    print("\nfirst notifications of alerts matched to no fault:")
    for alert in quiet or [{"t": 0, "name": "none", "severity": "", "labels": {}}]:
        print(f"  {alert['t']:7.1f}s {alert['name']} {alert['severity']} {alert['labels']}")
    healthy_end = min(f.start for f in scenario.faults)
    early = [e for e in events if e["t"] < healthy_end]
    print(f"\nnotifications before the first fault ({healthy_end:g}s): {len(early)}")
    if not events:
        print(banner, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
