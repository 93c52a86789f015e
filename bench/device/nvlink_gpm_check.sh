#!/bin/sh
# One command on a 4-GPU host (root, PyTorch, nvidia-ml-py): bench/device/README.md.
cd "$(dirname "$0")/../.." && exec env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    python3 bench/device/nvlink_gpm_check.py "$@"
