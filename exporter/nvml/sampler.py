"""NVLink sampling off the scrape path: one thread per GPU, in two tiers.

Why: on an H200 (driver 580, 18 links) every per-link value costs ~0.8 ms of CPU in the
driver, whichever call reads it (nvmlDeviceGetNvLinkErrorCounter 0.79 ms a call,
nvmlDeviceGetFieldValues 0.82 ms per link-scoped value), while link state costs 0.06 ms
for all links and a GPU-total throughput field 0.58 ms. Reading everything every 10 s cost
3% of a core on 4 GPUs. So each GPU's thread reads:

- tier "gpu", every `interval` seconds: link states only (version and remote endpoint only
  for a link seen for the first time or whose state changed: they change only when a link
  retrains). The link-down and flap alerts need nothing else.
- tier "link", every `link_interval` seconds: one field-values call for the GPU totals
  (DL CRC/replay/recovery errors, and throughput TX/RX where GPM is not used), per-link
  throughput, and the per-link error counters.
  Per-link throughput comes from GPM (GPU Performance Monitoring, Hopper and later): one
  sample holds every link's bytes per second since the previous one, 0.09 ms of driver CPU
  on an H200 where field values cost 0.4-0.8 ms per link and direction (17-30 ms a GPU).
  The byte counters then count from the first sample the exporter took (a restart is a
  counter reset to Prometheus), and the GPU totals are their sums. A GPU without GPM
  (before Hopper, MIG mode) reads throughput by field values, per link and as GPU totals.
  Each error counter type is read by whichever method the first
  link round measured cheaper per value on this GPU (one nvmlDeviceGetFieldValues batch, or
  one nvmlDeviceGetNvLinkErrorCounter call per link); a field answering NOT_SUPPORTED falls
  back to the call, a counter both refuse has no series. The plan is kept until the set of
  links changes.
- the gate: a per-link counter of a kind the GPU totals cover (crc_flit, replay, recovery)
  is read only when one of those totals changed since the last per-link read, when that
  read is `gate_safety` seconds old, or when the links changed; otherwise its last value is
  served (a sum that did not move means none of its terms did: the counters only grow).
  crc_data has no GPU total on H100/H200, but the data link layer recovers every CRC error,
  data or flit, by replaying the flit: a data-CRC error moves the replay total too, so
  crc_data is gated on it (GATED_BY). Every kind on a GPU answering no totals is read every
  link round.

Each tier's values carry the time their round began, so a scrape serves both with their
age. GPUs start their rounds `phase` seconds apart: rounds of several GPUs running at
once contend inside the driver (4 H200s in parallel took 187 ms of CPU per GPU round,
against 91 ms one after another). A GPU stuck inside the driver blocks its own thread,
never the scrape or the other GPUs.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .backend import (ERROR_TOTAL_FIELDS, ERROR_TYPES, FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_THROUGHPUT_DATA_TX,
                      SCOPE_ALL_LINKS, FieldValuesUnsupported, GpmUnsupported, GpuInfo, LinkReading, LinkStatic,
                      NvmlBackend, NvmlDeviceError, error_field)

log = logging.getLogger("fabricscope.exporter.nvml")

# How an error counter is read (the label values of fabric_nvlink_error_counter_reads).
BATCHED, PER_CALL, UNSUPPORTED = "field_values", "per_call", "unsupported"
# How per-link throughput is read (label values of fabric_nvlink_throughput_method).
GPM, FIELD_VALUES = "gpm", "field_values"
# The two tiers (label values of the per-tier metrics).
GPU_TIER, LINK_TIER = "gpu", "link"
TIERS = (GPU_TIER, LINK_TIER)
# Method choice: timings below this (seconds per value) are not the driver's; a per-link
# call must cost under CLEAR_WIN x a batched value to replace it.
MEANINGFUL_COST = 0.2e-3
CLEAR_WIN = 0.98
# The gate: per-link counters the GPU totals cover are read anyway once their last read is
# this many link intervals old (a driver resetting a total, or a total not the sum of its
# links, is then wrong for at most this long).
GATE_SAFETY_INTERVALS = 10
# What a link round did with the gated per-link error counters (label values of
# fabric_nvlink_error_counter_rounds_total): read because ...
GATE_FIRST, GATE_CHANGED, GATE_SAFETY, GATE_NO_TOTALS = "first", "totals_changed", "safety", "no_totals"
GATE_SKIPPED = "unchanged"                   # ... or not read: the totals had not moved
GATE_OUTCOMES = (GATE_FIRST, GATE_CHANGED, GATE_SAFETY, GATE_NO_TOTALS, GATE_SKIPPED)
# Per-link error kind -> the GPU total that moves whenever one of its counters does.
GATED_BY = {"crc_flit": "crc_flit", "replay": "replay", "recovery": "recovery",
            "crc_data": "replay"}           # a data-CRC error is replayed: the replay total moves
# The GPU totals, read in one field-values call at the start of each link round: throughput
# (KiB) only where GPM does not give it.
_ERROR_TOTALS = [(field_id, SCOPE_ALL_LINKS) for field_id in ERROR_TOTAL_FIELDS.values()]
_TOTALS_WITH_THROUGHPUT = (("tx", "rx", *ERROR_TOTAL_FIELDS),
                           [(FI_NVLINK_THROUGHPUT_DATA_TX, SCOPE_ALL_LINKS),
                            (FI_NVLINK_THROUGHPUT_DATA_RX, SCOPE_ALL_LINKS), *_ERROR_TOTALS])
_TOTALS_OF_ERRORS = (tuple(ERROR_TOTAL_FIELDS), _ERROR_TOTALS)


@dataclass(frozen=True)
class GpuSample:
    links: tuple[LinkReading, ...]
    started: float                  # time.monotonic() when the gpu-tier round began
    duration: float                 # seconds the gpu-tier round took
    error_reads: dict[str, int]     # BATCHED / PER_CALL / UNSUPPORTED -> error counters read that way
    failure: str | None = None      # NvmlDeviceError reason when the GPU could not be read
    tx_bytes: int | None = None     # GPU totals over all links, read by the link tier
    rx_bytes: int | None = None
    throughput: str | None = None   # GPM or FIELD_VALUES: how per-link throughput is read
    gated: int = 0                  # per-link error counters read only when a GPU total moves
    errors_read: float | None = None     # when the gated counters served were last read per link
    link_started: float | None = None    # when the link-tier round whose values `links` carry began
    link_duration: float | None = None
    read_costs: dict[str, float] = field(default_factory=dict)   # method -> measured CPU seconds per value


@dataclass
class _Plan:
    """Which call reads which per-link value, for one set of links."""
    links: tuple[int, ...]
    batched: list[tuple[int, int, int, str]]            # (field id, scope id, link, key)
    per_call: list[tuple[int, str]] = field(default_factory=list)   # (link, error kind)
    unsupported: set[tuple[int, str]] = field(default_factory=set)
    settled: bool = False           # the first round has sorted the reads by support and cost
    costs: dict[str, float] = field(default_factory=dict)          # method -> CPU seconds per value
    throughput: bool = True         # per-link throughput in the batch (False: GPM reads it)

    @classmethod
    def for_links(cls, links: tuple[int, ...], throughput: bool = True) -> "_Plan":
        """throughput False: per-link throughput is GPM's, not the batch's."""
        batched, per_call = [], []
        for link in links:
            if throughput:
                batched.append((FI_NVLINK_THROUGHPUT_DATA_TX, link, link, "tx"))
                batched.append((FI_NVLINK_THROUGHPUT_DATA_RX, link, link, "rx"))
            for kind in ERROR_TYPES:
                ids = error_field(kind, link)
                if ids is None:
                    per_call.append((link, kind))
                else:
                    batched.append((*ids, link, kind))
        return cls(links=links, batched=batched, per_call=per_call, throughput=throughput)

    def error_reads(self) -> dict[str, int]:
        return {BATCHED: sum(1 for *_, key in self.batched if key in ERROR_TYPES),
                PER_CALL: len(self.per_call), UNSUPPORTED: len(self.unsupported)}


class GpuSampler:
    """Reads one GPU's NVLinks in its own daemon thread: the gpu tier every `interval`
    seconds, the link tier every `link_interval` seconds, the first round `phase` seconds
    after start."""

    def __init__(self, backend: NvmlBackend, gpu: GpuInfo, interval: float, link_interval: float | None = None,
                 phase: float = 0.0, history=None) -> None:
        self.backend = backend
        # The link history (exporter/nvml/history.py) each round's link states go to, or None.
        self.history = history
        self.gpu = gpu
        self.interval = interval
        self.link_interval = interval if link_interval is None else link_interval
        self.phase = phase
        self.latest: GpuSample | None = None     # replaced whole, read without a lock
        self.cpu_by_tier = {tier: 0.0 for tier in TIERS}   # CPU time of this GPU's thread, all rounds
        self.rounds_by_tier = {tier: 0 for tier in TIERS}
        self._busy_since: float | None = None
        self._static: dict[int, tuple[bool, LinkStatic]] = {}   # link -> (state when read, attributes)
        self._plan: _Plan | None = None
        self.gate_safety = GATE_SAFETY_INTERVALS * self.link_interval
        self._totals_supported = True            # some GPU-total field answers
        self._totals: dict[str, int] = {}        # the GPU totals of the latest link round
        self._gate: dict[str, int] | None = None     # error totals read just before the last per-link read
        self._errors_read: float | None = None   # when that per-link read began
        self.gate_rounds = {outcome: 0 for outcome in GATE_OUTCOMES}
        self._force_link = False
        self._gpm: bool | None = None            # per-link throughput from GPM (None: not asked yet)
        self._gpm_bytes: dict[int, list[float]] = {}   # link -> [tx, rx] bytes GPM counted since its first sample
        # The link tier's latest values (raw, as NVML answers them) and when their round began.
        self._link_values: dict[tuple[int, str], int] = {}
        self._link_started: float | None = None
        self._link_duration: float | None = None
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_tier.values())

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
        if self._wake.wait(self.phase):
            self._wake.clear()
        next_link = 0.0                                 # the first round reads both tiers
        while not self._stop.is_set():
            started = time.monotonic()
            link_round = self._force_link or started >= next_link
            self._force_link = False
            self._busy_since = started
            try:
                sample = self.sample_once(link_round)
            except Exception as exc:                 # a bug must not end sampling of this GPU
                log.exception("GPU %d: NVLink sample failed", self.gpu.index)
                sample = GpuSample((), started, time.monotonic() - started, {}, failure=type(exc).__name__)
            if link_round:
                next_link = started + self.link_interval
            if self.history is not None and not sample.failure:
                # Before the sample is served, written too where due (a write a minute on a
                # healthy node, ~ms): a scrape that serves a link down serves its sighting,
                # and a restart after it finds it on disk.
                try:
                    self.history.observe(self.gpu, sample.links)
                    self.history.save_if_due()
                except Exception:                    # a bug there must not end sampling either
                    log.exception("GPU %d: NVLink history not updated", self.gpu.index)
            with self._done:
                self.latest = sample
                self._busy_since = None
                self._done.notify_all()
            self._wake.wait(max(0.0, min(started + self.interval, next_link) - time.monotonic()))
            self._wake.clear()

    # ---- what the scrape reads ----------------------------------------------------------------

    def busy_for(self, now: float) -> float:
        """Seconds the round in progress has been running (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else max(0.0, now - since)

    def refresh(self, timeout: float = 10.0) -> bool:
        """Ask for a round of both tiers now and wait until one that began after this call
        has finished. False on timeout (e.g. the GPU hangs in NVML)."""
        asked = time.monotonic()
        self._force_link = True
        self._wake.set()
        deadline = asked + timeout
        with self._done:
            # A round that began after the call and read the link tier itself (a round that began
            # before the call could take the request into its link tier, and then leave an extra
            # forced round behind).
            while (self.latest is None or self.latest.started < asked or self.latest.link_started is None
                   or self.latest.link_started < self.latest.started):
                if self.latest is not None and self.latest.failure and self.latest.started >= asked:
                    return True                      # the GPU answered with an error: a fresh answer
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
        return True

    # ---- one round --------------------------------------------------------------------------

    def sample_once(self, link_round: bool = True) -> GpuSample:
        """One round: the gpu tier, and the link tier too when link_round (else the link
        tier's values of the previous sample are carried over with their own age)."""
        started, cpu = time.monotonic(), time.thread_time()
        try:
            states = self.backend.link_states(self.gpu)
            links = tuple(sorted(states))
            statics = {link: self._static_of(link, active) for link, active in states.items()}
        except NvmlDeviceError as exc:
            log.warning("GPU %d (%s): %s", self.gpu.index, self.gpu.pci_bus_id, exc)
            self.cpu_by_tier[GPU_TIER] += time.thread_time() - cpu
            self._link_started = None                # read the links again once it answers
            return GpuSample((), started, time.monotonic() - started, {}, failure=exc.reason)
        duration = time.monotonic() - started
        now_cpu = time.thread_time()
        self.cpu_by_tier[GPU_TIER] += now_cpu - cpu
        self.rounds_by_tier[GPU_TIER] += 1
        if link_round or not self._plan_fits(links) or self._link_started is None:
            link_started = time.monotonic()
            try:
                if self._gpm is None:
                    self._gpm = self.backend.gpm_supported(self.gpu)
                    log.info("GPU %d: per-link NVLink throughput by %s", self.gpu.index,
                             "GPM" if self._gpm else "field values (no GPM)")
                totals = self._read_totals()
                if not self._plan_fits(links):
                    self._plan = _Plan.for_links(links, throughput=not self._gpm)
                skip, gate = self._gate_decision(totals, link_started)
                self._link_values = self._read(self._plan, skip)
                if self._gpm:
                    self._count_gpm_bytes(links)
                self._totals = totals
                if not skip:                         # committed only once the per-link read succeeded
                    self._gate, self._errors_read = gate or None, link_started
            except NvmlDeviceError as exc:
                log.warning("GPU %d (%s): %s", self.gpu.index, self.gpu.pci_bus_id, exc)
                self.cpu_by_tier[LINK_TIER] += time.thread_time() - now_cpu
                self._link_started = None            # read the links again next round
                return GpuSample((), started, time.monotonic() - started, {}, failure=exc.reason)
            self._link_started, self._link_duration = link_started, time.monotonic() - link_started
            self.cpu_by_tier[LINK_TIER] += time.thread_time() - now_cpu
            self.rounds_by_tier[LINK_TIER] += 1
        values = self._link_values
        readings = []
        for link in links:
            static = statics[link]
            tx, rx = self._link_bytes(link)
            readings.append(LinkReading(
                link=link, active=states[link], version=static.version,
                remote_pci_bus_id=static.remote_pci_bus_id, remote_type=static.remote_type,
                tx_bytes=tx, rx_bytes=rx,
                errors={kind: values[(link, kind)] for kind in ERROR_TYPES if (link, kind) in values}))
        tx_total, rx_total = self._gpu_bytes(links)
        return GpuSample(tuple(readings), started, duration, self._plan.error_reads(),
                         tx_bytes=tx_total, rx_bytes=rx_total, throughput=GPM if self._gpm else FIELD_VALUES,
                         link_started=self._link_started, link_duration=self._link_duration,
                         read_costs=dict(self._plan.costs), gated=self._gated_count(),
                         errors_read=self._errors_read)

    def _plan_fits(self, links: tuple[int, ...]) -> bool:
        """The plan reads these links, and throughput the way this GPU reads it now."""
        plan = self._plan
        return plan is not None and plan.links == links and plan.throughput == (not self._gpm)

    def _link_bytes(self, link: int) -> tuple[int | None, int | None]:
        """A link's cumulative (tx, rx) bytes: GPM's count, or the field values (KiB)."""
        if self._gpm:
            counted = self._gpm_bytes.get(link)
            return (None, None) if counted is None else (int(counted[0]), int(counted[1]))
        tx, rx = self._link_values.get((link, "tx")), self._link_values.get((link, "rx"))
        return None if tx is None else tx * 1024, None if rx is None else rx * 1024

    def _gpu_bytes(self, links: tuple[int, ...]) -> tuple[int | None, int | None]:
        """The GPU's cumulative (tx, rx) bytes over all links: the sum of GPM's per-link
        counts, or the GPU-total fields (KiB)."""
        if self._gpm:
            counted = [self._gpm_bytes[link] for link in links if link in self._gpm_bytes]
            if not counted:
                return None, None
            return int(sum(c[0] for c in counted)), int(sum(c[1] for c in counted))
        tx, rx = self._totals.get("tx"), self._totals.get("rx")
        return None if tx is None else tx * 1024, None if rx is None else rx * 1024

    def _count_gpm_bytes(self, links: tuple[int, ...]) -> None:
        """Add what each link moved since the last GPM sample (the first sample counts 0).
        A GPU that refuses GPM after all reads throughput by field values from the next
        link round on (its counters then restart from the driver's, a reset to Prometheus)."""
        try:
            moved = self.backend.nvlink_bytes_moved(self.gpu, links)
        except GpmUnsupported as exc:
            log.info("GPU %d: GPM refused (%s); per-link NVLink throughput by field values", self.gpu.index, exc)
            self._gpm = False                    # _plan_fits() now asks for a new plan
            self._gpm_bytes.clear()
            return
        for link in links:
            counted = self._gpm_bytes.get(link)
            if counted is None:
                counted = self._gpm_bytes[link] = [0.0, 0.0]
            if moved and link in moved:
                counted[0] += moved[link][0]
                counted[1] += moved[link][1]

    def _static_of(self, link: int, active: bool) -> LinkStatic:
        cached = self._static.get(link)
        if cached is None or cached[0] != active:
            cached = self._static[link] = (active, self.backend.link_static(self.gpu, link))
        return cached[1]

    def _read_totals(self) -> dict[str, int]:
        """The GPU totals over all links that answer (the error kinds of ERROR_TOTAL_FIELDS,
        and "tx"/"rx" in KiB without GPM): one field-values call, ~1-2 ms of driver CPU on an
        H100 or H200."""
        if not self._totals_supported:
            return {}
        keys, fields = _TOTALS_OF_ERRORS if self._gpm else _TOTALS_WITH_THROUGHPUT
        try:
            raw = self.backend.field_values(self.gpu, fields)
        except FieldValuesUnsupported:
            raw = [None] * len(fields)
        totals = {key: value for key, value in zip(keys, raw) if value is not None}
        if not totals:
            self._totals_supported = False           # not asked again: costs a call per round
            log.info("GPU %d: no GPU-total NVLink fields; every error counter is read every link round",
                     self.gpu.index)
        elif self._gate is None and self._errors_read is None:
            log.info("GPU %d: GPU-total NVLink error fields %s answer; their per-link counters are read when "
                     "a total moves, or every %.0f s", self.gpu.index,
                     sorted(k for k in ERROR_TOTAL_FIELDS if k in totals) or "none", self.gate_safety)
        return totals

    def _gate_decision(self, totals: dict[str, int], now: float) -> tuple[set[str], dict[str, int]]:
        """(error kinds this link round need not read per link, the error totals it read).
        Only kinds the totals cover; never before a full per-link read of the current links.
        The totals are read BEFORE the per-link counters: an error landing between the two
        reads is in the per-link values but not in the snapshot kept, so the next round sees
        the total move and reads again; the other order could hide it until the safety read."""
        gate = {kind: totals[kind] for kind in ERROR_TOTAL_FIELDS if kind in totals}
        plan = self._plan
        if not gate:
            outcome = GATE_NO_TOTALS
        elif self._gate is None or self._errors_read is None or plan is None or not plan.settled:
            outcome = GATE_FIRST
        elif gate != self._gate:
            outcome = GATE_CHANGED
        elif now - self._errors_read >= self.gate_safety:
            outcome = GATE_SAFETY
        else:
            outcome = GATE_SKIPPED
        self.gate_rounds[outcome] += 1
        return (_gated_kinds(gate) if outcome == GATE_SKIPPED else set()), gate

    def _gated_count(self) -> int:
        if not self._gate or self._plan is None:
            return 0
        kinds = _gated_kinds(self._gate)
        return sum(1 for *_, key in self._plan.batched if key in kinds) + \
            sum(1 for _, kind in self._plan.per_call if kind in kinds)

    def _read(self, plan: _Plan, skip: frozenset[str] | set[str] = frozenset()) -> dict[tuple[int, str], int]:
        """Read the plan's per-link values; the error kinds in `skip` are not read and keep
        their last values."""
        values: dict[tuple[int, str], int] = {}
        if skip:
            values.update({key: value for key, value in self._link_values.items() if key[1] in skip})
        batched = [entry for entry in plan.batched if entry[3] not in skip]
        if batched:
            cpu = time.thread_time()
            try:
                raw = self.backend.field_values(self.gpu, [(fid, scope) for fid, scope, _, _ in batched])
            except FieldValuesUnsupported as exc:
                if not plan.settled:
                    log.info("GPU %d: nvmlDeviceGetFieldValues unsupported (%s); one call per error counter, "
                             "no throughput", self.gpu.index, exc)
                raw = [None] * len(batched)
            answered = sum(value is not None for value in raw)
            if not plan.settled and answered:
                plan.costs[BATCHED] = (time.thread_time() - cpu) / answered
            kept = []                                # skip is empty until the plan is settled
            for entry, value in zip(batched, raw):
                _, _, link, key = entry
                if value is not None:
                    values[(link, key)] = value
                    kept.append(entry)
                elif plan.settled:
                    kept.append(entry)               # supported before: absent this round only
                elif key in ERROR_TYPES:
                    plan.per_call.append((link, key))  # no such field here: the per-link call
            if not plan.settled:
                plan.batched = kept
        spent, calls = 0.0, 0                    # CPU of the calls that answered a value
        for link, kind in list(plan.per_call):
            if kind in skip:
                continue
            cpu = time.thread_time()
            value = self.backend.error_counter(self.gpu, link, kind)
            if value is not None:
                spent, calls = spent + time.thread_time() - cpu, calls + 1
                values[(link, kind)] = value
            elif not plan.settled:
                plan.per_call.remove((link, kind))
                plan.unsupported.add((link, kind))
        if not plan.settled:
            if calls:
                plan.costs[PER_CALL] = spent / calls
            self._choose_methods(plan, values)
            plan.settled = True
            reads = plan.error_reads()
            log.info("GPU %d: %d NVLink error counters per sample by field values (%.3f ms a value), %d by "
                     "per-counter call (%.3f ms a call), %d unsupported", self.gpu.index, reads[BATCHED],
                     plan.costs.get(BATCHED, 0) * 1e3, reads[PER_CALL], plan.costs.get(PER_CALL, 0) * 1e3,
                     reads[UNSUPPORTED])
        return values

    def _choose_methods(self, plan: _Plan, values: dict[tuple[int, str], int]) -> None:
        """Move the error counters a batch answers to per-link calls where a call costs
        less than a batched value on this GPU (measured, CPU time). A call is timed once per
        counter type when no counter was read per call yet."""
        batched_kinds = sorted({key for *_, key in plan.batched if key in ERROR_TYPES})
        if not batched_kinds or BATCHED not in plan.costs:
            return
        if PER_CALL not in plan.costs:
            spent, calls = 0.0, 0
            for kind in batched_kinds:
                link = next(link for *_, link, key in plan.batched if key == kind)
                cpu = time.thread_time()
                if self.backend.error_counter(self.gpu, link, kind) is not None:
                    spent, calls = spent + time.thread_time() - cpu, calls + 1
            if not calls:
                return
            plan.costs[PER_CALL] = spent / calls
        # Per-link values cost ~0.8 ms in an H200's driver; well under that, what was timed is Python
        # overhead and noise, and the batch (fewer calls) stays. A call must also win clearly.
        if plan.costs[BATCHED] < MEANINGFUL_COST or plan.costs[PER_CALL] >= CLEAR_WIN * plan.costs[BATCHED]:
            return
        for entry in [e for e in plan.batched if e[3] in ERROR_TYPES]:
            plan.batched.remove(entry)
            plan.per_call.append((entry[2], entry[3]))


def _gated_kinds(totals: dict[str, int]) -> set[str]:
    """The per-link error kinds that unchanged `totals` (kind -> GPU total) vouch for."""
    return {kind for kind, total in GATED_BY.items() if total in totals}
