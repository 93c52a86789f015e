"""The largest mappings of this process by resident memory, from /proc/self/smaps: what the
memory benches (bench/exporter_memory.py, bench/device/nvml_memory.py) list at the end."""
from __future__ import annotations

import collections


def largest_mappings(top: int = 15) -> list[tuple[float, float, int, str]]:
    """(RSS MB, anonymous MB, mappings, name) per mapped file or kind, largest first."""
    rss, anon, count = collections.Counter(), collections.Counter(), collections.Counter()
    name = "[anon]"
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                name = fields[5] if len(fields) > 5 else "[anon]"
                count[name] += 1
            elif fields[0] == "Rss:":
                rss[name] += int(fields[1])
            elif fields[0] == "Anonymous:":
                anon[name] += int(fields[1])
    return [(kb / 1024, anon[n] / 1024, count[n], n) for n, kb in rss.most_common(top)]
