"""What the NVLink collector did inside every scrape before NVML moved off the scrape path
(issue 14): per GPU, link states, one throughput batch, and one
nvmlDeviceGetNvLinkErrorCounter call per link and error type. The benches time it as the
"before" figure (bench/scrape_latency.py --gpu, bench/device/gpu_cost.py)."""
from __future__ import annotations


def read_as_the_old_collector(backend, gpus) -> None:
    from fabricscope.exporter.nvml.backend import (ERROR_TYPES, FI_NVLINK_THROUGHPUT_DATA_RX,
                                                   FI_NVLINK_THROUGHPUT_DATA_TX)

    for gpu in gpus:
        links = sorted(backend.link_states(gpu))
        backend.field_values(gpu, [(FI_NVLINK_THROUGHPUT_DATA_TX, link) for link in links]
                             + [(FI_NVLINK_THROUGHPUT_DATA_RX, link) for link in links])
        for link in links:
            for kind in ERROR_TYPES:
                backend.error_counter(gpu, link, kind)
