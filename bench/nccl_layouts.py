"""Where each NCCL build PyTorch wheels shipped keeps a communicator's rank: the layout the
exporter finds (exporter/nccl/commlayout.py) in the real libnccl.so.2 of each
nvidia-nccl-cu12 wheel, downloaded with pip. Prints a Markdown table (and writes it to --out).

    .venv/bin/python bench/nccl_layouts.py --out bench/results/nccl_layouts.md

No GPU needed: the layout comes from the library's exported accessors alone. On a GPU host,
bench/device/nccl_late_attach.py reads real communicators with it.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The nvidia-nccl-cu12 versions PyTorch 2.1 to 2.9 pinned, and the other releases between.
VERSIONS = ("2.18.1", "2.18.3", "2.19.3", "2.20.5", "2.21.5", "2.22.3", "2.23.4", "2.24.3", "2.25.1", "2.26.2",
            "2.27.3", "2.27.5", "2.28.3", "2.28.7", "2.28.9")
PLATFORMS = ("manylinux_2_18_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def library_of(version: str, work: Path) -> Path | None:
    """libnccl.so.2 of nvidia-nccl-cu12==version, or None when pip finds no wheel."""
    wheels = work / version
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *platforms,
               "--python-version", "3.12", "-d", str(wheels), f"nvidia-nccl-cu12=={version}"]
    if subprocess.run(command, capture_output=True).returncode != 0:
        return None
    [wheel] = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("lib/libnccl.so.2"))
        target = wheels / "libnccl.so.2"
        with archive.open(member) as source, open(target, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
    wheel.unlink()
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*", default=list(VERSIONS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from fabricscope.exporter.nccl import commlayout

    rows = ["| nvidia-nccl-cu12 | libnccl.so.2 sha256 (first 16) | ncclComm.rank at | commHash at |",
            "|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="nccl-wheels-") as work:
        for version in args.versions:
            library = library_of(version, Path(work))
            if library is None:
                rows.append(f"| {version} | (no wheel for this platform) | | |")
                continue
            digest = hashlib.sha256(library.read_bytes()).hexdigest()[:16]
            try:
                layout = commlayout.library_layout(str(library))
                rows.append(f"| {version} | `{digest}` | {layout.rank_at:#x} | {layout.hash_at:#x} |")
            except commlayout.LayoutUnknown as exc:
                rows.append(f"| {version} | `{digest}` | unknown: {exc.reason} | |")
            library.unlink()
            print(rows[-1], flush=True)
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
