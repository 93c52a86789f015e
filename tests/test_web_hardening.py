"""The exporter's HTTP side under attack: idle and slow connections, request framing that
a proxy could read differently, authentication abuse, hostile bodies and broken web
configs. Each test reproduces one attack against the real server over real sockets."""
from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import threading
import time

import bcrypt
import pytest
import requests

from fabricscope.exporter.context import Context
from fabricscope.exporter.main import start_exporter
from fabricscope.exporter.webconfig import WebConfigError, load_web_config

ROUNDS = 10   # ~60 ms a check here: long enough to see who pays for a bcrypt computation


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# POST /nccl/operations is the body-taking route these attacks need; it is off by default.
INGEST_ON = {"nccl": {"ingest": True}}


@pytest.fixture(scope="module")
def tls_exporter(tmp_path_factory):
    """One TLS + basic-auth exporter (with the NCCL ingest route) for the module."""
    work = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", work / "key.pem", "-out", work / "cert.pem"],
                   check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=ROUNDS)).decode().replace("$2b$", "$2y$")
    # A cheap hash to flood: its checks outrun the 5-a-second limit even on a loaded machine.
    quick = bcrypt.hashpw(b"quick", bcrypt.gensalt(rounds=4)).decode()
    (work / "web.yml").write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
                                  f"basic_auth_users:\n  prom: '{hashed}'\n  quick: '{quick}'\n")
    from tests.conftest import free_port
    port = free_port()
    exporter = start_exporter(Context(node="n", state_dir=work / "state", config=INGEST_ON), ["nccl"], f"127.0.0.1:{port}",
                              str(work / "web.yml"))
    yield exporter, f"https://127.0.0.1:{port}", str(work / "cert.pem")
    exporter.stop()


@pytest.fixture(scope="module")
def plain_exporter(tmp_path_factory):
    work = tmp_path_factory.mktemp("plain")
    from tests.conftest import free_port
    port = free_port()
    exporter = start_exporter(Context(node="n", state_dir=work / "state", config=INGEST_ON), ["nccl"], f"127.0.0.1:{port}")
    yield exporter, port
    exporter.stop()


def exchange(port: int, raw: bytes, wait: float = 1.5) -> bytes:
    """Send raw bytes, return everything the server sends until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(raw)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except socket.timeout:
            pass
    return b"".join(chunks)


def statuses(reply: bytes) -> list[int]:
    return [int(line.split()[1]) for line in reply.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


# ---- 1: idle connections and the TLS handshake ----------------------------------------

def test_silent_connections_do_not_stop_a_tls_exporter(tls_exporter):
    exporter, url, cert = tls_exporter
    idle = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(40)]
    try:
        started = time.monotonic()
        reply = requests.get(url + "/metrics", verify=cert, headers=basic("prom", "s3cret"), timeout=5)
        assert reply.status_code == 200 and "fabric_exporter_build_info" in reply.text
        assert time.monotonic() - started < 3
    finally:
        for sock in idle:
            sock.close()


def test_tls_port_refuses_plaintext_and_old_tls(tls_exporter):
    exporter, url, cert = tls_exporter
    assert not exchange(exporter.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
    try:
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            old.wrap_socket(raw, server_hostname="127.0.0.1")


# ---- 8: framing and connection caps ----------------------------------------------------

def test_chunked_body_is_read(plain_exporter):
    _, port = plain_exporter
    reply = exchange(port, b"POST /nccl/operations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                           b"Connection: close\r\n\r\n1\r\n{\r\n0\r\n\r\n")
    assert statuses(reply) == [400]
    assert b"invalid JSON" in reply          # the body was read, not taken as empty


@pytest.mark.parametrize("headers", [
    b"Content-Length: 2\r\nContent-Length: 40\r\n",
    b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length : 2\r\n",
    b"Content-Length: -2\r\n",
    b"Content-Length: +2\r\n",
    b"Host: y\r\n",
])
def test_ambiguous_framing_is_refused(plain_exporter, headers):
    _, port = plain_exporter
    reply = exchange(port, b"POST /nccl/operations HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n{}"
                           b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(reply) == [400], reply[:300]


@pytest.mark.parametrize("body_headers, body", [
    (b"Content-Length: 38\r\n", b"GET /metrics HTTP/1.1\r\nHost: smuggled\r\n\r\n"),
    (b"Transfer-Encoding: chunked\r\n", b"29\r\nGET /metrics HTTP/1.1\r\nHost: smuggled\r\n\r\n\r\n0\r\n\r\n"),
])
def test_the_unread_body_of_a_refused_request_is_never_a_request(tls_exporter, body_headers, body):
    exporter, url, cert = tls_exporter
    context = ssl.create_default_context(cafile=cert)
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"POST /nccl/operations HTTP/1.1\r\nHost: x\r\n" + body_headers + b"\r\n" + body)
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            except (socket.timeout, ssl.SSLError):
                pass
    reply = b"".join(chunks)
    assert statuses(reply) == [401], reply[:400]
    assert b"fabric_exporter_build_info" not in reply


def test_slow_connections_are_capped_and_cost_no_threads(plain_exporter):
    exporter, port = plain_exporter
    before = threading.active_count()
    slow = []
    try:
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")      # never finishes its headers
            slow.append(sock)
        time.sleep(0.5)
        assert threading.active_count() <= before + 12    # the worker pool, not a thread each
    finally:
        for sock in slow:
            sock.close()
    # Once they are gone the exporter serves normally (while it is still closing them, a new
    # connection from the same address over its share may be reset: retried until then).
    deadline = time.monotonic() + 15
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "the exporter did not serve again after the slow clients left"
        time.sleep(0.2)


# ---- 9: authentication ------------------------------------------------------------------

def _median_seconds(url, cert, user, passwords) -> float:
    times = []
    for password in passwords:
        started = time.perf_counter()
        assert requests.get(url + "/", verify=cert, headers=basic(user, password), timeout=10).status_code == 401
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def test_unknown_users_cost_what_wrong_passwords_cost(tls_exporter):
    exporter, url, cert = tls_exporter
    time.sleep(1)   # a full bucket of password checks
    wrong = _median_seconds(url, cert, "prom", [f"wrong-{i}" for i in range(3)])
    unknown = _median_seconds(url, cert, "mallory", [f"guess-{i}" for i in range(3)])
    assert wrong > 0.01, "a bcrypt check at cost 10 takes tens of milliseconds"
    assert unknown > wrong / 3, f"unknown user answered in {unknown:.4f}s, a wrong password in {wrong:.4f}s"


def test_password_floods_are_throttled_and_repeats_cached_while_scrapes_go_on(tls_exporter):
    exporter, url, cert = tls_exporter
    assert requests.get(url + "/metrics", verify=cert, headers=basic("prom", "s3cret"), timeout=10).status_code == 200
    time.sleep(1)
    from concurrent.futures import ThreadPoolExecutor

    session = requests.Session()
    session.verify = cert

    def attempt(i: int) -> int:
        return session.get(url + "/", verify=cert, headers=basic("quick", f"flood-{i}"), timeout=10).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(attempt, range(60)))
    elapsed = time.monotonic() - started
    # At most the burst (10) plus 5 a second reach bcrypt; the rest are refused at once.
    assert set(codes) <= {401, 429} and codes.count(429) > 0, codes
    assert codes.count(401) <= 10 + 5 * elapsed + 1, (codes.count(401), elapsed)
    # The scraper's credentials were verified before: still served during the flood.
    assert requests.get(url + "/metrics", verify=cert, headers=basic("prom", "s3cret"), timeout=10).status_code == 200
    time.sleep(1)
    # A repeated wrong pair is answered from the refusal cache, not by bcrypt again.
    first = requests.get(url + "/", verify=cert, headers=basic("prom", "same-wrong"), timeout=10).status_code
    again = [requests.get(url + "/", verify=cert, headers=basic("prom", "same-wrong"), timeout=10).status_code
             for _ in range(20)]
    assert first == 401 and set(again) == {401}


@pytest.mark.parametrize("header", [
    None,
    "Basic " + base64.b64encode(b"prom:" + b"x" * 73).decode(),       # bcrypt refuses > 72 bytes
    "Basic " + base64.b64encode("prom:\udcff".encode("utf-8", "surrogatepass")).decode(),
    "Basic not-base64!",
    "Basic " + base64.b64encode(b"no-colon").decode(),
    "Bearer abc",
    "Basic " + "A" * 5000,
])
def test_bad_credentials_get_a_clear_401(tls_exporter, header):
    exporter, url, cert = tls_exporter
    time.sleep(0.3)
    reply = requests.get(url + "/metrics", verify=cert, headers={"Authorization": header} if header else {}, timeout=10)
    assert reply.status_code in (401, 431), reply.status_code
    assert requests.get(url + "/metrics", verify=cert, headers=basic("prom", "s3cret"), timeout=10).status_code == 200


# ---- 11: error responses and web-config mistakes ---------------------------------------

def test_deeply_nested_json_is_a_400(plain_exporter):
    _, port = plain_exporter
    reply = requests.post(f"http://127.0.0.1:{port}/nccl/operations", data=b"[" * 100_000 + b"]" * 100_000, timeout=10)
    assert reply.status_code == 400 and "nested too deeply" in reply.json()["error"]


@pytest.mark.parametrize("record", [
    {"op": "x" * 1_000_000},
    {"op": "AllReduce", "comm": "y" * 1_000_000, "rank": 0, "nranks": 1, "bytes": 1, "start": 1.7e9},
    {"z" * 1_000_000: 1},
])
def test_invalid_input_is_not_echoed_back(plain_exporter, record):
    _, port = plain_exporter
    reply = requests.post(f"http://127.0.0.1:{port}/nccl/operations", data=json.dumps(record), timeout=10)
    assert reply.status_code == 400 and len(reply.content) < 1000, len(reply.content)


@pytest.mark.parametrize("text, message", [
    ("basic_auth_users: [alice]\n", "basic_auth_users: input should be a valid dictionary"),
    ("basic_auth_users:\n  alice: 12\n", "basic_auth_users.alice: input should be a valid string"),
    ("tls_server_config: yes\n", "tls_server_config: input should be a valid dictionary"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS99\n",
     "tls_server_config.min_version: input should be 'TLS10', 'TLS11', 'TLS12' or 'TLS13', got 'TLS99'"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: [x]\n", "tls_server_config.cipher_suites: unknown key"),
    ("http_server_config:\n  headers: {X-A: \"a\\r\\nSet-Cookie: x\"}\n", "control character"),
    ("basic_auth_users:\n  alice: $2b$10$short\n", "basic_auth_users.alice: not a valid bcrypt hash"),
    ("basic_auth_users:\n  alice: $2b$99$" + "a" * 53 + "\n", "basic_auth_users.alice: not a valid bcrypt hash"),
])
def test_web_config_mistakes_name_the_key(tmp_path, text, message):
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("which", ["cert_file", "key_file", "client_ca_file"])
def test_a_fifo_as_a_tls_file_is_a_clear_error_not_a_hang(tmp_path, which):
    """ssl opens the files itself: a FIFO there would block start-up until a writer came."""
    import os

    from fabricscope.devcerts import ensure_dev_certs

    certs = ensure_dev_certs(tmp_path / "certs")
    files = {"cert_file": certs.cert, "key_file": certs.key, "client_ca_file": certs.ca}
    files[which] = tmp_path / "fifo"
    os.mkfifo(files[which])
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n" + "".join(f"  {key}: {value}\n" for key, value in files.items())
                    + "  client_auth_type: RequireAndVerifyClientCert\n")
    with pytest.raises(WebConfigError, match="not a regular file"):
        load_web_config(path)


def test_web_config_mistake_stops_the_exporter_without_a_traceback(tmp_path):
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS99\n")
    result = subprocess.run([sys.executable, "-m", "fabricscope.cli", "exporter", "--web.config.file",
                             str(tmp_path / "web.yml"), "--web.listen-address", "127.0.0.1:0",
                             "--path.state", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "tls_server_config.min_version" in result.stderr and "TLS99" in result.stderr


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"POST /nccl/operations HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n", 413),
    (b"POST /nccl/operations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"500000\r\n" + b"a" * 0x500000, 413),     # a 5 MB chunk: refused once 4 MiB are in
])
def test_oversized_requests_get_their_status_and_the_server_goes_on(plain_exporter, request_bytes, status):
    _, port = plain_exporter
    try:
        reply = exchange(port, request_bytes)
    except ConnectionResetError:
        pytest.fail("connection reset instead of a status")
    assert statuses(reply)[:1] == [status], reply[:200]
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200


def test_a_flood_at_a_trusted_scrapers_address_leaves_the_scrapers_own_login_unthrottled():
    """Behind a NAT, the scraper shares its address with whoever floods it. At a trusted
    address the password-check limit is per configured user; elsewhere per address."""
    from fabricscope.exporter.webconfig import Auth, WebConfig
    from fabricscope.httpadmission import TrustedSources

    def config() -> WebConfig:
        users = {user: bcrypt.hashpw(password, bcrypt.gensalt(rounds=4))
                 for user, password in (("prom", b"scrape"), ("other", b"right"))}
        return WebConfig(users=users, trusted=TrustedSources(["127.0.0.3/32"]),
                         _decoy=bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=4)))

    def flood(web: WebConfig, source: str) -> list[Auth]:
        return [web.authenticate(basic("other", f"wrong-{i}")["Authorization"], source) for i in range(40)]

    trusted = config()
    assert Auth.THROTTLED in flood(trusted, "127.0.0.3")
    assert trusted.authenticate(basic("prom", "scrape")["Authorization"], "127.0.0.3") is Auth.OK
    untrusted = config()
    assert Auth.THROTTLED in flood(untrusted, "127.0.0.4")
    assert untrusted.authenticate(basic("prom", "scrape")["Authorization"], "127.0.0.4") is Auth.THROTTLED


def test_a_bad_trusted_source_stops_the_exporter_at_start_up(tmp_path):
    result = subprocess.run([sys.executable, "-m", "fabricscope.cli", "exporter", "--web.listen-address",
                             "127.0.0.1:0", "--path.state", str(tmp_path), "--web.trusted-sources", "10.0.0.0/8,nat-box"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--web.trusted-sources: 'nat-box' is not an IP address or CIDR network" in result.stderr
