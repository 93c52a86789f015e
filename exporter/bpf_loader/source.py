"""The interface the ebpf collector reads: raw kernel-shaped maps, whoever holds them.

KernelMapSource (kernel_source.py) holds real BPF objects; the demo's BpfSimSource
(demo/sources/bpf.py) holds the same structures in memory. Both hand back
raw bytes laid out exactly as the kernel lays them out, so one conversion serves both.
"""
from __future__ import annotations

from typing import Protocol


class MapSource(Protocol):
    def availability(self) -> tuple[str, str]:
        """(reason, message): reason "ok" when every declared program is attached; otherwise
        why the first one is not (programs() says which of them serve)."""

    def programs(self) -> dict[str, bool]:
        """Every declared program -> attached now."""

    def program_stats(self) -> dict[str, tuple[int, int]] | None:
        """program -> (run_count, run_time_ns); None when the kernel is not accounting."""

    def read_map(self, obj: str, map_name: str) -> list[tuple[bytes, bytes]]:
        """(key, value) pairs of one map; per-CPU values summed. KeyError: no such map
        (e.g. its object did not load)."""

    def peers(self) -> dict[str, str]:
        """Peer IP -> cluster host name the source knows of (config adds to it)."""

    def untracked_processes(self) -> int:
        """Processes of interest the kernel could not track by name (map full); 0 if none."""

    def refresh(self) -> None:
        """Housekeeping before a scrape reads the maps (e.g. which processes to track)."""

    def close(self) -> None:
        ...
