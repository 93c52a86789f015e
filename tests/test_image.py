"""The OCI images as a fleet runs them, built here from a debootstrap'ed Debian base with
deploy/image/build.py (no registry): one build per test session shared by every test here.

- The runtime image holds the installed package and no compiler or sources.
- The exporter runs in it with the DaemonSet's privileges and mounts (read from
  deploy/kubernetes/exporter.yaml, so the two cannot differ): a fake-libnccl rank in a
  second container, with its own mount namespace, has its collectives counted under its
  communicator's identity, and loopback TCP fills the RTT histogram.
- deploy/compose/compose.yaml runs under podman-compose (the test extra's), and a fault
  written to the kernel log pages through Alertmanager to the sidecar.
Needs root and podman; where they are missing or podman cannot run, the tests skip on a
workstation and fail under CI=true. The cold build takes about 6 minutes on 2 cores (the
table in docs/deploy.md, written by build.py): it is the product these tests exist to
check, so they run it. The kept base image and podman's layer cache make a later build
take seconds while the packaged sources are unchanged, about 4 minutes when they changed.
"""
from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from fabricscope.exporter.nccl.commid import comm_label
from fabricscope.demo.stack.binaries import free_port
from tests import procs
from tests.conftest import could_not_run, missing_tool, require_tool
from tests.installed import label_values, loopback_retransmits, loopback_traffic, samples, value
from tests.nccl_fake import identity
from tests.nccl_fake.build import build_fake_nccl
from tests.test_nccl_uprobe import Rank, salted_unique_id

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / "deploy" / "image"
ENGINE_ENV = {**os.environ, "CONTAINERS_CONF": str(IMAGE_DIR / "containers.conf")}
DAEMONSET = next(d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/exporter.yaml").read_text())
                 if d["kind"] == "DaemonSet")
COMPOSE_FILE = REPO / "deploy" / "compose" / "compose.yaml"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"      # the test extra's

def distinct_free_ports(names: list[str]) -> dict[str, int]:
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = free_port()
        if port not in ports.values():
            ports[names[len(ports)]] = port
    return ports


# The compose stack on free ports, through the compose file's own port variables: a
# deployment of it on this host's default ports is left alone, and the variables are tested.
COMPOSE_PORTS = distinct_free_ports(["FABRICSCOPE_PROMETHEUS_PORT", "FABRICSCOPE_ALERTMANAGER_PORT",
                                     "FABRICSCOPE_EXPORTER_PORT", "FABRICSCOPE_SIDECAR_PORT"])
# Each test names its containers with this prefix: a crashed run's leftovers are found
# and removed before the next one starts.
PREFIX = "fabricscope-test-"

pytestmark = pytest.mark.timeout(2400)   # the shared cold build runs inside the first test


def podman(*args: str, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], env=ENGINE_ENV, capture_output=True, text=True, timeout=timeout,
                            **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} failed: {(result.stdout + result.stderr)[-3000:]}")
    return result


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict:
    """deploy/image/build.py's record of the images it built (tags, sizes, seconds)."""
    if os.geteuid() != 0:
        could_not_run("needs root: debootstrap, podman build and privileged containers")
    for tool in ("podman", "buildah", "debootstrap", "runc"):
        require_tool(tool)
    if not PODMAN_COMPOSE.exists():
        missing_tool("podman-compose", "podman-compose (pip, the test extra)")
    record = tmp_path_factory.mktemp("image") / "build.json"
    try:
        built = subprocess.run([sys.executable, str(IMAGE_DIR / "build.py"), "--record", str(record)],
                               capture_output=True, text=True, timeout=2000)
    except subprocess.TimeoutExpired:
        could_not_run("deploy/image/build.py did not finish in 2000 s")
    if built.returncode != 0:
        could_not_run(f"the images could not be built: {built.stderr[-3000:]}")
    found = json.loads(record.read_text())
    for name, tag in found["tags"].items():
        probe = podman("run", "--rm", "--entrypoint", "/bin/true", tag, check=False)
        if probe.returncode != 0:
            could_not_run(f"podman cannot run {tag}: {probe.stderr[-2000:]}")
    return found


# Programs the tests and `make test`'s set-up exec that no require_tool/require_binary call
# names (those are found in the test sources below): the BPF build, the rules, the engines.
EXECUTED_BY_THE_SUITE = {"jsonnet", "clang", "bpftool", "vmagent", "vmalert", "prometheus-node-exporter",
                         "ip", "nft", "openssl", "gcc", "readelf", "debootstrap", "podman", "buildah", "runc",
                         "iptables", "unshare", "chromium", "promtool", "amtool"}


def binaries_the_suite_needs() -> set[str]:
    named = set()
    for source in (REPO / "tests").glob("*.py"):
        named |= set(re.findall(r'(?:require_tool|require_binary)\("([\w.+-]+)"', source.read_text()))
    return (named | EXECUTED_BY_THE_SUITE) - {"no-such-tool-anywhere"}


def test_system_deps_installer_provides_every_binary_from_a_bare_bookworm(images):
    """deploy/install-system-deps.sh, run as CI runs it but in the bare debootstrap'ed
    bookworm base, leaves every program the suite execs on PATH (PostgreSQL's initdb where
    the tests look for it), and a second run finds nothing left to install."""
    wanted = sorted(binaries_the_suite_needs())
    script = ("set -e; /deploy/install-system-deps.sh >/tmp/install.log 2>&1 || { tail -40 /tmp/install.log; exit 1; }; "
              "for b in " + " ".join(wanted) + "; do command -v $b >/dev/null || echo MISSING $b; done; "
              "ls /usr/lib/postgresql/*/bin/initdb >/dev/null || echo MISSING initdb; "
              "/deploy/install-system-deps.sh | sed 's/^/SECOND RUN: /'")
    done = podman("run", "--rm", "-v", f"{REPO / 'deploy'}:/deploy:ro", images["tags"]["base"], "bash", "-c", script,
                  timeout=1500, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "MISSING" not in done.stdout and "SECOND RUN" not in done.stdout, done.stdout[-4000:]


def remove_containers(*names: str) -> None:
    podman("rm", "-f", "--ignore", *names, timeout=60, check=False)


def test_runtime_image_holds_the_package_and_no_compiler_or_sources(images):
    script = ("for t in clang gcc cc make pip; do command -v $t; done; ls -d /src 2>/dev/null; "
              "find / -xdev \\( -name '*.bpf.c' -o -name 'vmlinux.h' \\) -print; "
              "ls /opt/fabricscope/lib/python3*/site-packages/fabricscope/exporter/bpf/")
    listing = podman("run", "--rm", "--entrypoint", "sh", images["tags"]["fabricscope"], "-c", script).stdout.split()
    objects = sorted(p.name.replace(".bpf.c", ".bpf.o") for p in (REPO / "exporter" / "bpf").glob("*.bpf.c"))
    declarations = sorted(p.name for p in (REPO / "exporter" / "bpf").glob("*.yaml"))
    assert sorted(listing) == sorted(objects + declarations), listing
    usage = podman("run", "--rm", images["tags"]["fabricscope"], "exporter", "--help").stdout
    assert "--path.procfs" in usage


def daemonset_run_flags(state_dir: Path) -> list[str]:
    """`podman run` flags giving the container the DaemonSet pod's privileges, namespaces
    and mounts; the state hostPath becomes `state_dir` (a test must not write the host's)."""
    pod = DAEMONSET["spec"]["template"]["spec"]
    [container] = pod["containers"]
    flags = []
    if container.get("securityContext", {}).get("privileged"):
        flags.append("--privileged")
    if pod.get("hostPID"):
        flags.append("--pid=host")
    if pod.get("hostNetwork"):
        flags.append("--network=host")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        host = host_paths[mount["name"]]
        if host == "/var/lib/fabricscope-exporter":
            host = str(state_dir)
        options = ["ro"] if mount.get("readOnly") else []
        if mount.get("mountPropagation") == "HostToContainer":
            options.append("rslave")
        flags += ["-v", f"{host}:{mount['mountPath']}" + (f":{','.join(options)}" if options else "")]
    return flags


def daemonset_args(node: str, listen: str) -> list[str]:
    """The DaemonSet's exporter arguments with the node name filled in as the pod's
    environment would, and the listen address a free one."""
    [container] = DAEMONSET["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(NODE_NAME)", node) for a in container["args"]]
    return [f"--web.listen-address={listen}" if a.startswith("--web.listen-address=") else a for a in args]


def test_exporter_in_the_image_counts_another_containers_nccl_calls_and_loopback_tcp(images, tmp_path):
    exporter_name, rank_name = PREFIX + "exporter", PREFIX + "nccl-rank"
    remove_containers(exporter_name, rank_name)
    port = free_port()
    (tmp_path / "state").mkdir()
    podman("run", "-d", "--name", exporter_name, *daemonset_run_flags(tmp_path / "state"),
           images["tags"]["fabricscope"], *daemonset_args("image-node", f"127.0.0.1:{port}"))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        def answering():
            state = podman("inspect", "--format", "{{.State.Status}}", exporter_name).stdout.strip()
            if state != "running":
                pytest.fail(f"the exporter container is {state}: {podman('logs', exporter_name).stderr[-3000:]}")
            try:
                return samples(url)
            except requests.ConnectionError:
                return None
        before = procs.wait_for(answering, 90, "the exporter in its container to answer")
        if value(before, "fabric_ebpf_available", node="image-node", reason="ok") != 1:
            could_not_run(f"no eBPF in the container ({label_values(before, 'fabric_ebpf_available', 'reason')}): "
                          f"{podman('logs', exporter_name).stderr[-3000:]}")

        # One rank of a two-rank communicator in a container of its own (own mount
        # namespace): the library is at a path the exporter's container does not have.
        library, driver = build_fake_nccl(tmp_path)
        salt, n, count = random.randrange(1, 256), 30, 500
        rank = subprocess.Popen(["podman", "run", "-i", "--rm", "--name", rank_name, "-e", f"FAKE_NCCL_ID_SALT={salt}",
                                 "-v", f"{tmp_path}:{tmp_path}:ro", images["tags"]["base"],
                                 str(driver), "2", "1", str(n), str(count), "3", "16"],
                                env=ENGINE_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert rank.stdout.readline().strip() == "ready"
            pid = int(podman("inspect", "--format", "{{.State.Pid}}", rank_name).stdout)
            assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            procs.wait_for(lambda: value(samples(url), "fabric_nccl_probe_attached", node="image-node",
                                         library=str(library)) == 1, 60, "uprobes on the rank container's libnccl")
            rank.stdin.write("go\n")
            rank.stdin.flush()
            assert rank.stdout.readline().strip() == "done"
            comm = comm_label(identity.comm_hash(salted_unique_id(salt)))
            found = procs.wait_for(
                lambda: (lambda f: f if value(f, "fabric_nccl_calls_total", node="image-node", comm=comm, rank="1",
                                              op="AllReduce") == n else None)(samples(url)),
                30, f"{n} AllReduce calls of comm {comm} rank 1")
            assert value(found, "fabric_nccl_comm_info", node="image-node", comm=comm, rank="1", nranks="2") == 1
            assert value(found, "fabric_nccl_bytes_total", node="image-node", comm=comm, rank="1",
                         op="AllReduce") == n * count * 4
            rank.stdin.write("exit\n")
            rank.stdin.flush()
            assert rank.wait(60) == 0
        finally:
            if rank.poll() is None:
                remove_containers(rank_name)
                rank.wait(60)

        assert_every_tcp_program_serves(url, "image-node")
    finally:
        remove_containers(exporter_name)


def assert_every_tcp_program_serves(url: str, node: str) -> None:
    """Every program the exporter declares is attached and "ok" says so; each of the three
    TCP programs fills its own series: RTT (tp_btf), connect latency
    (tracepoint sock/inet_sock_set_state) and retransmits (tracepoint tcp/tcp_retransmit_skb),
    the last two through tracefs where libbpf looks for it inside the container."""
    found = samples(url)
    attached = {dict(labels)["program"]: v for (name, labels), v in found.items()
                if name == "fabric_ebpf_program_attached"}
    assert attached and all(v == 1 for v in attached.values()), attached
    assert {"tcp_probe", "inet_sock_set_state", "tcp_retransmit_skb"} <= set(attached)
    assert value(found, "fabric_ebpf_available", node=node, reason="ok") == 1, \
        label_values(found, "fabric_ebpf_available", "reason")

    def counts(f):
        return (value(f, "fabric_tcp_rtt_seconds_count", node=node) or 0,
                value(f, "fabric_tcp_connect_latency_seconds_count", node=node) or 0)
    rtt, connects = counts(found)
    loopback_traffic()
    procs.wait_for(lambda: (lambda now: now[0] - rtt >= 20 and now[1] - connects >= 20)(counts(samples(url))), 30,
                   "20 loopback RTT samples and 20 connect latencies")

    def retransmits() -> float:
        return sum(v for (name, _labels), v in samples(url).items() if name == "fabric_tcp_retransmits_total")
    before = retransmits()
    assert loopback_retransmits(lambda: retransmits() > before), "no retransmit counted"


# podman's default grace period: past it the exporter is SIGKILLed (exit code 137).
GRACE_SECONDS = 10
# What the exporter may take of it. Measured at 7c50783 on a loaded 2-core VM: 0.2 s
# starting, 0.5 s serving, 0.5 s tracing a libnccl (uprobe_multi links; 4.7 s with
# perf-event uprobes, and SIGKILL before any release was done in parallel).
STOP_SECONDS = 3


def test_exporter_container_stops_within_three_seconds_of_sigterm(images, tmp_path):
    """`podman stop` sends SIGTERM to PID 1 (the exporter) and kills it after the grace
    period. The exporter must end by itself well inside it: while still starting, serving,
    and serving with uprobes on a live rank's libnccl (the kernel releases uprobes behind
    grace periods of its own). The seconds each case took are printed."""
    name = PREFIX + "stop"
    (tmp_path / "state").mkdir()
    library, driver = build_fake_nccl(tmp_path)
    rank = None
    took: dict[str, float] = {}
    try:
        for case in ("starting", "serving", "serving, tracing libnccl"):
            if case == "serving, tracing libnccl":
                rank = Rank(driver, 2, 1, 1, 16, 1, 16)      # waits for "go": a process mapping libnccl
            remove_containers(name)
            port = free_port()
            url = f"http://127.0.0.1:{port}/metrics"
            podman("run", "-d", "--name", name, *daemonset_run_flags(tmp_path / "state"),
                   images["tags"]["fabricscope"], *daemonset_args("stop-node", f"127.0.0.1:{port}"))
            try:
                if case == "serving":
                    procs.wait_for(lambda: _answers(url), 90, "the exporter to answer")
                elif rank is not None:
                    procs.wait_for(lambda: _answers(url) and value(samples(url), "fabric_nccl_probe_attached",
                                                                   node="stop-node", library=str(library)) == 1,
                                   90, "the exporter to answer with uprobes on the rank's libnccl")
                began = time.monotonic()
                stopped = podman("stop", "--time", str(GRACE_SECONDS), name, timeout=60, check=False)
                took[case] = round(time.monotonic() - began, 1)
                state = podman("inspect", "--format", "{{.State.ExitCode}} {{.State.Status}}", name).stdout.split()
                assert stopped.returncode == 0 and "SIGKILL" not in stopped.stderr, stopped.stderr[-2000:]
                assert state[1] == "exited" and state[0] != "137", (state, podman("logs", name).stderr[-2000:])
                assert took[case] <= STOP_SECONDS, (case, took)
            finally:
                remove_containers(name)
    finally:
        print(f"podman stop took (s): {took}")
        if rank is not None:
            rank.proc.kill()
            rank.proc.wait(30)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def compose(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**ENGINE_ENV, **{name: str(port) for name, port in COMPOSE_PORTS.items()}}
    return subprocess.run([str(PODMAN_COMPOSE), "-p", COMPOSE_PROJECT, "-f", str(COMPOSE_FILE), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


# Its own project name: the volumes a real deployment of this compose file keeps on this
# host are never touched, and `down -v` removes only this test's.
COMPOSE_PROJECT = "fabricscope-test"


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_compose_stack_pages_a_fault_written_to_the_kernel_log(images):
    """podman-compose up: the exporter reads the host's /dev/kmsg; a mlx5 firmware command
    timeout written there fires FabricKernelLogFatal, Alertmanager routes it to the pager
    receiver and delivers the copy to the sidecar's webhook (TLS, API key)."""
    taken = [f"{name}={port}" for name, port in COMPOSE_PORTS.items() if port_in_use(port)]
    if taken:
        could_not_run(f"the compose stack's host ports are taken: {', '.join(taken)}")
    compose("down", "-v", timeout=300)
    try:
        up = compose("up", "-d")
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
        prometheus = f"http://127.0.0.1:{COMPOSE_PORTS['FABRICSCOPE_PROMETHEUS_PORT']}"

        def scraped():
            try:
                targets = requests.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            except (requests.ConnectionError, ValueError):
                return None
            return {t["labels"]["job"] for t in targets if t["health"] == "up"} >= {"fabricscope", "fabricscope-sidecar"}
        procs.wait_for(scraped, 180, f"Prometheus to scrape the exporter and the sidecar "
                                     f"({compose('logs', timeout=60).stdout[-2000:]})")
        assert_every_tcp_program_serves(f"http://127.0.0.1:{COMPOSE_PORTS['FABRICSCOPE_EXPORTER_PORT']}/metrics",
                                        "compose-host")

        marker = f"fabricscope-compose-test-{random.randrange(1 << 30):x}"
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<3>mlx5_core 0000:3b:00.0: cmd_work_handler:964:(pid 1): {marker} command timeout\n")
        alertmanager = f"http://127.0.0.1:{COMPOSE_PORTS['FABRICSCOPE_ALERTMANAGER_PORT']}"

        def paged():
            alerts = requests.get(f"{alertmanager}/api/v2/alerts", timeout=5,
                                  params={"filter": 'alertname="FabricKernelLogFatal"'}).json()
            return next((a for a in alerts if a["labels"].get("node") == "compose-host"), None)
        alert = procs.wait_for(paged, 120, "FabricKernelLogFatal at Alertmanager")
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["pattern"] == "command_timeout"
        assert {r["name"] for r in alert["receivers"]} == {"fabricscope-sidecar", "pager"}

        secrets = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                              f"{COMPOSE_PROJECT}_fabricscope-secrets").stdout.strip())
        token = (secrets / "sidecar-token").read_text().strip()

        def delivered():
            rows = requests.get(f"https://127.0.0.1:{COMPOSE_PORTS['FABRICSCOPE_SIDECAR_PORT']}/alerts", params={"since_ms": 0}, timeout=5,
                                verify=str(secrets / "ca.pem"), headers={"Authorization": f"Bearer {token}"}).json()
            # The sidecar also reconciles with Alertmanager's API, which can list the alert
            # (receive_count 0, no receiver) before group_wait lets the webhook deliver it.
            return next((r for r in rows["alerts"] if r["labels"].get("alertname") == "FabricKernelLogFatal"
                         and r["labels"].get("node") == "compose-host" and r["receive_count"] >= 1), None)
        row = procs.wait_for(delivered, 120, "the notification at the sidecar's webhook")
        assert row["status"] == "firing" and row["receiver"] == "fabricscope-sidecar"
    finally:
        down = compose("down", "-v", timeout=300)
        assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
