"""The one schema of --config.file: every section, key, type and range the exporter reads.

The whole file is validated at start-up (main.context_from_args, in a short-lived child
process: exporter/isolated.py): an unknown section or key, a wrong type or a bad value
stops the process with the file, the key path and what was expected. The child hands back
every section validated (`load_config_file`); a Context built in code (tests, the demo)
instead validates each section when its collector asks for it (Context.section), against
the same models. Sections hold only the keys the file set; defaults stay with the code
that uses them. Importing this module imports pydantic: the serving exporter never does.

    infiniband:
      replace_default_thresholds: false
      thresholds: [{counter: symbol_error, type: velocity, threshold: 50, unit: minute}]
      roles: {mlx5_4: storage}
      hw_counter_include: "^(out_of_buffer|np_cnp_sent)$"   # besides the judged ones; "" exports all
      counter_exclude: "^VL15_dropped$"   # counters/ files left out (never a judged one); "" none
    netdev: {device_include: "^eth", device_exclude: "^(lo|veth)", ethtool_include: "..."}
    ebpf: {objects: [tcp, sched], processes: [python3], peers: {10.0.0.2: gpu-node-1}, ...}
    nvlink: {sample_interval_seconds: 15, link_sample_interval_seconds: 120, series: budget}
    nccl: {hang_multiplier: 3.0, window: 20, ingest: false, ...}
"""
from __future__ import annotations

import ipaddress
import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from .schema import STRICT, ConfigError, load_yaml, validate

Seconds = Annotated[float, Field(gt=0, le=86400)]
PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]
UNIT_NAMES = ("second", "1s", "s", "minute", "1m", "m", "hour", "1h", "h")
ROLE_NAMES = ("compute", "storage", "management", "unknown")


class _Section(BaseModel):
    model_config = STRICT


class ThresholdEntry(_Section):
    """One counter threshold (see exporter/health/thresholds.py for what each kind means)."""
    counter: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/\s]+$")]
    type: Literal["delta", "velocity"] | None = None
    threshold: Annotated[float, Field(ge=0)] | None = None
    unit: Literal[UNIT_NAMES] | None = None      # type: ignore[valid-type]
    severity: Literal["fatal", "non_fatal"] = "non_fatal"
    enabled: bool = True

    @model_validator(mode="after")
    def _complete(self) -> "ThresholdEntry":
        if not self.enabled:
            return self
        if self.type is None:
            raise ValueError("`type` (delta or velocity) is required unless enabled: false")
        if self.threshold is None:
            raise ValueError("`threshold` (a number >= 0) is required unless enabled: false")
        if self.unit is not None and self.type != "velocity":
            raise ValueError("`unit` only applies to velocity thresholds")
        return self


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return value


Regex = Annotated[str, Field(max_length=4096)]


class InfinibandSection(_Section):
    replace_default_thresholds: bool = False
    thresholds: list[ThresholdEntry] = []
    roles: dict[str, Literal[ROLE_NAMES]] = {}   # type: ignore[valid-type]
    hw_counter_include: Regex | None = None
    counter_exclude: Regex | None = None

    @field_validator("hw_counter_include", "counter_exclude")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return value if value is None else _regex(value)


class NetdevSection(_Section):
    # The same settings as --collector.netdev.<flag>, dashes as underscores.
    device_include: Regex | None = None
    device_exclude: Regex | None = None
    ethtool_include: Regex | None = None
    statistics_exclude: Regex | None = None

    @field_validator("device_include", "device_exclude", "ethtool_include", "statistics_exclude")
    @classmethod
    def _patterns(cls, value: str | None) -> str | None:
        return value if value is None else _regex(value)


class EbpfSection(_Section):
    objects: list[str] | None = None
    processes: list[Annotated[str, Field(min_length=1, max_length=15)]] | None = None   # comm: 15 bytes
    peers: dict[str, Annotated[str, Field(min_length=1, max_length=253)]] = {}
    gpu_device_prefix: str | None = None
    gpu_device_majors: list[Annotated[int, Field(ge=0, le=4095)]] | None = None
    process_scan_interval_seconds: Seconds | None = None
    enable_stats: bool = False
    object_dir: str | None = None
    # Network namespace files (/run/netns/NAME, /proc/PID/ns/net): the RTT histograms count
    # only these namespaces' sockets; default every namespace. tcp.bpf.c holds at most 64.
    tcp_rtt_network_namespaces: Annotated[list[str], Field(min_length=1, max_length=64)] | None = None
    # {histogram: seconds}: the window of a declared window_quantile (exporter/bpf/*.yaml)
    # other than its declaration's. For compressed demo timelines: the rules must be
    # rendered with the same exporter config (rules/render.py), as their baseline is offset
    # by this window.
    window_seconds: dict[str, Annotated[int, Field(ge=1, le=3600)]] | None = None

    @field_validator("tcp_rtt_network_namespaces")
    @classmethod
    def _namespace_files(cls, paths: list[str] | None) -> list[str] | None:
        for path in paths or ():
            try:
                os.stat(path)
            except OSError as exc:
                raise ValueError(f"network namespace file {path[:200]!r}: {exc.strerror}") from None
        return paths

    @field_validator("objects")
    @classmethod
    def _known_objects(cls, objects: list[str] | None) -> list[str] | None:
        from .bpf_loader.declarations import load_declarations

        known = sorted(d.object for d in load_declarations())
        for name in objects or ():
            if name not in known:
                raise ValueError(f"no BPF object {name[:40]!r}; expected some of {', '.join(known)}")
        return objects

    @field_validator("window_seconds")
    @classmethod
    def _windowed_histograms(cls, windows: dict[str, int] | None) -> dict[str, int] | None:
        from .bpf_loader.declarations import load_declarations

        known = sorted(m.name for d in load_declarations() for m in d.metrics if m.window_quantile)
        for name in windows or ():
            if name not in known:
                raise ValueError(f"{name[:80]!r} declares no window_quantile; expected some of {', '.join(known)}")
        return windows

    @field_validator("peers")
    @classmethod
    def _ip_keys(cls, peers: dict[str, str]) -> dict[str, str]:
        for ip in peers:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"{ip[:60]!r} is not an IP address") from None
        return peers


class NvlinkSection(_Section):
    sample_interval_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    link_sample_interval_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    series: Literal["budget", "full"] | None = None


class NcclSection(_Section):
    hang_multiplier: Annotated[float, Field(gt=1)] | None = None
    min_completed: PositiveInt | None = None
    # At most the last 64 durations per (comm, rank, op): what the kernel keeps for the
    # uprobes (RECENT_MAX in exporter/bpf/nccl.bpf.c).
    window: Annotated[int, Field(ge=1, le=64)] | None = None
    max_comms: PositiveInt | None = None
    max_series: PositiveInt | None = None
    idle_evict_seconds: Seconds | None = None
    boundary_ops: PositiveInt | None = None
    uprobes: bool | None = None
    rescan_seconds: Seconds | None = None
    bpf_object: str | None = None
    ingest: bool | None = None

    @model_validator(mode="after")
    def _window(self) -> "NcclSection":
        window = self.window if self.window is not None else 20
        if self.min_completed is not None and self.min_completed > window:
            raise ValueError(f"min_completed ({self.min_completed}) must not exceed window ({window})")
        return self


SECTIONS: dict[str, type[_Section]] = {
    "infiniband": InfinibandSection,
    "netdev": NetdevSection,
    "ebpf": EbpfSection,
    "nvlink": NvlinkSection,
    "nccl": NcclSection,
}


class ExporterConfig(_Section):
    infiniband: InfinibandSection | None = None
    netdev: NetdevSection | None = None
    ebpf: EbpfSection | None = None
    nvlink: NvlinkSection | None = None
    nccl: NcclSection | None = None


def validate_config(data: Any, source: str) -> dict[str, Any]:
    """The whole file checked; returns it unchanged (sections as the file wrote them)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    validate(ExporterConfig, data, source)
    return data


def section(config: dict[str, Any], name: str, source: str = "config") -> dict[str, Any]:
    """One section validated, as a dict of the keys it set (nested entries validated and
    normalised: thresholds become dicts with every field)."""
    raw = config.get(name)
    model = SECTIONS.get(name)
    if model is None:
        raise ConfigError(f"{source}: no section {name!r} in the schema")
    return validate(model, raw, source, at=(name,)).model_dump(exclude_unset=True)


def validated_sections(data: Any, source: str) -> dict[str, dict[str, Any]]:
    """Every section of a whole config, validated and normalised as `section` returns it."""
    config = validate_config(data, source)
    return {name: section(config, name, source) for name in config}


def load_config_file(path: str) -> dict[str, dict[str, Any]]:
    """--config.file read and validated: each section as `section` returns it."""
    return validated_sections(load_yaml(path), path)
