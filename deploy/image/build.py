#!/usr/bin/env python3
"""Build the OCI images from a Debian base made here, without a container registry.

  python3 deploy/image/build.py [--rebuild-base] [--no-cache] [--docs docs/deploy.md] [--record build.json]

1. The base: `debootstrap --variant=minbase bookworm` into a scratch directory, imported
   with `podman import` as localhost/fabricscope-base:bookworm (kept and reused: pass
   --rebuild-base to make it again).
2. localhost/fabricscope:<version> from deploy/image/Containerfile (build stage: BPF
   objects and the wheel; runtime stage: the installed virtualenv only), and Prometheus
   and Alertmanager images from their Debian packages on the same base.

Every podman call runs with CONTAINERS_CONF=deploy/image/containers.conf (runc, ulimits
within the host's). The host's extra CA certificates (/usr/local/share/ca-certificates)
are mounted into the build's RUN steps, so pip reaches the package index where HTTPS goes
through an intercepting proxy; they are not copied into any image.
Prints what it built as JSON (seconds per step, image sizes); --docs rewrites the
measured table in docs/deploy.md from this run. Needs root (debootstrap, podman).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CONTAINERS_CONF = HERE / "containers.conf"
BASE_IMAGE = "localhost/fabricscope-base:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
DOCS_BEGIN = "<!-- image-build:begin (deploy/image/build.py --docs writes this table) -->"
DOCS_END = "<!-- image-build:end -->"
BUILD_STAGE_LABEL = "io.fabricscope.stage=build"   # set by the Containerfiles' build stage

# What a minbase rootfs lacks to be a good image base: no services start from package
# scripts (there is no init in a container), no recommended packages, no apt caches.
POLICY_RC_D = "#!/bin/sh\n# Services never start from package scripts inside an image.\nexit 101\n"
APT_CONF = ('APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
            'DPkg::Post-Invoke {"rm -f /var/cache/apt/archives/*.deb || true";};\n')


class BuildError(RuntimeError):
    pass


# Host programs the build execs, and why: checked before anything starts, so a missing one
# is named instead of surfacing as a container engine's bare "No such file or directory".
HOST_TOOLS = {
    "debootstrap": "debootstrap (makes the Debian base)",
    "podman": "podman (builds and runs the images)",
    "runc": "runc (the OCI runtime containers.conf names)",
    "iptables": "iptables (netavark's firewall driver runs it to set up every build step's network)",
    "/usr/lib/podman/netavark": "netavark (podman's network backend)",
}


def missing_host_tools() -> list[str]:
    """The HOST_TOOLS entries this host lacks, each with its Debian package and purpose."""
    return [why for tool, why in HOST_TOOLS.items()
            if not (os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool))]


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def fabricscope_image() -> str:
    return f"localhost/fabricscope:{version()}"


def images() -> dict[str, tuple[Path, str]]:
    """name -> (Containerfile, tag)."""
    return {"fabricscope": (HERE / "Containerfile", fabricscope_image()),
            "prometheus": (HERE / "prometheus.Containerfile", "localhost/fabricscope-prometheus:bookworm"),
            "alertmanager": (HERE / "alertmanager.Containerfile", "localhost/fabricscope-alertmanager:bookworm")}


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, env=engine_env(), capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(map(str, command))} failed ({result.returncode}):\n"
                         f"{(result.stdout + result.stderr)[-4000:]}")
    return result


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], env=engine_env()).returncode == 0


def image_size(tag: str) -> int:
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", tag]).stdout.strip())


def build_base(mirror: str) -> None:
    """debootstrap a minbase bookworm and import it as BASE_IMAGE."""
    with tempfile.TemporaryDirectory(prefix="fabricscope-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=1200)
        (rootfs / "usr/sbin/policy-rc.d").write_text(POLICY_RC_D)
        (rootfs / "usr/sbin/policy-rc.d").chmod(0o755)
        (rootfs / "etc/apt/apt.conf.d/90fabricscope-image").write_text(APT_CONF)
        run(["chroot", str(rootfs), "apt-get", "clean"])
        for cache in (rootfs / "var/lib/apt/lists").glob("*_*"):
            cache.unlink()
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            run(["podman", "import", "--change", "CMD [\"/bin/bash\"]", "-", BASE_IMAGE],
                stdin=tar.stdout, timeout=600)
        finally:
            tar.stdout.close()
            tar.wait()


def build_image(containerfile: Path, tag: str, cache: bool = True) -> None:
    command = ["podman", "build", "--layers", "-f", str(containerfile), "-t", tag, "--build-arg", f"BASE={BASE_IMAGE}"]
    if not cache:
        command.append("--no-cache")
    if HOST_EXTRA_CAS.is_dir() and any(HOST_EXTRA_CAS.iterdir()):
        command += ["--volume", f"{HOST_EXTRA_CAS}:/usr/local/share/ca-certificates:ro"]
    run([*command, str(REPO)], timeout=3600)


def build_all(mirror: str = DEFAULT_MIRROR, rebuild_base: bool = False, only: list[str] | None = None,
              cache: bool = True) -> dict:
    """Build the base (unless present) and the images; what was built, how long it took."""
    # The host's 1-minute load average at the start: build times on a shared host say little
    # without it.
    record: dict = {"steps": {}, "sizes": {}, "tags": {}, "cold": rebuild_base and not cache,
                    "load_average": round(os.getloadavg()[0], 1)}
    start = time.monotonic()
    if rebuild_base or not image_exists(BASE_IMAGE):
        build_base(mirror)
        record["steps"]["base"] = round(time.monotonic() - start, 1)
    record["tags"]["base"] = BASE_IMAGE
    record["sizes"]["base"] = image_size(BASE_IMAGE)
    for name, (containerfile, tag) in images().items():
        if only and name not in only:
            continue
        began = time.monotonic()
        build_image(containerfile, tag, cache)
        record["steps"][name] = round(time.monotonic() - began, 1)
        record["tags"][name] = tag
        record["sizes"][name] = image_size(tag)
    # The build stage's image (compiler, headers, sources: ~1.2 GB) is nobody's product: no
    # tag names it, and every build with changed sources would leave another.
    run(["podman", "image", "prune", "-f", "--filter", f"label={BUILD_STAGE_LABEL}"], timeout=600)
    record["total_seconds"] = round(time.monotonic() - start, 1)
    return record


def docs_table(record: dict, command: str) -> str:
    host = f"{os.cpu_count()} CPU cores, {platform.machine()}, Linux {platform.release()}"
    how = ("every step cold: debootstrap from the mirror, every package and wheel downloaded, no cached layer"
           if record["cold"] else "with the base image and podman's layer cache as the host had them")
    rows = ["| image | tag | size (MB, uncompressed) | build time (s) |", "|---|---|---:|---:|"]
    for name in ("base", *images()):
        if name in record["sizes"]:
            seconds = record["steps"].get(name)
            rows.append(f"| {name} | `{record['tags'][name]}` | {record['sizes'][name] / 1e6:.0f} | "
                        f"{'reused' if seconds is None else f'{seconds:.0f}'} |")
    return "\n".join([f"Measured by `{command}` on {host} (1-minute load average {record['load_average']:g} at the "
                      f"start), {how}. Total: {record['total_seconds']:.0f} s.",
                      "", *rows])


def write_docs(path: Path, record: dict, command: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(DOCS_BEGIN) + ".*?" + re.escape(DOCS_END), re.S)
    if not pattern.search(text):
        raise BuildError(f"{path}: no {DOCS_BEGIN} ... {DOCS_END} section to rewrite")
    path.write_text(pattern.sub(lambda _: f"{DOCS_BEGIN}\n{docs_table(record, command)}\n{DOCS_END}", text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"Debian mirror for debootstrap ({DEFAULT_MIRROR})")
    parser.add_argument("--rebuild-base", action="store_true", help="debootstrap the base again even if present")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="build every image layer again (with --rebuild-base: a cold build, as the docs table wants)")
    parser.add_argument("--only", action="append", choices=list(images()), help="build only this image (repeatable)")
    parser.add_argument("--record", type=Path, help="also write the JSON record here")
    parser.add_argument("--docs", type=Path, help="rewrite the measured table in this Markdown file")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("build.py: needs root (debootstrap and podman build)", file=sys.stderr)
        return 2
    missing = missing_host_tools()
    if missing:
        print("build.py: missing on this host: " + "; ".join(missing)
              + " (deploy/install-system-deps.sh installs them)", file=sys.stderr)
        return 2
    try:
        record = build_all(args.mirror, args.rebuild_base, args.only, args.cache)
        if args.docs:
            write_docs(args.docs, record, "python3 deploy/image/build.py " + " ".join(argv or sys.argv[1:]))
    except (BuildError, subprocess.TimeoutExpired) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(record, indent=2)
    if args.record:
        args.record.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
