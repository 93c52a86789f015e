"""The sidecar as operators run it: `fabricscope sidecar` under gunicorn with TLS, over
real sockets. Security defaults (TLS, keys and scopes, rate limit, body limit, audit),
probes, the OpenAPI document and key rotation."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests

from fabricscope.sidecar_process import sidecar_argv, start_sidecar
from fabricscope.stack import free_port
from fabricscope.queryapi.keys import add_key
from tests.procs import wait_for
from tests.sidecar_helpers import bearer, make_keys

MAX_BODY = 4096


class Server:
    def __init__(self, process, keys: dict[str, str], workdir: Path) -> None:
        self.process = process
        self.url = process.url
        self.keys = keys
        self.workdir = workdir
        self.session = requests.Session()
        # Per request, not session.verify: REQUESTS_CA_BUNDLE in the environment would win.
        self.ca = str(process.certs.ca)

    def request(self, method: str, path: str, key: str | None = None, **kwargs) -> requests.Response:
        headers = {**(bearer(self.keys[key]) if key else {}), **kwargs.pop("headers", {})}
        return self.session.request(method, self.url + path, headers=headers, timeout=15, verify=self.ca, **kwargs)

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in (self.workdir / "sidecar-audit.log").read_text().splitlines()]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sidecar")
    keys = make_keys(workdir / "keys.yaml", {"limited": "read"})
    # The limited key: 1 request/s with a burst of 3.
    text = (workdir / "keys.yaml").read_text().replace(
        "- id: limited\n", "- id: limited\n  rate_limit: {per_second: 1, burst: 3}\n")
    (workdir / "keys.yaml").write_text(text)
    unreachable = f"http://127.0.0.1:{free_port()}"
    process = start_sidecar(workdir, "127.0.0.1", free_port(), unreachable, workdir / "keys.yaml",
                            extra_args=["--max-body-bytes", str(MAX_BODY), "--prometheus-timeout", "1"])
    try:
        yield Server(process, keys, workdir)
    finally:
        process.stop()


def test_tls_is_required_unless_explicitly_opted_out(tmp_path):
    result = subprocess.run(sidecar_argv("--database", str(tmp_path / "db"), "--port", str(free_port())),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "TLS is required" in result.stderr and "--insecure-no-tls" in result.stderr


def test_tls_is_on_by_default(server):
    assert server.url.startswith("https://")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(server.url.replace("https://", "http://") + "/api/versions", timeout=5)
    # An unknown CA is refused by a verifying client.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/api/versions", timeout=5)


def test_versions_probe_is_open_and_gives_major_minor_only(server):
    response = server.request("GET", "/api/versions")
    assert response.status_code == 200
    assert re.fullmatch(r"\d+\.\d+", response.json()["version"])
    assert "v1" in response.json()["api_versions"]


def test_health_is_liveness_without_a_key_and_full_with_one(server):
    anonymous = server.request("GET", "/api/v1/health").json()
    assert anonymous["status"] == "ok" and anonymous["version"] is None
    full = server.request("GET", "/api/v1/health", "reader").json()
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", full["version"])
    assert full["storage"] == "sqlite" and full["schema_version"] >= 1
    # Prometheus is down in this module: health says so instead of failing.
    assert full["prometheus"] == "unreachable"


def test_no_key_is_401_an_unknown_key_is_401_a_missing_scope_is_403(server):
    response = server.request("GET", "/api/v1/openapi.json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
    assert "Bearer" in response.headers["WWW-Authenticate"]
    response = server.request("GET", "/api/v1/openapi.json", headers={"X-API-Key": "fsk_not-a-key"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "bad_credentials"
    response = server.request("POST", "/api/v1/admin/retention/run", "writer")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert server.request("POST", "/api/v1/admin/retention/run", "admin").status_code == 200
    # Unknown paths need a key too (no probing for endpoints), then 404.
    assert server.request("GET", "/nope").status_code == 401
    response = server.request("GET", "/nope", "reader")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_openapi_document_is_3_1_and_generated_from_the_code(server):
    spec = server.request("GET", "/api/v1/openapi.json", "reader").json()
    assert spec["openapi"].startswith("3.1")
    assert {"/api/versions", "/api/v1/health", "/api/v1/admin/retention/run"} <= set(spec["paths"])
    assert spec["paths"]["/api/v1/admin/retention/run"]["post"]["security"]


def test_rate_limit_answers_429_and_the_429_is_audited(server):
    statuses = [server.request("GET", "/api/v1/openapi.json", "limited").status_code for _ in range(6)]
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    limited = server.request("GET", "/api/v1/openapi.json", "limited")
    if limited.status_code == 429:
        assert int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["code"] == "rate_limited"
    # Other keys are not affected.
    assert server.request("GET", "/api/v1/openapi.json", "reader").status_code == 200
    records = wait_for(lambda: [r for r in server.audit() if r["status"] == 429], 10, "429 in the audit log")
    assert records[0]["key_id"] == "limited" and records[0]["error_code"] == "rate_limited"
    assert records[0]["path"] == "/api/v1/openapi.json"
    # Rejected authentication is audited as well, and no record carries a key.
    audit_text = (server.workdir / "sidecar-audit.log").read_text()
    assert any(r["status"] == 401 for r in server.audit())
    assert not any(token in audit_text for token in server.keys.values())


def test_a_body_over_the_limit_is_413(server):
    response = server.request("POST", "/api/v1/admin/retention/run", "admin", data=b"x" * (MAX_BODY + 1),
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_keys_rotate_without_a_restart(server):
    keys_file = server.workdir / "keys.yaml"
    token = add_key(keys_file, "rotated-in", ["read"])
    wait_for(lambda: server.request("GET", "/api/v1/openapi.json", headers=bearer(token)).status_code == 200,
             10, "a newly added key to be accepted")
    text = keys_file.read_text()
    start = text.index("- id: rotated-in")
    keys_file.write_text(text[:start])
    wait_for(lambda: server.request("GET", "/api/v1/openapi.json", headers=bearer(token)).status_code == 401,
             10, "a removed key to be refused")
    # A broken edit keeps the keys that worked.
    keys_file.write_text(text[:start] + "keys: [this is not\n")
    time.sleep(1.5)
    assert server.request("GET", "/api/v1/openapi.json", "reader").status_code == 200
    keys_file.write_text(text[:start])


def test_second_sidecar_on_the_same_database_is_refused(server):
    result = subprocess.run(sidecar_argv("--database", str(server.workdir / "sidecar.db"), "--insecure-no-tls",
                                         "--port", str(free_port())),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "locked by another sidecar process" in result.stderr
