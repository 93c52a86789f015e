"""Schema-driven fuzzing: schemathesis generates requests from the sidecar's own OpenAPI
document (valid and invalid bodies, parameters and headers) against the real server
with a real Prometheus behind it; no request may get a 5xx. The example count is kept
small so the run stays short; `SIDECAR_FUZZ_EXAMPLES` raises it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.demo import stack
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import make_keys

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SIDECAR_FUZZ_EXAMPLES", "12"))


def test_no_request_generated_from_the_openapi_document_gets_a_5xx(tmp_path):
    schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if schemathesis is None:
        pytest.fail("schemathesis is not installed (it is in the test extra: run `make setup`)")
    config = stack.prometheus_config("fuzz", tmp_path / "targets.json", f"127.0.0.1:{stack.free_port()}", [])
    with procs.prometheus(config, tmp_path / "prom") as prom:
        keys = make_keys(tmp_path / "keys.yaml")
        sidecar = start_sidecar(tmp_path, "127.0.0.1", stack.free_port(), prom.url, tmp_path / "keys.yaml",
                                extra_args=["--rate-limit", "100000", "--rate-burst", "100000"])
        try:
            result = subprocess.run(
                [schemathesis, "run", f"{sidecar.url}/api/v1/openapi.json",
                 "-H", f"Authorization: Bearer {keys['admin']}", "--tls-verify", str(sidecar.certs.ca),
                 "--checks", "not_a_server_error", "--max-examples", str(EXAMPLES), "--seed", "20261126",
                 "--request-timeout", "20", "--suppress-health-check", "all"],
                capture_output=True, text=True, timeout=540, env={**os.environ, "NO_COLOR": "1"},
                cwd=tmp_path)   # its run artefacts (.schemathesis/) stay out of the checkout
        finally:
            sidecar.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"schemathesis found failures:\n{output[-6000:]}"
    # It really ran requests against every operation (warnings, e.g. an operation whose
    # generated inputs were all refused with 4xx, are not failures).
    passed = re.search(r"\d+ generated, (\d+) passed", output)
    assert passed and int(passed.group(1)) >= 100, output[-3000:]
