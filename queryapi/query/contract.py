"""What an answer owes the question (issue 37): every constraint it names is honoured,
every word is understood, or nothing runs and the answer says why.

- Every word is understood (words.py: catalog terms, plain English, the fabric's nouns,
  shorthand read as what it stands for) or the matcher abstains naming it; words for what
  nothing measures (temperature, pods, bus bandwidth) are never corrected into a catalog
  word, and action verbs are refused as actions.
- A constraint (window, job, rank, communicator, trace, operation, cluster, rack, device,
  port, GPU, node, service, Xid, IP) is honoured when the chosen query takes it as a
  parameter. When it does not, a registered variant that does is taken (the windowed
  form of an instant query); when none does, nothing runs and the answer names it.
"""
from __future__ import annotations

from typing import Any

from .extract import Extraction
from .registry import QuerySpec

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


def abstention_answer(match) -> str:
    """Why nothing ran, in the words of the question, and what comes closest."""
    nearest = "; ".join(f"{a['query_name']} ({a['description']})" for a in match.alternatives
                        if a.get("description"))
    if match.actions:
        why = (f"This layer only reads: it cannot {', '.join(match.actions)} anything, so nothing was run. "
               "Do it through your own tooling; these read-only queries come closest.")
    elif match.unknown_names:
        why = "; ".join(f"{name!r} is not a name the cluster knows"
                        + (f" (close: {', '.join(close)})" if close else "")
                        for name, close in match.unknown_names.items()) + ", so nothing was run."
    elif match.unsupported:
        constraints = ", ".join(f"{slot} {value}" for slot, value in match.unsupported.items())
        why = f"No registered query can filter by {constraints}, so nothing was run rather than an unfiltered answer."
    elif match.invalid:
        why = "; ".join(f"{name}: {message}" for name, message in match.invalid.items()) + ", so nothing was run."
    else:
        unexplained = (f" (words it does not understand: {', '.join(match.unexplained)})"
                       if match.unexplained else "")
        why = f"I can't answer that with a registered query{unexplained}, so nothing was run."
    return (f"{why} " + (f"Nearest: {nearest}. " if nearest else "")
            + "GET /ai/query/catalog lists what can be asked.")
