"""NVLink sampling off the scrape path: one thread per GPU, on the collector's own schedule.

Why: on an H200, nvmlDeviceGetNvLinkErrorCounter costs ~0.85 ms a call and a GPU has 18
links x 4 counters, so reading a 4-GPU node at scrape time took 0.2-0.8 s. Here each GPU's
thread reads its links every `interval` seconds and publishes an immutable GpuSample; a
scrape only looks at the latest samples and their age. A GPU stuck inside the driver
blocks its own thread, never the scrape or the other GPUs.

Per round, per GPU:
- link states (~1 µs a call) every round; version and remote endpoint only for a link seen
  for the first time or whose state changed (they only change when a link retrains);
- throughput and error counters in one nvmlDeviceGetFieldValues batch where the driver
  supports the field, otherwise one nvmlDeviceGetNvLinkErrorCounter call per counter. The
  first round finds out which (a field answering NOT_SUPPORTED falls back to the call; a
  counter both refuse has no series); the plan is kept until the set of links changes.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .backend import (ERROR_TYPES, FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_THROUGHPUT_DATA_TX,
                      FieldValuesUnsupported, GpuInfo, LinkReading, LinkStatic, NvmlBackend, NvmlDeviceError,
                      error_field)

log = logging.getLogger("fabricscope.exporter.nvml")

# How an error counter is read (the label values of fabric_nvlink_error_counter_reads).
BATCHED, PER_CALL, UNSUPPORTED = "field_values", "per_call", "unsupported"


@dataclass(frozen=True)
class GpuSample:
    links: tuple[LinkReading, ...]
    started: float                  # time.monotonic() when the round began: its oldest value
    duration: float                 # seconds the round took
    error_reads: dict[str, int]     # BATCHED / PER_CALL / UNSUPPORTED -> error counters read that way
    failure: str | None = None      # NvmlDeviceError reason when the GPU could not be read


@dataclass
class _Plan:
    """Which call reads which value, for one set of links."""
    links: tuple[int, ...]
    batched: list[tuple[int, int, int, str]]            # (field id, scope id, link, key)
    per_call: list[tuple[int, str]] = field(default_factory=list)   # (link, error kind)
    unsupported: set[tuple[int, str]] = field(default_factory=set)
    settled: bool = False           # the first round has sorted the fields by support

    @classmethod
    def for_links(cls, links: tuple[int, ...]) -> "_Plan":
        batched, per_call = [], []
        for link in links:
            batched.append((FI_NVLINK_THROUGHPUT_DATA_TX, link, link, "tx"))
            batched.append((FI_NVLINK_THROUGHPUT_DATA_RX, link, link, "rx"))
            for kind in ERROR_TYPES:
                ids = error_field(kind, link)
                if ids is None:
                    per_call.append((link, kind))
                else:
                    batched.append((*ids, link, kind))
        return cls(links=links, batched=batched, per_call=per_call)

    def error_reads(self) -> dict[str, int]:
        return {BATCHED: sum(1 for *_, key in self.batched if key in ERROR_TYPES),
                PER_CALL: len(self.per_call), UNSUPPORTED: len(self.unsupported)}


class GpuSampler:
    """Reads one GPU's NVLinks every `interval` seconds in its own daemon thread."""

    def __init__(self, backend: NvmlBackend, gpu: GpuInfo, interval: float) -> None:
        self.backend = backend
        self.gpu = gpu
        self.interval = interval
        self.latest: GpuSample | None = None     # replaced whole, read without a lock
        self.cpu_seconds = 0.0                   # CPU time of this GPU's sampling thread, all rounds
        self._busy_since: float | None = None
        self._static: dict[int, tuple[bool, LinkStatic]] = {}   # link -> (state when read, attributes)
        self._plan: _Plan | None = None
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"nvml-gpu{self.gpu.index}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ends the thread; one stuck in NVML is left behind (a daemon, it cannot hold the exit)."""
        self.signal_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def signal_stop(self) -> None:
        """Ask the thread to end after its current round, without waiting."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._busy_since = started
            cpu = time.thread_time()
            try:
                sample = self.sample_once()
            except Exception as exc:                 # a bug must not end sampling of this GPU
                log.exception("GPU %d: NVLink sample failed", self.gpu.index)
                sample = GpuSample((), started, time.monotonic() - started, {}, failure=type(exc).__name__)
            with self._done:
                self.cpu_seconds += time.thread_time() - cpu
                self.latest = sample
                self._busy_since = None
                self._done.notify_all()
            self._wake.wait(max(0.0, started + self.interval - time.monotonic()))
            self._wake.clear()

    # ---- what the scrape reads ----------------------------------------------------------------

    def busy_for(self, now: float) -> float:
        """Seconds the round in progress has been running (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else max(0.0, now - since)

    def refresh(self, timeout: float = 10.0) -> bool:
        """Ask for a round now and wait until one that began after this call has finished.
        False on timeout (e.g. the GPU hangs in NVML)."""
        asked = time.monotonic()
        self._wake.set()
        deadline = asked + timeout
        with self._done:
            while self.latest is None or self.latest.started < asked:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
        return True

    # ---- one round --------------------------------------------------------------------------

    def sample_once(self) -> GpuSample:
        started = time.monotonic()
        try:
            states = self.backend.link_states(self.gpu)
            links = tuple(sorted(states))
            statics = {link: self._static_of(link, active) for link, active in states.items()}
            if self._plan is None or self._plan.links != links:
                self._plan = _Plan.for_links(links)
            values = self._read(self._plan)
        except NvmlDeviceError as exc:
            log.warning("GPU %d (%s): %s", self.gpu.index, self.gpu.pci_bus_id, exc)
            return GpuSample((), started, time.monotonic() - started, {}, failure=exc.reason)
        readings = []
        for link in links:
            static = statics[link]
            tx, rx = values.get((link, "tx")), values.get((link, "rx"))
            readings.append(LinkReading(
                link=link, active=states[link], version=static.version,
                remote_pci_bus_id=static.remote_pci_bus_id, remote_type=static.remote_type,
                tx_bytes=None if tx is None else tx * 1024, rx_bytes=None if rx is None else rx * 1024,
                errors={kind: values[(link, kind)] for kind in ERROR_TYPES if (link, kind) in values}))
        return GpuSample(tuple(readings), started, time.monotonic() - started, self._plan.error_reads())

    def _static_of(self, link: int, active: bool) -> LinkStatic:
        cached = self._static.get(link)
        if cached is None or cached[0] != active:
            cached = self._static[link] = (active, self.backend.link_static(self.gpu, link))
        return cached[1]

    def _read(self, plan: _Plan) -> dict[tuple[int, str], int]:
        values: dict[tuple[int, str], int] = {}
        if plan.batched:
            try:
                raw = self.backend.field_values(self.gpu, [(fid, scope) for fid, scope, _, _ in plan.batched])
            except FieldValuesUnsupported as exc:
                if not plan.settled:
                    log.info("GPU %d: nvmlDeviceGetFieldValues unsupported (%s); one call per error counter, "
                             "no throughput", self.gpu.index, exc)
                raw = [None] * len(plan.batched)
            kept = []
            for entry, value in zip(plan.batched, raw):
                _, _, link, key = entry
                if value is not None:
                    values[(link, key)] = value
                    kept.append(entry)
                elif plan.settled:
                    kept.append(entry)               # supported before: absent this round only
                elif key in ERROR_TYPES:
                    plan.per_call.append((link, key))  # no such field here: the per-link call
            plan.batched = kept
        for link, kind in list(plan.per_call):
            value = self.backend.error_counter(self.gpu, link, kind)
            if value is not None:
                values[(link, kind)] = value
            elif not plan.settled:
                plan.per_call.remove((link, kind))
                plan.unsupported.add((link, kind))
        if not plan.settled:
            plan.settled = True
            reads = plan.error_reads()
            log.info("GPU %d: %d NVLink error counters per sample by field values, %d by per-counter call, "
                     "%d unsupported", self.gpu.index, reads[BATCHED], reads[PER_CALL], reads[UNSUPPORTED])
        return values
