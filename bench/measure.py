"""Small measurements the benches share: percentiles, a process's or thread's CPU from
/proc, and where py-spy is. Standard library only: it runs on GPU hosts without the venv."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


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
