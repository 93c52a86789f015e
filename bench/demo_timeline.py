"""What a newcomer's `make run` pages, and when: runs the stack (the default scenario,
fast alerts, as `fabricscope stack` does) for one pass of the timeline and prints, per
scripted fault, what it notified and when, what paged, and when its alerts resolved
after it ended (demo/stack/timeline.py records and attributes them).

    .venv/bin/python bench/demo_timeline.py [--duration 1800] [--time-scale 1] [--write-doc docs/demo.md]
                                            [--save run.pickle | --load run.pickle]

Takes --duration / --time-scale seconds of wall time (the default timeline is 30
minutes), so it is not part of bench/run_all.py. --time-scale K runs the same timeline on
a clock K times faster (`fabricscope stack --time-scale`); the printed times are always
scenario seconds. --write-doc replaces the measured section of docs/demo.md (between its
`timeline` markers) with this run's table, naming the clock it ran on.
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo.stack import timeline  # noqa: E402
from measure import replace_between_markers  # noqa: E402

BEGIN, END = "<!-- timeline:begin (bench/demo_timeline.py --write-doc) -->", "<!-- timeline:end -->"


def where(fault) -> str:
    target = " ".join(f"{k}={v}" for k, v in sorted(fault.target.items()))
    return " ".join(part for part in (fault.node or "cluster-wide", target) if part)


def table(rec: timeline.Recording, result: timeline.Analysis) -> list[str]:
    clock = "real" if rec.time_scale == 1 else f"compressed {rec.time_scale:g}x (`--time-scale {rec.time_scale:g}`)"
    pages = sum(len(p) for o in result.faults for p in o.pages.values())
    tickets = sum(1 for o in result.faults for n in o.notified if n[1] == timeline.TICKET)
    lines = [
        f"One pass of `{_relative(rec.scenario.source)}` ({rec.duration:g} scenario seconds, {clock} clock, "
        f"fast alerts; measured on a {_cores()}-core machine shared with other work). Times are scenario "
        "seconds after the fault's start (notifications) or end (resolution in Alertmanager, notified or not).",
        "",
        "| scripted fault (window, s) | notified (receiver, severity, s after start) | pages | resolved in Alertmanager (s after end) | resolution notified (s after end) |",
        "|---|---|---|---|---|",
    ]
    for outcome in result.faults:
        f = outcome.fault
        end = f"{outcome.end:g}" if outcome.end != float("inf") else "end"
        notified = "; ".join(f"`{name}` {receiver} {severity} +{t - f.start:.0f}"
                             for t, receiver, name, severity in outcome.notified) or "nothing"
        paged = ", ".join(f"`{names[0]}`" + (f" (+{len(names) - 1} more)" if len(names) > 1 else "")
                          for names in outcome.pages.values()) or "none"
        resolved = "; ".join(
            [f"+{outcome.resolved_at - outcome.end:.0f}"] if outcome.resolved_at is not None else []) or "–"
        if outcome.held_within_bound:
            resolved += "; raised at the end, within its bound: " + ", ".join(
                f"`{n}` (until +{t - outcome.end:.0f})" for n, t in sorted(outcome.held_within_bound.items()))
        if outcome.still_held:
            resolved += "; still raised at the end, past its bound: " + ", ".join(f"`{n}`" for n in outcome.still_held)
        resolution = "; ".join(f"{receiver} +{t - outcome.end:.0f}"
                               for receiver, t in sorted(outcome.resolution_notified.items())
                               if receiver in (timeline.PAGER, timeline.TICKET)) or "–"
        lines.append(f"| {f.kind} {where(f)} ({f.start:g}–{end}) | {notified} | {paged} | {resolved} | {resolution} |")
    lines += [
        "",
        f"{pages} page(s) and {tickets} ticket(s) in all; notified or raised with no scripted fault to explain it: "
        + (", ".join(f"`{name}` at {t:.0f}" for t, name, _ in result.unexplained) or "nothing")
        + f". At the end the sidecar's firing alerts {'equal' if rec.sidecar_firing == rec.alertmanager_firing else 'differ from'} "
        f"Alertmanager's ({len(rec.alertmanager_firing)} held). Bounds: first notification within "
        f"{timeline.FIRST_NOTIFICATION_BOUND:g} s of a fault's start; resolution in Alertmanager within "
        f"{timeline.RESOLVE_BOUND:g} s of its end ("
        + ", ".join(f"`{name}` {bound:g} s: the hour it counts" for name, bound in timeline.ALERT_RESOLVE_BOUNDS.items())
        + "); the resolution notified within that plus the receiver's group_interval: "
        + ", ".join(f"{r} {timeline.notified_resolve_bound(r):g} s" for r in (timeline.PAGER, timeline.TICKET))
        + ". Pages per incident: " + _pages_per_incident(result) + "; first page after its fault's start: "
        + _first_pages(result) + ".",
    ]
    return lines


def _pages_per_incident(result: timeline.Analysis) -> str:
    counts = sorted(len(names) for o in result.faults for names in o.pages.values())
    return (f"{min(counts)}–{max(counts)}" if counts and min(counts) != max(counts)
            else f"{counts[0]}" if counts else "none") + f" over {len(counts)} incident(s)"


def _first_pages(result: timeline.Analysis) -> str:
    delays = [min(t for t, receiver, *_ in o.notified if receiver == timeline.PAGER) - o.fault.start
              for o in result.faults if o.pages]
    return f"{min(delays):.0f}–{max(delays):.0f} s" if delays else "none"


def _relative(source) -> str:
    path = Path(str(source))
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(source)


def _cores() -> int:
    return os.cpu_count() or 1


def write_doc(path: Path, lines: list[str]) -> None:
    replace_between_markers(path, BEGIN, END, "\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="scenario seconds (default 1800)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--scenario", default=None, help="default: the demo's default scenario")
    parser.add_argument("--write-doc", type=Path, default=None)
    parser.add_argument("--save", type=Path, default=None,
                        help="also keep the recording (pickle) here, to write the table again with --load")
    parser.add_argument("--load", type=Path, default=None, help="analyse a recording kept with --save; run nothing")
    args = parser.parse_args()
    if args.load:
        rec = pickle.loads(args.load.read_bytes())
    else:
        with tempfile.TemporaryDirectory(prefix="fabricscope-demo-timeline-") as tmp:
            rec = timeline.record(args.scenario, args.duration, Path(tmp), time_scale=args.time_scale)
        if args.save:
            args.save.write_bytes(pickle.dumps(rec))
    result = timeline.analyse(rec)
    lines = table(rec, result)
    print("\n".join(lines))
    if args.write_doc:
        write_doc(args.write_doc, lines)
    return 0 if rec.notifications else 1


if __name__ == "__main__":
    sys.exit(main())
