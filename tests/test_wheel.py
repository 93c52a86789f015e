"""An installed wheel is the whole product: built from this checkout, installed into a fresh
virtual environment and run from a directory outside the source tree, it starts the CLI,
imports the exporter, and finds every file the stack and the exporter load (rules, mixin,
Alertmanager config and templates, BPF objects and declarations, the demo scenario)."""
from __future__ import annotations

import json
import shutil
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

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
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=work)
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
from fabricscope.exporter.ebpf.objects import object_path, SOURCE_DIR
from fabricscope.demo.scenario import default_scenario_path
from fabricscope.stack.configs import alertmanager_config
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
