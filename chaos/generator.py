"""A rail-optimized fat-tree cluster in the shape of the published reference designs
(DGX SuperPOD-style): scalable units (SU) of 32 hosts x 8 GPUs, 8 rails, one leaf per rail
per SU, spines per rail per pod (a group of SUs), a core layer joining the pods, and
dual-homed storage and management Ethernet networks.

    topology = generate_fat_tree(FatTreeSpec(hosts=128, job_hosts=32))

Per host (names follow what the exporter labels, so live metrics map onto them):
  <host>/gpu<g>        GPU g, PCIe to its rail's HCA <host>/mlx5_<g % rails>   (compute)
  <host>/mlx5_<r>      compute HCA on rail r, to leaf-su<s>-r<r>               (compute)
  <host>/mlx5_<rails>  storage NIC, two ports to storage-leaf-su<s>-a / -b      (storage)
  <host>/eth0          management NIC, two ports to mgmt-leaf-su<s>-a / -b     (mgmt)
  <host>/nvswitch<k>   in-host NVSwitches (nvl_domain_hosts = 1), every GPU to each (nvlink)
With nvl_domain_hosts = N > 1, N hosts share a rack-scale NVLink domain: its NVSwitch
trays (nvl-<d>-tray<k>) sit in the domain's rack and every GPU of the domain links to each.

Every rack has two PDUs (A and B feeds); every server, switch and tray in it takes both,
so losing one PDU darkens nothing and a power_failure (both feeds of the domain) darkens
the rack.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .model import Job, Rank, Topology

COMPUTE, STORAGE, MGMT, NVLINK = "compute", "storage", "mgmt", "nvlink"


@dataclass(frozen=True)
class FatTreeSpec:
    hosts: int = 32
    gpus_per_host: int = 8
    rails: int = 8
    hosts_per_su: int = 32
    hosts_per_rack: int = 4
    sus_per_pod: int = 16          # SUs whose rail leaves share one set of spines
    spines_per_rail: int = 2       # per pod
    cores: int = 4                 # joining every pod's spines
    nvswitches_per_host: int = 4
    nvl_domain_hosts: int = 1      # > 1: rack-scale NVLink domains of that many hosts
    nvswitch_trays: int = 9        # per rack-scale NVLink domain
    storage_spines: int = 2
    storage_servers: int = 2
    mgmt_spines: int = 2
    host_prefix: str = "gpu-node-"
    host_names: tuple[str, ...] = field(default=())   # overrides host_prefix + index
    job_hosts: int | None = None   # split hosts into jobs of this many hosts (all their GPUs)
    name: str = "fat-tree"

    def validate(self) -> None:
        for key in ("hosts", "gpus_per_host", "rails", "hosts_per_su", "hosts_per_rack", "sus_per_pod",
                    "spines_per_rail", "cores", "nvl_domain_hosts", "storage_spines", "mgmt_spines"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1, got {getattr(self, key)}")
        if self.host_names and len(self.host_names) != self.hosts:
            raise ValueError(f"host_names has {len(self.host_names)} names for {self.hosts} hosts")
        if self.nvl_domain_hosts > 1 and self.hosts_per_su % self.nvl_domain_hosts:
            raise ValueError(f"nvl_domain_hosts ({self.nvl_domain_hosts}) must divide hosts_per_su "
                             f"({self.hosts_per_su})")
        if self.job_hosts is not None and self.job_hosts < 1:
            raise ValueError(f"job_hosts must be at least 1, got {self.job_hosts}")

    def host_name(self, index: int) -> str:
        return self.host_names[index] if self.host_names else f"{self.host_prefix}{index}"


class _Builder:
    def __init__(self, spec: FatTreeSpec, topology: Topology) -> None:
        self.spec = spec
        self.t = topology

    def rack(self, rack: str) -> tuple[str, str]:
        """A rack's A and B PDUs (created on first use)."""
        feeds = (f"pdu-{rack}-a", f"pdu-{rack}-b")
        if feeds[0] not in self.t:
            for pdu in feeds:
                self.t.add_device(pdu, "pdu", rack=rack)
        return feeds

    def powered(self, name: str, kind: str, rack: str, **attrs) -> str:
        self.t.add_device(name, kind, rack=rack, **attrs)
        for pdu in self.rack(rack):
            self.t.add_power_feed(pdu, name)
        return name

    def mesh(self, lower: list[str], upper: list[str], kind: str, partition: str) -> None:
        for a in lower:
            for b in upper:
                self.t.add_link(a, b, kind, partition=partition)


def generate_fat_tree(spec: FatTreeSpec = FatTreeSpec()) -> Topology:
    spec.validate()
    t = Topology(spec.name)
    b = _Builder(spec, t)
    sus = -(-spec.hosts // spec.hosts_per_su)
    pods = -(-sus // spec.sus_per_pod)

    cores = [b.powered(f"core-{j}", "core_switch", "rack-core") for j in range(spec.cores)]
    storage_spines = [b.powered(f"storage-spine-{j}", "spine_switch", "rack-core") for j in range(spec.storage_spines)]
    mgmt_spines = [b.powered(f"mgmt-spine-{j}", "spine_switch", "rack-core") for j in range(spec.mgmt_spines)]
    for j in range(spec.storage_servers):
        server = b.powered(f"storage-{j}", "storage_server", "rack-storage")
        b.mesh([server], storage_spines, "ethernet", STORAGE)

    spines: dict[tuple[int, int], list[str]] = {}
    for p in range(pods):
        for r in range(spec.rails):
            spines[(p, r)] = [b.powered(f"spine-p{p}-r{r}-{j}", "spine_switch", f"rack-p{p}-spine")
                              for j in range(spec.spines_per_rail)]
            b.mesh(spines[(p, r)], cores, "infiniband", COMPUTE)

    hosts: list[str] = []
    for s in range(sus):
        net = f"rack-su{s}-net"
        leaves = [b.powered(f"leaf-su{s}-r{r}", "leaf_switch", net) for r in range(spec.rails)]
        for r, leaf in enumerate(leaves):
            b.mesh([leaf], spines[(s // spec.sus_per_pod, r)], "infiniband", COMPUTE)
        storage_leaves = [b.powered(f"storage-leaf-su{s}-{x}", "leaf_switch", net) for x in "ab"]
        mgmt_leaves = [b.powered(f"mgmt-leaf-su{s}-{x}", "leaf_switch", net) for x in "ab"]
        b.mesh(storage_leaves, storage_spines, "ethernet", STORAGE)
        b.mesh(mgmt_leaves, mgmt_spines, "ethernet", MGMT)
        first = s * spec.hosts_per_su
        domain_size = spec.nvl_domain_hosts
        per_rack = domain_size if domain_size > 1 else spec.hosts_per_rack
        trays: list[str] = []
        for i in range(first, min(first + spec.hosts_per_su, spec.hosts)):
            local = i - first
            rack = f"rack-su{s}-{local // per_rack}"
            if domain_size > 1 and local % domain_size == 0:
                d = i // domain_size
                trays = [b.powered(f"nvl-{d}-tray{k}", "nvswitch", rack) for k in range(spec.nvswitch_trays)]
            hosts.append(_host(b, spec, spec.host_name(i), rack, leaves, storage_leaves, mgmt_leaves, trays))

    if spec.job_hosts:
        for k, start in enumerate(range(0, len(hosts), spec.job_hosts)):
            t.add_job(node_major_job(f"job-{k}", hosts[start:start + spec.job_hosts], spec.gpus_per_host))
    return t


def _host(b: _Builder, spec: FatTreeSpec, host: str, rack: str, leaves: list[str], storage_leaves: list[str],
          mgmt_leaves: list[str], trays: list[str]) -> str:
    t = b.t
    b.powered(host, "gpu_server", rack)
    hcas = []
    for r in range(spec.rails):
        hca = f"{host}/mlx5_{r}"
        t.add_device(hca, "hca", host=host, rack=rack, ib_device=f"mlx5_{r}", rail=r)
        t.add_link(hca, leaves[r], "infiniband", partition=COMPUTE, a_port=1)
        hcas.append(hca)
    storage = f"{host}/mlx5_{spec.rails}"
    t.add_device(storage, "nic", host=host, rack=rack, ib_device=f"mlx5_{spec.rails}", netdev="eth1")
    t.add_link(host, storage, "pcie", partition=STORAGE)
    for port, leaf in enumerate(storage_leaves, start=1):
        t.add_link(storage, leaf, "ethernet", partition=STORAGE, a_port=port)
    mgmt = f"{host}/eth0"
    t.add_device(mgmt, "nic", host=host, rack=rack, netdev="eth0")
    t.add_link(host, mgmt, "pcie", partition=MGMT)
    for port, leaf in enumerate(mgmt_leaves, start=1):
        t.add_link(mgmt, leaf, "ethernet", partition=MGMT, a_port=port)
    if not trays:
        trays = []
        for k in range(spec.nvswitches_per_host):
            name = f"{host}/nvswitch{k}"
            t.add_device(name, "nvswitch", host=host, rack=rack, pci_bus_id=f"00000000:{0xC0 + k:02X}:00.0")
            trays.append(name)
    for g in range(spec.gpus_per_host):
        gpu = f"{host}/gpu{g}"
        t.add_device(gpu, "gpu", host=host, rack=rack, index=g)
        t.add_link(gpu, hcas[g % spec.rails], "pcie", partition=COMPUTE)
        for switch in trays:
            t.add_link(gpu, switch, "nvlink", partition=NVLINK)
    return host


def node_major_job(name: str, hosts: list[str], gpus_per_host: int, source: str = "inventory") -> Job:
    """A job with one rank per GPU over `hosts`, rank = host position * gpus + GPU index
    (the layout torchrun and the demo's NCCL job use)."""
    ranks = [Rank(rank=h * gpus_per_host + g, gpu=f"{host}/gpu{g}", host=host)
             for h, host in enumerate(hosts) for g in range(gpus_per_host)]
    return Job(name=name, ranks=ranks, source=source)
