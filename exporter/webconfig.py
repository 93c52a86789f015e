"""The exporter-toolkit --web.config.file format: TLS and bcrypt basic_auth_users.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      min_version: TLS12                             # optional (TLS12 default)
      max_version: TLS13                             # optional
    basic_auth_users:
      alice: $2y$10$...      # bcrypt hash, as htpasswd -B makes
    http_server_config:
      headers: {X-Frame-Options: deny}

Relative paths are resolved against the config file's directory, as exporter-toolkit does.
The file is validated against one schema (exporter/webconfig_schema.py) at start-up: an
unknown key (including exporter-toolkit keys this exporter does not implement), a wrong
type, an unknown TLS version or a hash bcrypt cannot use stops the exporter with the key
path. The schema check runs in a short-lived child process (exporter/isolated.py), so
pydantic and PyYAML are not kept in the serving exporter.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

from fabricscope.httpadmission import TrustedSources

from .isolated import IsolatedStepError, in_child
from .parsers.files import UnreadableFile, read_file_bytes
from .schema import ConfigError

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
_BCRYPT_MAX_PASSWORD = 72   # bytes bcrypt looks at; longer is refused, never silently cut


class WebConfigError(ConfigError):
    pass


class Auth(Enum):
    OK = "ok"
    DENIED = "denied"           # 401
    THROTTLED = "throttled"     # 429: too many password checks right now


class _FailureRate:
    """Token bucket for bcrypt checks of credentials not seen before: a flood of wrong
    passwords costs at most `per_second` hash computations, not a CPU per request."""
    # One bucket per client address: a flood from one address must not throttle the
    # scraper's correct credentials from another. At a trusted source's address (the
    # scraper's, perhaps shared through a NAT) one bucket per configured user, and one for
    # unknown users: a flood there against another user does not throttle the scraper's.

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second, self.burst = per_second, burst
        self.tokens = float(burst)
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.per_second)
            self.updated = now
            if self.tokens < 1:
                return False
            self.tokens -= 1
            return True


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    # Verified and refused (user, SHA-256 of password) pairs, most recent last: bcrypt is
    # deliberately slow (~50-200 ms) and Prometheus sends the same credentials on every
    # scrape; an attacker repeating a wrong pair gets the cached answer. Never the
    # plain password.
    cache_size: int = 1024
    _verified: OrderedDict = field(default_factory=OrderedDict)
    _refused: OrderedDict = field(default_factory=OrderedDict)
    # Password checks per client address (most recently used last, at most cache_size
    # addresses: the oldest is forgotten, and a forgotten address starts with a full burst).
    _rates: OrderedDict = field(default_factory=OrderedDict)
    # Hash checked for unknown users, at the configured cost, so an unknown user costs
    # the same as a wrong password and usernames cannot be found by timing.
    _decoy: bytes = b""
    trusted: TrustedSources = field(default_factory=TrustedSources)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, header: str | None, source: str = "") -> bool:
        return self.authenticate(header, source) is Auth.OK

    def authenticate(self, header: str | None, source: str = "") -> Auth:
        """The verdict on a basic-auth header sent from address `source`."""
        if not self.users:
            return Auth.OK
        if not header or not header.startswith("Basic ") or len(header) > 1024:
            return Auth.DENIED
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return Auth.DENIED
        password_bytes = password.encode()
        if not sep or len(password_bytes) > _BCRYPT_MAX_PASSWORD:
            return Auth.DENIED
        key = (user, hashlib.sha256(password_bytes).digest())
        with self._lock:
            if key in self._verified:
                self._verified.move_to_end(key)
                return Auth.OK
            if key in self._refused:
                return Auth.DENIED
        bucket = (source, user if user in self.users else None) if source in self.trusted else source
        if not self._rate_of(bucket).take():
            return Auth.THROTTLED
        hashed = self.users.get(user)
        import bcrypt   # users are configured (none: returned above)
        try:
            ok = bcrypt.checkpw(password_bytes, hashed if hashed is not None else self._decoy) and hashed is not None
        except ValueError:      # cannot happen for validated hashes; refuse rather than fail
            ok = False
        with self._lock:
            table = self._verified if ok else self._refused
            table[key] = True
            if len(table) > self.cache_size:
                table.popitem(last=False)
        return Auth.OK if ok else Auth.DENIED


    def _rate_of(self, source: "str | tuple[str, str | None]") -> _FailureRate:
        with self._lock:
            rate = self._rates.get(source)
            if rate is None:
                rate = self._rates[source] = _FailureRate(per_second=5.0, burst=10)
                if len(self._rates) > self.cache_size:
                    self._rates.popitem(last=False)
            else:
                self._rates.move_to_end(source)
            return rate


def load_web_config(path: str | Path | None) -> WebConfig:
    if not path:
        return WebConfig()
    path = Path(path)
    try:
        parsed = in_child(_read_web_config_file, str(path))
    except (ConfigError, IsolatedStepError) as exc:
        raise WebConfigError(str(exc)) from None
    config = WebConfig(headers=dict(parsed["http_server_config"]["headers"]))
    if parsed["tls_server_config"] is not None:
        config.ssl_context = _ssl_context(SimpleNamespace(**parsed["tls_server_config"]), path.parent, path)
    costs = []
    for user, hashed in parsed["basic_auth_users"].items():
        config.users[user] = _usable_hash(hashed, user, path)
        costs.append(int(config.users[user][4:6]))
    if costs:
        import bcrypt   # only an exporter that checks passwords imports it (0.5 MB resident)
        config._decoy = bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=max(costs)))
    return config


def _read_web_config_file(path: str) -> dict:
    from .webconfig_schema import read_web_config_file   # imports pydantic: in a child process
    return read_web_config_file(path)


def _usable_hash(hashed: str, user: str, path: Path) -> bytes:
    where = f"{path}: basic_auth_users.{user}"
    raw = hashed.encode()
    if not raw.startswith((b"$2a$", b"$2b$", b"$2y$")):
        raise WebConfigError(f"{where}: not a bcrypt hash (expected $2y$..., as htpasswd -B writes)")
    raw = raw.replace(b"$2y$", b"$2b$", 1)
    # A hash with the right prefix can still be one bcrypt refuses (bad cost, truncated
    # salt): find out now, not on the first login.
    import bcrypt

    try:
        bcrypt.checkpw(b"", raw)
    except ValueError as exc:
        raise WebConfigError(f"{where}: not a valid bcrypt hash ({exc})") from None
    if not 4 <= int(raw[4:6]) <= 31:
        raise WebConfigError(f"{where}: bcrypt cost {raw[4:6].decode()} is out of range")
    return raw


def _ssl_context(tls: SimpleNamespace, base: Path, path: Path) -> ssl.SSLContext:
    def resolve(name: str | None) -> str | None:
        if not name:
            return None
        file = base / name
        try:
            read_file_bytes(file)     # ssl's own open of a FIFO or a device would block start-up forever
        except UnreadableFile as exc:
            raise WebConfigError(f"{path}: tls_server_config: {file}: {exc}") from None
        return str(file)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(resolve(tls.cert_file), resolve(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{path}: tls_server_config: cannot load certificate: {exc}") from None
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    if tls.max_version is not None:
        if _TLS_VERSIONS[tls.max_version] < context.minimum_version:
            raise WebConfigError(f"{path}: tls_server_config.max_version {tls.max_version} is below "
                                 f"min_version {tls.min_version}")
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
    context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file:
        try:
            context.load_verify_locations(resolve(tls.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{path}: tls_server_config.client_ca_file: cannot load: {exc}") from None
    elif tls.client_auth_type in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"):
        raise WebConfigError(f"{path}: tls_server_config.client_ca_file: required by {tls.client_auth_type}")
    return context
