"""Demo scenarios: a YAML file (data, not code) that shapes the cluster and scripts faults.

    seed: 42
    cluster: {name: demo, nodes: 4, gpus_per_node: 8, hcas_per_node: 8}
    tick_seconds: 1
    duration: 30m          # optional: the demo stops after this
    repeat: 25m            # optional: the fault timeline loops every 25 minutes
    faults:
      - {kind: symbol_error_storm, node: 1, at: 3m, duration: 2m,
         target: {device: mlx5_3, port: 1}, params: {rate_per_second: 25}}

Validation happens once, up front, and every error names the fault it is about
("fault 2 (link_flap): ..."), so a typo never surfaces as a silent no-op minutes later.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fabricscope import yamlsafe

from .plugin import Fault

# Faults the filesystem simulation applies itself (sysfs, procfs, kmsg).
FILESYSTEM_FAULTS = {"symbol_error_storm", "link_flap", "link_down", "microburst", "nvlink_down", "mlx5_fatal"}
# Faults only simulated sources act on (they reach them through SimSource.step).
SOURCE_FAULTS = {"nccl_hang", "straggler_rank"}
# Kinds that aim at one HCA port, and so need a node and a device.
PORT_FAULTS = {"symbol_error_storm", "link_flap", "link_down"}
RANK_FAULTS = {"nccl_hang", "straggler_rank"}

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+)ms)?$")
_SCENARIO_KEYS = {"seed", "cluster", "tick_seconds", "duration", "repeat", "faults"}
_CLUSTER_KEYS = {"name", "nodes", "gpus_per_node", "hcas_per_node", "node_prefix"}
_FAULT_KEYS = {"kind", "node", "at", "duration", "target", "params"}


class ScenarioError(ValueError):
    """A scenario file that cannot run; the message says where and why."""


@dataclass(frozen=True)
class Scenario:
    seed: int
    cluster_name: str
    nodes: int
    gpus_per_node: int
    hcas_per_node: int          # compute HCAs (mlx5_0..); the storage NIC comes on top
    tick_seconds: float
    node_prefix: str = "gpu-node"
    duration: float | None = None
    repeat: float | None = None
    faults: tuple[Fault, ...] = ()
    source: str = "<dict>"      # where it was loaded from, for messages

    def node_name(self, index: int) -> str:
        return f"{self.node_prefix}-{index}"

    def with_nodes(self, nodes: int) -> "Scenario":
        """The same scenario on a different node count; faults on nodes that no longer exist
        are dropped (the caller is told which), cluster-wide faults stay."""
        if nodes < 1:
            raise ScenarioError(f"node count must be at least 1, got {nodes}")
        kept = tuple(f for f in self.faults if f.node is None or int(f.node.rsplit("-", 1)[1]) < nodes)
        return replace(self, nodes=nodes, faults=kept)

    def active_faults(self, now: float) -> list[Fault]:
        """Faults active at scenario time `now`. With `repeat`, the timeline loops: the
        returned Faults carry start/end shifted into the current cycle, so a source can
        always compute `now - fault.start` as time into the fault."""
        if now < 0:
            return []
        offset = 0.0
        if self.repeat:
            cycle = int(now // self.repeat)
            offset = cycle * self.repeat
        local = now - offset
        active = []
        for fault in self.faults:
            if fault.start <= local and (fault.end is None or local < fault.end):
                active.append(fault if offset == 0 else replace(
                    fault, start=fault.start + offset, end=None if fault.end is None else fault.end + offset))
        return active


def parse_duration(value: Any, what: str) -> float:
    """'90s', '5m', '1h30m', '2.5s', '500ms', or a plain number of seconds."""
    if isinstance(value, bool):
        raise ScenarioError(f"{what}: expected a duration like 90s, 5m or 1h30m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        match = _DURATION.match(value.strip())
        if not match or not any(match.groups()):
            raise ScenarioError(f"{what}: bad duration {value!r} (use e.g. 90s, 5m, 1h30m or a number of seconds)")
        hours, minutes, secs, millis = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs + millis / 1000
    else:
        raise ScenarioError(f"{what}: expected a duration like 90s, 5m or 1h30m, got {value!r}")
    if seconds < 0:
        raise ScenarioError(f"{what}: must not be negative, got {value!r}")
    return seconds


def _positive_int(value: Any, what: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ScenarioError(f"{what}: expected an integer from 1 to {maximum}, got {value!r}")
    return value


def known_fault_kinds() -> set[str]:
    """Built-in kinds plus any a source plugin declares in a FAULT_KINDS attribute."""
    from .sim_sources import discover_source_modules

    kinds = FILESYSTEM_FAULTS | SOURCE_FAULTS
    for module in discover_source_modules().values():
        kinds |= set(getattr(module, "FAULT_KINDS", ()))
    return kinds


def _parse_node(value: Any, scenario_nodes: int, prefix: str, where: str) -> str:
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: node must be an index or a node name, got {value!r}")
    if isinstance(value, int):
        index = value
    elif isinstance(value, str) and value.startswith(prefix + "-") and value[len(prefix) + 1:].isdigit():
        index = int(value[len(prefix) + 1:])
    else:
        raise ScenarioError(f"{where}: node {value!r} is neither an index nor a name like {prefix}-0")
    if not 0 <= index < scenario_nodes:
        raise ScenarioError(f"{where}: node {value!r} is out of range (cluster has {scenario_nodes} nodes: "
                            f"0..{scenario_nodes - 1})")
    return f"{prefix}-{index}"


def _parse_target(kind: str, target: dict, node: str | None, cluster: dict, where: str) -> dict:
    target = dict(target)
    hcas, gpus = cluster["hcas_per_node"], cluster["gpus_per_node"]
    if kind in PORT_FAULTS or kind == "mlx5_fatal":
        if node is None:
            raise ScenarioError(f"{where}: {kind} needs a node")
        device = target.get("device", "mlx5_0")
        index = device if isinstance(device, int) and not isinstance(device, bool) else None
        if isinstance(device, str) and re.fullmatch(r"mlx5_\d+", device):
            index = int(device.split("_")[1])
        # mlx5_<hcas> is the storage NIC, so it is a valid target too.
        if index is None or not 0 <= index <= hcas:
            raise ScenarioError(f"{where}: target device {device!r} does not exist (mlx5_0..mlx5_{hcas})")
        target["device"] = f"mlx5_{index}"
        port = target.get("port", 1)
        if port != 1:
            raise ScenarioError(f"{where}: target port {port!r} does not exist (ConnectX HCAs here have port 1)")
        target["port"] = 1
    elif kind == "nvlink_down":
        if node is None:
            raise ScenarioError(f"{where}: nvlink_down needs a node")
        gpu, link = target.get("gpu", 0), target.get("link", 0)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
            raise ScenarioError(f"{where}: target gpu {gpu!r} does not exist (0..{gpus - 1})")
        if isinstance(link, bool) or not isinstance(link, int) or not 0 <= link < 18:
            raise ScenarioError(f"{where}: target link {link!r} does not exist (NVLink 0..17)")
        target.update(gpu=gpu, link=link)
    elif kind in RANK_FAULTS:
        world = cluster["nodes"] * gpus
        rank = target.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ScenarioError(f"{where}: {kind} needs target rank from 0 to {world - 1}, got {rank!r}")
    return target


def _parse_fault(index: int, raw: Any, cluster: dict, kinds: set[str], repeat: float | None) -> Fault:
    if not isinstance(raw, dict):
        raise ScenarioError(f"fault {index}: expected a mapping, got {type(raw).__name__}")
    kind = raw.get("kind")
    where = f"fault {index} ({kind})"
    if not isinstance(kind, str) or kind not in kinds:
        raise ScenarioError(f"fault {index}: unknown kind {kind!r} (known: {', '.join(sorted(kinds))})")
    unknown = set(raw) - _FAULT_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_FAULT_KEYS)})")
    if "at" not in raw:
        raise ScenarioError(f"{where}: missing 'at' (when the fault starts, e.g. 90s)")
    if isinstance(raw["at"], (int, float)) and not isinstance(raw["at"], bool) and raw["at"] < 0:
        raise ScenarioError(f"{where}: at must not be negative, got {raw['at']!r}")
    start = parse_duration(raw["at"], f"{where}: at")
    end = None
    if raw.get("duration") is not None:
        length = parse_duration(raw["duration"], f"{where}: duration")
        if length <= 0:
            raise ScenarioError(f"{where}: duration must be positive, got {raw['duration']!r}")
        end = start + length
    if repeat is not None and start >= repeat:
        raise ScenarioError(f"{where}: at {start:g}s is not inside the repeat window of {repeat:g}s")
    node = None
    if raw.get("node") is not None:
        node = _parse_node(raw["node"], cluster["nodes"], cluster["node_prefix"], where)
    for key in ("target", "params"):
        if not isinstance(raw.get(key, {}) or {}, dict):
            raise ScenarioError(f"{where}: {key} must be a mapping")
    target = _parse_target(kind, raw.get("target") or {}, node, cluster, where)
    params = dict(raw.get("params") or {})
    for name, value in params.items():
        if kind in FILESYSTEM_FAULTS and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
            raise ScenarioError(f"{where}: param {name} must be a number or a string, got {value!r}")
    if kind == "link_flap":
        count = params.get("count", 3)
        period = params.get("period_seconds", 20)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ScenarioError(f"{where}: params.count must be a positive integer, got {count!r}")
        if isinstance(period, bool) or not isinstance(period, (int, float)) or period < 2:
            raise ScenarioError(f"{where}: params.period_seconds must be a number >= 2, got {period!r}")
        if end is None:
            end = start + count * period
    if "counters_cleared_after" in params and kind not in PORT_FAULTS:
        raise ScenarioError(f"{where}: params.counters_cleared_after applies to port faults only "
                            f"({', '.join(sorted(PORT_FAULTS))})")
    for name in ("rate_per_second", "retrans_fraction", "timeouts_per_second", "counters_cleared_after"):
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ScenarioError(f"{where}: params.{name} must be a non-negative number, got {value!r}")
    return Fault(kind=kind, node=node, start=start, end=end, target=target, params=params)


def load_scenario(source: str | Path | dict) -> Scenario:
    """Read and validate a scenario from a YAML file path or an already-parsed mapping."""
    if isinstance(source, dict):
        data, origin = source, "<dict>"
    else:
        origin = str(source)
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise ScenarioError(f"{origin}: cannot read scenario: {exc.strerror or exc}") from None
        try:
            data = yamlsafe.load(text)
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{origin}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{origin}: top level must be a mapping, got {type(data).__name__}")
    unknown = set(data) - _SCENARIO_KEYS
    if unknown:
        raise ScenarioError(f"{origin}: unknown keys {sorted(unknown)} (allowed: {sorted(_SCENARIO_KEYS)})")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioError(f"{origin}: seed must be an integer, got {seed!r}")
    raw_cluster = data.get("cluster") or {}
    if not isinstance(raw_cluster, dict):
        raise ScenarioError(f"{origin}: cluster must be a mapping")
    unknown = set(raw_cluster) - _CLUSTER_KEYS
    if unknown:
        raise ScenarioError(f"{origin}: unknown cluster keys {sorted(unknown)} (allowed: {sorted(_CLUSTER_KEYS)})")
    cluster = {
        "name": str(raw_cluster.get("name", "demo")),
        "nodes": _positive_int(raw_cluster.get("nodes", 4), "cluster.nodes", 64),
        "gpus_per_node": _positive_int(raw_cluster.get("gpus_per_node", 8), "cluster.gpus_per_node", 8),
        "hcas_per_node": _positive_int(raw_cluster.get("hcas_per_node", 8), "cluster.hcas_per_node", 8),
        "node_prefix": str(raw_cluster.get("node_prefix", "gpu-node")),
    }
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", cluster["node_prefix"]):
        raise ScenarioError(f"cluster.node_prefix: {cluster['node_prefix']!r} must be lower-case letters, digits and '-'")
    tick = parse_duration(data.get("tick_seconds", 1), "tick_seconds")
    if not 0.05 <= tick <= 60:
        raise ScenarioError(f"tick_seconds: must be between 0.05 and 60, got {data.get('tick_seconds')!r}")
    duration = parse_duration(data["duration"], "duration") if data.get("duration") is not None else None
    repeat = parse_duration(data["repeat"], "repeat") if data.get("repeat") is not None else None
    if repeat is not None and repeat <= 0:
        raise ScenarioError(f"repeat: must be positive, got {data['repeat']!r}")
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        raise ScenarioError(f"{origin}: faults must be a list")
    kinds = known_fault_kinds()
    faults = tuple(_parse_fault(i, raw, cluster, kinds, repeat) for i, raw in enumerate(raw_faults))
    return Scenario(seed=seed, cluster_name=cluster["name"], nodes=cluster["nodes"],
                    gpus_per_node=cluster["gpus_per_node"], hcas_per_node=cluster["hcas_per_node"],
                    tick_seconds=tick, node_prefix=cluster["node_prefix"], duration=duration,
                    repeat=repeat, faults=faults, source=origin)


def default_scenario_path() -> Path:
    return Path(__file__).with_name("scenarios") / "default.yaml"
