"""Child server processes (Prometheus, Alertmanager): started, awaited until ready, always reaped."""
from __future__ import annotations

import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .binaries import find_binary
from .errors import StackError


@dataclass
class ManagedProcess:
    """A child server process with a readiness URL; stop() always reaps it.

    Output goes to `log_path` (not a pipe nobody reads, which would block the child once
    the pipe buffer fills)."""
    name: str
    argv: list[str]
    ready_url: str
    log_path: Path
    # For an https ready_url served with a certificate of a private CA (the demo's).
    ssl_context: ssl.SSLContext | None = None
    env: dict[str, str] | None = None      # the child's environment (default: ours)
    process: subprocess.Popen | None = None
    _log_file: Any = field(default=None, repr=False)

    def start(self, timeout: float = 60.0) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        # A new session so Ctrl-C in the terminal reaches only us; we stop the child
        # ourselves, in order, after the things that depend on it.
        self.process = subprocess.Popen(self.argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise StackError(f"{self.name} exited with status {code} before it was ready; "
                                 f"last output:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2, context=self.ssl_context) as response:  # noqa: S310 - our own server
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} not ready at {self.ready_url} after {timeout:.0f}s; "
                                 f"last output:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_prometheus(config_path: Path, data_dir: Path, host: str, port: int, log_path: Path,
                     extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    binary = find_binary("prometheus")
    argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={host}:{port}", "--log.level=warn", *(extra_args or [])]
    return ManagedProcess("prometheus", argv, f"http://{host}:{port}/-/ready", log_path).start(timeout)


def start_alertmanager(config_path: Path, data_dir: Path, host: str, port: int, log_path: Path,
                       extra_args: list[str] | None = None, timeout: float = 60.0) -> ManagedProcess:
    binary = find_binary("prometheus-alertmanager")
    argv = [binary, f"--config.file={config_path}", f"--storage.path={data_dir}",
            f"--web.listen-address={host}:{port}", f"--web.external-url=http://{host}:{port}/",
            # Empty: no gossip cluster (a single local Alertmanager needs no peers, and
            # the default 0.0.0.0:9094 may be taken).
            "--cluster.listen-address=", "--log.level=warn", *(extra_args or [])]
    return ManagedProcess("alertmanager", argv, f"http://{host}:{port}/-/ready", log_path).start(timeout)
