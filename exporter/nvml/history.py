"""Each NVLink's latest active and inactive sightings, kept on the node across restarts.

Why on the node: "is this link down after it worked within the last 6 h" asked in
Prometheus reads every link's state at every evaluation (144 links an 8-GPU node, a
value filter selects them all before it drops the healthy ones), and its "last active"
record writes one series per link every minute. The sampler sees every link-state read
anyway; it keeps the answer here, and the collector exports it only for the links seen
inactive within RETENTION_SECONDS, so a healthy fleet exports none of it and a rule that
selects the series by name reads only the few links with a down history.

Persisted in <state_dir>/nvlink.json (StateFile: atomic and durable, a corrupt file set
aside and reported), so an exporter restarted under a down link still knows when the link
was last active before the restart:

  version  1
  gpus     "<gpu index>" -> {"uuid": <GPU UUID>,
                             "links": {"<link>": [last active or null, last inactive or null]}}

Times are Unix seconds of the node's clock, taken when the round that read the state ran.
A GPU is its index (the `gpu` label of every NVLink series) and its UUID: a GPU replaced
at an index (another UUID) starts without history, its predecessor's links not being its.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from ..statefile import StateFile
from .backend import GpuInfo, LinkReading

log = logging.getLogger("fabricscope.exporter.nvml")

FORMAT_VERSION = 1
# A link's sightings are exported while its latest inactive sighting is this recent, and a
# sighting older than this is forgotten. Longer than every window a rule reads them over
# (the NVLink error window, 5 m; "was active within" 6 h is asked of the active sighting
# of a link inactive now, which is exported whatever its age), and a day of "went down
# recently" for a person looking at the node.
RETENTION_SECONDS = 24 * 3600.0
# An active link's persisted last-active time is refreshed at most this often: on a
# healthy node one write of ~4 KB a minute (144 links), not one per GPU round (8 GPUs every
# 15 s, fsynced). A restart then loses at most this much of a link's last-active time,
# nothing against the 6 h look-back. A state change is written at once.
PERSIST_ACTIVE_SECONDS = 60.0


class LinkHistory:
    """Sightings per (GPU, link), fed by the GPU samplers' threads (observe, then
    save_if_due), read by the scrape (sightings)."""

    def __init__(self, state_file: StateFile, clock: Callable[[], float] = time.time,
                 retention: float = RETENTION_SECONDS) -> None:
        self.state_file = state_file
        self.clock = clock
        self.retention = retention
        self._lock = threading.Lock()         # the sightings: eight sampler threads and the scrape
        self._save_lock = threading.Lock()    # one write at a time, the latest snapshot last
        self._observed_at: dict[str, float] = {}    # GPU -> clock of its latest round
        self._persisted_at: dict[str, float] = {}   # GPU -> that clock as of the last successful write
        data = state_file.load()
        try:
            self._gpus = self._restore(data)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # Valid JSON of the wrong shape is as useless as torn JSON: set it aside, start clean.
            state_file.set_aside(f"wrong shape: {exc!r}")
            self._gpus = {}
        self.load_problem = state_file.load_problem
        self._dirty = self.load_problem == "corrupt"   # replace a set-aside file at the first save

    @property
    def write_errors(self) -> int:
        return self.state_file.write_errors

    def _restore(self, data: dict) -> dict[str, dict]:
        if not data:
            return {}
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {FORMAT_VERSION}")
        horizon = self.clock() - self.retention
        gpus = {}
        for index, entry in data["gpus"].items():
            if not isinstance(entry["uuid"], str):
                raise TypeError("uuid")
            int(index)
            links = {}
            for link, pair in entry["links"].items():
                active, inactive = (_time(value) for value in pair)
                if inactive is not None and inactive < horizon:
                    inactive = None
                if inactive is None and (active is None or active < horizon):
                    continue                  # nothing left worth keeping (a link gone a day)
                links[int(link)] = [active, inactive]
            gpus[index] = {"uuid": entry["uuid"], "links": links}
        return gpus

    def observe(self, gpu: GpuInfo, readings: Iterable[LinkReading]) -> None:
        """One round's link states of a GPU, seen now."""
        now = self.clock()
        key = str(gpu.index)
        with self._lock:
            entry = self._gpus.get(key)
            if entry is None or entry["uuid"] != gpu.uuid:
                if entry is not None:
                    log.info("GPU %d has another UUID (%s, was %s): its NVLink history starts again",
                             gpu.index, gpu.uuid, entry["uuid"])
                entry = self._gpus[key] = {"uuid": gpu.uuid, "links": {}}
                self._dirty = True
            links = entry["links"]
            horizon = now - self.retention
            self._observed_at[key] = now
            refresh_active = now - self._persisted_at.get(key, float("-inf")) >= PERSIST_ACTIVE_SECONDS
            for reading in readings:
                pair = links.get(reading.link)
                if pair is None:
                    pair = links[reading.link] = [None, None]
                    self._dirty = True
                was_active = pair[0] is not None and (pair[1] is None or pair[0] >= pair[1])
                if reading.active:
                    pair[0] = now
                    if not was_active or refresh_active:
                        self._dirty = True
                else:
                    pair[1] = now
                    if was_active:
                        self._dirty = True
                if pair[1] is not None and pair[1] < horizon:
                    pair[1] = None            # back up for a day: no longer a down history
                    self._dirty = True

    def save_if_due(self) -> None:
        """Write the sightings when something worth keeping changed (observe)."""
        with self._save_lock:
            with self._lock:
                if not self._dirty:
                    return
                snapshot = {"version": FORMAT_VERSION,
                            "gpus": {index: {"uuid": entry["uuid"],
                                             "links": {str(link): list(pair)
                                                       for link, pair in entry["links"].items()}}
                                     for index, entry in self._gpus.items()}}
                self._dirty = False
                taken = dict(self._observed_at)
            if self.state_file.save(snapshot):
                with self._lock:
                    self._persisted_at.update(taken)
            else:
                with self._lock:
                    self._dirty = True        # tried again after the next round

    def sightings(self, gpu: GpuInfo) -> dict[int, tuple[float | None, float]]:
        """link -> (last active or None, last inactive) of the GPU's links seen inactive
        within the retention: the links with a down history."""
        with self._lock:
            entry = self._gpus.get(str(gpu.index))
            if entry is None or entry["uuid"] != gpu.uuid:
                return {}
            return {link: (pair[0], pair[1]) for link, pair in entry["links"].items() if pair[1] is not None}


def _time(value) -> float | None:
    """A stored sighting: null or a number (bool is not one)."""
    if value is None:
        return None
    if value.__class__ not in (int, float):
        raise TypeError(f"sighting {value!r}")
    return float(value)
