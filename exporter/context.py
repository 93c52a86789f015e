"""What every collector is handed: injected filesystem roots, state dir, config, sources.

Nothing in the exporter reads /sys or /proc directly; it goes through these roots so
tests and the demo cluster can point the same code at a fixture or simulated tree.
"""
from __future__ import annotations

import copy
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Context:
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")
    # Kernel log source: /dev/kmsg on a real host, a plain file (one record a line,
    # kmsg format) in tests and the demo.
    kmsg: Path = Path("/dev/kmsg")
    state_dir: Path = Path("/var/lib/fabricscope")
    node: str = field(default_factory=socket.gethostname)
    # Per-collector configuration sections from --config.file (YAML), keyed by
    # collector name.
    config: dict[str, Any] = field(default_factory=dict)
    # Simulated backends injected by the demo cluster (e.g. "nvml", "bpf", "nccl").
    # A real exporter leaves this empty and collectors use the host's sources.
    sources: dict[str, Any] = field(default_factory=dict)
    # Parsed argparse namespace, for collector-specific flags.
    args: Any = None
    # Where `config` came from, for error messages.
    config_source: str = "config"
    # True when `config` already holds every section validated and normalised
    # (config.load_config_file, as `fabricscope exporter` reads --config.file at start-up).
    config_validated: bool = False

    def section(self, name: str) -> dict[str, Any]:
        """The collector's section, validated against the one schema (exporter/config.py):
        only the keys that were set, so defaults stay with the code that uses them."""
        if self.config_validated:
            # A copy: a collector may adjust its section without changing the config.
            return copy.deepcopy(self.config.get(name, {}))
        from .config import section   # pydantic: only where the config was not checked yet
        return section(self.config, name, self.config_source)
