"""Does the exporter's GPM-counted NVLink traffic agree with the driver's own counters?

On a GPU host, while a 4-rank NCCL all-reduce loop moves data over NVLink, the exporter
(nvlink collector only, link tier every --link-interval seconds, default 10) is scraped
twice, four link rounds apart. Over the same two moments this script reads the driver's per-link
throughput counters itself (field values NVLINK_THROUGHPUT_DATA_TX/RX, the path a GPU
without GPM takes). It prints, per link of GPU 0, the rate each way and their ratio, and
the exporter's fabric_nvlink_throughput_method.

    bench/device/nvlink_gpm_check.sh        # as root on a 4-GPU host; $OUT/nvlink_gpm_check.txt when OUT is set
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from gpu_cost import WORLD, Exporter, say  # noqa: E402
from nccl_straggler import free_port, import_exporter, label, pick  # noqa: E402


def allreduce_rank(rank: int, port: int, stop) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    tensor = torch.ones(16 << 20, device="cuda")          # 64 MB
    while not stop.is_set():
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        time.sleep(0.01)
    dist.destroy_process_group()


def driver_counters(backend, gpu, links) -> tuple[float, dict[int, tuple[int, int]]]:
    from fabricscope.exporter.nvml.backend import FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_THROUGHPUT_DATA_TX

    fields = [(f, link) for link in links for f in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)]
    values = backend.field_values(gpu, fields)
    at = time.monotonic()
    return at, {link: (values[2 * i] * 1024, values[2 * i + 1] * 1024) for i, link in enumerate(links)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-interval", type=float, default=10.0, help="the exporter's link tier (seconds)")
    link_interval = parser.parse_args().link_interval
    import_exporter()
    from fabricscope.exporter.nvml import open_backend

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    port = free_port()
    ranks = [ctx.Process(target=allreduce_rank, args=(rank, port, stop)) for rank in range(WORLD)]
    backend = open_backend()
    gpu = backend.gpus()[0]
    links = tuple(sorted(backend.link_states(gpu)))
    with tempfile.TemporaryDirectory(prefix="fabricscope-gpm-") as tmp:
        config = Path(tmp, "exporter.yml")
        # series: full: per-link bytes by direction and the per-GPU figures this check reads.
        config.write_text(f"nvlink:\n  sample_interval_seconds: 5\n  link_sample_interval_seconds: {link_interval}\n"
                          "  series: full\n")
        exporter = Exporter("nvlink only", ["nvlink"], Path(tmp), config)
        try:
            exporter.wait_ready()
            for rank in ranks:
                rank.start()
            time.sleep(30)                                   # NCCL up, traffic flowing, a few link rounds
            if not all(rank.is_alive() for rank in ranks):
                raise SystemExit("the all-reduce job did not start (see the ranks' output above)")
            first, first_scraped = exporter.scrape(), time.monotonic()
            first_at, first_driver = driver_counters(backend, gpu, links)
            time.sleep(4 * link_interval)
            second, second_scraped = exporter.scrape(), time.monotonic()
            second_at, second_driver = driver_counters(backend, gpu, links)
        finally:
            stop.set()
            for rank in ranks:
                rank.join(timeout=20)
                if rank.is_alive():
                    rank.kill()
            exporter.stop()
    method = {label(k, "method"): v for k, v in pick(second, "fabric_nvlink_throughput_method", gpu="0").items()}
    say(f"GPU 0 ({gpu.name}), {len(links)} links; exporter throughput method: {method}")
    # The exporter's values are its link rounds': its rates are over the time between the two
    # rounds the scrapes served (scrape time minus the link tier's age), the driver's over its reads.
    def round_time(samples, scraped):
        return scraped - sum(pick(samples, "fabric_nvlink_sample_age_seconds", gpu="0", tier="link").values())

    exporter_span = round_time(second, second_scraped) - round_time(first, first_scraped)
    span = second_at - first_at
    ratios = []
    say(f"{'link':>4} {'exporter TX MB/s':>17} {'driver TX MB/s':>15} {'ratio':>6} {'exporter RX MB/s':>17} "
        f"{'driver RX MB/s':>15} {'ratio':>6}")
    for link in links:
        labels = {"gpu": "0", "link": str(link)}
        row = []
        for name, index in (("fabric_nvlink_transmit_bytes_total", 0), ("fabric_nvlink_receive_bytes_total", 1)):
            exported = sum(pick(second, name, **labels).values()) - sum(pick(first, name, **labels).values())
            driver = second_driver[link][index] - first_driver[link][index]
            row += [exported / exporter_span / 1e6, driver / span / 1e6]
            if driver:
                ratios.append(row[-2] / row[-1])
        say(f"{link:>4} {row[0]:17.1f} {row[1]:15.1f} {row[0] / row[1] if row[1] else float('nan'):6.3f} "
            f"{row[2]:17.1f} {row[3]:15.1f} {row[2] / row[3] if row[3] else float('nan'):6.3f}")
    if ratios:
        say(f"exporter rate / driver rate ({exporter_span:.0f} s between the exporter's link rounds, {span:.0f} s "
            f"between the driver reads), all links and directions: min {min(ratios):.3f}, max {max(ratios):.3f}")
    backend.close()
    out = os.environ.get("OUT")
    if out:
        from gpu_cost import lines
        Path(out, "nvlink_gpm_check.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
