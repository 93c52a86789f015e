"""NCCL collectives per (communicator, rank, op): uprobes, the ingest API, or the demo.

The tracker (exporter/nccl/tracker.py) does the accounting; this module wires its event
sources and maps its snapshot to metric families. Config section `nccl`:
  hang_multiplier (3.0), min_completed (5), window (20), max_comms (128),
  max_series (4096), idle_evict_seconds (3600), boundary_ops (64): see NcclTracker;
  ingest (false): accept POST /nccl/operations (put it behind basic_auth_users);
  uprobes (true): attach to libnccl in running processes;
  rescan_seconds: how often every process's maps are read: 300 s as a safety net when the
    exec/dlopen hints (exporter/bpf/procwatch.bpf.c) run, 2 s when they cannot;
  bpf_object: path of nccl.bpf.o (default: exporter/bpf/nccl.bpf.o).
fabric_nccl_rank_info places each local rank on its GPU and job (exporter/nccl/placement.py,
docs/slow-rank-to-cable.md).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ..bpf_loader import elfsym
from ..framework import Collector, SampleCache, register
from ..nccl.ingest import IngestRoutes
from ..nccl.placement import RankPlacement, RankProcess
from ..nccl.tracker import BOUNDARY_SLOTS, NcclTracker
from ..nvml import NvmlUnavailable, open_backend

log = logging.getLogger("fabricscope.exporter.nccl")

DEFAULT_OBJECT = Path(__file__).resolve().parent.parent / "bpf" / "nccl.bpf.o"
LABELS = ["comm", "rank", "op"]
# How long a host without NVML waits before the rank -> GPU lookup tries it again.
NVML_RETRY_SECONDS = 60.0


def _optional_seconds(value) -> float | None:
    return None if value is None else float(value)


@register
class NcclCollector(Collector):
    name = "nccl"
    description = "NCCL collectives from uprobes on libnccl and POST /nccl/operations; hang detection."

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        section = ctx.section("nccl")   # validated: exporter/config.py NcclSection
        self.source = ctx.sources.get("nccl")
        clock = getattr(self.source, "clock", time.time)
        self.tracker = NcclTracker.from_config(section, clock=clock)
        # Families built once; per-op histograms that did not move served again.
        self.samples = SampleCache()
        ingest = section.get("ingest", False)
        self.ingest = IngestRoutes(self.tracker, enabled=ingest)
        self.uprobes = None
        if self.source is not None:
            self.source.attach(self.tracker)          # the demo: simulated calls
        elif section.get("uprobes", True):
            from ..nccl.uprobe import UprobeSource

            self.uprobes = UprobeSource(ctx.procfs, ctx.sysfs, Path(section.get("bpf_object", DEFAULT_OBJECT)),
                                        rescan_seconds=_optional_seconds(section.get("rescan_seconds")))
            self.uprobes.attach(self.tracker)
        self._nvml = ctx.sources.get("nvml")
        self._nvml_owned = False
        self._nvml_retry_at = 0.0
        self.placement = RankPlacement(ctx.procfs, self._nvml_backend)

    def _nvml_backend(self):
        """NVML for the rank -> GPU lookup, opened only once there are ranks to place."""
        if self._nvml is None and time.monotonic() >= self._nvml_retry_at:
            try:
                self._nvml, self._nvml_owned = open_backend(), True
            except NvmlUnavailable as exc:
                log.debug("NVML unavailable for rank placement (%s); using device nodes", exc)
                self._nvml_retry_at = time.monotonic() + NVML_RETRY_SECONDS
        return self._nvml

    def routes(self):
        return self.ingest.routes()

    def close(self) -> None:
        if self.uprobes is not None:
            self.uprobes.close()
        if self._nvml_owned:
            self.placement.wait(2.0)                  # a lookup may be in NVML right now
            self._nvml.close()
            self._nvml, self._nvml_owned = None, False

    def collect(self) -> Iterable[Metric]:
        self.samples.next_scrape()
        empty, family = self.samples.empty, self.samples.family
        # First, before any other work: the closer to the scrape's start, the tighter the rules'
        # estimate of this node's clock offset (rules/mixin/rules/nccl.libsonnet, "clocks").
        # The wall clock, also in the demo: its simulated NCCL times run behind it by up to a
        # tick, the same on every node, and a clock that ticks would look unsettled.
        scraped_at = family(GaugeMetricFamily, "fabric_nccl_scrape_timestamp_seconds", "This node's wall clock when "
                            "the scrape began (UNIX seconds): against the scrape's own timestamp it "
                            "gives the node's clock offset.", (),
                            (((), time.time()),))
        snap = self.tracker.snapshot()
        info = empty(GaugeMetricFamily, "fabric_nccl_comm_info", "Communicator membership of a local rank; always 1.",
                     ("comm", "rank", "nranks"))
        for comm, rank, nranks in snap.comms:
            info.add_metric([comm, str(rank), str(nranks)], 1.0)
        calls = empty(CounterMetricFamily, "fabric_nccl_calls", "Collective calls entered.", LABELS)
        nbytes = empty(CounterMetricFamily, "fabric_nccl_bytes", "Bytes of the calls: count x datatype size "
                       "(AllGather: per-rank send count).", LABELS)
        enqueue = empty(HistogramMetricFamily, "fabric_nccl_enqueue_seconds", "API entry to return (enqueue time, "
                        "not completion: NCCL calls are asynchronous).", LABELS)
        duration = empty(HistogramMetricFamily, "fabric_nccl_operation_duration_seconds", "Completed operations: "
                         "start to the rank's next call on the comm, or to `end` when "
                         "ingested.", LABELS)
        last = empty(GaugeMetricFamily, "fabric_nccl_last_call_timestamp_seconds", "When the rank last entered this "
                     "collective (UNIX seconds).", LABELS)
        average = empty(GaugeMetricFamily, "fabric_nccl_completed_average_seconds", "Rolling average duration of the "
                        f"last {self.tracker.window} completed operations.", LABELS)
        for op in snap.ops:
            labels = [op.comm, str(op.rank), op.op]
            calls.add_metric(labels, op.calls)
            nbytes.add_metric(labels, op.nbytes)
            self.samples.histogram(enqueue, labels, op.enqueue, op.enqueue_sum)
            self.samples.histogram(duration, labels, op.duration, op.duration_sum)
            last.add_metric(labels, op.last_call)
            if op.completed_average is not None:
                average.add_metric(labels, op.completed_average)
        inflight = empty(GaugeMetricFamily, "fabric_nccl_inflight_elapsed_seconds", "Elapsed time of the operation "
                         "in flight (absent when none).", LABELS)
        hanging = empty(GaugeMetricFamily, "fabric_nccl_hanging", f"1 when the in-flight operation's elapsed time "
                        f"exceeds {self.tracker.hang_multiplier:g}x the rolling average.",
                        LABELS)
        active = {(a.comm, a.rank, a.op): a for a in snap.active}
        for a in snap.active:
            inflight.add_metric([a.comm, str(a.rank), a.op], a.elapsed)
        for op in snap.ops:
            current = active.get((op.comm, op.rank, op.op))
            hanging.add_metric([op.comm, str(op.rank), op.op], 1.0 if current and current.hanging else 0.0)
        yield from (scraped_at, info, calls, nbytes, enqueue, duration, last, average, inflight, hanging)
        yield self._rank_info()
        yield from self._arrival_families(snap)
        yield from self._housekeeping(snap)
        if self.uprobes is not None:
            yield from self._uprobe_families()

    def _rank_info(self) -> Metric:
        empty = self.samples.empty
        info = empty(GaugeMetricFamily, "fabric_nccl_rank_info", "The GPU (NVML index, empty if unknown) and job id "
                     "(empty if none) of a local rank, joinable on (node, gpu); always 1.",
                     # job_id, not job: Prometheus owns `job` (the scrape job) on every series.
                     ("comm", "rank", "nranks", "gpu", "job_id"))
        source = self.source if self.source is not None else self.uprobes
        listed = source.rank_processes() if source is not None and hasattr(source, "rank_processes") else []
        # The process seen initialising the comm first; a pid an ingested record names after.
        listed = sorted(listed) + sorted(self.tracker.rank_processes())
        seen = set()
        ranks = []
        for comm, rank, nranks, pid in listed:
            if (comm, rank) not in seen:          # one series per rank, whatever pids claim it
                seen.add((comm, rank))
                ranks.append(RankProcess(comm, rank, nranks, pid))
        if ranks:
            for r in self.placement.resolve(ranks):
                info.add_metric([r.comm, str(r.rank), str(r.nranks), r.gpu, r.job_id], 1.0)
        return info

    def _arrival_families(self, snap) -> Iterable[Metric]:
        empty = self.samples.empty
        lag = empty(HistogramMetricFamily, "fabric_nccl_arrival_lag_seconds", "Per collective: when the rank entered "
                    "it minus the earliest entry among the comm's ranks on this node (absent "
                    "with one local rank: see fabric_nccl_sequence_boundary_*).",
                    ("comm", "rank"))
        sequence = empty(GaugeMetricFamily, "fabric_nccl_operation_sequence", "Collectives the rank has entered on "
                         "the comm (Send/Recv excluded): the k of its latest op.",
                         ("comm", "rank"))
        # Each rank keeps its last BOUNDARY_SLOTS boundaries (k a multiple of boundary_ops) in
        # slot (k / boundary_ops) % BOUNDARY_SLOTS; the node exports the slots all its ranks agree on.
        boundary = empty(GaugeMetricFamily, "fabric_nccl_sequence_boundary", "The sequence number k (a multiple "
                         f"of boundary_ops, {self.tracker.boundary_ops}) every local rank of the comm holds in "
                         f"this slot of its last {BOUNDARY_SLOTS} boundaries (slot (k / boundary_ops) % "
                         f"{BOUNDARY_SLOTS}); absent while they differ.", ("comm", "slot"))
        boundary_start = empty(GaugeMetricFamily, "fabric_nccl_sequence_boundary_entry_timestamp_seconds", "When the "
                               "comm's first local rank entered the op of fabric_nccl_sequence_boundary in this "
                               "slot (UNIX seconds; joins nodes).", ("comm", "slot"))
        for seq in snap.sequences:
            labels = [seq.comm, str(seq.rank)]
            sequence.add_metric(labels, seq.sequence)
            if seq.lag_count:
                self.samples.histogram(lag, labels, seq.lag, seq.lag_sum)
        for comm, slot, k, entered in snap.boundaries:
            boundary.add_metric([comm, str(slot)], k)
            boundary_start.add_metric([comm, str(slot)], entered)
        culprit = empty(GaugeMetricFamily, "fabric_nccl_hang_culprit", "1 while a hang on the comm names this rank: "
                        "not_entered (its sequence is behind its peers') or stuck_in_call (its "
                        "call has not returned while a peer's has).", ("comm", "rank", "reason"))
        for c in snap.culprits:
            culprit.add_metric([c.comm, str(c.rank), c.reason], 1.0)
        yield from (lag, sequence, boundary, boundary_start, culprit)

    def _housekeeping(self, snap) -> Iterable[Metric]:
        empty, family = self.samples.empty, self.samples.family
        evicted = empty(CounterMetricFamily, "fabric_nccl_comms_evicted", "Communicators dropped from memory: idle "
                        "past idle_evict_seconds, or over max_comms/max_series.", ("reason",))
        for reason, count in sorted(snap.evicted.items()):
            evicted.add_metric([reason], count)
        dropped = family(CounterMetricFamily, "fabric_nccl_calls_dropped", "Calls not tracked because max_series was "
                         "reached by a single communicator.", (),
                         (((), snap.dropped_calls),))
        requests = empty(CounterMetricFamily, "fabric_nccl_ingest_requests", "POST /nccl/operations requests "
                         "(disabled: refused because the nccl.ingest setting is off).",
                         ("result",))
        for result, count in sorted(self.ingest.requests.items()):
            requests.add_metric([result], count)
        yield from (evicted, dropped, requests)

    def _uprobe_families(self) -> Iterable[Metric]:
        empty, family = self.samples.empty, self.samples.family
        status = self.uprobes.status()
        available = empty(GaugeMetricFamily, "fabric_nccl_uprobes_available", "1 if the NCCL uprobe program is "
                          "loaded; reason says why not otherwise.", ("reason",))
        available.add_metric([status.reason], 1.0 if status.reason == "ok" else 0.0)
        attached = empty(GaugeMetricFamily, "fabric_nccl_probe_attached", "1 if uprobes are attached to this NCCL "
                         "library file.", ("library",))
        for library, ok in sorted(status.libraries.items()):
            attached.add_metric([library], 1.0 if ok else 0.0)
        traced = family(GaugeMetricFamily, "fabric_nccl_processes_traced", "Processes that map a probed NCCL library.", (),
                        (((), status.processes_traced),))
        exited = family(CounterMetricFamily, "fabric_nccl_processes_exited", "Traced processes that exited (their "
                        "open operations are dropped).", (),
                        (((), status.processes_exited),))
        lost = family(CounterMetricFamily, "fabric_nccl_events_lost", "Uprobe events dropped in the kernel because "
                      "the ring buffer was full.", (),
                      (((), status.events_lost),))
        invalid = empty(CounterMetricFamily, "fabric_nccl_events_invalid", "Uprobe events that could not be used.",
                        ("reason",))
        for reason, count in sorted(status.invalid.items()):
            invalid.add_metric([reason], count)
        skipped = empty(CounterMetricFamily, "fabric_nccl_library_files_skipped", "Mapped library files whose ELF "
                        "symbols could not be read (truncated, not ELF64, malformed).",
                        ("reason",))
        for reason, count in sorted(elfsym.MALFORMED_FILES.items()):
            skipped.add_metric([reason], count)
        named = empty(GaugeMetricFamily, "fabric_nccl_comm_identities", "Local ranks' communicators by where their "
                      "identity came from: init (its init was probed), memory (initialised before "
                      "the probes: read from the communicator), unknown (reason says why); and by "
                      "how their operations are numbered (join): counter (NCCL's own operation "
                      "counter), init (counted from the probed init), none (not judged: see "
                      "fabric_nccl_rank_numbering).",
                      ("source", "reason", "join"))
        for (source, reason, join), count in sorted(status.identities.items()):
            named.add_metric([source, reason, join], count)
        numbering = empty(GaugeMetricFamily, "fabric_nccl_rank_numbering", "1 per local rank: how its operations "
                          "are numbered, the same on every rank and node: counter (NCCL's own counter, seen "
                          "to move by exactly the rank's calls), init (counted from the probed init), none "
                          "(no exact number: no arrival lag, sequence or culprit for the rank; reason says "
                          "why).", ("comm", "rank", "numbering", "reason"))
        for (comm, rank), (how, reason) in sorted(status.numbering.items()):
            numbering.add_metric([comm, str(rank), how, reason], 1.0)
        yield from (available, attached, traced, exited, lost, invalid, skipped, named, numbering)
