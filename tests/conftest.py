"""Shared fixtures: free ports, a running exporter on a given context."""
from __future__ import annotations

import os
import socket

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


is_root = os.geteuid() == 0
needs_root = pytest.mark.skipif(not is_root, reason="needs root (eBPF / nftables)")
