"""The PCI layout of one simulated GPU node (an HGX H100-style board).

Each GPU sits behind a PCIe switch together with its paired compute HCA (GPU i with
mlx5_i), which is what makes GPUDirect RDMA fast and what the infiniband collector
looks for to call an HCA "compute". The storage NIC (a ConnectX in Ethernet mode, RoCE)
hangs directly off a root port on a NUMA node with no GPUs, and the management NIC is
an Intel E810 on another; neither shares a switch with a GPU.

Two sockets in NPS2 mode give four NUMA nodes: GPUs 0-3 on node 0, GPUs 4-7 on node 2,
the management NIC on node 1 and the storage NIC on node 3.

Bus numbers agree with the simulated NVML (demo/sources/nvml.py): GPU g at
0000:<0x18 + 0x10*g>:00.0 and its HCA one bus below, the four NVSwitches at c0-c3.
"""
from __future__ import annotations

from dataclasses import dataclass, field

VENDOR_MELLANOX, VENDOR_NVIDIA, VENDOR_INTEL, VENDOR_BROADCOM = "0x15b3", "0x10de", "0x8086", "0x1000"
CLASS_INFINIBAND, CLASS_ETHERNET, CLASS_3D, CLASS_BRIDGE = "0x020700", "0x020000", "0x030200", "0x060400"
DEVICE_CONNECTX7, DEVICE_H100_SXM, DEVICE_E810 = "0x1021", "0x2330", "0x1593"
DEVICE_ROOT_PORT, DEVICE_PEX_SWITCH, DEVICE_NVSWITCH = "0x352a", "0xc030", "0x22a3"
CLASS_OTHER_BRIDGE = "0x068000"
CORES_PER_NUMA = 28


@dataclass(frozen=True)
class PciFunction:
    bdf: str                   # 0000:18:00.0
    path: str                  # sysfs-relative: devices/pci0000:15/0000:15:01.0/.../0000:18:00.0
    vendor: str
    device: str
    pci_class: str
    numa_node: int
    driver: str
    link_speed: str = "32.0 GT/s PCIe"
    link_width: int = 16

    @property
    def local_cpulist(self) -> str:
        # Two hardware threads per core: siblings are offset by the total core count.
        first = self.numa_node * CORES_PER_NUMA
        total = 4 * CORES_PER_NUMA
        return f"{first}-{first + CORES_PER_NUMA - 1},{first + total}-{first + total + CORES_PER_NUMA - 1}"


@dataclass(frozen=True)
class NodeTopology:
    functions: tuple[PciFunction, ...]
    hca_bdfs: tuple[str, ...] = field(default=())      # mlx5_0 .. mlx5_<hcas-1>, then the storage NIC
    gpu_bdfs: tuple[str, ...] = field(default=())
    management_bdf: str = ""

    def function(self, bdf: str) -> PciFunction:
        return next(f for f in self.functions if f.bdf == bdf)


def _bdf(bus: int, device: int = 0, function: int = 0) -> str:
    return f"0000:{bus:02x}:{device:02x}.{function}"


def _behind_root_port(domain: int, port_device: int, bdf: str, vendor: str, device: str, pci_class: str,
                      numa_node: int, driver: str, **link) -> list[PciFunction]:
    """Root port <domain>:<port_device>.0 of host bridge pci0000:<domain> and one function
    directly behind it (no switch)."""
    port_bdf = _bdf(domain, port_device)
    port = f"devices/pci0000:{domain:02x}/{port_bdf}"
    return [PciFunction(port_bdf, port, VENDOR_INTEL, DEVICE_ROOT_PORT, CLASS_BRIDGE, numa_node, "pcieport"),
            PciFunction(bdf, f"{port}/{bdf}", vendor, device, pci_class, numa_node, driver, **link)]


def build_topology(gpus: int, hcas: int) -> NodeTopology:
    functions: list[PciFunction] = []
    hca_bdfs: list[str] = []
    gpu_bdfs: list[str] = []
    pairs = max(gpus, hcas)
    half = (pairs + 1) // 2
    for i in range(pairs):
        socket = 0 if i < half else 1
        root = 0x14 + 0x10 * i      # root port, switch up/down, then HCA (root+3), GPU (root+4)
        numa = 2 * socket
        domain = f"devices/pci0000:{root:02x}"
        root_port = f"{domain}/{_bdf(root, 1)}"
        upstream = f"{root_port}/{_bdf(root + 1)}"
        down_hca = f"{upstream}/{_bdf(root + 2, 0)}"
        down_gpu = f"{upstream}/{_bdf(root + 2, 1)}"
        functions += [
            PciFunction(_bdf(root, 1), root_port, VENDOR_INTEL, DEVICE_ROOT_PORT, CLASS_BRIDGE, numa, "pcieport"),
            PciFunction(_bdf(root + 1), upstream, VENDOR_BROADCOM, DEVICE_PEX_SWITCH, CLASS_BRIDGE, numa, "pcieport"),
            PciFunction(_bdf(root + 2, 0), down_hca, VENDOR_BROADCOM, DEVICE_PEX_SWITCH, CLASS_BRIDGE, numa, "pcieport"),
            PciFunction(_bdf(root + 2, 1), down_gpu, VENDOR_BROADCOM, DEVICE_PEX_SWITCH, CLASS_BRIDGE, numa, "pcieport"),
        ]
        if i < hcas:
            bdf = _bdf(root + 3)
            functions.append(PciFunction(bdf, f"{down_hca}/{bdf}", VENDOR_MELLANOX, DEVICE_CONNECTX7,
                                         CLASS_INFINIBAND, numa, "mlx5_core"))
            hca_bdfs.append(bdf)
        if i < gpus:
            bdf = _bdf(root + 4)
            functions.append(PciFunction(bdf, f"{down_gpu}/{bdf}", VENDOR_NVIDIA, DEVICE_H100_SXM,
                                         CLASS_3D, numa, "nvidia"))
            gpu_bdfs.append(bdf)
    # Storage NIC: straight off a root port on NUMA node 3, no switch, no GPU nearby.
    storage = _bdf(0xe1)
    functions += _behind_root_port(0xe0, 1, storage, VENDOR_MELLANOX, DEVICE_CONNECTX7, CLASS_ETHERNET, 3,
                                   "mlx5_core")
    hca_bdfs.append(storage)
    # Management NIC: NUMA node 1.
    management = _bdf(0xa1)
    functions += _behind_root_port(0xa0, 1, management, VENDOR_INTEL, DEVICE_E810, CLASS_ETHERNET, 1, "ice",
                                   link_speed="16.0 GT/s PCIe")
    # NVSwitches (what each GPU's NVLinks lead to), one root port each on NUMA node 2.
    for k in range(4):
        functions += _behind_root_port(0xbf, 1 + k, _bdf(0xc0 + k), VENDOR_NVIDIA, DEVICE_NVSWITCH,
                                       CLASS_OTHER_BRIDGE, 2, "nvidia-nvswitch", link_speed="16.0 GT/s PCIe",
                                       link_width=2)
    return NodeTopology(tuple(functions), tuple(hca_bdfs), tuple(gpu_bdfs), management)
