"""Secrets and generated configs for deploy/compose: run once into a shared volume.

    python -m fabricscope.deploy_secrets /secrets [--sidecar-url https://sidecar:19500]
        [--exporter-address 127.0.0.1:19400] [--alertmanager-address 127.0.0.1:19093]

Writes, each only if missing (so a restart keeps the key Grafana already uses):
  tls/ca.pem, tls/server.pem, tls/server-key.pem   the sidecar's certificate (local CA)
  ca.pem                                            the CA again, for Grafana and Prometheus
  keys.yaml                                         the sidecar's key file (hashes only)
  sidecar-token                                     the key Grafana's Infinity datasource and
                                                    Alertmanager's webhook present (read,write)
and, every run, alertmanager.yml: the repository's routing with its sidecar webhook
pointed at the sidecar over TLS with that token, and its notification templates
(templates/), so the Alertmanager container needs nothing but this volume; and
targets/{exporter,sidecar,alertmanager}.json, the file_sd target lists Prometheus's config
reads, so the ports come from compose's variables and not from a copy of them.
Every file is world-readable: Prometheus, Alertmanager and Grafana read them as their own
unprivileged users; the volume, mounted only into the stack's containers, is the boundary.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlparse

from .alertmanager import ALERTMANAGER_DIR
from .devcerts import ensure_dev_certs
from fabricscope.demo.stack import SIDECAR_WEBHOOK_PATH, StackError, alertmanager_config, write_yaml

GRAFANA_KEY_ID = "grafana"


def write_targets(directory: Path, **addresses: str) -> Path:
    """One file_sd list per service: [{"targets": ["host:port"]}]."""
    targets = directory / "targets"
    targets.mkdir(parents=True, exist_ok=True)
    for name, address in addresses.items():
        (targets / f"{name}.json").write_text(json.dumps([{"targets": [address]}]) + "\n")
        os.chmod(targets / f"{name}.json", 0o644)
    return targets


def write_secrets(directory: Path, sidecar_url: str, exporter_address: str = "127.0.0.1:19400",
                  alertmanager_address: str = "127.0.0.1:19093") -> dict[str, Path]:
    from fabricscope.queryapi.keys import add_key

    directory = Path(directory)
    host = urlparse(sidecar_url).hostname or "sidecar"
    certs = ensure_dev_certs(directory / "tls", hosts=tuple(dict.fromkeys((host, "localhost", "127.0.0.1"))))
    shutil.copyfile(certs.ca, directory / "ca.pem")
    token_file = directory / "sidecar-token"
    if not token_file.exists():
        token = add_key(directory / "keys.yaml", GRAFANA_KEY_ID, ["read", "write"])
        token_file.write_text(token)
    os.chmod(token_file, 0o644)
    templates = directory / "templates"
    shutil.copytree(ALERTMANAGER_DIR / "templates", templates, dirs_exist_ok=True)
    config = alertmanager_config(sidecar_url.rstrip("/") + SIDECAR_WEBHOOK_PATH, webhook_http_config={
        "tls_config": {"ca_file": "/secrets/ca.pem"},
        "authorization": {"credentials_file": "/secrets/sidecar-token"}})
    config["templates"] = [str(templates / Path(glob).name) for glob in config["templates"]]
    alertmanager = write_yaml(directory / "alertmanager.yml", config)
    sidecar = urlparse(sidecar_url)
    targets = write_targets(directory, exporter=exporter_address, alertmanager=alertmanager_address,
                            sidecar=f"{sidecar.hostname}:{sidecar.port or 443}")
    return {"ca": directory / "ca.pem", "token": token_file, "keys": directory / "keys.yaml",
            "alertmanager": alertmanager, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.deploy_secrets", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--sidecar-url", default="https://sidecar:19500")
    parser.add_argument("--exporter-address", default="127.0.0.1:19400", help="host:port Prometheus scrapes")
    parser.add_argument("--alertmanager-address", default="127.0.0.1:19093", help="host:port Prometheus alerts")
    args = parser.parse_args(argv)
    try:
        for name, path in write_secrets(args.directory, args.sidecar_url, args.exporter_address,
                                        args.alertmanager_address).items():
            print(f"{name}: {path}")
    except (StackError, OSError) as exc:
        print(f"deploy_secrets: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
