"""The simulated kernel log of one node: a file of /dev/kmsg records, one per line.

Record format is /dev/kmsg's: "<prio>,<seq>,<usec since boot>,<flags>;<message>", with
prio = facility << 3 | level (kernel facility 0, so just the level). Records are
appended with one write() each, so a reader sees whole lines; the sequence number only
grows, like the kernel's.
"""
from __future__ import annotations

import os
from pathlib import Path

KERN_ERR, KERN_WARNING, KERN_INFO = 3, 4, 6


class SimKmsg:
    def __init__(self, path: Path, uptime_at_start: float) -> None:
        self.path = Path(path)
        self.uptime_at_start = uptime_at_start
        self.seq = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")

    def append(self, level: int, seconds_since_boot: float, message: str) -> None:
        # One record is one line: embedded newlines would split it into bogus records.
        message = message.replace("\n", " ")
        record = f"{level},{self.seq},{round(seconds_since_boot * 1_000_000)},-;{message}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, record)
        finally:
            os.close(fd)
        self.seq += 1

    def log(self, level: int, now: float, message: str) -> None:
        """A record at scenario time `now` (seconds since the demo began)."""
        self.append(level, self.uptime_at_start + now, message)

    def boot_messages(self, hca_bdfs: list[str], gpu_bdfs: list[str]) -> None:
        """What a freshly booted GPU node leaves in its ring buffer (info level, no faults)."""
        t = 1.2
        self.append(KERN_INFO, t, "Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org) "
                                  "(gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) "
                                  "#1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)")
        for bdf in hca_bdfs:
            t += 0.35
            self.append(KERN_INFO, t, f"mlx5_core {bdf}: firmware version: 28.39.1002")
            self.append(KERN_INFO, t + 0.01, f"mlx5_core {bdf}: 252.056 Gb/s available PCIe bandwidth "
                                             f"(16.0 GT/s PCIe x16 link)")
            self.append(KERN_INFO, t + 0.2, f"mlx5_core {bdf}: Port module event: module 0, Cable plugged")
        t += 3.0
        self.append(KERN_INFO, t, "nvidia-nvlink: Nvlink Core is being initialized, major device number 237")
        self.append(KERN_INFO, t + 0.1, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05  "
                                        "Tue Oct  8 03:22:07 UTC 2024")
        for bdf in gpu_bdfs:
            t += 0.05
            self.append(KERN_INFO, t, f"nvidia {bdf}: enabling device (0000 -> 0002)")
