"""Where the compiled BPF objects live, and building them (tests, bench, `make bpf`).

The exporter itself never compiles: objects are built once by exporter/bpf/Makefile
(clang + vmlinux.h from the running kernel's BTF) and only loaded at run time.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent.parent / "bpf"


def default_object_dir() -> Path:
    return SOURCE_DIR


def object_path(name: str, object_dir: Path | None = None) -> Path:
    """Path of `<name>.bpf.o` in object_dir (default: next to the sources)."""
    return (object_dir or SOURCE_DIR) / f"{name}.bpf.o"


def build(source_dir: Path = SOURCE_DIR, timeout: float = 600) -> tuple[bool, str]:
    """Run exporter/bpf/Makefile on the *.bpf.c of `source_dir` (default: the exporter's own
    programs; the tests build theirs with the same flags); (every *.bpf.c has a fresh
    *.bpf.o, make's output)."""
    if shutil.which("make") is None:
        return False, "make is not installed"
    proc = subprocess.run(["make", "-s", "-C", str(SOURCE_DIR), f"SRC_DIR={Path(source_dir).resolve()}"],
                          capture_output=True, text=True, timeout=timeout)
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        return False, output
    missing = [src.name for src in source_dir.glob("*.bpf.c")
               if not (src.with_suffix("").with_suffix(".bpf.o")).is_file()]
    if missing:
        return False, output or f"no objects built for {', '.join(missing)}"
    return True, output
