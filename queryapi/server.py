"""`fabricscope sidecar`: validate the configuration, open storage, serve the app on the
HTTP server every fabricscope process uses (fabricscope/httpserver.py: requests read by
an event loop, then run on a pool of worker threads; TLS unless --insecure-no-tls).

One process per replica because the SQLite file is held under an exclusive lock and the
rate limiter and background workers are in-process; threads give the concurrency. The
app is built before anything listens, so a bad setting, a locked database or a newer
schema stops the command with a one-line error. For several replicas use PostgreSQL and
a load balancer.

Slow and silent clients cost no thread: the server reads each request whole on its event
loop before a worker sees it. The TLS handshake, request line and headers must arrive
within `client_timeout_seconds`, the body at a minimum rate, else 408 and the connection
is closed; silent connections are closed after that long idle.
"""
from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
import threading
from pathlib import Path

from fabricscope.exporter.malloc import cap_malloc_arenas, return_free_heap

from .config import DEFAULT_PORT, ENV_PREFIX, ConfigError, SidecarConfig, load_config
from .workers import PeriodicWorker

log = logging.getLogger("fabricscope.sidecar")

MEMORY_TRIM_SECONDS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = lambda name: f"(env {ENV_PREFIX}{name.upper()})"  # noqa: E731
    parser.add_argument("--host", default=None, help=f"listen address (default 127.0.0.1) {env('host')}")
    parser.add_argument("--port", type=int, default=None, help=f"listen port (default {DEFAULT_PORT}) {env('port')}")
    parser.add_argument("--tls-cert", type=Path, default=None, help=f"PEM certificate {env('tls_cert')}")
    parser.add_argument("--tls-key", type=Path, default=None, help=f"PEM private key {env('tls_key')}")
    parser.add_argument("--insecure-no-tls", action="store_const", const=True, default=None,
                        help="serve plaintext HTTP: API keys cross the network in the clear (loopback/testing only)")
    parser.add_argument("--keys-file", type=Path, default=None,
                        help=f"YAML file of hashed API keys with scopes, re-read when it changes {env('keys_file')}")
    parser.add_argument("--prometheus-url", default=None,
                        help="Prometheus (or Thanos/Mimir/VictoriaMetrics) HTTP API base URL "
                             f"(default http://127.0.0.1:19090) {env('prometheus_url')}")
    parser.add_argument("--prometheus-timeout", dest="prometheus_timeout_seconds", type=float, default=None,
                        help=f"seconds per Prometheus call (default 5) {env('prometheus_timeout_seconds')}")
    parser.add_argument("--database", default=None,
                        help="SQLite file (default var/sidecar/sidecar.db) or postgresql:// URL "
                             f"{env('database')}")
    parser.add_argument("--max-body-bytes", type=int, default=None,
                        help=f"request body limit, chunked bodies included (default 8 MiB) {env('max_body_bytes')}")
    parser.add_argument("--rate-limit", type=float, default=None,
                        help=f"requests/s per key (default 50) {env('rate_limit_per_second')}")
    parser.add_argument("--rate-burst", type=int, default=None,
                        help=f"burst per key (default 100) {env('rate_limit_burst')}")
    parser.add_argument("--retention-hours", type=float, default=None,
                        help=f"keep spans, correlations and alerts this long (default 168) {env('retention_hours')}")
    parser.add_argument("--audit-log", type=Path, default=None,
                        help=f"audit log file, one JSON object per request (default stderr) {env('audit_log')}")
    parser.add_argument("--threads", type=int, default=None, help=f"request threads (default 8) {env('threads')}")
    parser.add_argument("--client-timeout", dest="client_timeout_seconds", type=float, default=None,
                        help="seconds a client has for its TLS handshake, request line and headers, and for "
                             f"each later read; idle connections close after it (default 10) "
                             f"{env('client_timeout_seconds')}")
    parser.add_argument("--trusted-sources", default=None, metavar="CIDR,...",
                        help="networks of Prometheus, Grafana and other configured clients: connection slots "
                             f"are kept for them when a crowd fills the rest {env('trusted_sources')}")
    parser.add_argument("--gpu-hour-rates", default=None,
                        help="GPU-hour prices per rate class for get_cost, e.g. default=2.5,h100=4 "
                             f"{env('gpu_hour_rates')}")
    parser.add_argument("--chaos-topology", type=Path, default=None,
                        help=f"cluster inventory for chaos simulations (YAML/JSON, docs/chaos.md) {env('chaos_topology')}")
    parser.add_argument("--chaos-refresh-seconds", type=float, default=None,
                        help=f"merge live metrics over the inventory this often; 0: inventory only (default 60) "
                             f"{env('chaos_refresh_seconds')}")
    parser.add_argument("--alertmanager-url", default=None,
                        help="Alertmanager base URL: the recorded alerts are reconciled with its API, so one "
                             f"resolved while inhibited is shown resolved (default: none) {env('alertmanager_url')}")
    parser.add_argument("--alertmanager-reconcile-seconds", type=float, default=None,
                        help=f"how often (default 30) {env('alertmanager_reconcile_seconds')}")
    parser.add_argument("--add-key", metavar="ID", default=None,
                        help="mint a new API key with --scopes into --keys-file, print it once, and exit")
    parser.add_argument("--scopes", default="read", help="scopes for --add-key: read, write, admin (comma-separated)")
    parser.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warning", "error"])


def flags_from_args(args: argparse.Namespace) -> dict:
    flags = {name: getattr(args, name) for name in (
        "host", "port", "tls_cert", "tls_key", "insecure_no_tls", "keys_file", "prometheus_url",
        "prometheus_timeout_seconds", "database", "max_body_bytes", "retention_hours", "audit_log", "threads",
        "client_timeout_seconds", "trusted_sources", "gpu_hour_rates", "chaos_topology", "chaos_refresh_seconds",
        "alertmanager_url", "alertmanager_reconcile_seconds")}
    rate = {k: v for k, v in (("per_second", args.rate_limit), ("burst", args.rate_burst)) if v is not None}
    if rate:
        flags["rate_limit"] = rate
    return flags


def tls_context(config: SidecarConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load --tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {exc}") from None
    return context


def serve(app, config: SidecarConfig) -> int:
    """Serve until SIGTERM or SIGINT, then stop the workers and close storage; the exit
    status (2 when the port cannot be bound)."""
    from fabricscope.httpadmission import TrustedSources
    from fabricscope.httpserver import MAX_CONNECTIONS, HttpServer

    from .bulkheads import make_route, pool_sizes
    from .errors import server_error_body

    state = app.extensions["fabricscope"]
    try:
        context = tls_context(config) if config.uses_tls else None
        server = HttpServer(app, config.host, config.port, name="sidecar", threads=config.threads,
                            timeout=config.client_timeout_seconds,
                            max_body_bytes=config.max_body_bytes, ssl_context=context,
                            max_connections=max(MAX_CONNECTIONS, config.max_connections_per_source),
                            trusted_sources=TrustedSources(config.trusted_sources),
                            max_connections_per_source=config.max_connections_per_source,
                            max_requests_per_source=config.max_requests_per_source or None,
                            pools=pool_sizes(config.threads), route=make_route(app),
                            error_body=server_error_body).start()
    except (ConfigError, OSError) as exc:
        state.close()
        print(f"fabricscope sidecar: {exc}" if isinstance(exc, ConfigError) else
              f"fabricscope sidecar: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # What a burst of requests allocated and freed goes back to the kernel once it is
    # over: glibc otherwise keeps freed heap resident for reuse, and the RSS a burst
    # reached stayed while idle.
    state.workers.append(PeriodicWorker("memory-trim", MEMORY_TRIM_SECONDS, return_free_heap))
    state.start_background()
    try:
        stop.wait()
    finally:
        state.request_stop()
        server.stop()
        state.close()
    return 0


def run(args: argparse.Namespace) -> int:
    # Before any thread starts: a malloc arena per thread (8 per core) keeps what each
    # request thread freed resident (exporter/malloc.py).
    cap_malloc_arenas()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.add_key:
        return _add_key(args)
    from .app import create_app
    from .keys import KeyFileError
    from .storage import StorageError
    try:
        config = load_config(flags_from_args(args))
        app = create_app(config)
    except (ConfigError, StorageError, KeyFileError) as exc:
        print(f"fabricscope sidecar: {exc}", file=sys.stderr)
        return 2
    scheme = "https" if config.uses_tls else "http"
    if not config.uses_tls:
        log.warning("--insecure-no-tls: serving plaintext HTTP; API keys are sent in the clear")
    log.info("serving on %s://%s:%d (database %s, Prometheus %s)", scheme, config.host, config.port,
             app.extensions["fabricscope"].storage.describe(), config.prometheus_url)
    return serve(app, config)


def _add_key(args: argparse.Namespace) -> int:
    from .keys import KeyFileError, add_key
    if not args.keys_file:
        print("fabricscope sidecar: --add-key needs --keys-file", file=sys.stderr)
        return 2
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    try:
        token = add_key(args.keys_file, args.add_key, scopes)
    except KeyFileError as exc:
        print(f"fabricscope sidecar: {exc}", file=sys.stderr)
        return 2
    print(token)
    print(f"key {args.add_key!r} ({', '.join(scopes)}) added to {args.keys_file}; the running sidecar picks it "
          "up within a second. This is the only time the key is shown.", file=sys.stderr)
    return 0
