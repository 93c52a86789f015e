"""Kernel log patterns that mean a NIC or GPU is failing, with their severity.

The mlx5_core, NETDEV WATCHDOG and PCIe AER rows follow the NIC health monitor's log
watcher: deterministic driver/firmware failures are fatal, diagnostic context is non-fatal.
`name` is the `pattern` label value, so it must stay a fixed, short identifier.
docs/kernel-log.md documents this table; keep them in step.
"""
from __future__ import annotations

from dataclasses import dataclass

FATAL = "fatal"
NON_FATAL = "non_fatal"


@dataclass(frozen=True)
class LogPattern:
    name: str           # pattern label
    source: str         # source label: the driver or subsystem that logs it
    severity: str       # fatal | non_fatal
    regex: str          # searched (not anchored) in the message text; scoped flags only,
                        # (?i:...), since rows sharing a literal are also joined into one regex
    # A literal every matching message contains. Lines without any row's `requires`
    # are rejected by one substring test each, which keeps 10k-line scrapes cheap.
    requires: str


# Order matters: the first matching row wins, so more specific rows come first
# (an ACCESS_REG command that timed out is a command timeout, not an ACCESS_REG failure).
PATTERNS: tuple[LogPattern, ...] = (
    LogPattern("command_timeout", "mlx5_core", FATAL,
               r"Will cause a leak of a command resource|cmd_exec timeout|cmd_work_handler.*timeout", "mlx5_core"),
    LogPattern("health_compromised", "mlx5_core", FATAL,
               r"health compromised|health poll failed|reached miss count", "mlx5_core"),
    LogPattern("unrecoverable_error", "mlx5_core", FATAL, r"(?i:unrecoverable)|recovery flow aborted", "mlx5_core"),
    LogPattern("insufficient_power", "mlx5_core", NON_FATAL, r"(?i:insufficient(?:/unadvertised)? power)", "mlx5_core"),
    LogPattern("module_high_temperature", "mlx5_core", NON_FATAL, r"(?i:high temperature)", "mlx5_core"),
    LogPattern("module_absent", "mlx5_core", NON_FATAL, r"(?i:module absent)", "mlx5_core"),
    LogPattern("cable_unplugged", "mlx5_core", NON_FATAL, r"(?i:cable unplugged)", "mlx5_core"),
    LogPattern("access_reg_failed", "mlx5_core", NON_FATAL, r"ACCESS_REG\b.*\bfailed", "mlx5_core"),
    LogPattern("transmit_timeout", "netdev", NON_FATAL, r"NETDEV WATCHDOG:.*timed out", "NETDEV WATCHDOG"),
    # AER logs one "PCIe Bus Error: severity=..." line per error and device (the root
    # port's "AER: ... error received" line is the same event, so it is not counted).
    # Older kernels spell the severities "Uncorrected"/"Corrected", newer ones
    # "Uncorrectable"/"Correctable"; both are matched.
    LogPattern("pcie_uncorrected_fatal", "pcie", FATAL,
               r"PCIe Bus Error: severity=Uncorrect(?:ed|able) \(Fatal\)", "PCIe Bus Error"),
    LogPattern("pcie_uncorrected_non_fatal", "pcie", NON_FATAL,
               r"PCIe Bus Error: severity=Uncorrect(?:ed|able) \(Non-Fatal\)", "PCIe Bus Error"),
    LogPattern("pcie_corrected", "pcie", NON_FATAL, r"PCIe Bus Error: severity=Correct(?:ed|able)", "PCIe Bus Error"),
)

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
XID_REGEX = r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]+\): (\d+)"
XID_REQUIRES = "NVRM: Xid"

# Documented Xids exported under their own number; anything else is "other" so a
# garbled or future code cannot grow the label set.
KNOWN_XIDS: dict[int, str] = {
    8: "GPU stopped processing",
    13: "Graphics engine exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing (channel reset)",
    45: "Preemptive cleanup due to previous errors",
    48: "Double-bit ECC error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video decoder exception",
    69: "Graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link corrected error",
    140: "Unrecovered ECC error",
    154: "GPU recovery action changed",
}

# Xids after which the GPU (or its NVLink fabric) needs a reset or replacement.
FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def xid_label(code: int) -> str:
    return str(code) if code in KNOWN_XIDS else "other"


def xid_severity(code: int) -> str:
    return FATAL if code in FATAL_XIDS else NON_FATAL
