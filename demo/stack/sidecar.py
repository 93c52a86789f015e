"""The query sidecar as a child process of the demo stack and of the tests: TLS with the
demo CA (fabricscope.devcerts), a keys file with minted keys, ready when /api/versions
answers over https. The sidecar itself is `fabricscope sidecar` (fabricscope.queryapi);
this module only runs it, so the stack never imports the sidecar's code. In the demo
stack it also feeds the sidecar synthetic spans and prints the alerts it records."""
from __future__ import annotations

import json
import logging
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:     # the cryptography package comes with the sidecar extra; `stack --help` needs none
    from fabricscope.devcerts import DevCerts
from .errors import StackError
from .processes import ManagedProcess

log = logging.getLogger("fabricscope.demo.stack.sidecar")

DEFAULT_SIDECAR_PORT = 19500


@dataclass
class SidecarProcess:
    process: ManagedProcess
    url: str
    certs: DevCerts | None
    keys_file: Path

    def stop(self) -> None:
        self.process.stop()

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.certs.ca)) if self.certs else None


def sidecar_argv(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "fabricscope.cli", "sidecar", *args]


def mint_key(keys_file: Path, key_id: str, scopes: str) -> str:
    """A new key in `keys_file`, through the sidecar's own --add-key (printed once)."""
    result = subprocess.run(sidecar_argv("--add-key", key_id, "--scopes", scopes, "--keys-file", str(keys_file)),
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise StackError(f"minting sidecar key {key_id!r}: {result.stderr.strip()}")
    return result.stdout.strip()


def start_sidecar(workdir: Path, host: str, port: int, prometheus_url: str, keys_file: Path,
                  extra_args: list[str] | None = None, tls: bool = True, env: dict[str, str] | None = None,
                  timeout: float = 60.0, python: str = sys.executable) -> SidecarProcess:
    workdir = Path(workdir)
    args = ["--host", host, "--port", str(port), "--prometheus-url", prometheus_url,
            "--keys-file", str(keys_file), "--database", str(workdir / "sidecar.db"),
            "--audit-log", str(workdir / "sidecar-audit.log"), *(extra_args or [])]
    certs = None
    context = None
    if tls:
        from fabricscope.devcerts import ensure_dev_certs
        certs = ensure_dev_certs(workdir / "tls")
        args += ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
        context = ssl.create_default_context(cafile=str(certs.ca))
    else:
        args.append("--insecure-no-tls")
    scheme = "https" if tls else "http"
    url = f"{scheme}://{host}:{port}"
    process = ManagedProcess("sidecar", sidecar_argv(*args, python=python), f"{url}/api/versions", workdir / "sidecar.log",
                             ssl_context=context, env=env)
    process.start(timeout)
    return SidecarProcess(process, url, certs, Path(keys_file))


def https_json(url: str, token: str, context: ssl.SSLContext | None, payload: Any = None,
               timeout: float = 10.0) -> Any:
    """GET (or POST `payload` as JSON) with the API key; the decoded answer."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",  # noqa: S310 - our own sidecar
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310 - our own sidecar
        return json.loads(response.read())


class Periodic(threading.Thread):
    """Runs `step` every `interval` seconds until stopped; failures are logged, not fatal
    (the sidecar may be restarting)."""

    def __init__(self, name: str, interval: float, step: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.interval, self.step, self._stop_event = interval, step, threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.step()
            except (OSError, ValueError) as exc:
                log.warning("%s: %s", self.name, exc)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():          # a stack that failed half-way never started it
            self.join(10)


def span_feeder(sidecar: SidecarProcess, token: str, scenario, scenario_clock: Callable[[], float],
                interval: float = 2.0, per_batch: int = 20) -> Periodic:
    """Posts the demo's synthetic spans (fabricscope.demo.spans) to the sidecar."""
    from ..spans import SyntheticSpans

    source = SyntheticSpans(scenario)
    context = sidecar.ssl_context()

    def step() -> None:
        spans = source.batch(scenario_clock(), int(time.time() * 1000), per_batch)
        https_json(f"{sidecar.url}/tracing/spans", token, context, {"spans": spans})
    return Periodic("span-feeder", interval, step)


HELD = "held by Alertmanager, not notified"


def alert_printer(sidecar: SidecarProcess, token: str, show: Callable[[str], None],
                  interval: float = 1.0) -> Periodic:
    """Prints each alert the sidecar records, once per change of status or receiver (not per
    repeat). An alert the sidecar learnt of from Alertmanager's API before any notification
    (its reconciliation: inhibited, silenced or not yet sent) has no receiver yet: it is shown
    as held, and shown again when the notification brings its receiver."""
    from .webhook import ReceivedNotification, format_notification

    context = sidecar.ssl_context()
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    since = [int(time.time() * 1000)]

    def step() -> None:
        rows = https_json(f"{sidecar.url}/alerts?since_ms={since[0] - 5000}", token, context)["alerts"]
        for row in sorted(rows, key=lambda r: r["last_received_ms"]):
            key = (row["fingerprint"], row["starts_at"])
            if seen.get(key) == (row["status"], row["receiver"]):
                continue
            seen[key] = (row["status"], row["receiver"])
            since[0] = max(since[0], row["last_received_ms"])
            alert = {"status": row["status"], "labels": row["labels"], "annotations": row["annotations"]}
            show(format_notification(ReceivedNotification(row["last_received_ms"] / 1000,
                                                          {"receiver": row["receiver"] or HELD, "alerts": [alert]})))
    return Periodic("alert-printer", interval, step)
