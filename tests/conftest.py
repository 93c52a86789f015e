"""Shared fixtures: free ports, root detection."""
from __future__ import annotations

import os

import pytest

from fabricscope.stack.binaries import free_port  # noqa: F401  (tests import it from here)


@pytest.fixture
def port() -> int:
    return free_port()


is_root = os.geteuid() == 0
needs_root = pytest.mark.skipif(not is_root, reason="needs root (eBPF / nftables)")
