"""Small measurements the benches share: percentiles, a process's or thread's CPU from
/proc, and where py-spy is. Standard library only: it runs on GPU hosts without the venv."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def replace_between_markers(path: Path, begin: str, end: str, text: str) -> None:
    """Rewrite what lies between two marker lines of a doc (a table a bench generates);
    exits naming the doc when a marker is missing, rather than appending a second table."""
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: markers {begin} / {end} not found")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def percentile(values: list[float], q: float) -> float:
    """The value at fraction q (0..1) of the sorted values (nearest rank); nan for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def stat_cpu_seconds(stat: str | Path) -> float:
    """utime + stime of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat file."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def py_spy() -> str | None:
    """py-spy: carried to a GPU host in bench/device/lib (bench/device/stage.sh), else the
    venv's, else on PATH."""
    for candidate in (Path(__file__).resolve().parent / "device" / "lib" / "py-spy",
                      Path(sys.executable).parent / "py-spy"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("py-spy")
