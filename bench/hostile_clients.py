"""Hostile clients against the real exporter and sidecar: the figures of docs/security.md.

Runs each attack of tests/test_hostile_clients.py once more, measuring instead of
asserting, against servers started with the interpreter given (so the same script
measures an older checkout's servers: give its virtual environment's python), and writes
the results as JSON. With --table BEFORE.json AFTER.json it writes the table of
docs/security.md between its markers instead.

    .venv/bin/python bench/hostile_clients.py --out after.json
    /path/to/old/.venv/bin/python bench/hostile_clients.py --out before.json   # from this tree
    .venv/bin/python bench/hostile_clients.py --table before.json after.json

Attackers connect from 127.0.0.1 (a crowd from 127.0.0.10-250), the normal client from
127.0.0.2. Sections (--sections): servers (the slow-client rows of each server), crowd
(a crowd over 241 addresses with a real Prometheus scraping, and the framing cases, on each
server), nat (a password flood from a trusted scraper's own address), memory (each
server's RSS holding a crowd), work (the sidecar's bounded work), leaks (empty OTLP spans, and the internal Prometheus URL in any answer). Takes a
few minutes a section.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hostile import (ATTACKER, FRAMING, KINDS, Attack, Crowd, every_route, framing_exchange,  # noqa: E402
                           otlp_empty_spans, otlp_export, prometheus_scraping, scrapes, silent_sockets, timed_get)

FIXTURE = REPO / "tests" / "fixtures" / "node"
COLLECTORS = ["infiniband", "netdev", "tcp"]
DOC = REPO / "docs" / "security.md"
BEGIN, END = "<!-- table: bench/hostile_clients.py --table -->", "<!-- end of table -->"


def p99(samples) -> float:
    times = sorted(s if status is not None else float("inf") for status, s in samples)
    return times[max(0, -(-len(times) * 99 // 100) - 1)]


def seconds(value: float) -> str:
    return "no answer" if value == float("inf") else f"{value:.3f} s"


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    """A started server process, answering `path` with 200 once ready."""

    def __init__(self, process: subprocess.Popen, port: int, context, path: str, headers: dict, log: Path,
                 scrape_auth: dict | None = None):
        self.process, self.port, self.context, self.path, self.headers, self.log = \
            process, port, context, path, headers, log
        self.scrape_auth = scrape_auth
        deadline = time.monotonic() + 60
        while self.get()[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {log}")
            time.sleep(0.3)

    def get(self, path=None, headers=None, source=None, timeout=15.0):
        extra = {"source": source} if source else {}
        return timed_get("127.0.0.1", self.port, path or self.path, self.context,
                         self.headers if headers is None else headers, timeout=timeout, **extra)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def start_exporter(python: str, work: Path, tls: bool) -> Server:
    import bcrypt

    from fabricscope.devcerts import ensure_dev_certs
    from fabricscope.exporter.framework import load_collector_modules
    port = free_port()
    argv = ["exporter", f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={FIXTURE}/sys",
            f"--path.procfs={FIXTURE}/proc", f"--path.rootfs={FIXTURE}", f"--path.kmsg={FIXTURE}/kmsg",
            f"--path.state={work}/state", *[f"--no-collector.{n}" for n in load_collector_modules() if n not in COLLECTORS]]
    work.mkdir(parents=True, exist_ok=True)
    context, headers = None, {}
    if tls:
        certs = ensure_dev_certs(work / "tls")
        users = {"prometheus": "scrape", "scraper2": "first", **{f"other{i}": f"right{i}" for i in range(6)}}
        hashed = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=6)).decode() for u, p in users.items()}
        (work / "web.yml").write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                                      "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in hashed.items()))
        argv.append(f"--web.config.file={work / 'web.yml'}")
        if supports(python, "--web.trusted-sources"):
            argv.append(f"--web.trusted-sources={SCRAPER}")
        context = ssl.create_default_context(cafile=str(certs.ca))
        headers = basic("prometheus", "scrape")
    log = work / "exporter.log"
    process = subprocess.Popen([python, "-m", "fabricscope.cli", *argv], stdout=log.open("w"),
                               stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    return Server(process, port, context, "/metrics", headers, log,
                  {"username": "prometheus", "password": "scrape"} if tls else None)


# The scraper's address in the password-flood row: trusted where the exporter has the flag.
SCRAPER = "127.0.0.3"


def supports(python: str, flag: str) -> bool:
    """Whether the exporter run by `python` has `flag` (an older checkout may not)."""
    usage = subprocess.run([python, "-m", "fabricscope.cli", "exporter", "--help"], capture_output=True,
                           text=True, cwd=tempfile.gettempdir(), timeout=60).stdout
    return flag in usage


def start_sidecar(python: str, work: Path, tls: bool, prometheus_url: str, keys: bool = True) -> tuple[Server, dict]:
    from fabricscope.demo.stack.sidecar import start_sidecar as start
    from tests.sidecar_helpers import make_keys
    work.mkdir(parents=True, exist_ok=True)
    tokens = make_keys(work / "keys.yaml") if keys else {}
    port = free_port()
    running = start(work, "127.0.0.1", port, prometheus_url, work / "keys.yaml", tls=tls, python=python,
                    extra_args=["--prometheus-timeout", "5"])
    return Server(running.process.process, port, running.ssl_context(), "/api/versions", {},
                  work / "sidecar.log"), tokens


ROW_SECONDS = 30      # a row stops sampling after this long (an old server answers slowly)


def under(server: Server, counts: dict[str, int], samples: int = 10, settle: float = 1.0) -> list:
    with Attack("127.0.0.1", server.port, counts, tls=server.context is not None):
        time.sleep(settle)
        found = []
        end = time.monotonic() + ROW_SECONDS
        while len(found) < samples and time.monotonic() < end:
            found.append(server.get(timeout=10))
            time.sleep(0.2)
    return found


def slow_rows(server: Server, name: str, results: dict) -> None:
    baseline = [server.get() for _ in range(20)]
    results[f"{name}: baseline p99"] = seconds(p99(baseline))
    for count in (8, 40):
        results[f"{name}: {count} one-byte connections, p99"] = seconds(p99(under(server, {"one_byte": count})))
    attacked = under(server, {kind: 200 for kind in KINDS}, samples=20)
    failed = sum(status != 200 for status, _ in attacked)
    ratio = p99(attacked) / p99(baseline)
    results[f"{name}: 200 of each slow kind, p99"] = (
        f"{seconds(p99(attacked))} ({f'{ratio:.1f}x baseline; ' if ratio != float('inf') else ''}"
        f"{failed} of {len(attacked)} failed)")
    socks = silent_sockets("127.0.0.1", server.port, 1000)
    try:
        served = [server.get(timeout=5)[0] == 200 for _ in range(6)]
    finally:
        for sock in socks:
            sock.close()
    results[f"{name}: 1,000 silent sockets from one address, probes from another served"] = \
        f"{sum(served)} of {len(served)}"
    time.sleep(1)


def crowd_rows(server: Server, name: str, work: Path, results: dict) -> None:
    """A crowd of 1,000 connect-only sockets over 127.0.0.10-250 (each re-opened 0.2 s after
    the server closes it) while the normal client asks 40 times and Prometheus scrapes
    every 0.5 s; then each framing case, and whether the request after it was answered."""
    from tests import procs
    config = prometheus_scraping(server.port, server.context is not None, server.scrape_auth, "500ms")
    with procs.prometheus(config, work / f"prometheus-{name}") as prometheus:
        procs.wait_for(lambda: scrapes(prometheus, time.time() - 3, time.time())[0] >= 1, 30, "a first scrape")
        with Crowd("127.0.0.1", server.port, 1000) as crowd:
            time.sleep(1.0)
            since = time.time()
            served = []
            for _ in range(40):
                served.append(server.get(timeout=5)[0])
                time.sleep(0.25)
            until = time.time()
            held = crowd.most_held
        time.sleep(1.0)
        good, made = scrapes(prometheus, since, until)
    results[f"{name}: crowd of 1,000 silent sockets over 241 addresses, normal client served"] = \
        f"{served.count(200)} of 40 (the crowd held {held} at most)"
    results[f"{name}: the same crowd, Prometheus's scrapes every 0.5 s that succeeded"] = f"{good} of {made}"
    time.sleep(3)                                       # the crowd's sockets closed
    for case, (_, expected) in FRAMING.items():
        answered = framing_exchange(server.port, server.context, server.path, server.headers, case)
        verdict = ", ".join(map(str, answered)) or "no answer in 3 s"
        if len(answered) > 1:
            verdict += " (the request after it answered)"
        results[f"{name}: framing, {case}"] = verdict


def memory_row(server: Server, name: str, results: dict) -> None:
    """The server's RSS holding 1,000 silent connections over 241 addresses (on TLS, each
    past its handshake): what a crowd costs now that it is held rather than refused."""
    import socket

    from tests.hostile import CROWD_SOURCES
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    before = rss_mb(server.process.pid)
    socks = []
    try:
        for i in range(1000):
            try:
                raw = socket.create_connection(("127.0.0.1", server.port), timeout=5,
                                               source_address=(CROWD_SOURCES[i % len(CROWD_SOURCES)], 0))
                socks.append(context.wrap_socket(raw, server_hostname="x") if server.context else raw)
            except (OSError, ssl.SSLError):
                pass                                    # refused (a full server): not held
        time.sleep(0.5)
        held = rss_mb(server.process.pid)
    finally:
        for sock in socks:
            sock.close()
    results[f"{name}: RSS holding 1,000 silent connections over 241 addresses"] = \
        f"{before:.0f} -> {held:.0f} MB ({(held - before) * 1024 / max(1, len(socks)):.0f} KB each)"


def nat_row(server: Server, results: dict) -> None:
    """A wrong-password flood from the scraper's own address (a NAT), then the scraper's
    first login there (credentials never verified before, so not cached)."""
    with ThreadPoolExecutor(8) as pool:
        flood = list(pool.map(lambda n: server.get("/", basic("other0", f"wrong{n}"), source=SCRAPER)[0], range(60)))
    status = server.get("/metrics", basic("scraper2", "first"), source=SCRAPER)[0]
    answers = ", ".join(f"{flood.count(code)} x {code or 'no answer'}" for code in sorted(set(flood), key=str))
    results["exporter-tls: wrong-password flood from the scraper's address, the scraper's first login"] = \
        f"{status} (the flood's 60: {answers})"


def leak_rows(python: str, work: Path, results: dict) -> None:
    """8 parallel exports of 4 M empty spans from one key (RSS), and every route's answer
    with an unreachable Prometheus whose URL carries a marker path."""
    import uuid

    import requests

    from tests.sidecar_helpers import bearer
    marker = f"internal-{uuid.uuid4().hex[:12]}"
    sidecar, tokens = start_sidecar(python, work / "leaks", False, f"http://127.0.0.1:{free_port()}/{marker}")
    pid = sidecar.process.pid
    try:
        base_rss = rss_mb(pid)
        body = otlp_empty_spans(4_194_288)
        headers = {**bearer(tokens["writer"]), "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}

        def send(_):
            try:
                return requests.post(sidecar_url(sidecar) + "/v1/traces", data=body, timeout=120,
                                     headers=headers).status_code
            except requests.RequestException:
                return "no answer in 120 s"

        peak = base_rss
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(send, i) for i in range(8)]
            while not all(f.done() for f in futures):
                peak = max(peak, rss_mb(pid))
                time.sleep(0.02)
            statuses = sorted({f.result() for f in futures}, key=str)
        results[f"sidecar: 8 x 4,194,288 empty OTLP spans (gzip {len(body) / 1e3:.0f} KB each), one key"] = \
            f"{statuses}; RSS {base_rss:.0f} -> {peak:.0f} MB ({peak / base_rss:.1f}x)"
        time.sleep(12)                                   # the heap returned (every 10 s)
        answers = every_route(sidecar_url(sidecar), bearer(tokens["admin"]))
        named = sorted({f"{method} {path}" for method, path, _, text in answers if marker in text})
        results["sidecar: answers naming the internal Prometheus URL (every route, tool and MCP call)"] = \
            f"{len([a for a in answers if marker in a[3]])} of {len(answers)}{naming(named)}"
    finally:
        sidecar.stop()


def naming(routes: list[str]) -> str:
    """The routes that named the URL, the tool calls counted rather than listed."""
    tools = [route for route in routes if route.startswith("POST /api/v1/tools/")]
    others = [route for route in routes if route not in tools]
    listed = others + ([f"{len(tools)} tools over POST /api/v1/tools/<name>"] if tools else [])
    return f" ({', '.join(listed)})" if listed else ""


def flood_row(server: Server, results: dict) -> None:
    served = []
    for i in range(6):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: server.get("/", basic(f"other{i}", f"wrong{n}"), source=ATTACKER), range(60)))
        served.append(server.get("/metrics", basic(f"other{i}", f"right{i}"))[0])
    results["exporter-tls: password flood, right credentials from another address"] = \
        f"{served.count(200)} of 6 answered 200 ({', '.join(str(s) for s in served)})"


def sidecar_work_rows(python: str, work: Path, results: dict) -> None:
    import requests

    from tests import procs
    from tests.sidecar_helpers import bearer
    config = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}
    with procs.prometheus(config, work / "prometheus") as prometheus:
        sidecar, tokens = start_sidecar(python, work / "sidecar", False, prometheus.url)
        pid = sidecar.process.pid
        try:
            base_rss = rss_mb(pid)
            sidecar.get("/ai/query/catalog", bearer(tokens["admin"]))
            prom_pid = prometheus.process.process.pid
            os.kill(prom_pid, signal.SIGSTOP)
            try:
                with ThreadPoolExecutor(8) as pool:
                    stuck = pool.map(lambda _: sidecar.get("/api/v1/cluster/outlier-ranks", bearer(tokens["reader"]),
                                                           source=ATTACKER, timeout=30), range(8))
                    time.sleep(1.0)
                    answers = [sidecar.get("/ai/query/catalog", bearer(tokens["admin"])) for _ in range(10)]
                    stuck_statuses = sorted({s for s, _ in stuck}, key=str)
                    body_504 = requests.get(sidecar_url(sidecar) + "/api/v1/cluster/outlier-ranks", timeout=30,
                                            headers=bearer(tokens["admin"])).text
            finally:
                os.kill(prom_pid, signal.SIGCONT)
            results["sidecar: Prometheus paused, a request that does not need it, worst of 10"] = \
                f"{seconds(max(s for _, s in answers))} (the 8 stuck: {stuck_statuses})"
            results["sidecar: an error body names the Prometheus URL"] = \
                "yes" if prometheus.url.split("//")[1] in body_504 else "no"
            with ThreadPoolExecutor(8) as pool:       # past the admin key's burst of 100 (50/s): 429s
                list(pool.map(lambda _: sidecar.get("/ai/query/catalog", bearer(tokens["admin"])), range(400)))
            metrics = requests.get(sidecar_url(sidecar) + "/metrics", timeout=10).text
            results["sidecar: /metrics (open) names key ids after 429s"] = "yes" if 'key_id="admin"' in metrics else "no"
            body = otlp_export(150_000)
            peak = [base_rss]

            def send(_):
                try:
                    reply = requests.post(sidecar_url(sidecar) + "/v1/traces", data=body, timeout=120,
                                          headers={**bearer(tokens["writer"]), "Content-Type": "application/x-protobuf",
                                                   "Content-Encoding": "gzip"})
                except requests.RequestException:
                    return "no answer in 120 s"
                peak.append(rss_mb(pid))
                return reply.status_code

            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(send, i) for i in range(8)]
                while not all(f.done() for f in futures):
                    peak.append(rss_mb(pid))
                    time.sleep(0.05)
                statuses = sorted({f.result() for f in futures}, key=str)
            results["sidecar: 8 x 150,000 OTLP spans (gzip %.0f KB each)" % (len(body) / 1e3)] = \
                f"{statuses}; RSS {base_rss:.0f} -> {max(peak):.0f} MB ({max(peak) / base_rss:.1f}x)"
            time.sleep(60)
            results["sidecar: RSS 60 s after the bursts"] = f"{rss_mb(pid):.0f} MB ({rss_mb(pid) / base_rss:.2f}x baseline)"
            results["sidecar: billion-laughs keys file"] = laughs_row(sidecar, work / "sidecar", tokens)
        finally:
            sidecar.stop()
        results["sidecar: SIGTERM with a correlation backlog, Prometheus paused"] = sigterm_row(
            python, work / "sigterm", prometheus)


def sidecar_url(server: Server) -> str:
    return f"{'https' if server.context else 'http'}://127.0.0.1:{server.port}"


def laughs_row(sidecar: Server, work: Path, tokens: dict) -> str:
    from tests.sidecar_helpers import bearer
    keys_file = work / "keys.yaml"
    kept = keys_file.read_text()
    logged = sidecar.log.stat().st_size
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in "bcdefghi":
        lines.append(f"{level}: &{level} [{', '.join(['*' + chr(ord(level) - 1)] * 9)}]")
    started = time.monotonic()
    keys_file.write_text("\n".join(lines) + "\nkeys: *i\n")
    time.sleep(3)
    status = sidecar.get("/api/v1/health", bearer(tokens["reader"]))[0]
    keys_file.write_text(kept)
    time.sleep(0.1)
    new = sidecar.log.read_bytes()[logged:].splitlines()
    longest = max((len(line) for line in new), default=0)
    return (f"{len(new)} log line(s), longest {longest:,} bytes; old keys {'kept' if status == 200 else 'LOST'} "
            f"({time.monotonic() - started:.1f} s)")


def sigterm_row(python: str, work: Path, prometheus) -> str:
    import requests

    from tests.sidecar_helpers import bearer, seed_span
    sidecar, tokens = start_sidecar(python, work, False, prometheus.url)
    spans = [seed_span("backlog", f"s{i}", 600_000, ["leaf-1", "spine-1"]) for i in range(300)]
    requests.post(sidecar_url(sidecar) + "/tracing/spans", json={"spans": spans}, timeout=30,
                  headers=bearer(tokens["writer"]))
    prom_pid = prometheus.process.process.pid
    os.kill(prom_pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)
        started = time.monotonic()
        sidecar.process.send_signal(signal.SIGTERM)
        sidecar.process.wait(60)
        took = time.monotonic() - started
    finally:
        os.kill(prom_pid, signal.SIGCONT)
    try:
        again, _ = start_sidecar(python, work, False, prometheus.url, keys=False)
        again.stop()
        restart = "a restart right after starts"
    except Exception:                             # noqa: BLE001 (any failure to start is the finding)
        restart = "a restart right after FAILED"
    return f"{took:.1f} s; {restart}"


def measure(python: str, sections: list[str], results: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        servers = (("exporter", False), ("exporter", True), ("sidecar", False), ("sidecar", True))
        for kind, tls in (servers if {"servers", "crowd", "nat", "memory"} & set(sections) else ()):
            name = f"{kind}-{'tls' if tls else 'plain'}"
            if not {"servers", "crowd", "memory"} & set(sections) and name != "exporter-tls":
                continue
            if kind == "exporter":
                server = start_exporter(python, work / name, tls)
            else:
                server, _ = start_sidecar(python, work / name, tls, f"http://127.0.0.1:{free_port()}")
            try:
                if "servers" in sections:
                    slow_rows(server, name, results)
                    if name == "exporter-tls":
                        flood_row(server, results)
                if "crowd" in sections:
                    crowd_rows(server, name, work, results)
                if "nat" in sections and name == "exporter-tls":
                    nat_row(server, results)
                if "memory" in sections:
                    memory_row(server, name, results)
            finally:
                server.stop()
            print(json.dumps(results, indent=1), flush=True)
        if "work" in sections:
            sidecar_work_rows(python, work / "bounded", results)
        if "leaks" in sections:
            leak_rows(python, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def write_table(before: dict, after: dict, labels: tuple[str, str]) -> None:
    rows = [f"| attack | {labels[0]} | {labels[1]} |", "| --- | --- | --- |"]
    rows += [f"| {row} | {before.get(row, 'not measured')} | {after.get(row, 'not measured')} |"
             for row in dict.fromkeys([*after, *before])]
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the servers")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    parser.add_argument("--table", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="write docs/security.md's table from two result files")
    parser.add_argument("--labels", nargs=2, default=("before", "after"))
    parser.add_argument("--sections", default="servers,crowd,nat,memory,work,leaks",
                        help="servers, crowd, work, leaks (see above)")
    parser.add_argument("--merge", type=Path, help="start from the results in this file (another section's run)")
    args = parser.parse_args()
    if args.table:
        write_table(json.loads(args.table[0].read_text()), json.loads(args.table[1].read_text()), tuple(args.labels))
        return
    results = json.loads(args.merge.read_text()) if args.merge else {}
    results = measure(args.python, args.sections.split(","), results)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
