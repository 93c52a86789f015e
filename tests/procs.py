"""Real Prometheus and Alertmanager for tests: started on 127.0.0.1 with a free port and a
temporary storage directory, ready (/-/ready answered) before the test body runs, and
always torn down, including when the test fails.

The process handling itself is fabricscope.stack's (the same code `fabricscope stack`
runs); this module only adds pytest-friendly context managers and skip-when-missing.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import pytest
import requests

from fabricscope import stack

HOST = "127.0.0.1"


def require_binary(name: str) -> str:
    """Path of a Debian-packaged binary; skips the test with the reason when absent."""
    try:
        return stack.find_binary(name)
    except stack.StackError as exc:
        pytest.skip(str(exc))


class Server:
    """A running server: its process and base URL."""

    def __init__(self, process: stack.ManagedProcess, url: str) -> None:
        self.process = process
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        response = requests.get(self.url + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, payload: Any) -> requests.Response:
        response = requests.post(self.url + path, json=payload, timeout=10)
        response.raise_for_status()
        return response


def alertmanager(config: dict[str, Any] | Path, workdir: Path) -> ContextManager[Server]:
    """Alertmanager on a free port with `config` (a dict is written to workdir first)."""
    return _server("alertmanager", "prometheus-alertmanager", stack.start_alertmanager, config, workdir)


def prometheus(config: dict[str, Any] | Path, workdir: Path) -> ContextManager[Server]:
    """Prometheus on a free port with `config` (a dict is written to workdir first)."""
    return _server("prometheus", "prometheus", stack.start_prometheus, config, workdir)


@contextlib.contextmanager
def _server(name: str, binary: str, start: Callable[..., stack.ManagedProcess],
            config: dict[str, Any] | Path, workdir: Path) -> Iterator[Server]:
    require_binary(binary)
    config_path = _config_file(config, workdir / f"{name}.yml")
    port = stack.free_port(HOST)
    process = start(config_path, workdir / f"{name}-data", HOST, port, workdir / f"{name}.log")
    try:
        yield Server(process, f"http://{HOST}:{port}")
    finally:
        process.stop()


def _config_file(config: dict[str, Any] | Path, path: Path) -> Path:
    if isinstance(config, dict):
        return stack.write_yaml(path, config)
    return Path(config)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll until `condition()` is truthy and return it; fail naming `what` otherwise.

    The timeout is a generous upper bound for a real component to converge, not a
    performance assertion."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
