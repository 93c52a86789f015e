"""The query sidecar as a child process of the demo stack and of the tests: TLS with the
demo CA (fabricscope.devcerts), a keys file with minted keys, ready when /api/versions
answers over https. The sidecar itself is `fabricscope sidecar` (fabricscope.queryapi);
this module only runs it, so the stack never imports the sidecar's code."""
from __future__ import annotations

import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .devcerts import DevCerts, ensure_dev_certs
from .stack import ManagedProcess, StackError

DEFAULT_SIDECAR_PORT = 19500


@dataclass
class SidecarProcess:
    process: ManagedProcess
    url: str
    certs: DevCerts | None
    keys_file: Path

    def stop(self) -> None:
        self.process.stop()


def sidecar_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fabricscope.cli", "sidecar", *args]


def mint_key(keys_file: Path, key_id: str, scopes: str) -> str:
    """A new key in `keys_file`, through the sidecar's own --add-key (printed once)."""
    result = subprocess.run(sidecar_argv("--add-key", key_id, "--scopes", scopes, "--keys-file", str(keys_file)),
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise StackError(f"minting sidecar key {key_id!r}: {result.stderr.strip()}")
    return result.stdout.strip()


def start_sidecar(workdir: Path, host: str, port: int, prometheus_url: str, keys_file: Path,
                  extra_args: list[str] | None = None, tls: bool = True, env: dict[str, str] | None = None,
                  timeout: float = 60.0) -> SidecarProcess:
    workdir = Path(workdir)
    args = ["--host", host, "--port", str(port), "--prometheus-url", prometheus_url,
            "--keys-file", str(keys_file), "--database", str(workdir / "sidecar.db"),
            "--audit-log", str(workdir / "sidecar-audit.log"), *(extra_args or [])]
    certs = None
    context = None
    if tls:
        certs = ensure_dev_certs(workdir / "tls")
        args += ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
        context = ssl.create_default_context(cafile=str(certs.ca))
    else:
        args.append("--insecure-no-tls")
    scheme = "https" if tls else "http"
    url = f"{scheme}://{host}:{port}"
    process = ManagedProcess("sidecar", sidecar_argv(*args), f"{url}/api/versions", workdir / "sidecar.log",
                             ssl_context=context, env=env)
    process.start(timeout)
    return SidecarProcess(process, url, certs, Path(keys_file))
