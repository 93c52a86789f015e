"""One simulated GPU node: its filesystem (sys/, proc/, kmsg) and the faults applied to it.

Everything here is a function of (cluster seed, node index, tick number): the node's
random stream is derived from the seed and consumed in a fixed order each tick, so the
same scenario produces byte-identical trees at the same tick, on any machine.
"""
from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

from .plugin import Fault, NodeSpec
from .sim_files import TreeWriter
from .sim_kmsg import KERN_ERR, KERN_INFO, KERN_WARNING, SimKmsg
from .sim_procfs import SimProcfs
from .sim_sysfs import PHYS_DISABLED, PHYS_POLLING, SimSysfs, occasional
from .sim_topology import build_topology

MARKER = ".fabricscope-demo-node"
DEFAULT_STORM_RATE = 25.0          # symbol errors/s: over the >10/s non-fatal and 120/hour BER thresholds
DEFAULT_RCV_ERROR_RATIO = 0.5      # port_rcv_errors per symbol error during a storm
_PHYS_STATES = {"Polling": PHYS_POLLING, "Disabled": PHYS_DISABLED}


class NodeRootError(RuntimeError):
    pass


def prepare_root(root: Path) -> None:
    """Start from an empty node directory; refuse to wipe anything the demo did not create."""
    root = Path(root)
    if root.exists():
        if any(root.iterdir()) and not (root / MARKER).exists():
            raise NodeRootError(f"{root} exists and was not created by the demo; refusing to clear it")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / MARKER).write_text("simulated node filesystem of `fabricscope demo`; cleared on every start\n")


# Faults whose onset leaves a one-off trace (a kernel log line) rather than a state.
ONSET_FAULTS = {"nvlink_down", "mlx5_fatal"}


def _fault_key(fault: Fault) -> tuple:
    # repr: plugin faults may carry unhashable targets (lists, mappings).
    return (fault.kind, fault.start, fault.node, repr(sorted(fault.target.items())))


class SimNode:
    def __init__(self, spec: NodeSpec, seed: int) -> None:
        self.spec = spec
        self.root = Path(spec.root)
        self.rng = random.Random(f"fabricscope-demo/{seed}/{spec.index}/filesystem")
        # The node has been up a few days when the demo starts: counters are not near zero.
        self.uptime = round(self.rng.uniform(2, 9) * 86400, 3)
        self.topology = build_topology(spec.gpus, spec.hcas)
        self.node_guid_base = 0x946DAE0300000000 | (self.rng.getrandbits(20) << 8)
        self.writer: TreeWriter | None = None
        self.sysfs: SimSysfs | None = None
        self.procfs: SimProcfs | None = None
        self.kmsg: SimKmsg | None = None
        self._seen_onsets: set[tuple] = set()
        # Port faults whose repair ends with the counters cleared: fault key -> (device, when).
        self._counter_clears: dict[tuple, tuple[str, float]] = {}
        self.now = 0.0

    @property
    def sysfs_root(self) -> Path:
        return self.root / "sys"

    @property
    def procfs_root(self) -> Path:
        return self.root / "proc"

    @property
    def kmsg_path(self) -> Path:
        return self.root / "kmsg"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def build(self) -> None:
        """Create the node's tree as it is at scenario time 0."""
        prepare_root(self.root)
        self.writer = TreeWriter(self.root)
        self.sysfs = SimSysfs(self.writer, self.topology, self.spec.index, self.spec.name, self.spec.hcas,
                              self.rng, self.uptime)
        self.procfs = SimProcfs(self.writer, self.spec.index, self.rng, self.uptime)
        self.kmsg = SimKmsg(self.kmsg_path, self.uptime)
        self.kmsg.boot_messages(list(self.topology.hca_bdfs), list(self.topology.gpu_bdfs))
        self.state_dir.mkdir(exist_ok=True)
        self.sysfs.write_static(self.node_guid_base)
        self.procfs.write_static()
        self._write_dynamic()

    def tick(self, now: float, dt: float, faults: list[Fault], write: bool = True) -> None:
        """Advance to scenario time `now` (dt seconds after the previous tick) under `faults`,
        those active on this node or cluster-wide (the engine selects them).
        write=False advances the model only (catching up missed ticks); kernel log
        records are appended either way, as they happen."""
        self.now = now
        self._apply_link_state(now, faults)
        self._clear_repaired_counters(now, faults)
        self.sysfs.tick(dt)
        microburst = next((f.params for f in faults if f.kind == "microburst"), None)
        self.procfs.advance(dt, microburst)
        for fault in faults:
            if fault.kind == "symbol_error_storm":
                self._symbol_errors(fault, dt)
        for fault in faults:
            if fault.kind not in ONSET_FAULTS:
                continue
            key = _fault_key(fault)
            if key not in self._seen_onsets:
                self._seen_onsets.add(key)
                self._onset(fault, now)
        if write:
            self._write_dynamic()

    def _write_dynamic(self) -> None:
        self.sysfs.write_dynamic()
        self.procfs.write_dynamic(self.sysfs.netdevs)

    # ---- faults --------------------------------------------------------------------------
    def _apply_link_state(self, now: float, faults: list[Fault]) -> None:
        wanted: dict[str, tuple[str, bool]] = {}     # device -> (phys_state, is_flap) while down
        for fault in faults:
            device = fault.target.get("device")
            if device not in self.sysfs.ports:
                continue
            if fault.kind == "link_down":
                phys = _PHYS_STATES.get(str(fault.params.get("phys_state", "Disabled")), PHYS_DISABLED)
                wanted[device] = (phys, False)
            elif fault.kind == "link_flap" and device not in wanted:
                count = int(fault.params.get("count", 3))
                period = float(fault.params.get("period_seconds", 20))
                down_for = float(fault.params.get("down_seconds", period / 2))
                elapsed = now - fault.start
                cycle = math.floor(elapsed / period)
                if 0 <= cycle < count and elapsed - cycle * period < down_for:
                    wanted[device] = (PHYS_POLLING, True)
        for device, port in self.sysfs.ports.items():
            down = wanted.get(device)
            phys, flap = down if down else (None, False)
            if self.sysfs.set_port_link(device, down is None, phys, flap):
                self._log_link(device, port.netdev, up=down is None, now=now)

    def _clear_repaired_counters(self, now: float, faults: list[Fault]) -> None:
        """`counters_cleared_after: S` on a port fault: S seconds after the fault ends, the
        port's counters are cleared, as a technician does with `perfquery -R` after
        reseating a cable, so a latched fatal breach clears instead of lingering."""
        for fault in faults:
            delay = fault.params.get("counters_cleared_after")
            device = fault.target.get("device")
            if delay is not None and fault.end is not None and device in self.sysfs.ports:
                self._counter_clears.setdefault(_fault_key(fault), (device, fault.end + float(delay)))
        for key, (device, when) in list(self._counter_clears.items()):
            if now >= when:
                self.sysfs.clear_port_counters(device)
                del self._counter_clears[key]

    def _log_link(self, device: str, netdev: str | None, up: bool, now: float) -> None:
        bdf = self.sysfs.bdf(device)
        event = "Cable plugged" if up else "Cable unplugged"
        self.kmsg.log(KERN_INFO, now, f"mlx5_core {bdf}: Port module event: module 0, {event}")
        if netdev:
            self.kmsg.log(KERN_INFO, now, f"mlx5_core {bdf} {netdev}: Link {'up' if up else 'down'}")

    def _symbol_errors(self, fault: Fault, dt: float) -> None:
        port = self.sysfs.ports.get(fault.target.get("device"))
        if port is None or not port.up:   # a dead link has no symbols to get wrong
            return
        rate = float(fault.params.get("rate_per_second", DEFAULT_STORM_RATE))
        ratio = float(fault.params.get("rcv_error_ratio", DEFAULT_RCV_ERROR_RATIO))
        errors = occasional(self.rng, rate * self.rng.uniform(0.8, 1.2), dt)
        port.counters["symbol_error"] += errors
        port.counters["port_rcv_errors"] += occasional(self.rng, rate * ratio * self.rng.uniform(0.8, 1.2), dt)

    def _onset(self, fault: Fault, now: float) -> None:
        """One-shot effects when a fault begins: the kernel's log lines."""
        pid = self.rng.randint(2000, 60000)
        if fault.kind == "nvlink_down":
            gpu, link = int(fault.target.get("gpu", 0)), int(fault.target.get("link", 0))
            if gpu < len(self.topology.gpu_bdfs):
                bus = self.topology.gpu_bdfs[gpu].rsplit(".", 1)[0]
                self.kmsg.log(KERN_WARNING, now,
                              f"NVRM: Xid (PCI:{bus}): 74, pid={pid}, name=python3, NVLink: fatal error detected "
                              f"on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
        elif fault.kind == "mlx5_fatal":
            device = fault.target.get("device", "mlx5_0")
            if device in self.sysfs.ports:
                bdf = self.sysfs.bdf(device)
                self.kmsg.log(KERN_ERR, now,
                              f"mlx5_core {bdf}: wait_func:1160:(pid {pid}): ACCESS_REG(0x805) cmd_exec timeout. "
                              f"Will cause a leak of a command resource")
