"""Why eBPF is unavailable, as a small bounded set of reasons.

Every failure on the way from "is this host able to run BPF" to "the program is
attached" ends in one of these strings, which become the `reason` label of
fabric_ebpf_available. Keep the set bounded: a reason is a label value.
"""
from __future__ import annotations

import errno as _errno
import os
from pathlib import Path

from .tracefs import tracefs_ready

OK = "ok"
NOT_ROOT = "not_root"
NO_BTF = "no_btf"
NO_LIBBPF = "no_libbpf"
OBJECT_MISSING = "object_missing"
BAD_OBJECT = "bad_object"
LOAD_FAILED = "load_failed"
ATTACH_FAILED = "attach_failed"
NO_TRACEFS = "no_tracefs"
PERMISSION_DENIED = "permission_denied"
MAP_FULL = "map_full"
DISABLED = "disabled"

REASONS = frozenset({OK, NOT_ROOT, NO_BTF, NO_LIBBPF, OBJECT_MISSING, BAD_OBJECT, LOAD_FAILED,
                     ATTACH_FAILED, NO_TRACEFS, PERMISSION_DENIED, MAP_FULL, DISABLED})


class BpfUnavailable(Exception):
    """eBPF cannot be used here; `reason` is one of REASONS, the message says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown eBPF unavailability reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


def reason_for_errno(stage: str, err: int, euid: int | None = None) -> str:
    """Map a failing libbpf call (stage: open, load, attach, update) and its errno to a reason.

    The kernel answers EPERM/EACCES both for "you lack CAP_BPF" and, at load time, for
    "the verifier refused this program"; the effective uid tells them apart.
    """
    euid = os.geteuid() if euid is None else euid
    if err in (_errno.EPERM, _errno.EACCES) and euid != 0:
        return NOT_ROOT
    if stage == "open":
        if err == _errno.ENOENT:
            return OBJECT_MISSING
        if err in (_errno.EPERM, _errno.EACCES):
            return PERMISSION_DENIED
        return BAD_OBJECT
    if stage == "load":
        if err == _errno.ESRCH:
            # CO-RE relocation found no matching kernel type: usually missing BTF.
            return NO_BTF
        return LOAD_FAILED
    if stage == "attach":
        if err == _errno.ENOENT:
            return NO_TRACEFS if not tracefs_ready() else ATTACH_FAILED
        return ATTACH_FAILED
    if stage == "update":
        if err in (_errno.E2BIG, _errno.ENOSPC, _errno.ENOMEM):
            return MAP_FULL
        return LOAD_FAILED
    raise ValueError(f"unknown stage {stage!r}")


def preflight(sysfs: Path = Path("/sys"), euid: int | None = None) -> tuple[str, str] | None:
    """Cheap checks before touching libbpf: (reason, message) when BPF cannot work here."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return NOT_ROOT, f"eBPF needs root (CAP_BPF + CAP_PERFMON); running as uid {euid}"
    btf = sysfs / "kernel" / "btf" / "vmlinux"
    if not btf.exists():
        return NO_BTF, f"{btf} is missing: the kernel was built without CONFIG_DEBUG_INFO_BTF, CO-RE programs cannot load"
    return None
