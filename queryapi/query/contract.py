"""What an answer owes the question (issue 37): every constraint it names is honoured,
every word is understood, or nothing runs and the answer says why.

- Shorthand operators type ("rn", "errs", "crit", "w/") is read as the words it stands
  for before anything else, so extraction and matching see "right now", "errors".
- Words for what nothing in the catalog measures (temperature, power draw, pods, disks,
  bus bandwidth) are never corrected into a catalog word ("scheduled" is not a typo of
  "scheduler"): they stay unexplained, and the matcher abstains on them.
- A constraint (window, job, rank, communicator, trace, operation, cluster, rack, device,
  port, GPU, node, service, Xid, IP) is honoured when the chosen query takes it as a
  parameter. When it does not, a registered variant that does is taken (the windowed
  form of an instant query); when none does, nothing runs and the answer names it.
"""
from __future__ import annotations

import re
from typing import Any

from .extract import Extraction
from .registry import QuerySpec

# Chat and runbook shorthand -> the words it stands for (whole words only).
SHORTHAND = {
    "rn": "right now", "atm": "at the moment", "asap": "now", "errs": "errors", "err": "error",
    "crit": "critical", "crits": "critical", "warn": "warning", "warns": "warnings", "wk": "week", "wks": "weeks",
    "yday": "yesterday", "pls": "please", "plz": "please", "thx": "thanks", "ty": "thanks", "u": "you",
    "r": "are", "ur": "your", "w/": "with", "w/o": "without", "runq": "runqueue", "lat": "latency",
    "b/c": "because", "bc": "because", "nw": "network", "approx": "about", "fleetwide": "fleet wide", "clusterwide": "cluster wide",
}
_SHORTHAND = re.compile(r"(?<![\w/-])(" + "|".join(re.escape(k) for k in sorted(SHORTHAND, key=len, reverse=True))
                        + r")(?![\w/-])", re.I)


def expand_shorthand(message: str) -> str:
    # "30 min" and "2 hrs" keep their number: only the unit word is replaced.
    return _SHORTHAND.sub(lambda m: SHORTHAND[m.group(1).lower()], message)


# What no registered query measures: never typo-corrected, never filler.
OUT_OF_SCOPE = frozenset("""
temperature temperatures temp temps thermal overheating heat watts wattage draw memory vram hbm dram pod pods
kubernetes k8s kubectl crashloop crashlooping crashloopbackoff disk disks filesystem inode inodes scheduled
scheduling schedule queued bandwidth busbw algbw throughput utilization utilisation utilized occupancy joke jokes
fan fans pue humidity airflow clock clocks voltage ecc speed speeds mtu uptime cuda tokens
""".split())

# The layer only reads: a question asking for one of these is refused as an action.
ACTIONS = frozenset("""
restart restarts reboot drain cordon uncordon kill delete remove create close file fix repair reset shutdown
disable enable replace reseat submit cancel deploy upgrade install write compose reimage power-cycle silence
silenced mute unmute ack acknowledge suppress snooze purge wipe flush requeue evict terminate rollback
""".split())

# Slots that narrow what a question is about. A question naming one gets an answer filtered
# by it, or no answer. Limits, quantiles and thresholds shape an answer and are not here.
CONSTRAINTS = ("window", "host", "device", "rack", "pdu", "job", "rank", "comm", "trace", "op", "cluster", "gpu",
               "port", "service", "xid", "ip", "severity")


def taken_slots(spec: QuerySpec, slots: dict[str, Any]) -> set[str]:
    """The extracted slots the query's parameters take (its own name first, then nl_from)."""
    taken = set()
    for name, pspec in spec.params.items():
        for source in [name, *pspec.nl_from]:
            if source in slots:
                taken.add(source)
                break
    return taken


def untaken(spec: QuerySpec, extraction: Extraction, also: dict[str, Any] | None = None) -> dict[str, Any]:
    """The constraints the question names that `spec` cannot filter by (slot -> value).
    `also` adds slots the answer carries from elsewhere (a follow-up's previous turn)."""
    slots = {**(also or {}), **extraction.slots}
    taken = taken_slots(spec, slots) | set(spec.covers)
    if "job" in slots and "comm" in taken and "comm" in extraction.derived:
        taken.add("job")            # the job is filtered through its communicator
    left = {}
    for group in extraction.named_together():
        named = {slot for slot in group if slot in CONSTRAINTS and slot in extraction.slots}
        if named and not named & taken:
            left.update({slot: extraction.slots[slot] for slot in sorted(named)})
    return left
