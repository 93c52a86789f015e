"""Make sure tracefs is mounted where libbpf looks: classic tracepoint/ programs attach
through it.

libbpf reads a tracepoint's perf event id from a fixed path of this process's own mount
namespace: /sys/kernel/debug/tracing when that path exists, /sys/kernel/tracing
otherwise (libbpf's tracefs_path()). It has no setting for another root, so tracefs must
be there, whatever --path.sysfs says: in a container the host's sysfs is mounted at
/host/sys, and a tracefs found under /host/sys/kernel/tracing is one libbpf never reads
(it then fails with "failed to determine tracepoint ... perf event ID").

tp_btf/ and raw_tp/ programs do not need it, so a host where mounting fails still runs
those: only the programs a declaration lists under tracefs_programs stay unattached
(reason "no_tracefs", logged with what to mount).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
DEBUGFS_TRACING = Path("/sys/kernel/debug/tracing")


def libbpf_tracefs_dir() -> Path:
    """Where libbpf will read tracepoint ids from (its own choice, mirrored)."""
    return DEBUGFS_TRACING if os.path.lexists(DEBUGFS_TRACING) else TRACEFS


def tracefs_ready() -> bool:
    return (libbpf_tracefs_dir() / "events").is_dir()


def ensure_tracefs() -> tuple[bool, str]:
    """(ready, message): mounts tracefs where libbpf looks when it is not there."""
    target = libbpf_tracefs_dir()
    if (target / "events").is_dir():
        return True, f"tracefs at {target}"
    if not target.is_dir():
        return False, f"{target} does not exist: kernel without CONFIG_TRACING?"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"nodev", str(target).encode(), b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        return False, (f"mount -t tracefs nodev {target} failed: {os.strerror(err)}; in a container, "
                       f"mount the host's {TRACEFS} at {target} (libbpf reads tracepoint ids there, "
                       f"not under --path.sysfs)")
    if not (target / "events").is_dir():
        return False, f"tracefs mounted at {target} but has no events/ directory"
    return True, f"mounted tracefs at {target}"
