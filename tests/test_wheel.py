"""An installed wheel is the whole product: built from this checkout, installed into a fresh
virtual environment and run from a directory outside the source tree, it starts the CLI,
imports the exporter, and finds every file the stack and the exporter load (rules, mixin,
Alertmanager config and templates, BPF objects and declarations, the demo scenario).
As root it does what the checkout does: the installed exporter loads its eBPF programs
(TCP RTT fills under loopback traffic) and its NCCL uprobes count a fake libnccl's calls,
and the installed `fabricscope stack` pages a scripted fault."""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import requests
import yaml

from fabricscope.exporter.nccl.commid import comm_label
from fabricscope.demo.stack.binaries import free_port
from tests import procs
from tests.conftest import could_not_run
from tests.installed import label_values, loopback_traffic, samples, value
from tests.nccl_fake import identity
from tests.nccl_fake.build import build_fake_nccl
from tests.test_nccl_uprobe import Rank, salted_unique_id

REPO = Path(__file__).resolve().parent.parent


def run(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    # PYTHONPATH and the like would let the source tree leak into the installed copy.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, a working directory outside the source tree)."""
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ in the tree it builds, and a stale
    # build/lib would leak into the next wheel built from the checkout.
    source = work / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "var", "__pycache__", "*.egg-info", ".pytest_cache", "fixtures", "nccl_fake"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(source)], cwd=work)
    [wheel] = (work / "dist").glob("fabricscope-*.whl")
    venv.EnvBuilder(with_pip=True).create(work / "venv")
    bin_dir = work / "venv" / "bin"
    # The sidecar and chaos extras: `fabricscope stack` runs the sidecar from this install.
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{wheel}[sidecar,chaos]"], cwd=work)
    outside = work / "elsewhere"
    outside.mkdir()
    return bin_dir, outside


def test_cli_and_exporter_run_from_the_installed_wheel(installed):
    bin_dir, outside = installed
    help_text = run([str(bin_dir / "fabricscope"), "stack", "--help"], cwd=outside).stdout
    assert "--fast-alerts" in help_text and "--prometheus-port" in help_text
    run([str(bin_dir / "fabricscope"), "exporter", "--help"], cwd=outside)
    probe = """
import json, fabricscope, fabricscope.exporter
from fabricscope.rules import rule_files
from fabricscope.alertmanager import ALERTMANAGER_CONFIG, ALERTMANAGER_DIR
from fabricscope.exporter.bpf_loader.objects import object_path, SOURCE_DIR
from fabricscope.demo.scenario import default_scenario_path
from fabricscope.demo.stack.configs import alertmanager_config
print(json.dumps({
    "package": fabricscope.exporter.__file__,
    "rules": [str(p) for p in rule_files()],
    "alertmanager": ALERTMANAGER_CONFIG.is_file(),
    "templates": alertmanager_config("http://127.0.0.1:1/hook")["templates"],
    "bpf_objects": sorted(p.name for p in SOURCE_DIR.glob("*.bpf.o")),
    "declarations": sorted(p.name for p in SOURCE_DIR.glob("*.yaml")),
    "scenario": default_scenario_path().is_file(),
}))
"""
    found = json.loads(run([str(bin_dir / "python"), "-c", probe], cwd=outside).stdout)
    site = str(bin_dir.parent)
    assert found["package"].startswith(site), found["package"]
    assert [Path(p).name for p in found["rules"]] == ["fabricscope-alerts.yaml", "fabricscope-recording.yaml"]
    assert all(p.startswith(site) for p in found["rules"])
    assert found["alertmanager"] and found["scenario"]
    [templates] = found["templates"]
    assert templates.startswith(site) and list(Path(templates).parent.glob("*.tmpl"))
    # Only the programs the exporter loads: the loader's test program stays in tests/.
    assert found["bpf_objects"] == sorted(p.name for p in (REPO / "exporter" / "bpf").glob("*.bpf.o"))
    assert "selftest.bpf.o" not in found["bpf_objects"]
    assert found["declarations"] == sorted(p.name for p in (REPO / "exporter" / "bpf").glob("*.yaml"))


def test_installed_wheel_renders_the_rules_like_the_checkout(installed, tmp_path):
    """--fast-alerts renders the packaged mixin: the installed renderer reproduces the
    committed rule files byte for byte."""
    bin_dir, outside = installed
    run([str(bin_dir / "python"), "-m", "fabricscope.rules.render", str(tmp_path)], cwd=outside)
    for name in ("fabricscope-alerts.yaml", "fabricscope-recording.yaml"):
        assert (tmp_path / name).read_text() == (REPO / "rules" / name).read_text()


def test_no_generic_top_level_package_in_the_wheel(installed):
    bin_dir, _ = installed
    site_packages = next((bin_dir.parent / "lib").glob("python*/site-packages"))
    for generic in ("exporter", "rules", "alertmanager", "queryapi", "chaos", "dashboards", "tests"):
        assert not (site_packages / generic).exists(), generic


def test_installed_wheel_carries_the_dashboards_the_report_draws(installed):
    """The generated dashboard JSON ships in the package; without the dashboards extra
    the report says what to install instead of failing on an import."""
    bin_dir, outside = installed
    probe = "from fabricscope.dashboards import model; print(sorted(model.load_all()))"
    found = run([str(bin_dir / "python"), "-c", probe], cwd=outside).stdout
    assert found.strip() == str(sorted(p.stem for p in (REPO / "dashboards" / "json").glob("*.json")))
    result = subprocess.run([str(bin_dir / "fabricscope"), "report", "--prometheus-url", "http://127.0.0.1:1"],
                            cwd=outside, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "pip install 'fabricscope[dashboards]'" in result.stderr, result.stderr


def test_installed_wheel_carries_no_bpf_sources_and_every_object(installed):
    """The wheel ships compiled objects and declarations only; the exporter needs no .bpf.c."""
    bin_dir, _ = installed
    site_packages = next((bin_dir.parent / "lib").glob("python*/site-packages"))
    bpf = site_packages / "fabricscope" / "exporter" / "bpf"
    assert not list(bpf.glob("*.bpf.c"))
    assert sorted(p.name for p in bpf.glob("*.bpf.o")) == \
        sorted(p.name.replace(".bpf.c", ".bpf.o") for p in (REPO / "exporter" / "bpf").glob("*.bpf.c"))


# ---- root: the installed exporter's eBPF and NCCL uprobes, the installed stack -------------

@contextlib.contextmanager
def exporter_process(argv: list[str], cwd: Path, log_path: Path, url: str):
    """The exporter started from `argv`, answering at `url` before the body runs."""
    with log_path.open("w") as log:
        exporter = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                    env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
        try:
            def answering():
                if exporter.poll() is not None:
                    pytest.fail(f"the installed exporter exited: {log_path.read_text()[-3000:]}")
                try:
                    return samples(url)
                except requests.ConnectionError:
                    return None
            procs.wait_for(answering, 60, "the installed exporter to answer")
            yield exporter
        finally:
            exporter.terminate()
            exporter.wait(30)


@pytest.fixture
def installed_exporter(installed, tmp_path):
    """`fabricscope exporter` from the wheel, as root, on a free port; its /metrics URL."""
    if os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.skip("needs root and kernel BTF: the installed exporter loads BPF programs")
    bin_dir, outside = installed
    url = f"http://127.0.0.1:{free_port()}/metrics"
    argv = [str(bin_dir / "fabricscope"), "exporter", f"--web.listen-address={url.split('/')[2]}",
            f"--path.state={tmp_path / 'state'}", "--node-name=wheel-node"]
    with exporter_process(argv, outside, tmp_path / "exporter.log", url):
        yield url, tmp_path / "exporter.log"


def test_installed_exporter_loads_ebpf_and_fills_the_tcp_rtt_histogram(installed_exporter):
    url, log = installed_exporter
    before = samples(url)
    if value(before, "fabric_ebpf_available", node="wheel-node", reason="ok") != 1:
        reasons = label_values(before, "fabric_ebpf_available", "reason")
        could_not_run(f"the installed exporter has no eBPF ({reasons}): {log.read_text()[-2000:]}")
    def rtt(found):
        return value(found, "fabric_tcp_rtt_seconds_count", node="wheel-node") or 0
    loopback_traffic()
    procs.wait_for(lambda: rtt(samples(url)) - rtt(before) >= 20, 30, "20 loopback RTT samples")


def test_installed_exporter_counts_a_fake_libnccl_process_calls(installed_exporter, tmp_path):
    url, log = installed_exporter
    library, driver = build_fake_nccl(tmp_path)
    salt = random.randrange(1, 256)
    n, count = 25, 1000
    ranks = [Rank(driver, 2, rank, n, count, 3, 16, env={"FAKE_NCCL_ID_SALT": str(salt)}) for rank in (0, 1)]
    try:
        procs.wait_for(lambda: value(samples(url), "fabric_nccl_probe_attached", node="wheel-node",
                                     library=str(library)) == 1, 30, "uprobes on the fake libnccl")
        for r in ranks:
            r.tell()
        for r in ranks:
            r.expect("done")
        comm = comm_label(identity.comm_hash(salted_unique_id(salt)))
        def calls(found, rank):
            return value(found, "fabric_nccl_calls_total", node="wheel-node", comm=comm,
                                                  rank=str(rank), op="AllReduce")
        found = procs.wait_for(lambda: (lambda f: f if all(calls(f, r) == n for r in (0, 1)) else None)(samples(url)),
                               30, f"{n} AllReduce calls per rank of comm {comm}")
        assert value(found, "fabric_nccl_bytes_total", node="wheel-node", comm=comm, rank="0", op="AllReduce") \
            == n * count * 4
    finally:
        for r in ranks:
            r.finish()


def test_installed_stack_pages_a_scripted_fault(installed, tmp_path):
    """`fabricscope stack --duration 60` from the wheel: real Prometheus and Alertmanager
    with the packaged rules page a kernel-log fatal through the installed sidecar.
    About 80 s (60 s of stack, the rest start-up and stop): the run length is the one the
    installed-product check names, and the page lands at about 30 s of it."""
    bin_dir, outside = installed
    scenario = tmp_path / "fault.yaml"
    scenario.write_text(yaml.safe_dump({
        "seed": 7, "cluster": {"name": "wheeltest", "nodes": 1, "gpus_per_node": 2, "hcas_per_node": 2},
        "tick_seconds": 1,
        "faults": [{"kind": "mlx5_fatal", "node": 0, "at": "1s", "duration": "5m", "target": {"device": "mlx5_1"}}]}))
    result = run([str(bin_dir / "fabricscope"), "stack", "--duration", "60", "--scenario", str(scenario),
                  "--workdir", str(tmp_path / "work"), "--prometheus-port", "0", "--alertmanager-port", "0",
                  "--sidecar-port", "0", "--scrape-interval", "1s"], cwd=outside, timeout=180)
    # The receiver in brackets is the webhook's, or empty where the sidecar learnt of the
    # alert from Alertmanager's API first (its reconciliation): either way Alertmanager has it.
    assert re.search(r"\] FIRING FabricKernelLogFatal \(critical\) cluster=wheeltest "
                     r"node=gpu-node-0 .*source=mlx5_core", result.stdout), result.stdout[-3000:]


SYSTEMD_UNIT = REPO / "deploy" / "systemd" / "fabricscope-exporter.service"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
DOCUMENTED_PREFIX = "/opt/fabricscope"


def documented_install_lines() -> list[str]:
    """docs/deploy.md's systemd install lines that put the CLI in place (the venv and the
    pip install; the others copy the unit and start it)."""
    section = DEPLOY_DOC.read_text().split("## systemd", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if DOCUMENTED_PREFIX in line]


def test_systemd_unit_starts_the_installed_exporter(installed, tmp_path):
    """docs/deploy.md's install lines run (into a temporary prefix, with the wheel built
    here) and the unit's ExecStart is the CLI they installed. Where systemd runs, the unit
    itself is started (under a test name, its port a free one); elsewhere its ExecStart runs
    as systemd would run it. Either way the exporter answers with every argument the unit
    gives it."""
    _bin_dir, outside = installed
    [wheel] = (outside.parent / "dist").glob("fabricscope-*.whl")
    prefix = tmp_path / "opt-fabricscope"
    lines = documented_install_lines()
    assert any("-m venv" in line for line in lines) and any("pip install" in line for line in lines), lines
    for line in lines:
        line = line.replace(DOCUMENTED_PREFIX, str(prefix)).replace(f"dist/{wheel.name}", str(wheel))
        run(["bash", "-c", line], cwd=outside)
    unit = SYSTEMD_UNIT.read_text()
    argv = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart=").split()
    assert argv[0] == f"{DOCUMENTED_PREFIX}/bin/fabricscope" and argv[1] == "exporter", argv
    cli = Path(argv[0].replace(DOCUMENTED_PREFIX, str(prefix)))
    assert cli.is_file() and os.access(cli, os.X_OK), f"the documented install did not produce {argv[0]}"
    bin_dir = cli.parent
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    installed_argv = [str(bin_dir / "fabricscope"), *[f"--web.listen-address=127.0.0.1:{port}"
                                                       if a.startswith("--web.listen-address=") else a
                                                       for a in argv[1:]]]
    if Path("/run/systemd/system").is_dir() and os.geteuid() == 0:
        name = f"fabricscope-exporter-test-{port}"
        state = f"--path.state=/var/lib/{name}"
        exec_start = " ".join(state if a.startswith("--path.state=") else a for a in installed_argv)
        unit_file = Path("/run/systemd/system") / f"{name}.service"
        unit_file.write_text(re.sub(r"^ExecStart=.*$", f"ExecStart={exec_start}", unit, flags=re.M)
                             .replace("StateDirectory=fabricscope-exporter", f"StateDirectory={name}"))
        try:
            run(["systemctl", "daemon-reload"], cwd=outside)
            run(["systemctl", "start", f"{name}.service"], cwd=outside)
            found = procs.wait_for(lambda: _scrape_or_none(url), 60, f"{name}.service to answer")
        finally:
            subprocess.run(["systemctl", "stop", f"{name}.service"], capture_output=True, timeout=60)
            unit_file.unlink()
            subprocess.run(["systemctl", "daemon-reload"], capture_output=True, timeout=60)
    else:
        # No systemd here: the unit's command line, run as systemd would run it.
        state = f"--path.state={tmp_path / 'state'}"
        installed_argv = [state if a.startswith("--path.state=") else a for a in installed_argv]
        with exporter_process(installed_argv, outside, tmp_path / "exporter.log", url):
            found = samples(url)
    assert label_values(found, "fabric_exporter_build_info", "version") == {"0.1.0"}


def _scrape_or_none(url: str):
    try:
        return samples(url)
    except requests.ConnectionError:
        return None
