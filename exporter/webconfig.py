"""The exporter-toolkit --web.config.file format: TLS and bcrypt basic_auth_users.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      min_version: TLS12                             # optional
    basic_auth_users:
      alice: $2y$10$...      # bcrypt hash, as htpasswd -B makes
    http_server_config:
      headers: {X-Frame-Options: deny}

Relative paths are resolved against the config file's directory, as exporter-toolkit does.
"""
from __future__ import annotations

import base64
import hashlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


class WebConfigError(ValueError):
    pass


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    # Cache of verified (user, password) pairs: bcrypt is deliberately slow (~50-200 ms)
    # and Prometheus sends the same credentials on every scrape.
    _verified: set[tuple[str, bytes, bytes]] = field(default_factory=set)

    def authorized(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except Exception:
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        password_bytes = password.encode()
        # Remember a verified pair by its SHA-256, never the plain password.
        key = (user, hashed, hashlib.sha256(password_bytes).digest())
        if key in self._verified:
            return True
        if bcrypt.checkpw(password_bytes, hashed):
            self._verified.add(key)
            return True
        return False


def load_web_config(path: str | Path | None) -> WebConfig:
    if not path:
        return WebConfig()
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise WebConfigError(f"web config {path}: top level must be a mapping")
    unknown = set(raw) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"web config {path}: unknown keys {sorted(unknown)}")
    base = path.parent
    config = WebConfig()
    tls = raw.get("tls_server_config")
    if tls:
        config.ssl_context = _ssl_context(tls, base, path)
    for user, hashed in (raw.get("basic_auth_users") or {}).items():
        hashed = str(hashed).encode()
        if not hashed.startswith((b"$2a$", b"$2b$", b"$2y$")):
            raise WebConfigError(f"web config {path}: password for {user!r} is not a bcrypt hash")
        config.users[str(user)] = hashed.replace(b"$2y$", b"$2b$", 1)
    config.headers = {str(k): str(v) for k, v in ((raw.get("http_server_config") or {}).get("headers") or {}).items()}
    return config


def _ssl_context(tls: dict, base: Path, path: Path) -> ssl.SSLContext:
    def resolve(name: str) -> str | None:
        value = tls.get(name)
        return str(base / value) if value else None

    cert, key = resolve("cert_file"), resolve("key_file")
    if not cert or not key:
        raise WebConfigError(f"web config {path}: tls_server_config needs cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"web config {path}: cannot load certificate: {exc}") from exc
    context.minimum_version = _TLS_VERSIONS.get(str(tls.get("min_version", "TLS12")), ssl.TLSVersion.TLSv1_2)
    auth_type = str(tls.get("client_auth_type", "NoClientCert"))
    if auth_type not in _CLIENT_AUTH:
        raise WebConfigError(f"web config {path}: unknown client_auth_type {auth_type!r}")
    context.verify_mode = _CLIENT_AUTH[auth_type]
    ca = resolve("client_ca_file")
    if ca:
        context.load_verify_locations(ca)
    elif auth_type in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"):
        raise WebConfigError(f"web config {path}: {auth_type} needs client_ca_file")
    return context
