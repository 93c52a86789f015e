#!/bin/sh
# One command on a GPU host (root, nvidia-ml-py): bench/device/README.md.
cd "$(dirname "$0")/../.." && exec python3 bench/device/nvml_memory.py "$@"
