"""<procfs>/net/snmp and <procfs>/net/netstat: pairs of "Proto: names" / "Proto: values" lines.

Both files share one layout: a header line naming the fields of a section, followed by a
line with the same prefix holding one integer per name. A section whose pair is broken
(odd line count, prefix mismatch, different lengths, a non-integer) is reported as a
SectionProblem and left out; the other sections of the file are still returned, so one
odd line from a patched kernel does not hide the TCP counters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import COUNTER_LIMIT, ReadProblem, parse_int

_NO_PATH = Path("-")   # parse_int names a file; here the section names the problem


@dataclass(frozen=True)
class SectionProblem:
    section: str        # "Tcp", "TcpExt", ... or "?" when the line has no prefix
    reason: str         # unpaired_line | prefix_mismatch | length_mismatch | not_a_number | out_of_range | no_prefix | duplicate_section
    detail: str

    def __str__(self) -> str:
        return f"{self.section}: {self.reason} ({self.detail})"


@dataclass
class SnmpFile:
    sections: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[SectionProblem] = field(default_factory=list)

    def get(self, section: str, name: str) -> int | None:
        return self.sections.get(section, {}).get(name)


def _split(line: str) -> tuple[str, list[str]] | None:
    prefix, colon, rest = line.partition(":")
    if not colon or not prefix or " " in prefix:
        return None
    return prefix, rest.split()


def parse_snmp(text: str, wanted: frozenset[str] | None = None) -> SnmpFile:
    """Every section, or only the `wanted` ones: the others (Ip, Icmp, IpExt, MPTcpExt, ...
    most of netstat's values but TcpExt) are paired up and skipped without converting or
    checking a value."""
    result = SnmpFile()
    lines = [line for line in text.splitlines() if line.strip()]
    index = 0
    while index < len(lines):
        header = _split(lines[index])
        if header is None:
            result.problems.append(SectionProblem("?", "no_prefix", f"line {index + 1}: {lines[index][:60]!r}"))
            index += 1
            continue
        section, names = header
        values_line = _split(lines[index + 1]) if index + 1 < len(lines) else None
        if values_line is None:
            result.problems.append(SectionProblem(section, "unpaired_line", f"line {index + 1} has no value line"))
            index += 1
            continue
        values_section, values = values_line
        if values_section != section:
            # The next line starts another section: this header lost its values. Resync there.
            result.problems.append(SectionProblem(section, "prefix_mismatch",
                                                  f"line {index + 1} header followed by {values_section!r}"))
            index += 1
            continue
        index += 2
        if wanted is not None and section not in wanted:
            continue
        if len(names) != len(values):
            result.problems.append(SectionProblem(section, "length_mismatch",
                                                  f"{len(names)} names but {len(values)} values"))
            continue
        parsed, problem = _parse_values(section, names, values)
        if problem is not None:
            result.problems.append(problem)
            continue
        if section in result.sections:
            result.problems.append(SectionProblem(section, "duplicate_section", "seen twice; first kept"))
            continue
        result.sections[section] = parsed
    return result


# A value line of plain decimals of at most 19 digits, each within ±2^64: the kernel's
# every line. Checked in one match and converted in C, where a number at a time cost a
# quarter of the tcp collector's scrape (netstat's TcpExt alone has over 100 values).
_PLAIN_VALUES = re.compile(r"-?[0-9]{1,19}(?: -?[0-9]{1,19})*")


def _parse_values(section: str, names: list[str], values: list[str]) -> tuple[dict[str, int], SectionProblem | None]:
    if _PLAIN_VALUES.fullmatch(" ".join(values)):
        return dict(zip(names, map(int, values))), None
    parsed = {}
    for name, text in zip(names, values):
        # Signed: Tcp MaxConn is -1. Beyond 64 bits (either sign) no kernel value exists,
        # and such a number would break the float exposition.
        value = parse_int(text, _NO_PATH)
        if isinstance(value, ReadProblem) or not -COUNTER_LIMIT < value < COUNTER_LIMIT:
            reason = value.reason if isinstance(value, ReadProblem) else "out_of_range"
            return {}, SectionProblem(section, "out_of_range" if reason == "out_of_range" else "not_a_number",
                                      f"{name} = {text[:20]!r}")
        parsed[name] = value
    return parsed, None
