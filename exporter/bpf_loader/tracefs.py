"""Make sure tracefs is mounted: classic tracepoint/ programs attach through it.

tp_btf/ and raw_tp/ programs do not need it, so a host where mounting fails still runs
those: only the programs a declaration lists under tracefs_programs stay unattached
(and the object reports reason "no_tracefs" in the log).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path


def tracefs_dir(sysfs: Path = Path("/sys")) -> Path:
    return sysfs / "kernel" / "tracing"


def ensure_tracefs(sysfs: Path = Path("/sys")) -> tuple[bool, str]:
    """(ready, message): mounts tracefs at <sysfs>/kernel/tracing when it is not there."""
    target = tracefs_dir(sysfs)
    if (target / "events").is_dir():
        return True, f"tracefs at {target}"
    legacy = sysfs / "kernel" / "debug" / "tracing"
    if (legacy / "events").is_dir():
        return True, f"tracefs at {legacy} (debugfs)"
    if not target.is_dir():
        return False, f"{target} does not exist: kernel without CONFIG_TRACING?"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"nodev", str(target).encode(), b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        return False, f"mount -t tracefs nodev {target} failed: {os.strerror(err)}"
    if not (target / "events").is_dir():
        return False, f"tracefs mounted at {target} but has no events/ directory"
    return True, f"mounted tracefs at {target}"
