"""The exporter framework: failure isolation, self-metrics, node label, HTTP, web config."""
from __future__ import annotations

import base64
import subprocess
import sys

import bcrypt
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import Collector, ScrapeCollector, build_collectors, COLLECTORS
from fabricscope.exporter.main import start_exporter
from fabricscope.exporter.webconfig import WebConfigError, load_web_config


class Good(Collector):
    name = "good"

    def collect(self):
        family = CounterMetricFamily("fabric_test_things", "Things.", labels=["thing"])
        family.add_metric(["a"], 3)
        yield family


class Bad(Collector):
    name = "bad"

    def collect(self):
        yield CounterMetricFamily("fabric_test_partial", "Never seen.", value=1)
        raise OSError("sysfs went away")


def registry_of(*collectors, node="n1"):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(list(collectors), node=node))
    return registry


def test_failing_collector_is_isolated_and_reported():
    ctx = Context()
    registry = registry_of(Bad(ctx), Good(ctx))
    assert registry.get_sample_value("fabric_test_things_total", {"thing": "a", "node": "n1"}) == 3
    assert registry.get_sample_value("fabric_scrape_collector_success", {"collector": "good", "node": "n1"}) == 1
    assert registry.get_sample_value("fabric_scrape_collector_success", {"collector": "bad", "node": "n1"}) == 0
    # Nothing half-collected leaks from the failing collector.
    assert registry.get_sample_value("fabric_test_partial_total", {"node": "n1"}) is None
    assert registry.get_sample_value("fabric_scrape_collector_duration_seconds", {"collector": "bad", "node": "n1"}) >= 0


def test_collector_that_cannot_start_is_reported_not_fatal():
    class Explodes(Collector):
        name = "explodes"

        def __init__(self, ctx):
            raise RuntimeError("no NVML")

        def collect(self):
            return []

    COLLECTORS["explodes"] = Explodes
    try:
        built = build_collectors(Context(), ["explodes"])
    finally:
        del COLLECTORS["explodes"]
    registry = registry_of(*built)
    assert registry.get_sample_value("fabric_scrape_collector_success", {"collector": "explodes", "node": "n1"}) == 0


def test_http_landing_page_metrics_and_404(port, tmp_path):
    ctx = Context(sysfs=tmp_path, procfs=tmp_path, state_dir=tmp_path / "state", node="node-a")
    exporter = start_exporter(ctx, [], f"127.0.0.1:{port}")
    try:
        base = f"http://127.0.0.1:{port}"
        landing = requests.get(base + "/", timeout=5)
        assert landing.status_code == 200 and 'href="/metrics"' in landing.text
        metrics = requests.get(base + "/metrics", timeout=5)
        assert metrics.status_code == 200
        assert 'fabric_exporter_build_info{node="node-a",version=' in metrics.text
        assert requests.get(base + "/nope", timeout=5).status_code == 404
    finally:
        exporter.stop()


def _basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_web_config_tls_and_basic_auth(port, tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", tmp_path / "key.pem", "-out", tmp_path / "cert.pem"],
                   check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
        f"basic_auth_users:\n  prom: '{hashed}'\n")
    exporter = start_exporter(Context(node="n"), [], f"127.0.0.1:{port}", str(tmp_path / "web.yml"))
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        cert = str(tmp_path / "cert.pem")
        assert requests.get(url, verify=cert, timeout=5).status_code == 401
        assert requests.get(url, verify=cert, headers=_basic("prom", "wrong"), timeout=5).status_code == 401
        ok = requests.get(url, verify=cert, headers=_basic("prom", "s3cret"), timeout=5)
        assert ok.status_code == 200 and "fabric_exporter_build_info" in ok.text
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        exporter.stop()


@pytest.mark.parametrize("text, message", [
    ("basic_auth_users:\n  bob: plaintext\n", "not a bcrypt hash"),
    ("tls_server_config:\n  cert_file: x.pem\n", "tls_server_config.key_file: required key is missing"),
    ("listen: 1\n", "listen: unknown key"),
    ("- a\n", "must be a mapping"),
])
def test_web_config_errors_are_specific(tmp_path, text, message):
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=message):
        load_web_config(path)


def test_cli_flags_enable_and_disable(tmp_path):
    from fabricscope.exporter import main as exporter_main
    import argparse

    parser = argparse.ArgumentParser()
    exporter_main.add_arguments(parser)
    defaults = exporter_main.enabled_collectors(parser.parse_args([]))
    assert defaults == sorted(n for n, cls in COLLECTORS.items() if cls.enabled_by_default)
    for name in COLLECTORS:
        disabled = exporter_main.enabled_collectors(parser.parse_args([f"--no-collector.{name}"]))
        assert disabled == [n for n in defaults if n != name]
        enabled = exporter_main.enabled_collectors(parser.parse_args([f"--collector.{name}"]))
        assert name in enabled and set(defaults) <= set(enabled)


@pytest.mark.parametrize("files, message", [
    ({"config.yml": "infiniband: [unclosed\n"}, "--config.file"),
    ({"config.yml": "- a list\n"}, "top level must be a mapping"),
    ({}, "No such file"),
    ({"config.yml": "{}\n", "web.yml": "basic_auth_users:\n  bob: plaintext\n"}, "not a bcrypt hash"),
])
def test_bad_startup_files_exit_with_a_clear_message(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = ["--config.file", str(tmp_path / "config.yml"), "--path.state", str(tmp_path / "state"),
            "--web.listen-address", "127.0.0.1:0"]
    if "web.yml" in files:
        args += ["--web.config.file", str(tmp_path / "web.yml")]
    result = subprocess.run([sys.executable, "-m", "fabricscope.cli", "exporter", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


def test_address_in_use_is_a_clear_error(port, tmp_path):
    first = start_exporter(Context(node="n"), [], f"127.0.0.1:{port}")
    try:
        result = subprocess.run([sys.executable, "-m", "fabricscope.cli", "exporter",
                                 f"--web.listen-address=127.0.0.1:{port}", f"--path.state={tmp_path}"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert "Address already in use" in result.stderr and "Traceback" not in result.stderr
    finally:
        first.stop()


def test_same_family_from_two_collectors_is_one_block():
    from fabricscope.exporter.exposition import render
    from prometheus_client.core import GaugeMetricFamily

    class StateA(Collector):
        name = "a"

        def collect(self):
            family = GaugeMetricFamily("fabric_state_file_problem", "Problem.", labels=["collector"])
            family.add_metric(["a"], 1)
            yield family

    class StateB(StateA):
        name = "b"

        def collect(self):
            family = GaugeMetricFamily("fabric_state_file_problem", "Problem.", labels=["collector"])
            family.add_metric(["b"], 0)
            yield family

    ctx = Context()
    text = render(ScrapeCollector([StateA(ctx), StateB(ctx)]).families()).decode()
    assert text.count("# TYPE fabric_state_file_problem gauge") == 1
    assert 'fabric_state_file_problem{collector="a"} 1.0' in text
    assert 'fabric_state_file_problem{collector="b"} 0.0' in text


@pytest.mark.parametrize("length, status", [("-5", 400), ("abc", 400), (str(5 * 1024 * 1024), 413)])
def test_hostile_content_length_is_refused_and_server_survives(port, length, status):
    import socket

    exporter = start_exporter(Context(node="n"), [], f"127.0.0.1:{port}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            reply = sock.recv(4096).decode()
        assert reply.startswith(f"HTTP/1.1 {status} ")
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        exporter.stop()


def test_samples_equal_to_last_scrapes_are_served_as_the_same_objects():
    """A collector that builds fresh samples every scrape gets the ones it served last time
    back where nothing changed, so the renderer reuses their lines; what is served still
    equals this scrape's values."""
    class Moving(Collector):
        name = "moving"
        value = 1

        def collect(self):
            family = CounterMetricFamily("fabric_moving", "moves", labels=["which"])
            family.add_metric(["still"], 5)
            family.add_metric(["moves"], self.value)
            yield family

    collector = Moving(Context())
    scrape = ScrapeCollector([collector])
    try:
        first = {s.labels["which"]: s for f in scrape.families() if f.name == "fabric_moving" for s in f.samples}
        collector.value = 2
        second = {s.labels["which"]: s for f in scrape.families() if f.name == "fabric_moving" for s in f.samples}
    finally:
        scrape.close()
    assert second["still"] is first["still"]
    assert second["moves"] is not first["moves"] and second["moves"].value == 2


def test_a_histogram_that_did_not_move_is_served_as_last_scrapes_samples():
    from prometheus_client.core import HistogramMetricFamily

    from fabricscope.exporter.framework import SampleCache

    def scrape(cache, buckets, total):
        cache.next_scrape()
        family = HistogramMetricFamily("fabric_h", "h", labels=["op"])
        cache.histogram(family, ["AllReduce"], buckets, total)
        plain = HistogramMetricFamily("fabric_h", "h", labels=["op"])
        plain.add_metric(["AllReduce"], buckets, total)
        assert family.samples == plain.samples           # what prometheus_client would build
        return family.samples

    cache = SampleCache()
    first = scrape(cache, [("0.1", 1), ("+Inf", 2)], 0.5)
    again = scrape(cache, [("0.1", 1), ("+Inf", 2)], 0.5)
    moved = scrape(cache, [("0.1", 1), ("+Inf", 3)], 0.9)
    assert all(a is b for a, b in zip(first, again))
    assert moved[-1].value == 0.9 and moved[0] is not first[0]


def test_a_cached_family_is_served_again_with_this_scrapes_samples_and_merges_without_piling_up():
    """SampleCache.family keeps the family object from one scrape to the next: it must carry
    exactly this scrape's samples (the counter's sample named _total, an unchanged one the
    same object), and a same-named family of another collector merged into it must not pile
    up scrape after scrape."""
    from prometheus_client.core import GaugeMetricFamily

    from fabricscope.exporter.exposition import render
    from fabricscope.exporter.framework import SampleCache

    class Cached(Collector):
        name = "cached"
        serves_unchanged_samples = True
        moving = 1

        def __init__(self, ctx):
            super().__init__(ctx)
            self.samples = SampleCache()

        def collect(self):
            self.samples.next_scrape()
            yield self.samples.family(CounterMetricFamily, "fabric_cached", "c", ("which",),
                                      [(("still",), 5), (("moves",), self.moving)])
            yield self.samples.family(GaugeMetricFamily, "fabric_state_file_problem", "Problem.", ("collector",),
                                      [((self.name,), 0)])

    class Plain(Collector):
        name = "plain"

        def collect(self):
            family = GaugeMetricFamily("fabric_state_file_problem", "Problem.", labels=["collector"])
            family.add_metric([self.name], 1)
            yield family

    cached = Cached(Context())
    scrape = ScrapeCollector([cached, Plain(Context())])
    try:
        texts, served = [], []
        for moving in (1, 1, 2):
            cached.moving = moving
            families = list(scrape.families())
            served.append({(s.name, s.labels.get("which")): s for f in families for s in f.samples})
            texts.append(render(families).decode())
    finally:
        scrape.close()
    for text in texts:
        assert text.count("fabric_state_file_problem{") == 2
        assert 'fabric_cached_total{which="still"} 5.0' in text
    assert 'fabric_cached_total{which="moves"} 2.0' in texts[2]
    assert served[1][("fabric_cached_total", "still")] is served[0][("fabric_cached_total", "still")]
    assert served[2][("fabric_cached_total", "moves")] is not served[1][("fabric_cached_total", "moves")]


def test_a_group_is_served_again_while_its_source_is_the_same_object_and_rebuilt_when_not():
    """SampleCache.group: the same source object -> last scrape's samples, without calling
    rows(); a new source -> rebuilt, its unchanged samples still last scrape's objects (also
    when the scrape before served the group whole)."""
    from fabricscope.exporter.framework import SampleCache

    cache, calls = SampleCache(), []

    def scrape(source):
        cache.next_scrape()
        def rows():
            calls.append(source)
            return [((name,), value) for name, value in source.items()]
        return cache.group("fabric_c_total", ("counter",), "mlx5_0/1", source, rows)

    quiet = {"symbol_error": 0, "link_downed": 1}
    first = scrape(quiet)
    again = scrape(quiet)
    moved = scrape({"symbol_error": 3, "link_downed": 1})
    assert again is first and len(calls) == 2 and calls[0] is quiet     # rows() not called for `again`
    assert [s.value for s in moved] == [3, 1]
    assert moved[1] is first[1] and moved[0] is not first[0]
