"""Collector framework: registration, enable/disable flags, per-collector self-metrics.

Each collector module in exporter/collectors/ subclasses Collector and decorates it with
@register. The ScrapeCollector runs every enabled collector on each scrape, times it,
and isolates failures: an exception in one collector becomes
fabric_scrape_collector_success{collector="x"} 0 and a log line, never a lost scrape.

Every collector runs on a worker thread under a deadline, one after another
(ScrapeCollector._start_in_turn says why not all at once); one that is slow or stuck is
left on its thread and the others go on on another. One that misses the deadline
(a read blocked in the kernel, a hung driver) is reported as failed and its families are
left out; while it is still stuck, later scrapes do not start it again, so a stuck
source costs one thread, not one more per scrape, and never the other collectors.
"""
from __future__ import annotations

import abc
import importlib
import logging
import pkgutil
import threading
import time
from typing import Any, Callable, ClassVar, Hashable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PromCollector
from prometheus_client.samples import Sample

from .context import Context

log = logging.getLogger("fabricscope.exporter")

# An HTTP route a collector contributes to the exporter's web server:
# handler(body: bytes, query: dict[str, list[str]]) -> (status, content_type, body).
RouteHandler = Callable[[bytes, dict], tuple[int, str, bytes]]

COLLECTORS: dict[str, type["Collector"]] = {}


class Collector(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str] = ""
    enabled_by_default: ClassVar[bool] = True
    # True for a collector that serves its unchanged samples as the same objects itself
    # (a SampleCache of its own); the others' samples are matched up by _Runner.
    serves_unchanged_samples: ClassVar[bool] = False

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        """Add collector-specific flags (named --collector.<name>.<flag>)."""

    @abc.abstractmethod
    def collect(self) -> Iterable[Metric]:
        """Read the source now and yield fresh metric families."""

    def routes(self) -> dict[tuple[str, str], RouteHandler]:
        """(method, path) -> handler for HTTP endpoints this collector serves."""
        return {}

    def close(self) -> None:
        """Release probes, threads and files."""


def register(cls: type[Collector]) -> type[Collector]:
    if cls.name in COLLECTORS and COLLECTORS[cls.name] is not cls:
        raise ValueError(f"collector {cls.name!r} registered twice")
    COLLECTORS[cls.name] = cls
    return cls


def load_collector_modules() -> dict[str, type[Collector]]:
    """Import every module in exporter.collectors so their @register runs."""
    from . import collectors

    for info in pkgutil.iter_modules(collectors.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{collectors.__name__}.{info.name}")
    return COLLECTORS


def sample_of(family: Metric, labels: dict[str, str], value: float) -> Sample:
    """A counter's or gauge's sample, the labels given as a dict: for families of thousands of
    series (NVLink per link, InfiniBand per counter) add_metric's per-call label zipping was
    40% of the collector's time. The dict may be shared between samples: nothing downstream
    mutates it."""
    return Sample(series_name(family), labels, value)


def series_name(family: Metric) -> str:
    """The name of a counter's or gauge's samples: a counter's with _total."""
    return family.name + "_total" if family.type == "counter" else family.name


def add_sample(family: Metric, labels: dict[str, str], value: float) -> None:
    """family.add_metric, through sample_of."""
    family.samples.append(sample_of(family, labels, value))


class SampleCache:
    """A collector's samples kept from one scrape to the next: a series whose value did not
    change is served as the same Sample object, whose formatted line the renderer keeps
    (exposition.Renderer), so it is neither built nor formatted again. Most of a node's
    series are error counters that never move. Series not served on a scrape are dropped
    at the next one, so the cache holds at most two scrapes' series."""

    def __init__(self) -> None:
        self._last: dict[tuple, Sample] = {}
        self._now: dict[tuple, Sample] = {}
        self._last_histograms: dict[tuple, tuple] = {}
        self._now_histograms: dict[tuple, tuple] = {}
        self._families: dict[str, tuple[Metric, str]] = {}   # name -> (family, its samples' name)
        self._last_groups: dict[tuple, tuple] = {}
        self._now_groups: dict[tuple, tuple] = {}

    def next_scrape(self) -> None:
        self._last, self._now = self._now, {}
        self._last_histograms, self._now_histograms = self._now_histograms, {}
        self._last_groups, self._now_groups = self._now_groups, {}

    def histogram(self, family: Metric, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                  sum_value: float) -> None:
        """family.add_metric of a HistogramMetricFamily, whose ~20 bucket samples are served
        again as long as the buckets and the sum did not change: building them was most of
        the nccl collector's time."""
        key = (family.name, tuple(labels))
        shape = (tuple(buckets), sum_value)
        cached = self._last_histograms.get(key)
        if cached is None or cached[0] != shape:
            start = len(family.samples)
            family.add_metric(labels, buckets, sum_value)
            cached = (shape, family.samples[start:])
        else:
            family.samples.extend(cached[1])
        self._now_histograms[key] = cached

    def samples(self, name: str, label_names: tuple[str, ...],
                rows: Iterable[tuple[tuple[str, ...], float]], keys: list | None = None) -> list[Sample]:
        """One family's samples from (label values, value) rows, each one unchanged since the
        last scrape served as the same object. A family at a time, not a sample at a time:
        the call per sample was a fifth of the infiniband collector's exposition. `keys`,
        when given, gets each sample's cache key."""
        last, now = self._last, self._now
        out = []
        for label_values, value in rows:
            key = (name, label_values)
            sample = last.get(key)
            if sample is None or sample.value != value:
                sample = Sample(name, dict(zip(label_names, label_values)), value)
            now[key] = sample
            out.append(sample)
            if keys is not None:
                keys.append(key)
        return out

    def group(self, name: str, label_names: tuple[str, ...], group: Hashable, source: object,
              rows: Callable[[], Iterable[tuple[tuple[str, ...], float]]]) -> list[Sample]:
        """The samples of one group of a family's series (one port's counters), built from
        `source` by `rows()` as `samples` builds them; while `source` is the very object
        it was last scrape (a parser serves the same object for files that read the same),
        last scrape's list again, without one lookup per sample."""
        key = (name, group)
        kept = self._last_groups.get(key)
        if kept is not None and kept[0] is source:
            self._now.update(zip(kept[2], kept[1]))       # for the scrape at which it moves
        else:
            keys = []
            samples = self.samples(name, label_names, rows(), keys)
            kept = (source, samples, keys)
        self._now_groups[key] = kept
        return kept[1]

    def family(self, kind: Callable[..., Metric], name: str, documentation: str, label_names: tuple[str, ...],
               rows: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
        """A counter or gauge family (kind: CounterMetricFamily or GaugeMetricFamily) with
        its samples from (label values, value) rows, as `samples` gives them. The family
        object itself is built once and given fresh samples on each scrape: building one
        (its name checked, its labels copied) cost more than its single sample in the tcp
        collector's sixty families. Families are never mutated downstream but for their
        samples list (the scrape merges same-named families), which is new each time."""
        kept = self._families.get(name) or self._new_family(kind, name, documentation, label_names)
        kept[0].samples = self.samples(kept[1], label_names, rows)
        return kept[0]

    def empty(self, kind: Callable[..., Metric], name: str, documentation: str,
              label_names: Sequence[str] = ()) -> Metric:
        """The family `kind(name, documentation, labels=label_names)` with no samples yet:
        the object served last scrape, its samples list replaced by a new empty one."""
        family = (self._families.get(name) or self._new_family(kind, name, documentation, label_names))[0]
        family.samples = []
        return family

    def _new_family(self, kind: Callable[..., Metric], name: str, documentation: str,
                    label_names: Sequence[str]) -> tuple[Metric, str]:
        family = kind(name, documentation, labels=label_names)
        kept = self._families[name] = (family, series_name(family))
        return kept

    def reuse(self, families: list[Metric]) -> list[Metric]:
        """The families, each sample equal to one served last scrape replaced by that one:
        for collectors that build fresh samples every scrape. Matching costs about a third
        of formatting a line again."""
        last, now = self._last, self._now
        for family in families:
            samples = family.samples
            for index, sample in enumerate(samples):
                key = (sample.name, tuple(sample.labels.items()))
                old = last.get(key)
                if old is not None and old[2:] == sample[2:]:    # value, timestamp, exemplar, ...
                    samples[index] = sample = old
                now[key] = sample
        return families


def _with_node_label(metric: Metric, node: str) -> Metric:
    metric.samples = [s._replace(labels={**s.labels, "node": node}) for s in metric.samples]
    return metric


DEFAULT_COLLECTOR_TIMEOUT = 5.0   # seconds; well inside Prometheus' default 10 s scrape timeout
# How long a collector runs alone before the next one starts beside it
# (ScrapeCollector._start_in_turn). Every collector on the 8-GPU demo node returns in under
# 3 ms; with seven collectors, slow ones together add at most 0.18 s to a scrape.
STAGGER_SECONDS = 0.025


class _Run:
    """One run of a collector: its outcome, once `returned` is set. Nobody waits on a run
    itself: the scrape waits on its batch (_Batch.wait)."""
    __slots__ = ("returned", "families", "took", "error")

    def __init__(self) -> None:
        self.returned = False
        self.families: list[Metric] = []
        self.took = 0.0
        self.error: BaseException | None = None


class _Runner:
    """One collector, the run it may still be in, and its sample cache."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.running: _Run | None = None
        self.started = 0.0
        self.samples = None if collector.serves_unchanged_samples else SampleCache()

    def start(self) -> _Run | None:
        """A new run for this scrape, or None while the previous one has not returned."""
        if self.running is not None and not self.running.returned:
            return None
        self.started = time.perf_counter()
        self.running = _Run()
        return self.running

    def execute(self, run: _Run) -> None:
        start = time.perf_counter()
        try:
            # Materialise here so a failure part-way yields nothing partial.
            families = list(self.collector.collect())
            if self.samples is not None:
                self.samples.next_scrape()
                self.samples.reuse(families)
            run.families = families
        except BaseException as exc:  # noqa: BLE001 - reported by the scrape, never kills the thread
            run.error = exc
        run.took = time.perf_counter() - start
        run.returned = True


class _Batch:
    """One scrape's runs, in order, for any number of workers to take one at a time. The
    scrape waits on the batch as a whole (`wait`), woken once when the last run returns,
    not once per collector: side by side in one process on the 8-HCA tree of
    bench/scrape_latency.py, that took 4-6% off collecting every collector (3.79 -> 3.55
    and 4.30 -> 4.06 ms of CPU a scrape) and 4% off infiniband, netdev and tcp.

    Plain locks rather than Futures: a Future and the waiters concurrent.futures.wait()
    builds around it allocate a Condition, an Event and their locks on every call. Measured
    side by side on the same tree, plain locks took 8-10% off the scrape's CPU (6.77 ->
    6.25 ms for infiniband, netdev and tcp; 8.65 -> 7.80 ms with every collector)."""

    def __init__(self, runs: list[tuple[_Runner, _Run]]) -> None:
        self._runs = runs
        self._next = 0
        self._unfinished = len(runs)
        self._lock = threading.Lock()
        self.progressed = time.monotonic()    # when a run last started or returned
        self._finished = threading.Lock()     # released once every run has returned
        if runs:
            self._finished.acquire()

    def take(self) -> tuple[_Runner, _Run] | None:
        with self._lock:
            if self._next == len(self._runs):
                return None
            self._next += 1
            self.progressed = time.monotonic()
            return self._runs[self._next - 1]

    def returned(self) -> None:
        """A taken run has returned (its outcome is in it)."""
        with self._lock:
            self._unfinished -= 1
            self.progressed = time.monotonic()
            if self._unfinished == 0:
                self._finished.release()

    def wait(self, timeout: float) -> bool:
        """Whether every run has returned, waiting up to `timeout` seconds for it."""
        if self._finished.acquire(timeout=max(0.0, timeout)):
            self._finished.release()
            return True
        return False

    @property
    def untaken(self) -> bool:
        return self._next < len(self._runs)


class _Worker:
    """A thread that runs a batch's collectors one after another. A daemon: one stuck in
    the kernel must not hold the exporter's exit."""

    def __init__(self, pool: _Workers, number: int) -> None:
        self.pool = pool
        self.batch: _Batch | None = None
        self.wake = threading.Lock()     # released: a batch (or None: stop) is waiting
        self.wake.acquire()
        threading.Thread(target=self._serve, name=f"collectors-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.wake.acquire()
            batch = self.batch
            if batch is None:
                return
            while (taken := batch.take()) is not None:
                taken[0].execute(taken[1])
                batch.returned()
            self.batch = None
            self.pool.rest(self)


class _Workers:
    """The collector threads: idle ones are reused, a new one is started only when every
    other is busy (in practice: stuck in a collector)."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._lock = threading.Lock()

    def work_on(self, batch: _Batch) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker(self, len(self._all))
                self._all.append(worker)
        worker.batch = batch
        worker.wake.release()

    def rest(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        """Each thread ends once it has returned from any collector it is in."""
        with self._lock:
            for worker in self._all:
                worker.batch = None
                if worker.wake.locked():
                    worker.wake.release()
            self._idle.clear()


class ScrapeCollector(_PromCollector):
    """The one prometheus_client collector: fans out to the enabled fabricscope collectors."""

    def __init__(self, collectors: list[Collector], node: str = "",
                 timeout: float = DEFAULT_COLLECTOR_TIMEOUT) -> None:
        self.collectors = collectors
        self.node = node
        self.timeout = timeout
        self._runners = [_Runner(collector) for collector in collectors]
        self._workers = _Workers()
        self._samples = SampleCache()     # the self-metrics': a collector's success is mostly unchanged

    def close(self) -> None:
        self._workers.close()

    def describe(self) -> list:  # no describe-time collection: scrapes stay the only reads
        return []

    def families(self) -> Iterator[Metric]:
        """Every enabled collector's families plus the self-metrics, without the node label
        (the exposition writer adds it while formatting, which is far cheaper)."""
        successes, durations = [], []
        # Several collectors export shared families (fabric_state_file_problem{collector},
        # ...). The text format allows one HELP/TYPE block per name, so same-named
        # families are merged into the first one, in order.
        merged: dict[str, Metric] = {}
        deadline = time.monotonic() + self.timeout
        runs = self._start_in_turn(deadline)
        for runner, run in runs:
            name = runner.collector.name
            families: list[Metric] = []
            ok = 0.0
            took = time.perf_counter() - runner.started
            if run is None:
                log.warning("collector %s is still running a scrape started %.0fs ago; skipped", name, took)
            elif not run.returned:
                log.warning("collector %s missed its %gs deadline; reported as failed", name, self.timeout)
                took = time.perf_counter() - runner.started
            elif run.error is not None:   # one failing collector never hides the others
                log.error("collector %s failed", name, exc_info=run.error)
                took = run.took
            else:
                families, took, ok = run.families, run.took, 1.0
            durations.append(((name,), took))
            successes.append(((name,), ok))
            for family in families:
                first = merged.setdefault(family.name, family)
                if first is not family:
                    if first.type != family.type:
                        log.error("collector %s exports %s as %s, already exported as %s; dropped",
                                  name, family.name, family.type, first.type)
                        continue
                    first.samples.extend(family.samples)
        yield from merged.values()
        self._samples.next_scrape()
        yield self._samples.family(GaugeMetricFamily, "fabric_scrape_collector_success",
                                   "1 if the collector's last scrape succeeded, 0 if it raised.", ("collector",),
                                   successes)
        yield self._samples.family(GaugeMetricFamily, "fabric_scrape_collector_duration_seconds",
                                   "Time the collector took on this scrape.", ("collector",), durations)

    def _start_in_turn(self, deadline: float) -> list[tuple[_Runner, _Run | None]]:
        """Run the collectors one after another on one thread; the next starts beside a
        collector that has not returned within STAGGER_SECONDS, on another thread. All
        share one deadline.

        Why not all at once, each on its own thread: the collectors are Python and hold the
        GIL between system calls. Started together on a 2-core node, every pread or stat of
        one hands the GIL to another. On the 8-HCA tree of bench/scrape_latency.py, all at
        once -> in turn on their own threads took 12% off the scrape's CPU (7.43 -> 6.57 ms
        for infiniband, netdev and tcp; 9.23 -> 8.13 ms with every collector); one thread
        for all of them instead of one each took off 2-3% more (5.62 -> 5.50 and 7.00 ->
        6.88 ms, side by side) and six threads. A collector blocked in the kernel or slow
        holds its followers back by STAGGER_SECONDS at most, so a stuck source still costs
        nobody their scrape."""
        runs = [(runner, runner.start()) for runner in self._runners]
        batch = _Batch([(runner, run) for runner, run in runs if run is not None])
        if not batch.untaken:
            return runs
        self._workers.work_on(batch)
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            stalled = now - batch.progressed
            if stalled >= STAGGER_SECONDS and batch.untaken:
                self._workers.work_on(batch)      # the rest go on beside the slow one
                stalled = 0.0
            wait = deadline - now
            if batch.untaken:
                wait = min(wait, STAGGER_SECONDS - stalled)
            if batch.wait(wait):
                break
        return runs

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's protocol (private registries in tests, get_sample_value)."""
        for family in self.families():
            yield _with_node_label(family, self.node) if self.node else family


class _BrokenCollector(Collector):
    """Stands in for a collector whose constructor raised: every scrape reports it failed."""

    name = "broken"

    def __init__(self, ctx: Context, name: str, error: Exception) -> None:
        super().__init__(ctx)
        self.name = name
        self.error = error

    def collect(self) -> Iterable[Metric]:
        raise RuntimeError(f"collector {self.name} could not start: {self.error}")


def build_collectors(ctx: Context, enabled: Iterable[str]) -> list[Collector]:
    built: list[Collector] = []
    for name in enabled:
        try:
            built.append(COLLECTORS[name](ctx))
        except Exception as exc:  # a collector that cannot start must not stop the exporter
            log.exception("collector %s could not start", name)
            built.append(_BrokenCollector(ctx, name, exc))
    return built
