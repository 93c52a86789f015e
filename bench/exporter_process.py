"""One `fabricscope exporter` process per collector set, as the cost benches run them side by
side (bench/exporter_cost.py here, bench/device/gpu_cost.py on a GPU host): started with
every collector either on or off, its CPU (utime + stime) and memory read from /proc, and
stopped with SIGTERM. Standard library only: it runs on GPU hosts without the venv."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from measure import stat_cpu_seconds

ALL = ["ebpf", "infiniband", "kmsg", "nccl", "netdev", "nvlink", "tcp"]
# "all" as glibc runs it on a 64-core host: 8 malloc arenas a core instead of the
# exporter's cap of 2 (exporter/malloc.py; the environment variable wins over the cap).
SET_ENVIRONMENT = {"all 512 arenas": {"MALLOC_ARENA_MAX": "512"}}


def cpu_seconds(pid: int) -> float:
    return stat_cpu_seconds(f"/proc/{pid}/stat")


def memory_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


class ExporterProcess:
    """`command` runs the exporter CLI; the listen address, state directory and collector
    flags are added here, the set's environment too."""

    def __init__(self, name: str, command: list[str], collectors: list[str], port: int, work: Path,
                 extra_args: list[str] = (), cwd: Path | None = None) -> None:
        self.name, self.port = name, port
        slug = name.replace(" ", "-")
        self.log = open(work / f"exporter-{slug}.log", "w")
        self.proc = subprocess.Popen(
            [*command, f"--web.listen-address=127.0.0.1:{port}", f"--path.state={work / ('state-' + slug)}",
             *extra_args, *[f"--{'' if c in collectors else 'no-'}collector.{c}" for c in ALL]],
            cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **SET_ENVIRONMENT.get(name, {})})
        self.base = f"http://127.0.0.1:{port}"

    def wait_ready(self, probe: Callable[[], object], timeout: float = 90) -> None:
        """Until `probe()` (a scrape) stops raising OSError; the exporter must not exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"exporter {self.name} exited with {self.proc.returncode}: see {self.log.name}")
            try:
                probe()
                return
            except OSError:
                time.sleep(0.3)
        raise SystemExit(f"exporter {self.name} never answered")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def memory_mb(self) -> dict[str, float]:
        return memory_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def measured_window(exporters: list["ExporterProcess"], seconds: float, scrape_interval: float
                    ) -> tuple[float, dict[str, float], dict[str, dict[str, float]]]:
    """Scrape every exporter (its `scrape()`) each `scrape_interval` for `seconds`: the wall
    time, each one's CPU seconds over it, and each one's memory at its end."""
    cpu0 = {e.name: e.cpu() for e in exporters}
    started = time.monotonic()
    next_scrape = started + scrape_interval
    while time.monotonic() < started + seconds:
        time.sleep(max(0.0, min(next_scrape, started + seconds) - time.monotonic()))
        if time.monotonic() >= next_scrape:
            for exporter in exporters:
                exporter.scrape()
            next_scrape += scrape_interval
    wall = time.monotonic() - started
    return (wall, {e.name: e.cpu() - cpu0[e.name] for e in exporters},
            {e.name: e.memory_mb() for e in exporters})
