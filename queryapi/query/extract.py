"""Deterministic parameter extraction from an operator's question (phase one of NL).

Compiled patterns find durations, quantiles, IPs, trace and communicator ids, GPU/rank/
port/Xid numbers, NCCL collectives, severities and service names. Entities are recognised
against what the live cluster knows (Vocabulary: Prometheus label values, the chaos
topology, the span store): hosts, devices, racks, PDUs, services, clusters and jobs (a job
names its communicator), whole names only, never cut short; short forms ("node-3", "job
48213") and small typos resolve to a known name. Nothing here decides which query runs: `matcher` does, and the
registry validates whatever comes out of here like any other input.
"""
from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from .params import format_duration

_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                 "seven": 7, "eight": 8, "nine": 9, "ten": 10, "twelve": 12, "fifteen": 15,
                 "twenty": 20, "thirty": 30, "few": 3}
_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}
_UNIT_RE = "|".join(sorted(_UNITS, key=len, reverse=True))
_COUNT_RE = r"[0-9]{1,4}|" + "|".join(_NUMBER_WORDS)

DURATION = re.compile(
    rf"\b(?:(?:in|over|during|within|for)\s+)?(?:the\s+)?(?:last|past|previous|prior)\s+"
    rf"(?:(?P<count>{_COUNT_RE})\s*)?(?P<unit>{_UNIT_RE})\b"
    rf"|\b(?P<compact>(?:[0-9]{{1,4}}(?:ms|s|m|h|d|w))+)\b"
    rf"|\b(?P<count2>[0-9]{{1,4}})\s*(?P<unit2>{_UNIT_RE})\b(?:\s+(?:ago|window|back))?"
    r"|\b(?P<today>today|yesterday|this hour|this week|this month|(?:since\s+)?last night|overnight"
    r"|this morning|this afternoon|this evening|tonight)\b", re.I)
# Time words for parts of a day: the window that covers them from now (a night or a morning
# is at most about 12 hours back, an afternoon or evening about 6), so they are never dropped.
_TIME_WORDS = {"today": "1d", "yesterday": "2d", "this hour": "1h", "this week": "1w", "this month": "30d",
               "last night": "12h", "overnight": "12h", "this morning": "12h", "this afternoon": "6h",
               "this evening": "6h", "tonight": "6h"}
QUANTILE = re.compile(r"\b(?P<median>median)\b|\bp(?P<dotted>99\.99|99\.9)\b|\bp(?P<digits>50|75|90|95|99|999|9999)\b"
                      r"|\b(?P<pct>50|75|90|95|99|99\.9|99\.99)(?:th|st|nd|rd)?\s*(?:percentile|pct|%)", re.I)
IPV4 = re.compile(r"\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}\b")
IPV6 = re.compile(r"(?<![\w:])(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?![\w:])", re.I)
COMM = re.compile(r"\b[0-9a-f]{16}\b", re.I)
TRACE = re.compile(r"\btraces?(?:[ _-]?id)?\s*[:#=]?\s*(?P<t>[0-9a-f]{16}(?:[0-9a-f]{16})?)\b", re.I)
THRESHOLD = re.compile(r"\bthreshold\s*(?:of|=|at)?\s*(?P<n>[0-9]{1,2}(?:\.[0-9]+)?)\b", re.I)
XID = re.compile(r"\bxids?\s*(?:#|code|no\.?)?\s*(?P<n>[0-9]{1,3})\b", re.I)
# Send/Recv only after "in" ("stuck in send"): "send me the list" names no collective.
NCCL_OP = re.compile(r"\b(?P<op>all[-_ ]?reduce|all[-_ ]?gather|reduce[-_ ]?scatter|broadcast|all[-_ ]?to[-_ ]?all)\b"
                     r"|\bin\s+(?P<p2p>send|recv)\b", re.I)
JOB = re.compile(r"\bjobs?\s*(?:id\s*)?[:#=]?\s*(?P<j>[A-Za-z0-9][\w.:/-]*[A-Za-z0-9]|[0-9])", re.I)
GPU = re.compile(r"\bgpus?\s*(?:#|no\.?|number|index)?\s*(?P<n>[0-9]{1,3})\b", re.I)
RANK = re.compile(r"\brank\s*(?:#|no\.?|number)?\s*(?P<n>[0-9]{1,7})\b", re.I)
PORT = re.compile(r"\bport\s*(?:#|no\.?|number)?\s*(?P<n>[0-9]{1,3})\b", re.I)
_LIMIT_WORDS = "top|first|worst|slowest|biggest|highest|noisiest|largest"
_LIMIT_COUNT = "[0-9]{1,3}|" + "|".join(k for k in _NUMBER_WORDS if k not in ("a", "an", "few"))
LIMIT = re.compile(rf"\b(?:{_LIMIT_WORDS})\s+(?P<n>{_LIMIT_COUNT})\b"
                   rf"|\b(?P<m>{_LIMIT_COUNT})\s+(?:{_LIMIT_WORDS}|most)\b", re.I)
SEVERITY = re.compile(r"\b(?P<s>critical|warning|warnings|info|fatal|non[-_ ]?fatal|paging|page)\b", re.I)
# "service chat-api", not "services broke their SLO": a plural names no one service.
SERVICE_AFTER = re.compile(r"\bservice\s+(?:named\s+|called\s+)?[\"']?(?P<n>[A-Za-z0-9][\w.:/-]*)", re.I)
SERVICE_BEFORE = re.compile(r"(?P<n>[A-Za-z0-9][\w.:/-]*)\s+service\b", re.I)
STATE = re.compile(r"\b(?P<s>down|init|armed|active|(?:not|isn't|aren't|non)[- ]active|inactive|offline)\b", re.I)
# Whole words only: "pdu-a1" and "rack-su0-0" are device names, not failure types.
FAILURE = re.compile(r"(?<![\w-])(?:(?P<power>power|pdu)|(?P<rack>rack)|(?P<switch>switch))(?![\w-])", re.I)
# "role compute", "firmware is 28.39.1002": a firmware value has digits ("firmware versions" has none).
FIELD_VALUE = re.compile(r"\b(?P<f>role|hca_type|board_id|numa_node)\s*(?:=|==|is|of)?\s*[\"']?(?P<v>[A-Za-z0-9][\w.-]*)"
                         r"|\b(?P<fw>firmware|fw_version|fw)\s*(?:version\s*)?(?:=|==|is|of)?\s*[\"']?(?P<fwv>[0-9][\w.-]*)",
                         re.I)
# Anything shaped like a host or switch name: letters, then -/_ groups with a digit, and
# whatever groups follow it ("leaf-su1-r0-b" is one name, not "leaf-su1-r0").
NAME_LIKE = re.compile(r"\b[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*?[-_.]?[0-9]+(?:[-_.][a-z0-9]+)*\b", re.I)
SHORT_HOST = re.compile(r"(?<![\w.-])(?P<kind>node|host|server|machine)[-_ ]?(?P<n>[0-9]{1,4})\b", re.I)
# Kernel modules and metric-ish words are not hosts ("mlx5_core errors in dmesg").
_NOT_NAMES = re.compile(r"^(?:p[0-9]+|[0-9].*|gpus?[0-9]+|rank[0-9]+|port[0-9]+|top[0-9]+|mlx5|x[0-9]+|"
                        r"[a-z0-9]+_core|nv[a-z]*[0-9]*|xid[0-9]*)$", re.I)
_SERVICE_STOP = {"the", "a", "an", "my", "our", "each", "every", "all", "by", "of", "is", "are", "which", "what",
                 "slo", "slos", "their", "its", "any", "per", "level", "for", "with", "in", "on", "from",
                 "violated", "violating", "breached", "missed", "breach", "violate", "violations", "violation", "has", "have", "had", "did", "do", "does"}
_FIELD_NAMES = {"firmware": "fw_version"}


@dataclass
class Extraction:
    """Slot -> value (raw for the registry to validate) and where each came from."""
    slots: dict[str, Any] = field(default_factory=dict)
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Names shaped like a host, device, rack or job that the cluster does not know, with the
    # known names closest to each: never dropped, never guessed (the matcher abstains).
    unknown: dict[str, list[str]] = field(default_factory=dict)
    # Slots filled from another slot, not named by the question (a job's communicator).
    derived: set[str] = field(default_factory=set)

    def put(self, slot: str, value: Any, match: re.Match[str] | None = None) -> None:
        if slot in self.slots:
            return          # the first mention wins ("on node-1 ... compared to node-2")
        self.slots[slot] = value
        if match is not None:
            self.spans.append((slot, match.start(), match.end()))
        else:
            self.derived.add(slot)

    def named_together(self) -> list[set[str]]:
        """The slots the question names, grouped by the words that named them: one name
        can be both a host and a topology device, and either reading honours it."""
        groups: dict[tuple[int, int], set[str]] = {}
        for slot, start, end in self.spans:
            groups.setdefault((start, end), set()).add(slot)
        return list(groups.values())

    def to_dict(self) -> dict[str, Any]:
        return {"params": dict(self.slots), "notes": list(self.notes),
                **({"unknown": dict(self.unknown)} if self.unknown else {})}


class Vocabulary:
    """What the live cluster knows, for recognising entities: hosts (node label values),
    devices (device label values and the chaos topology's devices), racks and PDUs (the
    topology), services (the span store), clusters (cluster label values) and jobs (job_id
    label values, each with the communicator its ranks share)."""

    def __init__(self, hosts: Iterable[str] = (), devices: Iterable[str] = (), *, racks: Iterable[str] = (),
                 pdus: Iterable[str] = (), services: Iterable[str] = (), clusters: Iterable[str] = (),
                 jobs: dict[str, str] | None = None) -> None:
        self.hosts = sorted({h for h in hosts if h})
        self.racks = sorted({r for r in racks if r})
        self.pdus = sorted({p for p in pdus if p})
        self.devices = sorted({d for d in devices if d} | set(self.racks) | set(self.pdus))
        self.services = sorted({s for s in services if s})
        self.clusters = sorted({c for c in clusters if c})
        self.jobs = {job: comm for job, comm in (jobs or {}).items() if job}
        self._hosts_lower = {h.lower(): h for h in self.hosts}
        self._devices_lower = {d.lower(): d for d in self.devices}
        self._named = {}      # lower-case name -> (slot, name), for the kinds besides hosts and devices
        for slot, names in (("service", self.services), ("cluster", self.clusters), ("job", self.jobs)):
            for name in names:
                self._named.setdefault(name.lower(), (slot, name))
        # A job is also known by what follows its scheduler prefix: slurm:48213 -> 48213.
        self._job_short = {}
        for job in self.jobs:
            short = job.split(":", 1)[-1].lower()
            self._job_short[short] = job if short not in self._job_short else None

    def host(self, text: str) -> str | None:
        return self._hosts_lower.get(text.lower())

    def device(self, text: str) -> str | None:
        return self._devices_lower.get(text.lower())

    def named(self, text: str) -> tuple[str, str] | None:
        """(slot, name) of a service, cluster or job known by this exact name."""
        return self._named.get(text.lower())

    def job(self, text: str) -> str | None:
        """A job by its id (slurm:48213) or the part after the scheduler (48213)."""
        lowered = text.lower()
        found = self._named.get(lowered)
        if found and found[0] == "job":
            return found[1]
        return self._job_short.get(lowered)

    def knows_names(self) -> bool:
        """Whether names can be judged at all (Prometheus or the topology answered)."""
        return bool(self.hosts or self.devices)

    def closest(self, text: str, names: Iterable[str], n: int = 3) -> list[str]:
        """Known names closest to an unknown one, for the answer to offer."""
        lowered = {name.lower(): name for name in names}
        return [lowered[m] for m in difflib.get_close_matches(text.lower(), list(lowered), n=n, cutoff=0.5)]

    def job_ids(self) -> list[str]:
        return sorted(self.jobs)

    def kind_of_device(self, name: str) -> str:
        return "rack" if name in self.racks else "pdu" if name in self.pdus else "device"

    def host_by_suffix(self, suffix: str) -> str | None:
        """'node-3' -> the one known host ending in node-3 (None when none or ambiguous)."""
        found = [h for h in self.hosts if h.lower().endswith(suffix.lower())
                 and (len(h) == len(suffix) or not h[-len(suffix) - 1].isalnum())]
        return found[0] if len(found) == 1 else None

    def close_name(self, text: str) -> tuple[str, str] | None:
        """A known host or device within a small typo of `text` ('gpu-nod-1')."""
        lowered = text.lower()
        for kind, names in (("host", self._hosts_lower), ("device", self._devices_lower)):
            match = difflib.get_close_matches(lowered, list(names), n=2, cutoff=0.85)
            # Names differing only in their trailing number are not typos of each other.
            match = [m for m in match if re.sub(r"[0-9]+$", "", m) != re.sub(r"[0-9]+$", "", lowered)
                     or m == lowered]
            # A typo is in the letters: a name with other digits is another machine.
            match = [m for m in match if re.findall(r"[0-9]+", m) == re.findall(r"[0-9]+", lowered)]
            if len(match) == 1:
                return kind, names[match[0]]
        return None


def _count(text: str | None) -> int:
    if not text:
        return 1
    text = text.lower()
    return _NUMBER_WORDS[text] if text in _NUMBER_WORDS else int(text)


def _duration(match: re.Match[str]) -> str | None:
    if match.group("compact"):
        return match.group("compact").lower()
    if match.group("today"):
        words = re.sub(r"\s+", " ", match.group("today").lower())
        return _TIME_WORDS[words.removeprefix("since ")]
    count, unit = ((match.group("count"), match.group("unit")) if match.group("unit")
                   else (match.group("count2"), match.group("unit2")))
    seconds = _count(count) * _UNITS[unit.lower()]
    return format_duration(seconds)


def extract(message: str, vocabulary: Vocabulary | None = None) -> Extraction:
    vocabulary = vocabulary or Vocabulary()
    found = Extraction()
    text = message[:2000]

    for match in IPV4.finditer(text):
        try:
            found.put("ip", str(ipaddress.ip_address(match.group(0))), match)
        except ValueError:
            found.notes.append(f"{match.group(0)!r} looks like an IPv4 address but is not one")
    for match in IPV6.finditer(text):
        try:
            found.put("ip", str(ipaddress.ip_address(match.group(0))), match)
        except ValueError:
            pass
    for match in TRACE.finditer(text):
        found.put("trace", match.group("t").lower(), match)
    for match in COMM.finditer(_mask(text, found.spans)):
        found.put("comm", match.group(0).lower(), match)
    for match in QUANTILE.finditer(text):
        if match.group("median"):
            found.put("quantile", "0.5", match)
        elif match.group("digits"):
            found.put("quantile", "0." + match.group("digits"), match)
        elif match.group("dotted"):
            found.put("quantile", "0." + match.group("dotted").replace(".", ""), match)
        else:
            # "99.9" -> "0.999" as text: float division would give 0.9990000000000001.
            whole, _, frac = match.group("pct").partition(".")
            found.put("quantile", f"0.{whole}{frac}", match)
    masked = _mask(text, found.spans)
    for match in DURATION.finditer(masked):
        value = _duration(match)
        if value:
            found.put("window", value, match)
    for slot, pattern in (("gpu", GPU), ("rank", RANK), ("port", PORT), ("xid", XID)):
        for match in pattern.finditer(masked):
            found.put(slot, int(match.group("n")), match)
    for match in THRESHOLD.finditer(masked):
        found.put("threshold", match.group("n"), match)
    masked = _mask(text, found.spans)
    for match in LIMIT.finditer(masked):
        found.put("limit", _count(match.group("n") or match.group("m")), match)
    for match in SEVERITY.finditer(masked):
        word = match.group("s").lower().replace(" ", "_").replace("-", "_")
        found.put("severity", {"warnings": "warning", "paging": "page", "nonfatal": "non_fatal"}.get(word, word), match)
    for match in STATE.finditer(masked):
        state = match.group("s").lower()
        found.put("state", "down" if (("active" in state and state != "active") or state == "offline") else state,
                  match)
    for match in NCCL_OP.finditer(masked):
        found.put("op", re.sub(r"[-_ ]", "", match.group("op") or match.group("p2p")).lower(), match)
    for match in FAILURE.finditer(masked):
        found.put("failure_type", f"{match.lastgroup}_failure", match)
    for match in FIELD_VALUE.finditer(masked):
        name = (match.group("f") or "fw_version").lower()
        found.put("field", _FIELD_NAMES.get(name, name), match)
        found.put("value", match.group("v") or match.group("fwv"), match)
    _names(_mask(text, found.spans), vocabulary, found)
    _jobs(_mask(text, found.spans), vocabulary, found)
    if "failure_type" not in found.slots:
        # A rack fails as a rack, a PDU takes its power with it.
        if "rack" in found.slots:
            found.put("failure_type", "rack_failure")
        elif "pdu" in found.slots:
            found.put("failure_type", "power_failure")
    rest = _mask(text, found.spans)
    candidates = [m for pattern in (SERVICE_AFTER, SERVICE_BEFORE) for m in pattern.finditer(rest)
                  if m.group("n").lower() not in _SERVICE_STOP]
    for match in sorted(candidates, key=lambda m: m.start("n"))[:1]:
        found.put("service", match.group("n"), match)
    return found


def _mask(text: str, spans: list[tuple[str, int, int]]) -> str:
    """Blank out what an earlier pattern consumed, keeping offsets."""
    chars = list(text)
    for _, start, end in spans:
        chars[start:end] = " " * (end - start)
    return "".join(chars)


def _jobs(text: str, vocabulary: Vocabulary, found: Extraction) -> None:
    """"job 48213", "job slurm:48213", "the llama70b-pretrain-0 job": the job, and the
    communicator its ranks share (the NCCL queries filter by comm)."""
    for match in JOB.finditer(text):
        token = match.group("j")
        job = vocabulary.job(token)
        if job:
            found.put("job", job, match)
        elif any(c.isdigit() for c in token) and "job" not in found.slots:
            # "job 99999": a job Prometheus has no ranks of. Named, not dropped.
            found.unknown[token] = vocabulary.closest(token, [*vocabulary.jobs, *vocabulary._job_short])
            found.spans.append(("job", match.start(), match.end()))
    for match in re.finditer(r"[A-Za-z0-9][A-Za-z0-9._:/-]*[A-Za-z0-9]", text):
        job = vocabulary.job(match.group(0))
        if job and "job" not in found.slots:
            found.put("job", job, match)
    if "job" in found.slots and vocabulary.jobs.get(found.slots["job"]):
        found.put("comm", vocabulary.jobs[found.slots["job"]])


def _names(text: str, vocabulary: Vocabulary, found: Extraction) -> None:
    # Known names first (exact, case-insensitive, whole tokens: "leaf-su1-r0-b" is not cut
    # to "leaf-su1-r0"), so "mlx5_3" is a device, "gpu-node-1" a host, "chat-api" a service.
    for match in re.finditer(r"[A-Za-z0-9][A-Za-z0-9._:/-]*[A-Za-z0-9]", text):
        token = match.group(0).rstrip(".:")
        host = vocabulary.host(token)
        device = vocabulary.device(token)
        named = vocabulary.named(token)
        if host:
            # A host is also a node of the topology: it stays a host, and the topology
            # queries take it through their device parameter's nl_from (an InfiniBand
            # device filter must not read a host name as an HCA).
            found.put("host", host, match)
        elif device:
            kind = vocabulary.kind_of_device(device)
            found.put("device" if kind == "device" else kind, device, match)
        if named and named[0] != "job":
            found.put(named[0], named[1], match)
    for match in SHORT_HOST.finditer(text):
        host = vocabulary.host_by_suffix(f"{match.group('kind').lower()}-{match.group('n')}")
        if host:
            found.put("host", host, match)
        elif "host" not in found.slots:
            found.notes.append(f"no known host matches {match.group(0)!r}")
            if vocabulary.hosts:
                found.unknown[match.group(0)] = vocabulary.closest(match.group(0), vocabulary.hosts)
                found.spans.append(("host", match.start(), match.end()))
    for match in NAME_LIKE.finditer(text):
        token = match.group(0).rstrip(".")
        if _NOT_NAMES.match(token) or vocabulary.host(token) or vocabulary.device(token) or vocabulary.named(token) \
                or vocabulary.job(token):
            continue
        close = vocabulary.close_name(token)
        if close:
            found.notes.append(f"read {token!r} as {close[1]!r}")
            found.put(close[0], close[1], match)
        elif re.search(r"[-_]", token) and not SHORT_HOST.fullmatch(token):
            found.notes.append(f"{token!r} is not a name Prometheus knows")
            if vocabulary.knows_names():
                # Named as unknown, with the closest known names: never run unfiltered.
                found.unknown[token] = vocabulary.closest(token, [*vocabulary.hosts, *vocabulary.devices])
                found.spans.append(("host", match.start(), match.end()))
            else:
                # Nothing to judge against (Prometheus not answering): offer it for both;
                # the chosen query takes the one it needs.
                found.put("host", token, match)
                found.put("device", token, match)
