"""The malloc arena cap: glibc takes it, and threads then share two arenas instead of one each."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Sixteen threads that each allocate outside pymalloc while the others hold theirs; glibc's
# malloc_stats() then prints one "Arena N:" block per arena on stderr.
PROGRAM = r"""
import ctypes, sys, threading
from fabricscope.exporter.malloc import cap_malloc_arenas
applied = cap_malloc_arenas() if sys.argv[1] == "cap" else None
barrier = threading.Barrier(16)
def work():
    blocks = [bytes(200_000) for _ in range(4)]
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(applied, flush=True)
ctypes.CDLL(None).malloc_stats()
"""


def arenas(mode: str, env: dict | None = None) -> tuple[str, int]:
    result = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr.count("Arena ")


def _glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="the arena cap is glibc's")
def test_capped_threads_share_two_arenas_where_each_had_its_own():
    env = {"MALLOC_ARENA_MAX": ""}
    applied, capped = arenas("cap", env)
    assert applied == "True" and capped <= 2, capped
    # As on a 64-core host (8 arenas a core): every thread its own arena.
    _, uncapped = arenas("none", {"MALLOC_ARENA_MAX": "512"})
    assert uncapped >= 8, uncapped


@pytest.mark.skipif(not _glibc(), reason="the arena cap is glibc's")
def test_an_operators_malloc_arena_max_wins():
    applied, count = arenas("cap", {"MALLOC_ARENA_MAX": "4"})
    assert applied == "False" and 2 < count <= 4, count
