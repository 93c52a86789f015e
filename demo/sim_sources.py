"""Discovery and isolation of the demo's simulated sources (demo/sources/*.py).

A source module that fails to import, to build, or to step is logged and set aside; the
rest of the node (and the cluster) keeps running, exactly like a failing collector.
"""
from __future__ import annotations

import importlib
import logging
import pkgutil
import random
from types import ModuleType
from typing import Any

from .plugin import ClusterSpec, Fault, NodeSpec

log = logging.getLogger("fabricscope.demo.sources")

_import_failures: set[str] = set()


def discover_source_modules() -> dict[str, ModuleType]:
    """Every module in fabricscope.demo.sources with a make_source function, by module name."""
    from . import sources

    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(sources.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{sources.__name__}.{info.name}")
        except Exception:
            if info.name not in _import_failures:  # log once, not on every scenario load
                _import_failures.add(info.name)
                log.exception("demo source module %s cannot be imported; skipped", info.name)
            continue
        if callable(getattr(module, "make_source", None)):
            found[info.name] = module
    return found


def source_rng(seed: int, node_index: int, module_name: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.Random: stable across processes
    # and Python runs (unlike hash()), so the same scenario seed replays the same values.
    return random.Random(f"fabricscope-demo/{seed}/{node_index}/{module_name}")


class NodeSources:
    """The simulated sources of one node, each stepped in isolation."""

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, modules: dict[str, ModuleType]) -> None:
        self.node = node
        self.by_key: dict[str, Any] = {}
        self._names: dict[str, str] = {}        # source key -> module name, for messages
        self.failures: dict[str, int] = {}      # module name -> failed steps/builds
        for name, module in modules.items():
            try:
                source = module.make_source(node, cluster, source_rng(cluster.seed, node.index, name))
                key = source.key
            except Exception:
                log.exception("demo source %s could not start on %s; node runs without it", name, node.name)
                self.failures[name] = self.failures.get(name, 0) + 1
                continue
            if key in self.by_key:
                log.error("demo sources %s and %s both claim key %r on %s; keeping %s",
                          self._names[key], name, key, node.name, self._names[key])
                continue
            self.by_key[key] = source
            self._names[key] = name

    def step(self, now: float, faults: list[Fault]) -> None:
        for key, source in self.by_key.items():
            name = self._names[key]
            try:
                source.step(now, faults)
            except Exception:
                count = self.failures.get(name, 0) + 1
                self.failures[name] = count
                # First failure with its traceback, then a reminder now and then, not a flood.
                if count == 1:
                    log.exception("demo source %s failed to step on %s at t=%.1fs", name, self.node.name, now)
                elif count % 300 == 0:
                    log.error("demo source %s on %s has failed %d steps", name, self.node.name, count)
