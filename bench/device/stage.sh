#!/bin/sh
# Prepare what a GPU host without clang, libbpf or the exporter's Python dependencies needs,
# on a machine that has them (`make setup` done): the BPF object, libbpf and libelf, and
# the exporter's pure-Python dependencies. All of it is git-ignored; carry these paths:
#   exporter/bpf/nccl.bpf.o  exporter/bpf/procwatch.bpf.o  bench/device/lib  bench/device/vendor
# and, for gpu_cost.sh (every collector): exporter/bpf/sched.bpf.o exporter/bpf/syscalls.bpf.o
#   exporter/bpf/tcp.bpf.o
set -eu
cd "$(dirname "$0")/../.."
make -s bpf
for object in nccl procwatch sched syscalls tcp; do
    test -f exporter/bpf/$object.bpf.o || { echo "exporter/bpf/$object.bpf.o was not built" >&2; exit 1; }
done
mkdir -p bench/device/lib bench/device/vendor
for lib in libbpf.so.1 libelf.so.1; do
    cp -L "$(/sbin/ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" bench/device/lib/
done
# Every core dependency of the exporter (pyproject's `dependencies`, not the extras), file
# by file from the venv: pure Python, or abi3 wheels that load in any CPython 3 on x86-64.
rm -rf bench/device/vendor && mkdir -p bench/device/vendor
.venv/bin/python - <<'PY'
import shutil

from packaging.requirements import Requirement
from importlib import metadata
from pathlib import Path

out = Path("bench/device/vendor")


def names(requirements):
    """Distribution names of the requirements that hold on Linux without an extra."""
    wanted = [Requirement(r) for r in requirements or []]
    return [r.name for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})]


# The core dependencies and theirs, transitively (pydantic needs pydantic-core, say).
pending, seen = names(metadata.requires("fabricscope")), set()
while pending:
    name = pending.pop()
    if name.lower() in seen:
        continue
    seen.add(name.lower())
    dist = metadata.distribution(name)
    pending += names(dist.requires)
    for file in dist.files or []:
        if "__pycache__" in file.parts or file.parts[0].endswith((".dist-info", "..")) or str(file).startswith(".."):
            continue
        source = Path(dist.locate_file(file))
        if source.is_file():
            (out / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, out / file)
PY
# Compiled modules for the GPU hosts' Python as well (PyTorch images run 3.12; the venv may
# be older): pydantic_core has no pure fallback and no abi3 build. Its wheel for 3.12, of the
# venv's version, beside the venv's own (each interpreter loads the file of its ABI tag).
PYDANTIC_CORE=$(.venv/bin/python -c 'import pydantic_core; print(pydantic_core.__version__)')
WHEELS=$(mktemp -d)
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$WHEELS" "pydantic-core==$PYDANTIC_CORE"
.venv/bin/python -c 'import sys, zipfile; [z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".so")]) for z in [zipfile.ZipFile(sys.argv[1])]]' \
    "$WHEELS"/pydantic_core-*.whl bench/device/vendor
rm -rf "$WHEELS"
# pyroute2 (pure Python, a test dependency): nccl_multinode.py builds its nodes' networks with it.
cp -r "$(.venv/bin/python -c 'import os, pyroute2; print(os.path.dirname(pyroute2.__file__))')" bench/device/vendor/
# py-spy, when the venv has it (pip install py-spy): gpu_cost.py --profile samples an exporter.
if test -x .venv/bin/py-spy; then cp .venv/bin/py-spy bench/device/lib/; fi
du -sh exporter/bpf/*.bpf.o bench/device/lib bench/device/vendor
