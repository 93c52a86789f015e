"""The alert lifecycle end to end (docs/alertmanager.md, Lifecycles): the whole stack that
`make run` starts (demo cluster, Prometheus with the fast rules, Alertmanager with the
repository's routing, the sidecar) runs every kind of scripted fault on a clock 5 times
faster (`fabricscope stack --time-scale 5`: the timeline, rule windows, for: and
Alertmanager's timings all compressed; thresholds not), and for each fault:

- its first notification comes within the documented bound of its start;
- its alerts resolve within the documented bound of its end, in Alertmanager (so also
  those that resolve while inhibited and are never notified resolved);
- nothing is notified or held that no fault explains (the healthy minutes stay quiet);
- each incident (Alertmanager group at the pager) pages exactly one alert, and every
  fault with a fatal side pages;
- at the end the sidecar's firing alerts are exactly Alertmanager's.

The scenario is tests/fixtures/timeline-scenario.yaml: 21 scenario minutes, about 4.2
minutes of wall time plus start-up (about 5 minutes in all on a 2-core machine, most of
it waiting on the clock): a resolve bound of 5 minutes cannot be seen in less. The first
5 scenario minutes are warm-up, left out of "nothing unexplained": the rules' 5-minute
windows are still filling (the NCCL clock-offset estimate from a few scrapes has read a
slow first answer as a node's skew, FabricNcclStragglerNode); the 3 minutes after, before
the faults, are checked.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fabricscope.demo.stack import timeline
from tests import procs

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).parent / "fixtures" / "timeline-scenario.yaml"
TIME_SCALE = 5
DURATION = 21 * 60            # scenario seconds: the last fault ends at 14m, + the resolve bound
WARM_UP = 5 * 60              # scenario seconds in which the rules' 5-minute windows fill
# Faults whose alerts include a critical one: each must page (once per incident).
PAGING = {"mlx5_fatal", "link_flap", "link_down", "nvlink_down", "nccl_hang"}


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    for binary in ("prometheus", "prometheus-alertmanager", "promtool"):
        procs.require_binary(binary)
    rec = timeline.record(SCENARIO, DURATION, tmp_path_factory.mktemp("timeline"), time_scale=TIME_SCALE)
    result = timeline.analyse(rec)
    print("\n" + "\n".join(describe(o) for o in result.faults))
    return rec, result


def describe(outcome) -> str:
    f = outcome.fault
    first = f"first {outcome.first[1]} at +{outcome.first[0] - f.start:.0f}s" if outcome.first else "never notified"
    resolved = (f"resolved +{outcome.resolved_at - outcome.end:.0f}s after its end" if outcome.resolved_at is not None
                else "nothing resolved")
    if outcome.held_within_bound:
        resolved += f"; held within its bound {sorted(outcome.held_within_bound)}"
    return f"{f.kind:<20} {f.start:>5.0f}-{outcome.end:<5.0f} {first}; {resolved}; still held {outcome.still_held}; " \
           f"pages {outcome.pages}"


def outcomes(analysis):
    return {o.fault.kind: o for o in analysis[1].faults}


@pytest.mark.parametrize("kind", ["mlx5_fatal", "symbol_error_storm", "link_flap", "link_down", "microburst",
                                  "nvlink_down", "straggler_rank", "nccl_hang"])
def test_each_fault_notifies_within_the_bound_and_resolves_within_the_bound(analysis, kind):
    outcome = outcomes(analysis)[kind]
    fault = outcome.fault
    assert outcome.first is not None, f"{kind} never notified: {describe(outcome)}"
    assert outcome.first[0] - fault.start <= timeline.FIRST_NOTIFICATION_BOUND, describe(outcome)
    assert outcome.still_held == [], f"{kind}: alerts still held at the end: {describe(outcome)}"
    assert outcome.resolved or outcome.held_within_bound, describe(outcome)
    for name, t in outcome.resolved.items():
        assert t - outcome.end <= timeline.resolve_bound(name), f"{name}: {describe(outcome)}"


@pytest.mark.parametrize("receiver", [timeline.PAGER, timeline.TICKET])
def test_resolutions_reach_each_receiver_within_its_bound(analysis, receiver):
    """The 5-minute resolve bound, plus the receiver's group_interval (Alertmanager sends
    a group's resolution at its next flush)."""
    bound = timeline.notified_resolve_bound(receiver)
    notified = {o.fault.kind: o.resolution_notified[receiver] - o.end
                for o in analysis[1].faults if receiver in o.resolution_notified}
    assert notified, f"no resolution reached {receiver}"
    assert {kind: late for kind, late in notified.items() if late > bound} == {}, (bound, notified)


def test_nothing_no_fault_explains_is_notified_or_held(analysis):
    _, result = analysis
    unexplained = [(t, name, labels) for t, name, labels in result.unexplained if t >= WARM_UP]
    assert unexplained == [], [f"{t:.0f}s {name} " + " ".join(f"{k}={v}" for k, v in sorted(labels.items())
                                                               if k not in ("alertname", "cluster"))
                                      for t, name, labels in unexplained]


def test_one_page_per_incident(analysis):
    for kind, outcome in outcomes(analysis).items():
        for group, paged in outcome.pages.items():
            assert len(paged) == 1, f"{kind}: incident {group} paged {paged}"
        if kind in PAGING:
            assert outcome.pages, f"{kind} never paged: {describe(outcome)}"


def test_the_sidecar_ends_with_alertmanagers_state(analysis):
    rec, _ = analysis
    assert rec.sidecar_firing == rec.alertmanager_firing
