"""When a link-down is seen, through real Prometheus: fabric_nvlink_state == 0 (what
FabricNvlinkLinkDown read before) against the exporter's sightings (what it reads now),
and when the alert fires.

One demo node (2 GPUs) whose exporter samples link state every second; Prometheus scrapes
and evaluates the rendered rules every second (groups at 1s, `for:` as in production); the
demo's nvlink_down fault takes GPU 1 link 3 down after its precursor. Both conditions are
asked of Prometheus every 0.2 s; the table gives, from the moment the simulated link went
inactive, when each first answered and when ALERTS showed the alert pending and firing.
Figures, not assertions.

    .venv/bin/python bench/nvlink_down_detection.py
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fabricscope.demo import stack  # noqa: E402
from tests import procs  # noqa: E402

AT, PRECURSOR, DURATION = 30, 10, 120
FAULT = {"kind": "nvlink_down", "node": 0, "at": AT, "duration": DURATION, "target": {"gpu": 1, "link": 3},
         "params": {"precursor_seconds": PRECURSOR}}
SCENARIO = {"seed": 5, "cluster": {"name": "detect", "nodes": 1, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 0.5, "faults": [FAULT]}
OVERRIDES = {"intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")}}
EXPORTER = {"nvlink": {"sample_interval_seconds": 1, "link_sample_interval_seconds": 10}}
LINK = '{gpu="1", link="3"}'
QUERIES = {
    "fabric_nvlink_state == 0 (before)": f"fabric_nvlink_state{LINK} == 0",
    "sightings: inactive newer (now)": (f"fabric_nvlink_last_inactive_timestamp_seconds{LINK} unless "
                                        f"fabric_nvlink_last_active_timestamp_seconds{LINK} >= "
                                        f"fabric_nvlink_last_inactive_timestamp_seconds{LINK}"),
    "FabricNvlinkLinkDown pending": 'ALERTS{alertname="FabricNvlinkLinkDown", alertstate="pending"}',
    "FabricNvlinkLinkDown firing": 'ALERTS{alertname="FabricNvlinkLinkDown", alertstate="firing"}',
}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="nvlink-detect-") as tmp:
        work = Path(tmp)
        rules = stack.render_rules(OVERRIDES, work / "rules")
        with procs.demo_pipeline(SCENARIO, rules, work, "detect", EXPORTER) as pipeline:
            down_at = pipeline.t0 + AT + PRECURSOR       # the simulated link goes inactive
            first: dict[str, float] = {}
            deadline = down_at + 100
            while time.time() < deadline and len(first) < len(QUERIES):
                for name, query in QUERIES.items():
                    if name not in first and pipeline.prometheus.get("/api/v1/query", query=query)["data"]["result"]:
                        first[name] = time.time()
                time.sleep(0.2)
    print(f"link inactive at scenario second {AT + PRECURSOR}; exporter link-state sampling every 1 s, "
          "scrape and rule evaluation every 1 s, for: 1m")
    for name in QUERIES:
        seen = first.get(name)
        print(f"  {name:<40} {'never' if seen is None else f'+{seen - down_at:5.1f} s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
