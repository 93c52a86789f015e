"""The serving exporter keeps no start-up-only modules: --config.file and --web.config.file
are validated (pydantic, PyYAML) in a short-lived child process (exporter/isolated.py),
with the same errors, and only the validated values come back (docs/cost.md "Memory")."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from fabricscope.demo.stack import free_port

# Runs `fabricscope exporter` as its command line does; SIGUSR1 makes it write the names of
# the modules it has imported (the handler runs on the main thread, which waits for SIGTERM).
DRIVER = """
import json, signal, sys
def dump(*_):
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(sys.modules), f)
signal.signal(signal.SIGUSR1, dump)
from fabricscope.cli import main
sys.exit(main(sys.argv[2:]))
"""
# bcrypt of "secret" at cost 4.
WEB_CONFIG = "basic_auth_users:\n  prometheus: $2b$04$8OrintucnpU.dL/r2luHMu6dveVSc8Wmh7SJtyfN0J4HeiHllbbuS\n"
START_UP_ONLY = ["pydantic", "pydantic_core", "yaml", "fabricscope.exporter.config",
                 "fabricscope.exporter.webconfig_schema"]


def _get(url: str, password: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if password is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_the_serving_exporter_has_not_imported_pydantic_or_yaml(tmp_path):
    (tmp_path / "config.yml").write_text("netdev: {device_include: '^lo$', device_exclude: '^$'}\n"
                                         "nvlink: {sample_interval_seconds: 5}\n")
    (tmp_path / "web.yml").write_text(WEB_CONFIG)
    (tmp_path / "kmsg").write_text("")
    modules_file, port = tmp_path / "modules.json", free_port()
    command = [sys.executable, "-c", DRIVER, str(modules_file), "exporter", "--web.listen-address",
               f"127.0.0.1:{port}", "--path.state", str(tmp_path / "state"), "--path.kmsg", str(tmp_path / "kmsg"),
               "--config.file", str(tmp_path / "config.yml"), "--web.config.file", str(tmp_path / "web.yml"),
               "--no-collector.nccl", "--no-collector.tcp"]     # ebpf stays on (its declarations are YAML)
    exporter = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}/metrics", time.monotonic() + 30
        while True:
            try:
                status, body = _get(url, "secret")
                break
            except OSError:
                assert exporter.poll() is None and time.monotonic() < deadline, exporter.stdout.read()
                time.sleep(0.1)
        # Both files took effect: the web config's user, the config file's interface filter.
        assert status == 200
        assert _get(url, "wrong")[0] == 401
        interfaces = {line.split('interface="')[1].split('"')[0] for line in body.splitlines()
                      if line.startswith("fabric_netdev_up{")}
        assert interfaces == {"lo"}
        exporter.send_signal(signal.SIGUSR1)
        while not modules_file.exists() or not modules_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        modules = set(json.loads(modules_file.read_text()))
        assert "fabricscope.exporter.collectors.netdev" in modules   # the dump is the exporter's
        assert [name for name in START_UP_ONLY if name in modules] == []
    finally:
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(timeout=30)


ISOLATED = """
import json, os, sys
from fabricscope.exporter.isolated import IsolatedStepError, in_child
from fabricscope.exporter.schema import ConfigError

def imports():
    import xml.dom.minidom
    return {"pid": os.getpid(), "values": [1.5, None, {"a": (1, 2)}]}

def bad_config():
    raise ConfigError("c.yml: nccl.window: input should be greater than or equal to 1, got 0")

def bug():
    return 1 / 0

def dies():
    os._exit(3)

out = {"parent": os.getpid()}
out["result"] = in_child(imports)
out["imported_here"] = "xml.dom.minidom" in sys.modules
for name, function in [("config", bad_config), ("bug", bug), ("dies", dies)]:
    try:
        in_child(function)
    except (ConfigError, IsolatedStepError) as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def test_a_start_up_step_runs_in_a_child_and_its_errors_come_back_whole():
    result = subprocess.run([sys.executable, "-c", ISOLATED], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["result"]["pid"] != out["parent"]
    assert out["result"]["values"] == [1.5, None, {"a": [1, 2]}]
    assert out["imported_here"] is False
    assert out["config"] == ["ConfigError", "c.yml: nccl.window: input should be greater than or equal to 1, got 0"]
    assert out["bug"][0] == "IsolatedStepError" and "ZeroDivisionError" in out["bug"][1]
    assert out["dies"] == ["IsolatedStepError", "dies ended without an answer (child exit status 3)"]


def test_with_other_threads_running_the_step_runs_in_this_process():
    """fork() with other threads running could deadlock the child: not done."""
    import threading

    from fabricscope.exporter.isolated import in_child

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert in_child(os.getpid) == os.getpid()
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("text, message", [
    ("nccl: {window: 0}\n", "nccl.window: input should be greater than or equal to 1, got 0"),
])
def test_config_sections_from_the_child_are_what_collectors_read(tmp_path, text, message):
    """The child's sections equal Context.section's own validation; a mistake still names
    file and key."""
    from fabricscope.exporter.config import load_config_file, section
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.isolated import in_child
    from fabricscope.exporter.schema import ConfigError, load_yaml

    good = tmp_path / "good.yml"
    good.write_text("infiniband:\n  thresholds: [{counter: symbol_error, type: velocity, threshold: 50}]\n"
                    "nccl: {hang_multiplier: 3}\n")
    raw = load_yaml(good)
    checked = Context(config=in_child(load_config_file, str(good)), config_validated=True)
    assert {name: checked.section(name) for name in ("infiniband", "nccl", "nvlink")} == \
        {name: section(raw, name) for name in ("infiniband", "nccl", "nvlink")}
    bad = tmp_path / "bad.yml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        in_child(load_config_file, str(bad))
    assert str(info.value) == f"{bad}: {message}"
