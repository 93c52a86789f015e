"""NVLink state, topology, traffic and errors per GPU, from NVML (or the demo's simulation).

NVML is read off the scrape path (exporter/nvml/sampler.py: one thread per GPU, every
`sample_interval_seconds`); a scrape serves the latest sample of each GPU at once, with
its age, so a slow or hung GPU shows as staleness, never as a slow scrape.

No NVML on the host is a normal state, not an error: fabric_nvml_available{reason} 0 and
nothing else. One GPU that cannot be read is reported and never hides the others.

Config section `nvlink`:
  sample_interval_seconds (15): how often each GPU's link states are read (tier "gpu": what
    the link-down and flap alerts need, evaluated every minute; ~0.1 ms of driver CPU per GPU
    called back to back, ~1.4 ms after a wait, as the sampler calls them, on an H200 during a
    job). 15 s: one round per default scrape interval.
  link_sample_interval_seconds (120): how often the GPU totals (DL errors; throughput without
    GPM), the per-link throughput (one GPM sample, else field values) and the per-link error
    counters are read (tier "link"; every per-link error value costs ~0.6-1 ms of driver CPU).
    The per-link counters the DL error totals vouch for are read only when a total moved, or
    every GATE_SAFETY_INTERVALS link intervals. 120 s keeps
    2-3 samples inside the 5m rate windows of the NVLink error and throughput-collapse
    alerts (both `for: 10m`). docs/cost.md has the figures.
  series ("budget"): how much per-link and per-GPU detail is exported. An 8-GPU node has 144
    links, so every per-link family costs 144 series of a node's ~1,500 (docs/metrics.md).
    "budget" keeps what the alerts, the dashboards and the live topology read: per link the
    state, the remote endpoint, the bytes both ways (fabric_nvlink_bytes_total) and the
    error counters that have counted an error; per GPU the error totals by type, the bytes
    each way, the sample ages and its links counted per remote end and state (what a
    fleet-wide reader asks instead of every link: exporter/nvml/remotes.py); the sampler's
    cost and gate figures summed (or the worst) over the node's GPUs. "full" adds every per-link error counter (zeros too), the
    per-link bytes by direction and the sampler's figures per GPU.

Each link's latest active and inactive sightings are kept node-side across restarts in
<state_dir>/nvlink.json (exporter/nvml/history.py) and exported only for the links seen
inactive within a day: what the link-down alert and the NVLink error alert's exclusion read
instead of every link's state.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..framework import Collector, SampleCache, register, sample_of
from ..nvml import GpuInfo, NvmlBackend, NvmlUnavailable, open_backend
from ..nvml.history import RETENTION_SECONDS, LinkHistory
from ..nvml.remotes import remote_link_counts
from ..nvml.sampler import (BATCHED, GATE_OUTCOMES, GATE_SAFETY_INTERVALS, GPU_TIER, LINK_TIER, PER_CALL,
                             UNSUPPORTED, GpuSampler)
from ..statefile import StateFile, state_metrics

log = logging.getLogger("fabricscope.exporter.nvlink")

DEFAULT_SAMPLE_INTERVAL = 15.0
DEFAULT_LINK_SAMPLE_INTERVAL = 120.0
# A round still running after this many intervals is reported as stalled.
STALL_INTERVALS = 2.0
# Seconds between the GPUs' rounds: a round of several GPUs at once contends inside the
# driver (docs/cost.md), and an H200's link round takes ~90 ms.
GPU_PHASE_SECONDS = 0.25
# While NVML cannot be opened (no driver, library absent), it is tried again at most this
# often, so a driver loaded after the exporter is seen within it. Tried on every scrape,
# the failing dlopen of libnvidia-ml cost 0.35-0.40 ms of CPU per scrape (side by side on
# the 8-HCA tree of bench/scrape_latency.py, every collector on: 7.35 -> 7.00 ms).
OPEN_RETRY_SECONDS = 30.0


def sample_interval(section: dict) -> float:
    """nvlink.sample_interval_seconds (the config schema holds it to (0, 3600])."""
    return float(section.get("sample_interval_seconds", DEFAULT_SAMPLE_INTERVAL))


def full_series(section: dict) -> bool:
    """nvlink.series is "full" (the schema allows "budget", the default, and "full")."""
    return section.get("series", "budget") == "full"


def link_sample_interval(section: dict) -> float:
    """nvlink.link_sample_interval_seconds (the config schema holds it to (0, 3600])."""
    return float(section.get("link_sample_interval_seconds", DEFAULT_LINK_SAMPLE_INTERVAL))


@register
class NvlinkCollector(Collector):
    name = "nvlink"
    description = "NVLink state, remote endpoints, traffic and error counters from NVML."

    def __init__(self, ctx, clock=time.time) -> None:
        super().__init__(ctx)
        section = ctx.section("nvlink")
        self.interval = sample_interval(section)
        self.link_interval = link_sample_interval(section)
        self.full = full_series(section)
        self._lock = threading.Lock()
        self._backend: NvmlBackend | None = ctx.sources.get("nvml")
        self._gpus: list[GpuInfo] = []
        self._link_cache: dict[str, tuple] = {}   # GPU -> (what its per-link samples show, the samples)
        self.samplers: list[GpuSampler] = []
        self._unavailable: str | None = None
        self._logged_reason: str | None = None
        self._next_open = 0.0                         # monotonic time of the next open attempt
        self.history = LinkHistory(StateFile(ctx.state_dir / "nvlink.json"), clock)
        self._state_samples = SampleCache()
        try:
            with self._lock:
                self._open()                          # sampling starts now, not at the first scrape
        except Exception:                             # e.g. a GPU refusing enumeration: the scrape retries
            log.exception("NVML GPUs could not be listed; retrying at the next scrape")

    def _open(self) -> NvmlBackend | None:
        # Retried while unavailable (every OPEN_RETRY_SECONDS): the driver may load after
        # the exporter.
        if self._backend is None and time.monotonic() >= self._next_open:
            self._next_open = time.monotonic() + OPEN_RETRY_SECONDS
            try:
                self._backend = open_backend()
                self._unavailable = None
            except NvmlUnavailable as exc:
                self._unavailable = exc.reason
                if self._logged_reason != exc.reason:
                    log.info("NVML unavailable (%s); nvlink collector exports fabric_nvml_available 0", exc)
                    self._logged_reason = exc.reason
        if self._backend is not None and not self.samplers:
            self._gpus = self._backend.gpus()
            self.samplers = [GpuSampler(self._backend, gpu, self.interval, self.link_interval,
                                        phase=position * GPU_PHASE_SECONDS, history=self.history)
                             for position, gpu in enumerate(self._gpus)]
            for sampler in self.samplers:
                sampler.start()
        return self._backend

    def refresh(self, timeout: float = 10.0) -> bool:
        """Take a fresh sample of every GPU now (tests, benchmarks); False if one timed out."""
        return all([sampler.refresh(timeout) for sampler in self.samplers])

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            backend = self._open()
        available = GaugeMetricFamily("fabric_nvml_available",
                                      "1 if NVML answered; reason says why not otherwise.", labels=["reason"])
        available.add_metric([self._unavailable or "ok"], 0.0 if backend is None else 1.0)
        yield available
        if backend is not None:
            yield from self._families()

    def _families(self) -> Iterable[Metric]:
        gpu_info = GaugeMetricFamily("fabric_gpu_info", "GPU identity; always 1.",
                                     labels=["gpu", "uuid", "name", "pci_bus_id"])
        state = GaugeMetricFamily("fabric_nvlink_state", "1 if the NVLink is active.", labels=["gpu", "link"])
        info = GaugeMetricFamily("fabric_nvlink_info", "NVLink version and remote endpoint; always 1.",
                                 labels=["gpu", "link", "version", "remote_pci_bus_id", "remote_type"])
        remote_links = GaugeMetricFamily("fabric_nvlink_remote_links", "The GPU's NVLinks to one remote end (an "
                                         "NVSwitch or a peer GPU, by PCI bus id) in a state: active (always there, 0 "
                                         "when none is), inactive (only while one is not active); from the same "
                                         "sample as fabric_nvlink_state.",
                                         labels=["gpu", "remote_pci_bus_id", "remote_type", "state"])
        link_bytes = CounterMetricFamily("fabric_nvlink_bytes", "Data bytes sent and received on the link (the "
                                         "sum of the two directions of fabric_nvlink_transmit_bytes_total and "
                                         "_receive_bytes_total, which nvlink.series: full exports).",
                                         labels=["gpu", "link"])
        # Names written out (the rules test finds the metrics by them); one help text each way.
        tx = CounterMetricFamily("fabric_nvlink_transmit_bytes", _link_bytes_help("sent", "TX"),
                                 labels=["gpu", "link"])
        rx = CounterMetricFamily("fabric_nvlink_receive_bytes", _link_bytes_help("received", "RX"),
                                 labels=["gpu", "link"])
        errors = CounterMetricFamily("fabric_nvlink_errors", "NVLink data-link error counters of a link; absent "
                                     "where the GPU answers NOT_SUPPORTED, and while 0 unless nvlink.series is "
                                     "full.", labels=["gpu", "link", "type"])
        gpu_errors = CounterMetricFamily("fabric_nvlink_gpu_errors", "NVLink data-link error counters summed over "
                                         "the GPU's links, by type (zeros too).", labels=["gpu", "type"])
        gpu_tx = CounterMetricFamily("fabric_nvlink_gpu_transmit_bytes", _gpu_bytes_help("sent", "TX"),
                                     labels=["gpu"])
        gpu_rx = CounterMetricFamily("fabric_nvlink_gpu_receive_bytes", _gpu_bytes_help("received", "RX"),
                                     labels=["gpu"])
        read_errors = GaugeMetricFamily("fabric_nvml_device_read_errors", "1 when the GPU's last sample could "
                                        "not read it, or its sample has been running for over "
                                        f"{STALL_INTERVALS:g} intervals (sample_stalled).", labels=["gpu", "reason"])
        age = GaugeMetricFamily("fabric_nvlink_sample_age_seconds", "Time since the round that read the values "
                                "served for the GPU began, per tier: gpu (link state, every sample_interval_seconds), "
                                "link (GPU totals, per-link throughput and error counters, every "
                                "link_sample_interval_seconds; gated error counters were verified unchanged "
                                "then, see fabric_nvlink_error_counter_read_age_seconds).", labels=["gpu", "tier"])
        # The sampler's own figures: per GPU with nvlink.series: full, else one series per
        # node (summed, or the worst GPU's), which is what a cost or freshness check reads.
        figures = _SamplerFigures(self.full)
        throughput_method = figures.family(GaugeMetricFamily, "fabric_nvlink_throughput_method", "How the GPUs' "
                                           "per-link throughput is read: gpm (one GPU Performance Monitoring sample "
                                           "a link round) or field_values (one driver round trip per link and "
                                           "direction); the number of GPUs read that way (1 per GPU).", ["method"],
                                           sum)
        gated = figures.family(GaugeMetricFamily, "fabric_nvlink_gated_error_counters", "Per-link error counters "
                               "the GPU reads only when the DL error total vouching for them moved (crc_flit, replay "
                               "and recovery their own; crc_data the replay total), or every "
                               f"{GATE_SAFETY_INTERVALS} link intervals; 0 where the GPU answers no totals (every "
                               "counter read every link round).", [], sum)
        errors_age = figures.family(GaugeMetricFamily, "fabric_nvlink_error_counter_read_age_seconds", "Time since "
                                    "the round that last read the GPU's per-link error counters from NVML began; "
                                    "between reads the gated counters served are the last read, verified current by "
                                    "unchanged GPU totals at each link round.", [], max)
        gate_rounds = figures.family(CounterMetricFamily, "fabric_nvlink_error_counter_rounds", "Link rounds by "
                                     "what they did with the gated per-link error counters: read (first, "
                                     "totals_changed, safety, no_totals) or not (unchanged).", ["outcome"], sum)
        duration = figures.family(GaugeMetricFamily, "fabric_nvlink_sample_duration_seconds", "Time the GPU's "
                                  "latest round of the tier took in NVML.", ["tier"], max)
        reads = figures.family(GaugeMetricFamily, "fabric_nvlink_error_counter_reads", "NVLink error counters read "
                               "per link round, by how: field_values (one batched nvmlDeviceGetFieldValues), "
                               "per_call (nvmlDeviceGetNvLinkErrorCounter each), unsupported (neither); the "
                               "cheaper of the two per value, as measured on the GPU.", ["method"], sum)
        read_cost = figures.family(GaugeMetricFamily, "fabric_nvlink_read_cost_seconds", "CPU time per value of "
                                   "each way of reading a per-link value, measured on the GPU's first link round.",
                                   ["method"], max)
        cpu = figures.family(CounterMetricFamily, "fabric_nvlink_sample_cpu_seconds", "CPU time (user + system) "
                             "the GPU's sampling thread has used per tier, NVML calls included.", ["tier"], sum)
        # Unix seconds of the node's clock (what the rules compare with time()).
        last_active = GaugeMetricFamily("fabric_nvlink_last_active_timestamp_seconds", "When the link was last "
                                        "seen active (node clock); only for links with a down history (see "
                                        "fabric_nvlink_last_inactive_timestamp_seconds), and absent for a link not "
                                        "seen active since its history began. Kept across exporter restarts.",
                                        labels=["gpu", "link"])
        last_inactive = GaugeMetricFamily("fabric_nvlink_last_inactive_timestamp_seconds", "When the link was "
                                          "last seen inactive (node clock); only for links seen inactive in the "
                                          f"last {RETENTION_SECONDS / 3600:g} h. Kept across exporter restarts.",
                                          labels=["gpu", "link"])
        interval = GaugeMetricFamily("fabric_nvlink_sample_interval_seconds", "Configured time between rounds "
                                     "of a tier.", labels=["tier"])
        interval.add_metric([GPU_TIER], self.interval)
        interval.add_metric([LINK_TIER], self.link_interval)
        now = time.monotonic()
        for gpu, sampler in zip(self._gpus, self.samplers):
            g = str(gpu.index)
            gpu_info.add_metric([g, gpu.uuid, gpu.name, gpu.pci_bus_id], 1.0)
            for tier, seconds in sampler.cpu_by_tier.items():
                cpu.add(g, [tier], seconds)
            for outcome in GATE_OUTCOMES:
                gate_rounds.add(g, [outcome], float(sampler.gate_rounds[outcome]))
            if sampler.busy_for(now) > STALL_INTERVALS * self.interval:
                read_errors.add_metric([g, "sample_stalled"], 1.0)
            sample = sampler.latest
            if sample is None:                        # first round still running
                continue
            age.add_metric([g, GPU_TIER], max(0.0, now - sample.started))
            duration.add(g, [GPU_TIER], sample.duration)
            if sample.failure:
                read_errors.add_metric([g, sample.failure], 1.0)
                continue
            if sample.link_started is not None:
                age.add_metric([g, LINK_TIER], max(0.0, now - sample.link_started))
                duration.add(g, [LINK_TIER], sample.link_duration or 0.0)
            if sample.throughput:
                throughput_method.add(g, [sample.throughput], 1.0)
            if sample.tx_bytes is not None:
                gpu_tx.add_metric([g], float(sample.tx_bytes))
            if sample.rx_bytes is not None:
                gpu_rx.add_metric([g], float(sample.rx_bytes))
            for method in (BATCHED, PER_CALL, UNSUPPORTED):
                reads.add(g, [method], float(sample.error_reads.get(method, 0)))
            for method, seconds in sorted(sample.read_costs.items()):
                read_cost.add(g, [method], seconds)
            gated.add(g, [], float(sample.gated))
            if sample.errors_read is not None:
                errors_age.add(g, [], max(0.0, now - sample.errors_read))
            per_link = (state, info, link_bytes, tx, rx, errors, gpu_errors, remote_links)
            for family, samples in zip(per_link, self._link_samples(g, sample, per_link)):
                family.samples.extend(samples)
            # The links of this sample only, as fabric_nvlink_state: a GPU that cannot be read
            # (or a link gone) shows no sightings, as it shows no state.
            sightings = self.history.sightings(gpu)
            for reading in sample.links:
                seen = sightings.get(reading.link)
                if seen is None:
                    continue
                labels = {"gpu": g, "link": str(reading.link)}
                if seen[0] is not None:
                    last_active.samples.append(sample_of(last_active, labels, seen[0]))
                last_inactive.samples.append(sample_of(last_inactive, labels, seen[1]))
        self._state_samples.next_scrape()
        history = self.history
        yield from (gpu_info, state, info, remote_links, link_bytes, tx, rx, gpu_tx, gpu_rx, errors, gpu_errors,
                    last_active, last_inactive, read_errors, age, *figures.families(), interval,
                    *state_metrics(self.name, history.load_problem, history.write_errors, None,
                                   self._state_samples))

    def _link_samples(self, g: str, sample, families: tuple[Metric, ...]) -> tuple[list, ...]:
        """The per-link samples of one GPU for `families` (state, info, bytes, tx, rx, errors,
        the GPU's error totals and its links per remote end: most of the collector's series
        and time), built once per
        link round and link-state set: between link rounds the values served are the same,
        so later scrapes reuse them."""
        key = (sample.link_started, tuple((r.link, r.active, r.version, r.remote_pci_bus_id, r.remote_type)
                                          for r in sample.links))
        cached = self._link_cache.get(g)
        if cached is not None and cached[0] == key:
            return cached[1]
        state, info, link_bytes, tx, rx, errors, gpu_errors, remote_links = families
        rows: tuple[list, ...] = ([], [], [], [], [], [], [], [])
        totals: dict[str, int] = {}
        for reading in sample.links:
            link = str(reading.link)
            labels = {"gpu": g, "link": link}
            rows[0].append(sample_of(state, labels, 1.0 if reading.active else 0.0))
            rows[1].append(sample_of(info, {"gpu": g, "link": link,
                                            "version": "" if reading.version is None else str(reading.version),
                                            "remote_pci_bus_id": reading.remote_pci_bus_id or "",
                                            "remote_type": reading.remote_type or ""}, 1.0))
            directions = [value for value in (reading.tx_bytes, reading.rx_bytes) if value is not None]
            if directions:
                rows[2].append(sample_of(link_bytes, labels, float(sum(directions))))
            if self.full and reading.tx_bytes is not None:
                rows[3].append(sample_of(tx, labels, float(reading.tx_bytes)))
            if self.full and reading.rx_bytes is not None:
                rows[4].append(sample_of(rx, labels, float(reading.rx_bytes)))
            for kind, value in sorted(reading.errors.items()):
                totals[kind] = totals.get(kind, 0) + value
                # A link's counter appears with its first error: the GPU's total (always
                # there) is what moves from a value it had before.
                if value or self.full:
                    rows[5].append(sample_of(errors, {"gpu": g, "link": link, "type": kind}, float(value)))
        rows[6].extend(sample_of(gpu_errors, {"gpu": g, "type": kind}, float(value))
                       for kind, value in sorted(totals.items()))
        rows[7].extend(sample_of(remote_links, {"gpu": g, "remote_pci_bus_id": bus, "remote_type": kind,
                                                "state": link_state}, float(count))
                       for (bus, kind, link_state), count in remote_link_counts(sample.links).items())
        self._link_cache[g] = (key, rows)
        return rows

    def close(self) -> None:
        with self._lock:
            for sampler in self.samplers:          # all at once: hung GPUs must not add up
                sampler.signal_stop()
            deadline = time.monotonic() + 2.0
            for sampler in self.samplers:
                sampler.stop(max(0.0, deadline - time.monotonic()))
            self.samplers = []
            if self._backend is not None and "nvml" not in self.ctx.sources:
                self._backend.close()
            self._backend = None


class _SamplerFigures:
    """Families of the sampler's own figures, each value added per GPU: kept per GPU (`gpu`
    label first) when per_gpu, else combined over the node's GPUs (sum, or max for the
    worst GPU) into one series per remaining label set."""

    def __init__(self, per_gpu: bool) -> None:
        self.per_gpu = per_gpu
        self._families: list[_Figure] = []

    def family(self, kind, name: str, documentation: str, labels: list[str], combine) -> "_Figure":
        figure = _Figure(kind(name, documentation, labels=(["gpu"] if self.per_gpu else []) + labels),
                         combine, self.per_gpu)
        self._families.append(figure)
        return figure

    def families(self) -> list[Metric]:
        return [figure.filled() for figure in self._families]


class _Figure:
    def __init__(self, family: Metric, combine, per_gpu: bool) -> None:
        self.metric, self.combine, self.per_gpu = family, combine, per_gpu
        self.values: dict[tuple[str, ...], float] = {}     # insertion order: GPU order

    def add(self, gpu: str, labels: list[str], value: float) -> None:
        key = tuple([gpu, *labels] if self.per_gpu else labels)
        previous = self.values.get(key)
        self.values[key] = value if previous is None else self.combine((previous, value))

    def filled(self) -> Metric:
        for key, value in self.values.items():
            self.metric.add_metric(list(key), value)
        return self.metric


def _link_bytes_help(verb: str, direction: str) -> str:
    return (f"Data bytes {verb} on the link: counted from GPM's per-link rates since the exporter's first sample, "
            f"or the driver's NVLINK_THROUGHPUT_DATA_{direction} without GPM (fabric_nvlink_throughput_method).")


def _gpu_bytes_help(verb: str, direction: str) -> str:
    return (f"Data bytes {verb} on all the GPU's NVLinks: the sum of its links' counters with GPM, else the "
            f"driver's all-links NVLINK_THROUGHPUT_DATA_{direction}; read every link_sample_interval_seconds.")
