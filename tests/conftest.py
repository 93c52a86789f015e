"""Shared fixtures: free ports, and the two ways a test may not run.

- A tool the project's installer provides (deploy/install-system-deps.sh) is missing:
  `missing_tool` fails the test, everywhere - `make setup` would have installed it.
- The test could not run on this host for a reason that is a real failure on a CI host
  (the BPF objects did not build, the verifier rejected a program, uprobes did not load):
  `could_not_run` skips with the reason on a workstation and fails under CI=true, so CI
  never goes green on tests that did not run.
Host facts no installer changes (not root, no kernel BTF, no NVIDIA driver) stay skips.
"""
from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from fabricscope.demo.stack.binaries import free_port


@pytest.fixture
def port() -> int:
    return free_port()


IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_tool(name: str, package: str | None = None) -> NoReturn:
    pytest.fail(f"{name} not found; run `make setup` (deploy/install-system-deps.sh installs "
                f"{package or name})")


def require_tool(name: str, package: str | None = None) -> str:
    """Path of an installer-provided tool, or a failure naming the package."""
    return shutil.which(name) or missing_tool(name, package)


def could_not_run(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a skip here would hide a failure)")
    pytest.skip(reason)
