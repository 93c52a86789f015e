"""Clients that try to stall the exporter and the sidecar, against the real processes over
TLS and plaintext: attackers connect from 127.0.0.1 (a crowd from 127.0.0.10-250), the
normal client from 127.0.0.2 (tests/hostile.py). Each test is one row of docs/security.md.

Timing: the rows that bound how long something takes (the normal client under attack,
a request while Prometheus is paused, SIGTERM, the crowd with Prometheus scraping) are
marked `timing` (run alone after the parallel pass). The whole file takes about 3 minutes
on two cores: four servers, each attacked for a few seconds by 800 connections and by
1,000 silent sockets, then for 20 s by a crowd of 1,000 sockets while Prometheus scrapes.
"""
from __future__ import annotations

import base64
import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from fabricscope.demo.stack import free_port
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.hostile import (ATTACKER, CLIENT, FRAMING, KINDS, Attack, Crowd, framing_exchange, otlp_empty_spans,
                           every_route, otlp_export, p90, prometheus_scraping, scrapes, silent_sockets, timed_get,
                           worst)
from tests.sidecar_helpers import bearer, make_keys

FIXTURE = Path(__file__).parent / "fixtures" / "node"
COLLECTORS = ["infiniband", "netdev", "tcp"]
CLIENT_TIMEOUT = 3          # the sidecar's --client-timeout here; the exporter's own is 3 s
PER_KIND = 200
SAMPLES = 20


@dataclass
class Target:
    name: str
    port: int
    context: ssl.SSLContext | None
    path: str
    headers: dict[str, str]
    process: subprocess.Popen | None = None
    workdir: Path | None = None
    scrape_auth: dict[str, str] | None = None       # Prometheus's basic_auth for /metrics

    def get(self, path: str | None = None, headers: dict[str, str] | None = None, source: str | None = None,
            timeout: float = 10.0):
        extra = {"source": source} if source else {}
        return timed_get("127.0.0.1", self.port, path or self.path, self.context,
                         headers if headers is not None else self.headers, timeout=timeout, **extra)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def wait_until_served(target: Target, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while target.get()[0] != 200:
        assert time.monotonic() < deadline, f"{target.name} did not start"
        time.sleep(0.2)


def start_exporter(workdir: Path, tls: bool) -> Target:
    from fabricscope.devcerts import ensure_dev_certs
    from fabricscope.exporter.framework import load_collector_modules

    port = free_port()
    args = [sys.executable, "-m", "fabricscope.cli", "exporter", f"--web.listen-address=127.0.0.1:{port}",
            f"--path.sysfs={FIXTURE}/sys", f"--path.procfs={FIXTURE}/proc", f"--path.rootfs={FIXTURE}",
            f"--path.kmsg={FIXTURE}/kmsg", f"--path.state={workdir}/state",
            *[f"--no-collector.{name}" for name in load_collector_modules() if name not in COLLECTORS]]
    context, headers = None, {}
    if tls:
        certs = ensure_dev_certs(workdir / "tls")
        # Two users at a low bcrypt cost: "prometheus" scrapes, "other" logs in only once,
        # right after a flood (its password never verified before, so never cached).
        users = {user: bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=6)).decode()
                 for user, password in (("prometheus", "scrape"), ("other", "right"))}
        (workdir / "web.yml").write_text(
            f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\nbasic_auth_users:\n"
            + "".join(f"  {user}: '{hashed}'\n" for user, hashed in users.items()))
        args.append(f"--web.config.file={workdir / 'web.yml'}")
        context = ssl.create_default_context(cafile=str(certs.ca))
        headers = basic("prometheus", "scrape")
    log = open(workdir / "exporter.log", "w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    target = Target(f"exporter-{'tls' if tls else 'plain'}", port, context, "/metrics", headers, process, workdir,
                    {"username": "prometheus", "password": "scrape"} if tls else None)
    try:
        wait_until_served(target)
    except BaseException:
        process.kill()                              # never left running when it did not come up
        process.wait(10)
        raise
    return target


def start_sidecar_target(workdir: Path, tls: bool, prometheus_url: str | None = None, extra_args: tuple = ()):
    tokens = make_keys(workdir / "keys.yaml")
    sidecar = start_sidecar(workdir, "127.0.0.1", free_port(), prometheus_url or f"http://127.0.0.1:{free_port()}",
                            workdir / "keys.yaml", tls=tls,
                            extra_args=["--client-timeout", str(CLIENT_TIMEOUT), "--prometheus-timeout", "5",
                                        *extra_args])
    target = Target(f"sidecar-{'tls' if tls else 'plain'}", int(sidecar.url.rsplit(":", 1)[1]),
                    sidecar.ssl_context(), "/api/versions", {}, sidecar.process.process, workdir)
    return sidecar, target, tokens


@pytest.fixture(scope="module", params=["exporter-plain", "exporter-tls", "sidecar-plain", "sidecar-tls"])
def target(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    tls = request.param.endswith("tls")
    if request.param.startswith("exporter"):
        running = start_exporter(workdir, tls)
        yield running
        running.process.terminate()
        running.process.wait(10)
    else:
        sidecar, running, _ = start_sidecar_target(workdir, tls)
        yield running
        sidecar.stop()


@pytest.mark.timing
def test_slow_and_half_sent_connections_do_not_slow_the_normal_client(target):
    baseline = [target.get() for _ in range(SAMPLES)]
    assert all(status == 200 for status, _ in baseline), baseline
    with Attack("127.0.0.1", target.port, {kind: PER_KIND for kind in KINDS}, tls=target.context is not None) as attack:
        time.sleep(1.0)                              # the attackers are in place
        under_attack = []
        for _ in range(SAMPLES):
            under_attack.append(target.get())
            time.sleep(CLIENT_TIMEOUT / SAMPLES)     # across a whole deadline cycle
    assert attack.most_held >= 32, "the attack never held its share of connections"
    assert all(status == 200 for status, _ in under_attack), under_attack
    # The p99 of 20 samples is their worst: at most 1 s. Against the baseline the 90th
    # percentile is held to 2x plus 100 ms: on two shared cores, with the attacker on the
    # same machine, any single request may be descheduled for longer than a scrape takes
    # (bench/hostile_clients.py reports the p99 ratio itself).
    assert worst(under_attack) <= 1.0, under_attack
    assert p90(under_attack) <= 2 * p90(baseline) + 0.1, (p90(baseline), p90(under_attack))


@pytest.mark.timing
def test_a_thousand_silent_sockets_from_one_address_do_not_lock_out_another(target):
    socks = silent_sockets("127.0.0.1", target.port, 1000)
    try:
        assert len(socks) > 900
        answers = [target.get() for _ in range(10)]
        assert all(status == 200 for status, _ in answers), answers
        # The attacker's own address is over its share: a new connection from it is closed.
        # The server closes a silent socket after its client deadline (3 s here), and on a
        # loaded machine the ten requests above can outlast it, so the attacker first fills
        # its share again (64 at most, 100 opened): the probe then meets a full share.
        socks += silent_sockets("127.0.0.1", target.port, 100)
        assert target.get(source=ATTACKER)[0] is None
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.timing
def test_a_crowd_of_silent_sockets_from_241_addresses_locks_out_neither_the_client_nor_prometheus(target, tmp_path):
    """1,000 connect-only sockets over 127.0.0.10-250, each re-opened 0.2 s after the server
    closes it, while the normal client asks 40 times and a real Prometheus scrapes every
    second (its timeout a second too: on two cores shared with the crowd, a shorter one
    measures the machine's load, not the server). Each address stays far inside its share:
    only the total can run out, and a crowd holding it must not lock anyone out."""
    config = prometheus_scraping(target.port, target.context is not None, target.scrape_auth, "1s")
    with procs.prometheus(config, tmp_path / "prometheus") as prometheus:
        procs.wait_for(lambda: scrapes(prometheus, time.time() - 3, time.time())[0] >= 1, 20,
                       "Prometheus's first successful scrape")
        with Crowd("127.0.0.1", target.port, 1000) as crowd:
            time.sleep(1.0)                              # the crowd in place
            since = time.time()
            served = []
            for _ in range(40):
                served.append(target.get(timeout=5)[0])
                time.sleep(0.5)
            until = time.time()
            held = crowd.most_held
        time.sleep(1.0)                                  # the last scrape stored
        good, made = scrapes(prometheus, since, until)
        durations = prometheus.get("/api/v1/query", query=f'scrape_duration_seconds{{job="target"}}'
                                   f'[{round(until - since)}s]', time=f"{until:.3f}")["data"]["result"]
    assert held >= 900, f"the crowd held at most {held} connections"
    assert served.count(200) >= 39, served
    assert made >= 19 and good >= 0.95 * made, (good, made, durations)


@pytest.mark.parametrize("case", [*FRAMING, "well-framed (control)"])
def test_framing_a_proxy_could_read_differently_is_refused_and_nothing_after_it_is_answered(target, case):
    status = FRAMING[case][1] if case in FRAMING else 200
    answered = framing_exchange(target.port, target.context, target.path, target.headers, case)
    assert answered == ([200, 200] if status == 200 else [status]), answered


@pytest.fixture(scope="module")
def exporter_tls(tmp_path_factory):
    running = start_exporter(tmp_path_factory.mktemp("exporter-flood"), tls=True)
    yield running
    running.process.terminate()
    running.process.wait(10)


def test_a_password_flood_from_one_address_leaves_another_address_served(exporter_tls):
    def wrong(i: int):
        return exporter_tls.get("/", basic("other", f"wrong-{i}"), source=ATTACKER)[0]

    with ThreadPoolExecutor(8) as pool:
        flood = list(pool.map(wrong, range(120)))
    assert 429 in flood and set(flood) <= {401, 429}, flood
    # Right after, from another address, credentials never verified before (so not cached).
    assert exporter_tls.get("/metrics", basic("other", "right"))[0] == 200


# ---- the sidecar's bounded work -----------------------------------------------------------

@pytest.fixture(scope="module")
def sidecar_with_prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sidecar-bounded")
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    with procs.prometheus(config, workdir / "prometheus") as prometheus:
        sidecar, target, tokens = start_sidecar_target(workdir, tls=False, prometheus_url=prometheus.url)
        try:
            yield sidecar, target, tokens, prometheus
        finally:
            sidecar.stop()


@pytest.mark.timing
def test_with_prometheus_paused_a_request_that_does_not_need_it_answers_at_once(sidecar_with_prometheus):
    sidecar, target, tokens, prometheus = sidecar_with_prometheus
    assert target.get("/ai/query/catalog", bearer(tokens["admin"]))[0] == 200     # warm: no first-call cost
    pid = prometheus.process.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        def prometheus_backed(_):
            return target.get("/api/v1/cluster/outlier-ranks", bearer(tokens["reader"]), source=ATTACKER,
                              timeout=30)[0]

        with ThreadPoolExecutor(8) as pool:
            stuck = pool.map(prometheus_backed, range(8))   # one key, all waiting on Prometheus
            time.sleep(1.0)
            answers = [target.get("/ai/query/catalog", bearer(tokens["admin"])) for _ in range(10)]
            # Another key's Prometheus-backed request, from another address: its own turn,
            # a 504 that does not name the internal Prometheus address.
            conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30, source_address=(CLIENT, 0))
            conn.request("GET", "/api/v1/cluster/outlier-ranks", headers=bearer(tokens["admin"]))
            timed_out = conn.getresponse()
            body = timed_out.read().decode()
            conn.close()
            statuses = list(stuck)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert timed_out.status == 504 and '"prometheus_timeout"' in body, body
    assert prometheus.url.split("//")[1] not in body, body
    assert all(status == 200 for status, _ in answers), answers
    assert worst(answers) <= 0.1, answers
    # The stuck ones end in Prometheus's timeout (504), or wait their turn and are refused
    # (503); none of them is a success or a crash.
    assert set(statuses) <= {503, 504}, statuses


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_otlp_export_over_the_span_cap_is_refused_and_memory_stays_bounded(sidecar_with_prometheus):
    import requests

    sidecar, target, tokens, _ = sidecar_with_prometheus
    body = otlp_export(150_000)
    assert len(body) < 2 << 20
    baseline = rss_bytes(target.process.pid)

    def send(_):
        return requests.post(sidecar.url + "/v1/traces", data=body, timeout=60,
                             headers={**bearer(tokens["writer"]), "Content-Type": "application/x-protobuf",
                                      "Content-Encoding": "gzip"})

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(send, range(8)))
    assert {reply.status_code for reply in replies} <= {413, 422, 503}, [r.text[:200] for r in replies]
    assert any(reply.status_code == 422 and "batch_too_large" in reply.text for reply in replies)
    assert rss_bytes(target.process.pid) < 2 * baseline


def peak_rss_while(pid: int, work) -> tuple[list, int]:
    """Run work() (a list of calls, in parallel) while sampling the process's RSS."""
    with ThreadPoolExecutor(len(work)) as pool:
        futures = [pool.submit(call) for call in work]
        peak = rss_bytes(pid)
        while not all(future.done() for future in futures):
            peak = max(peak, rss_bytes(pid))
            time.sleep(0.02)
        return [future.result() for future in futures], max(peak, rss_bytes(pid))


def test_eight_exports_of_4m_empty_spans_are_refused_before_parsing(sidecar_with_prometheus):
    """8 MiB of empty spans gzips to 8 KB; parsing one took the sidecar from 159 to 858 MB.
    Counted on the wire instead, 8 at once from one key leave its RSS under 2x."""
    import requests

    sidecar, target, tokens, _ = sidecar_with_prometheus
    body = otlp_empty_spans(4_194_288)
    assert len(body) < 16 << 10
    headers = {**bearer(tokens["writer"]), "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    baseline = rss_bytes(target.process.pid)

    def send():
        return requests.post(sidecar.url + "/v1/traces", data=body, timeout=60, headers=headers)

    replies, peak = peak_rss_while(target.process.pid, [send] * 8)
    assert {reply.status_code for reply in replies} <= {422, 503}, [r.text[:200] for r in replies]
    assert any("batch_too_large" in reply.text for reply in replies)
    assert peak < 2 * baseline, (baseline, peak)


def test_no_answer_of_any_route_names_the_internal_prometheus_url(tmp_path):
    """Every route of the OpenAPI document, every tool over HTTP and MCP, and the query
    routes with bodies that reach Prometheus, against a sidecar (with a chaos topology
    whose live refresh fails) whose unreachable Prometheus URL carries a marker path: the
    marker is in no body."""
    import uuid

    marker = f"internal-{uuid.uuid4().hex[:12]}"
    (tmp_path / "cluster.yaml").write_text("name: lab\ngenerate: {hosts: 4, job_hosts: 2}\n")
    sidecar, target, tokens = start_sidecar_target(
        tmp_path, tls=False, prometheus_url=f"http://127.0.0.1:{free_port()}/{marker}",
        extra_args=("--chaos-topology", str(tmp_path / "cluster.yaml"), "--chaos-refresh-seconds", "1"))
    try:
        procs.wait_for(lambda: target.get("/graph/chaos-topology", bearer(tokens["admin"]))[0] == 200, 30,
                       "the chaos topology")
        time.sleep(1.5)                                  # a live refresh has failed
        answers = every_route(sidecar.url, bearer(tokens["admin"]))
    finally:
        sidecar.stop()
    assert len(answers) > 40, len(answers)
    assert not [(method, path, status) for method, path, status, text in answers if marker in text]
    failed = {path for _, path, status, text in answers if status >= 500 and "prometheus_unreachable" in text}
    # The routes that named it before (through the query tools) did reach Prometheus here.
    assert {"/queries/meshql", "/ai/query/conversation", "/api/v1/cluster/outlier-ranks"} <= failed, failed
    assert any(path == "/mcp" and "prometheus_unreachable" in text for _, path, _, text in answers)
    assert any(path == "/graph/chaos-topology" and "PrometheusError" in text for _, path, _, text in answers)


def test_a_billion_laughs_keys_file_is_one_short_error_and_the_old_keys_stay(sidecar_with_prometheus):
    sidecar, target, tokens, _ = sidecar_with_prometheus
    keys_file = sidecar.keys_file
    kept = keys_file.read_text()
    log = target.workdir / "sidecar.log"
    logged = log.stat().st_size
    laughs = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        laughs.append(f"{level}: &{level} [{', '.join(['*' + previous] * 9)}]")
    try:
        keys_file.write_text("\n".join(laughs) + "\nkeys: *i\n")
        assert len(keys_file.read_bytes()) < 1024
        time.sleep(1.5)                                  # the sidecar looks at the file every second
        assert target.get("/api/v1/health", bearer(tokens["reader"]))[0] == 200
    finally:
        keys_file.write_text(kept)
    new_lines = log.read_bytes()[logged:].decode(errors="replace").splitlines()
    errors = [line for line in new_lines if "keeping the previous API keys" in line]
    assert len(errors) == 1 and len(errors[0]) < 1024, new_lines[-5:]
    assert "aliases" in errors[0]


@pytest.mark.timing
def test_sigterm_with_a_correlation_backlog_and_prometheus_paused_ends_within_5s_and_a_restart_starts(
        sidecar_with_prometheus, tmp_path):
    import requests

    from tests.sidecar_helpers import seed_span

    _, _, _, prometheus = sidecar_with_prometheus
    tokens = make_keys(tmp_path / "keys.yaml")
    port = free_port()
    sidecar = start_sidecar(tmp_path, "127.0.0.1", port, prometheus.url, tmp_path / "keys.yaml", tls=False,
                            extra_args=["--prometheus-timeout", "5"])
    pid = prometheus.process.process.pid
    try:
        # Every span over its SLO: each waits to be correlated against Prometheus.
        spans = [seed_span("backlog", f"s{i}", 600_000, ["leaf-1", "spine-1"]) for i in range(300)]
        reply = requests.post(sidecar.url + "/tracing/spans", json={"spans": spans}, timeout=30,
                              headers=bearer(tokens["writer"]))
        assert reply.status_code == 200 and reply.json()["violations"] == 300, reply.text[:300]
        os.kill(pid, signal.SIGSTOP)                 # the correlator's query now hangs
        time.sleep(1.0)
        started = time.monotonic()
        sidecar.process.process.send_signal(signal.SIGTERM)
        assert sidecar.process.process.wait(20) == 0
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
        sidecar.stop()
    assert took < 5, took
    # Right after: the same port and database.
    again = start_sidecar(tmp_path, "127.0.0.1", port, prometheus.url, tmp_path / "keys.yaml", tls=False)
    again.stop()


def test_the_open_metrics_page_names_no_key_ids(sidecar_with_prometheus):
    import requests

    sidecar, target, tokens, _ = sidecar_with_prometheus
    with ThreadPoolExecutor(8) as pool:            # faster than the key's 50 a second, past its burst
        limited = [status for status, _ in pool.map(
            lambda _: target.get("/ai/query/catalog", bearer(tokens["reader"])), range(400))]
    assert 429 in limited
    metrics = requests.get(sidecar.url + "/metrics", timeout=10).text
    assert "fabric_sidecar_rate_limited_total" in metrics and "reader" not in metrics
