"""The schema of --web.config.file (exporter-toolkit's format; exporter/webconfig.py uses it).

Imports pydantic: `fabricscope exporter` reads the file through read_web_config_file in a
short-lived child process (exporter/isolated.py), so the serving exporter never does.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from .schema import STRICT, ConfigError, load_yaml, validate

TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
ClientAuth = Literal["NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert"]
# RFC 9110 token characters: a header name outside them, or a value with CR/LF, would let
# the config file split a response.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*\Z")


class TlsServerConfig(BaseModel):
    model_config = STRICT
    cert_file: str
    key_file: str
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: str | None = None
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion | None = None


class HttpServerConfig(BaseModel):
    model_config = STRICT
    headers: dict[str, str] = {}

    @field_validator("headers")
    @classmethod
    def _safe_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"header name {name[:40]!r} is not an HTTP token")
            if not _HEADER_VALUE.match(value):
                raise ValueError(f"header {name!r} has a control character (CR/LF) in its value")
        return headers


class WebConfigFile(BaseModel):
    model_config = STRICT
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = {}
    http_server_config: HttpServerConfig = HttpServerConfig()


def read_web_config_file(path: str) -> dict[str, Any]:
    """The file parsed and validated, as plain values (every key, defaults filled in), or a
    ConfigError naming the file and key path."""
    raw = load_yaml(path)
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return validate(WebConfigFile, raw, path).model_dump()
