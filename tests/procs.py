"""Real Prometheus and Alertmanager for tests: started on 127.0.0.1 with a free port and a
temporary storage directory, ready (/-/ready answered) before the test body runs, and
always torn down, including when the test fails.

The process handling itself is fabricscope.demo.stack's (the same code `fabricscope stack`
runs); this module only adds pytest-friendly context managers and skip-when-missing.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import pytest
import requests

from fabricscope.demo import stack

HOST = "127.0.0.1"


def require_binary(name: str) -> str:
    """Path of a Debian-packaged binary; fails the test when absent (make setup installs it)."""
    try:
        return stack.find_binary(name)
    except stack.StackError as exc:
        pytest.fail(str(exc))


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


@dataclass
class Pipeline:
    """The demo cluster as the end-to-end tests run it: scraped by Prometheus every second,
    alerts through Alertmanager to a webhook receiver."""
    cluster: Any
    receiver: stack.WebhookReceiver
    alertmanager: Server
    prometheus: Server
    t0: float                       # wall time of scenario second 0 (the cluster's clock is monotonic)


@contextlib.contextmanager
def demo_pipeline(scenario: dict, rules: list[Path], workdir: Path, cluster_name: str,
                  exporter_config: dict | None = None) -> Iterator[Pipeline]:
    """Start everything (failing the test when a binary is missing), tear it all down.
    `exporter_config`: sections over the demo exporters' (the one the rules were rendered with)."""
    from fabricscope.demo import cluster as cluster_mod, scenario as scenario_mod
    from fabricscope.demo.main import write_targets_file

    for binary in ("prometheus", "prometheus-alertmanager"):
        require_binary(binary)
    loaded = scenario_mod.load_scenario(scenario) if isinstance(scenario, dict) else scenario
    with stack.WebhookReceiver() as receiver:
        am_config = stack.alertmanager_config(receiver.url, timing={
            "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"})
        with alertmanager(am_config, workdir / "am") as am, \
                cluster_mod.DemoCluster(loaded, workdir / "cluster", exporter_config=exporter_config) as cluster:
            t0 = time.time() - cluster.now()
            targets = write_targets_file(workdir / "targets.json", cluster.targets, cluster_name)
            prom_config = stack.prometheus_config(cluster_name, targets, am.url.removeprefix("http://"), rules,
                                                  scrape_interval="1s", evaluation_interval="1s")
            with prometheus(prom_config, workdir / "prom") as prom:
                yield Pipeline(cluster, receiver, am, prom, t0)


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


def victoria_metrics(workdir: Path) -> ContextManager[Server]:
    """Debian's single-node VictoriaMetrics on a free port: the Prometheus HTTP API, fed
    by Prometheus remote_write at /api/v1/write."""
    return _victoria_metrics(workdir)


@contextlib.contextmanager
def _victoria_metrics(workdir: Path) -> Iterator[Server]:
    binary = require_binary("victoria-metrics")
    port = stack.free_port(HOST)
    # latencyOffset 0: answer instant queries up to "now" (the default hides the last 30s,
    # which a test querying fresh samples would read as missing data).
    argv = [binary, f"-httpListenAddr={HOST}:{port}", f"-storageDataPath={workdir / 'vm-data'}",
            "-retentionPeriod=1d", "-search.latencyOffset=0s", "-loggerLevel=ERROR"]
    process = stack.ManagedProcess("victoria-metrics", argv, f"http://{HOST}:{port}/health",
                                   workdir / "victoria-metrics.log").start()
    try:
        yield Server(process, f"http://{HOST}:{port}")
    finally:
        process.stop()


def postgres_bin(name: str) -> str:
    """A PostgreSQL server binary: Debian keeps them in /usr/lib/postgresql/<version>/bin."""
    import glob
    import shutil

    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    found = candidates[-1] if candidates else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found; run `make setup` (installs the Debian package postgresql)")
    return found


@contextlib.contextmanager
def postgres(workdir: Path) -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 with trust auth; yields its URL.

    initdb refuses to run as root, so as root the server runs as the `postgres` user
    the Debian package creates (or `nobody`), owning only its own data directory."""
    import os
    import pwd
    import subprocess

    import shutil
    import tempfile

    initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
        if user is None:
            pytest.skip("running as root and no postgres/nobody user to run PostgreSQL as")
        # pytest's tmp_path is private to root (0700 parents): the server user could not
        # reach it. A directory of its own under /tmp can.
        workdir = Path(tempfile.mkdtemp(prefix="fabricscope-pg-"))
        entry = pwd.getpwnam(user)
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
        prefix = ["runuser", "-u", user, "--"]
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "pgdata"
    port = stack.free_port(HOST)
    for argv in ([*prefix, initdb, "-D", str(data), "-U", "fabricscope", "--auth=trust", "-E", "UTF8", "--no-sync"],
                 [*prefix, pg_ctl, "-D", str(data), "-l", str(workdir / "postgres.log"),
                  "-o", f"-p {port} -h {HOST} -k {data}", "-w", "-t", "60", "start"]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
    try:
        yield f"postgresql://fabricscope@{HOST}:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        if prefix:
            shutil.rmtree(workdir, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def child_pids_with_argument(argument: str) -> list[int]:
    """Processes whose command line contains `argument` (found through /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if argument.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
