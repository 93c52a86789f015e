"""Where each local NCCL rank runs: its GPU and its job, for fabric_nccl_rank_info.

rank -> process comes from the source that saw the rank (the uprobes know the pid of every
communicator they saw initialised; the demo knows its simulated processes). process -> GPU:
1. NVML's running-process lists (nvmlDeviceGetComputeRunningProcesses): the GPUs where the
   process holds a CUDA context. A rank that also touched another GPU (a stray tensor on
   cuda:0) shows on both; the GPU where it holds the most memory is the one it computes on.
2. Without NVML, the process's open device nodes (<procfs>/<pid>/fd -> /dev/nvidiaN), used
   only when exactly one is open (the CUDA runtime opens every visible GPU's node, so
   several mean "cannot tell"). The minor number N is mapped to a GPU through
   <procfs>/driver/nvidia/gpus/<bdf>/information; GPU numbers are NVML's (PCI order).
The job: SLURM_JOB_ID, then TORCHELASTIC_RUN_ID from <procfs>/<pid>/environ, then a
Kubernetes pod UID from <procfs>/<pid>/cgroup. Each process is read once; a value outside
[A-Za-z0-9_.:-]{1,64} is dropped, so a hostile environment cannot blow up a label.
No pid is ever a label: the series are keyed by (comm, rank), bounded by the tracker's
max_comms, and the pid only selects what to read.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..parsers.files import ReadProblem, read_text

log = logging.getLogger("fabricscope.exporter.nccl")

_DEVICE_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
JOB_VARIABLES = (("SLURM_JOB_ID", "slurm:"), ("TORCHELASTIC_RUN_ID", "torchelastic:"))
MAX_ENVIRON_BYTES = 1 << 20
# A process not yet on a GPU (CUDA initialising) is looked at again after this long.
RETRY_SECONDS = 10.0
# How long a scrape waits for a lookup it started before serving without it.
LOOKUP_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class RankProcess:
    comm: str
    rank: int
    nranks: int
    pid: int


@dataclass(frozen=True)
class RankInfo:
    comm: str
    rank: int
    nranks: int
    gpu: str        # NVML index, "" when it cannot be told
    job_id: str     # "" when the process names none; the job_id label


def _text(path: Path) -> str | None:
    text = read_text(path)
    return None if isinstance(text, ReadProblem) else text


def job_of(procfs: Path, pid: int) -> str:
    environ = _raw(procfs / str(pid) / "environ")
    if environ:
        variables = dict(item.partition("=")[::2] for item in environ.split("\0") if "=" in item)
        for name, prefix in JOB_VARIABLES:
            value = variables.get(name, "")
            if value and _LABEL_VALUE.match(prefix + value):
                return prefix + value
    cgroup = _text(procfs / str(pid) / "cgroup") or ""
    match = _POD.search(cgroup) if "kubepods" in cgroup else None
    return "k8s-pod:" + match.group(1).replace("_", "-") if match else ""


def _raw(path: Path) -> str:
    # environ holds NUL-separated bytes in whatever encoding the job used.
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_ENVIRON_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def device_minors(procfs: Path, pid: int) -> set[int]:
    """Minor numbers of the /dev/nvidiaN nodes the process holds open."""
    minors = set()
    try:
        entries = list(os.scandir(procfs / str(pid) / "fd"))
    except OSError:
        return minors
    for entry in entries:
        try:
            match = _DEVICE_NODE.match(os.readlink(entry.path))
        except OSError:
            continue                          # closed since the listing
        if match:
            minors.add(int(match.group(1)))
    return minors


def minor_to_gpu(procfs: Path) -> dict[int, int]:
    """/dev/nvidiaN minor -> NVML index, from the driver's per-GPU information files."""
    root = procfs / "driver" / "nvidia" / "gpus"
    try:
        bus_ids = sorted(entry.name.lower() for entry in os.scandir(root))
    except OSError:
        return {}
    out = {}
    for index, bus_id in enumerate(bus_ids):
        match = _MINOR.search(_text(root / bus_id / "information") or "")
        if match:
            out[int(match.group(1))] = index
    return out


class RankPlacement:
    """Caches one (gpu, job) answer per process; unresolved processes are retried.

    The lookups run on a worker thread, never in the scrape: an NVML call on a hung GPU,
    or a read of /proc/<pid>/environ of a process stuck holding its memory map lock, can
    block for as long as the fault lasts, and the NCCL collector must go on reporting the
    hang meanwhile. A scrape that starts a lookup waits for it at most `wait_seconds`
    (a healthy lookup takes milliseconds, so a new rank is placed in the same scrape), then
    serves what is known: a rank still being looked up shows gpu="" until a later one."""

    def __init__(self, procfs: Path, nvml: Callable[[], object | None], clock: Callable[[], float] = time.monotonic,
                 retry_seconds: float = RETRY_SECONDS, background: bool = True,
                 wait_seconds: float = LOOKUP_WAIT_SECONDS) -> None:
        self.procfs = Path(procfs)
        self._nvml = nvml                      # returns the backend, or None while unavailable
        self._clock = clock
        self._retry = retry_seconds
        self._background = background
        self._wait = wait_seconds
        self._lock = threading.Lock()
        self._known: dict[int, tuple[str, str]] = {}       # pid -> (gpu, job)
        self._retry_at: dict[int, float] = {}
        self._worker: threading.Thread | None = None

    def resolve(self, ranks: Iterable[RankProcess]) -> list[RankInfo]:
        ranks = list(ranks)
        pids = {r.pid for r in ranks}
        now = self._clock()
        with self._lock:
            for gone in set(self._known) - pids:
                del self._known[gone]
            self._retry_at = {pid: at for pid, at in self._retry_at.items() if pid in pids}
            todo = [pid for pid in sorted(pids) if self._known.get(pid, ("", ""))[0] == ""
                    and self._retry_at.get(pid, 0.0) <= now]
            busy = self._worker is not None and self._worker.is_alive()
            if todo and not busy:
                for pid in todo:
                    self._retry_at[pid] = now + self._retry
                jobs = {pid: self._known[pid][1] for pid in todo if pid in self._known}
                if self._background:
                    self._worker = threading.Thread(target=self._look_up, args=(todo, jobs),
                                                    name="nccl-rank-placement", daemon=True)
                    self._worker.start()
        if todo and not busy:
            if self._background:
                self._worker.join(self._wait)
            else:
                self._look_up(todo, jobs)
        with self._lock:
            return [RankInfo(r.comm, r.rank, r.nranks, *self._known.get(r.pid, ("", ""))) for r in ranks]

    def wait(self, timeout: float = 10.0) -> None:
        """Until the lookup in progress, if any, is done (tests, benchmarks)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _look_up(self, pids: list[int], jobs: dict[int, str]) -> None:
        try:
            gpus = self._gpus_of(pids)
            found = {pid: (gpus.get(pid, ""), jobs[pid] if pid in jobs else job_of(self.procfs, pid)) for pid in pids}
        except Exception:                          # never let a lookup kill the thread silently
            log.exception("placing NCCL ranks on GPUs")
            return
        with self._lock:
            self._known.update(found)

    def _gpus_of(self, pids: list[int]) -> dict[int, str]:
        found = self._from_nvml(set(pids))
        missing = [pid for pid in pids if pid not in found]
        if missing:
            minors = minor_to_gpu(self.procfs)
            for pid in missing:
                held = device_minors(self.procfs, pid)
                if len(held) == 1:
                    minor = held.pop()
                    found[pid] = str(minors.get(minor, minor))
        return found

    def _from_nvml(self, pids: set[int]) -> dict[int, str]:
        backend = self._nvml()
        if backend is None or not hasattr(backend, "running_processes"):
            return {}
        best: dict[int, tuple[int, int]] = {}              # pid -> (memory, gpu)
        for gpu in backend.gpus():
            try:
                processes = backend.running_processes(gpu)
            except Exception as exc:  # noqa: BLE001 - one GPU unreadable: the others still answer
                log.debug("running processes of GPU %d: %s", gpu.index, exc)
                continue
            for pid, used in processes:
                if pid in pids and (used or 0, -gpu.index) > best.get(pid, (-1, 0)):
                    best[pid] = (used or 0, -gpu.index)
        return {pid: str(-gpu) for pid, (_, gpu) in best.items()}
