"""Build the fake libnccl.so.2 (NCCL's real signatures) and its test driver with gcc.

Shared by tests/test_nccl_uprobe.py and bench/nccl_uprobe_cost.py.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

FAKE_DIR = Path(__file__).resolve().parent


def build_fake_nccl(out: Path, version_code: int | None = None) -> tuple[Path, Path]:
    """(library, driver) built into `out`; the driver finds the library through its rpath.
    version_code: the release ncclGetVersion reports (default NCCL 2.28.9's layout's, 22809)."""
    library = out / "libnccl.so.2"
    defines = [f"-DFAKE_NCCL_VERSION_CODE={version_code}"] if version_code else []
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *defines, "-o", library, FAKE_DIR / "fake_nccl.c"], check=True)
    return library, _program(out, "driver")


def build_step_driver(out: Path) -> Path:
    """The training-loop rank (steps.c) linked against the fake library already in `out`."""
    return _program(out, "steps")


def _program(out: Path, name: str) -> Path:
    program = out / name
    subprocess.run(["gcc", "-O2", "-o", program, FAKE_DIR / f"{name}.c", f"-I{FAKE_DIR}", f"-L{out}",
                    "-l:libnccl.so.2", f"-Wl,-rpath,{out}"], check=True)
    return program
