"""Where each NCCL release keeps the operation counters of struct ncclComm: offsetof() from
NCCL's own headers, compiled with g++ against the CUDA headers, one release tag at a time.
Prints the table exporter/nccl/commlayout.py's COUNTERS carries (and writes it to --out).

    .venv/bin/python bench/nccl_counters.py --nccl-src NCCL_GIT_DIR --out bench/results/nccl_counters.md

NCCL_GIT_DIR is a clone of github.com/NVIDIA/nccl (its tags v2.18.1-1 ... are read with
git archive). The `rank` column must equal the offset found in the wheel's binary
(bench/results/nccl_layouts.md, from the accessors' code): that equality is the check that
the compiled layout is the shipped one. No GPU needed.

Which counter is read (docs/nccl.md, "Numbering"):
- 2.26 and later: comm->seqNumber[NCCL_NUM_FUNCTIONS], summed. NCCL counts every collective
  it launches there, per communicator, whatever the transport (RAS compares it across ranks).
- 2.25: comm->collOpCount; 2.18-2.24: comm->sharedRes->collOpCount (shared by split comms
  with splitShare). Both advance only for launches with proxy (network) work; the exporter
  verifies per rank that the counter moves by exactly the calls it saw, or does not use it.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CUDA_INCLUDE = Path("/usr/local/cuda-13.0/include")
PROGRAM = r"""
#include <cstdio>
#include <cstddef>
#include "comm.h"
int main() {
  printf("rank %zu\n", offsetof(struct ncclComm, rank));
  printf("sharedRes %zu\n", offsetof(struct ncclComm, sharedRes));
  printf("shared_collOpCount %zu\n", offsetof(struct ncclSharedResources, collOpCount));
#ifdef HAS_COMM_COLL
  printf("collOpCount %zu\n", offsetof(struct ncclComm, collOpCount));
#endif
#ifdef HAS_SEQ
  printf("seqNumber %zu\n", offsetof(struct ncclComm, seqNumber));
  printf("functions %d\n", (int)NCCL_NUM_FUNCTIONS);
#endif
  return 0;
}
"""


def pfn_prelude(cudawrap: str, typedefs: str) -> str:
    """CUDA 13 dropped the unversioned PFN_cuX typedefs older NCCL headers declare pointers
    with: map each to its newest versioned one (only types are needed, never the calls)."""
    lines = ["#include <cuda.h>", "#include <cudaTypedefs.h>"]
    for name in sorted(set(re.findall(r"PFN_EXTERN\((cu\w+)\)", cudawrap))):
        versions = [(int(v), f"PFN_{name}_v{v}") for v in re.findall(rf"\bPFN_{name}_v(\d+)\b", typedefs)]
        if versions:
            lines.append(f"typedef {max(versions)[1]} PFN_{name};")
    return "\n".join(lines) + "\n"


def offsets(repo: Path, version: str, work: Path) -> dict[str, int]:
    src = work / version
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(repo), "archive", f"v{version}-1", "src"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    src = src / "src"
    major, minor, patch = (int(p) for p in version.split("."))
    header = (src / "nccl.h.in").read_text()
    for key, value in (("Major", major), ("Minor", minor), ("Patch", patch), ("Suffix", ""),
                       ("Version", major * 10000 + minor * 100 + patch)):
        header = header.replace("${nccl:%s}" % key, str(value))
    (src / "include/nccl.h").write_text(header)
    prelude = work / f"prelude-{version}.h"
    prelude.write_text(pfn_prelude((src / "include/cudawrap.h").read_text(),
                                   (CUDA_INCLUDE / "cudaTypedefs.h").read_text()))
    comm_h = (src / "include/comm.h").read_text()
    defines = [d for d, field in (("-DHAS_COMM_COLL", r"^\s+uint64_t collOpCount;"),
                                  ("-DHAS_SEQ", r"seqNumber\[NCCL_NUM_FUNCTIONS\]"))
               if re.search(field, comm_h.split("struct ncclComm {", 1)[1], re.M)]
    if (major, minor) < (2, 26) and "-DHAS_SEQ" in defines:
        # 2.23-2.25 declare seqNumber but count in it only while a profiler plugin is loaded.
        defines.remove("-DHAS_SEQ")
    program = work / "offsets.cc"
    program.write_text(PROGRAM)
    includes = [f"-I{p}" for p in (src / "include", src / "include/plugin", src, CUDA_INCLUDE, CUDA_INCLUDE / "cccl")]
    includes += [f"-I{p}" for p in sorted((src / "include").iterdir()) if p.is_dir()]
    binary = work / f"offsets-{version}"
    subprocess.run(["g++", "-std=c++17", "-w", "-fpermissive", *includes, "-include", str(prelude), *defines,
                    str(program), "-o", str(binary)], check=True, capture_output=True)
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in (line.split() for line in out.splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nccl-src", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tags = subprocess.run(["git", "-C", str(args.nccl_src), "tag"], capture_output=True, text=True,
                          check=True).stdout.split()
    versions = sorted({m.group(1) for t in tags if (m := re.fullmatch(r"v(2\.(?:18|19|2[0-8])\.\d+)-1", t))},
                      key=lambda v: tuple(int(p) for p in v.split(".")))
    rows = ["| NCCL | ncclComm.rank at | counter read | at | per comm | words | advances on |",
            "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="nccl-offsets-") as work:
        for version in versions:
            try:
                found = offsets(args.nccl_src, version, Path(work))
            except subprocess.CalledProcessError as exc:
                rows.append(f"| {version} | (not compiled: {(exc.stderr or b'')[-120:]!r}) | | | | | |")
                continue
            if "seqNumber" in found:
                counter = ("seqNumber", f"{found['seqNumber']:#x}", "yes", str(found["functions"]), "every launch")
            elif "collOpCount" in found:
                counter = ("collOpCount", f"{found['collOpCount']:#x}", "yes", "1", "launches with proxy work")
            else:
                counter = ("sharedRes->collOpCount",
                           f"{found['sharedRes']:#x} -> {found['shared_collOpCount']:#x}", "no (splitShare)", "1",
                           "launches with proxy work")
            rows.append(f"| {version} | {found['rank']:#x} | " + " | ".join(counter) + " |")
            print(rows[-1], flush=True)
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
