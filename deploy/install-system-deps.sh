#!/usr/bin/env bash
# Debian packages the tests and the demo stack need: real Prometheus, promtool,
# Alertmanager, amtool, node_exporter (benchmark baseline), jsonnet, the eBPF
# toolchain (clang, bpftool, libbpf), PostgreSQL, VictoriaMetrics with vmagent and vmalert
# (sidecar tests, the scale-out stack), headless Chromium (the rendered report's browser
# test), and the container tools the image and compose tests build and run with.
# Installs only what is missing; needs root for that.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have prometheus || need+=(prometheus)
have promtool || need+=(prometheus)
have prometheus-alertmanager || need+=(prometheus-alertmanager)
have amtool || need+=(prometheus-alertmanager)
have prometheus-node-exporter || need+=(prometheus-node-exporter)
have jsonnet || need+=(jsonnet)
have clang || need+=(clang llvm)
have bpftool || need+=(bpftool)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
dpkg -s libbpf1 >/dev/null 2>&1 || need+=(libbpf1)
# The sidecar's second storage backend and a second Prometheus-API backend for its tests.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
# The scale-out backend of `fabricscope stack --backend victoriametrics` (docs/scale.md):
# Debian's victoria-metrics ships the single-node server, vmagent and vmalert together.
have victoria-metrics || need+=(victoria-metrics)
have vmagent || need+=(victoria-metrics)
have vmalert || need+=(victoria-metrics)
have nft || need+=(nftables)
have ip || need+=(iproute2)
# The fake libnccl the uprobe tests trace, the ELF checks, test certificates.
have gcc || need+=(gcc)
have readelf || need+=(binutils)
have openssl || need+=(openssl)
have chromium || need+=(chromium)
# The OCI images (deploy/image/): a Debian base made with debootstrap, built and run with
# podman/buildah under runc (deploy/image/containers.conf); netavark and aardvark-dns give
# containers on a bridge names. (podman-compose comes from PyPI with the test extra:
# Debian's 1.0.3 cannot run network_mode: host services.)
have debootstrap || need+=(debootstrap)
have podman || need+=(podman)
have buildah || need+=(buildah)
have runc || need+=(runc)
[ -x /usr/lib/podman/netavark ] || need+=(netavark)
[ -x /usr/lib/podman/aardvark-dns ] || need+=(aardvark-dns)
# netavark's firewall driver execs iptables to set up every container network (build
# steps included); podman only suggests it, and without it a build fails with a bare
# "netavark: No such file or directory".
have iptables || need+=(iptables)

if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
    exit 1
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d keeps the packages' own services from starting: tests start their own
# instances on 127.0.0.1 with private ports and data directories.
# An existing policy-rc.d belongs to the machine's owner: leave it alone.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
