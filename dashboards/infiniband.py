"""InfiniBand fabric: port states over time, error-counter rates, the IBTA bit-error-rate
line (symbol errors per hour), traffic against link rate, flaps, and the exporter's
threshold verdicts (breached counters, fatal ports)."""
from __future__ import annotations

from grafanalib import core as g

from . import common as c
from .mixin_config import mixin_config, thresholds

TITLE = "fabricscope / InfiniBand fabric"
UID = c.uid_for(__file__)

SEL = c.matchers("cluster", "job", "node", "device")
PORT = "node, device, port"
PORT_LEGEND = "{{node}} {{device}}:{{port}}"

# fabric_infiniband_port_state is the kernel's state code (the `state` label names it).
PORT_STATES = [(1, "DOWN", "red"), (2, "INIT", "orange"), (3, "ARMED", "yellow"), (4, "ACTIVE", "green"),
               (5, "ACTIVE_DEFER", "blue")]
PHYS_STATES = [(1, "Sleep", "purple"), (2, "Polling", "orange"), (3, "Disabled", "red"),
               (4, "PortConfigurationTraining", "yellow"), (5, "LinkUp", "green"),
               (6, "LinkErrorRecovery", "orange"), (7, "PhyTest", "blue")]
ERROR_COUNTERS = ("symbol_error|port_rcv_errors|link_error_recovery|local_link_integrity_errors|"
                  "excessive_buffer_overrun_errors|port_rcv_remote_physical_errors|port_xmit_discards")
ROCE_COUNTERS = "np_cnp_sent|rp_cnp_handled|np_ecn_marked_roce_packets|out_of_buffer|out_of_sequence"


def device_variable() -> g.Template:
    return c.label_variable("device", "fabric_infiniband_port_info", ["cluster", "job", "node"])


def dashboard() -> g.Dashboard:
    limits = thresholds()
    windows = mixin_config()["windows"]
    ber_limit = limits["ibSymbolErrorsPerHour"]
    flap_window, flaps = windows["ibFlap"], limits["ibFlapDownTransitions"]
    panels = [
        c.row("Port state"),
        c.stat("Fatal ports", [c.prom(f"sum(fabric_infiniband_port_fatal{{{SEL}}}) or vector(0)", instant=True)],
               "none", "Ports the exporter calls fatal: state DOWN, physical state Disabled or a fatal counter breach.",
               thresholds=[(None, "green"), (1, "red")], size=c.Size(6, 4)),
        c.stat("Counters over threshold", [c.prom(
            f"sum(fabric_infiniband_port_counter_breached{{{SEL}}}) or vector(0)", instant=True)], "none",
            "Counters over their fatal or non-fatal threshold (latched by the exporter until recovery).",
            thresholds=[(None, "green"), (1, "orange")], size=c.Size(6, 4)),
        c.stat(f"Link-down transitions ({flap_window})", [c.prom(
            f"round(sum(increase(fabric_infiniband_port_down_transitions_total{{{SEL}}}[{flap_window}]))) or vector(0)",
            instant=True)], "none", f"ACTIVE → not ACTIVE transitions seen in the last {flap_window}.",
            thresholds=[(None, "green"), (1, "orange"), (flaps, "red")], size=c.Size(6, 4)),
        c.stat("Missing devices", [c.prom(f"sum(fabric_infiniband_device_missing{{{SEL}}}) or vector(0)",
                                          instant=True)], "none",
               "HCAs that were present and vanished (fatal).", thresholds=[(None, "green"), (1, "red")],
               size=c.Size(6, 4)),
        c.timeline("Port state", [c.prom(f"max by ({PORT}) (fabric_infiniband_port_state{{{SEL}}})",
                                         legend=PORT_LEGEND)],
                   "Logical port state over time (DOWN, INIT, ARMED, ACTIVE).", PORT_STATES, size=c.Size(12, 10)),
        c.timeline("Physical port state", [c.prom(
            f"max by ({PORT}) (fabric_infiniband_port_phys_state{{{SEL}}})", legend=PORT_LEGEND)],
            "Physical state over time (Polling while a cable is out, Disabled when shut).", PHYS_STATES,
            size=c.Size(12, 10)),
        c.row("Errors"),
        c.timeseries("Error counter rates", [c.prom(
            f"""sum by ({PORT}, counter) (rate(fabric_infiniband_port_counter_total{{{SEL}, counter=~"{ERROR_COUNTERS}"}}[{c.RATE}])) > 0""",
            legend=PORT_LEGEND + " {{counter}}")], "eps",
            "Link error counters per second, ports with errors only."),
        c.timeseries(f"Symbol errors per hour (BER line at {ber_limit:g})", [
            c.prom(f"""increase(fabric_infiniband_port_counter_total{{{SEL}, counter="symbol_error"}}[1h]) > 0""",
                   legend=PORT_LEGEND + " in the last hour"),
            c.prom(f"""rate(fabric_infiniband_port_counter_total{{{SEL}, counter="symbol_error"}}[{c.RATE}]) * 3600 > 0""",
                   legend=PORT_LEGEND + " now (recent rate, per hour)")], "short",
            f"Symbol errors in the trailing hour (what FabricInfinibandPreFailureBER judges against {ber_limit:g}, "
            "the IBTA 10^-12 bit-error-rate boundary: the alert stays raised for the hour it counts), and the "
            "recent rate as errors per hour: whether they are still arriving. Log scale: the "
            "line stays visible under a storm of thousands.",
            thresholds=[(None, "green"), (ber_limit, "red")], log_scale=True),
        c.timeseries(f"Flaps: link-down events in {flap_window}", [
            c.prom(f"increase(fabric_infiniband_port_down_transitions_total{{{SEL}}}[{flap_window}]) > 0",
                   legend=PORT_LEGEND + " down transitions"),
            c.prom(f"""increase(fabric_infiniband_port_counter_total{{{SEL}, counter="link_downed"}}[{flap_window}]) > 0""",
                   legend=PORT_LEGEND + " link_downed")], "short",
            f"Times each port went down in the trailing {flap_window}; {flaps} or more is a flap (FabricInfinibandLinkFlap).",
            thresholds=[(None, "green"), (flaps, "red")]),
        c.timeseries("Health events", [c.prom(
            f"""sum by ({PORT}, severity) (increase(fabric_infiniband_port_health_events_total{{{SEL}, severity!="baseline"}}[{c.RATE}])) > 0""",
            legend=PORT_LEGEND + " {{severity}}")], "short",
            "Fatal, non-fatal and recovery events raised by the exporter's port state machine.", bars=True),
        c.table("Breached counters", [c.prom(f"fabric_infiniband_port_counter_breached{{{SEL}}} == 1",
                                             instant=True, table=True)], "none",
                "Counters currently over a threshold, with the threshold's severity.",
                hidden=("Time", "__name__", "job", "instance", "Value"), size=c.Size(24, 6)),
        c.row("Traffic"),
        c.timeseries("Port traffic", [
            c.prom(f"sum by ({PORT}) (rate(fabric_infiniband_port_receive_bytes_total{{{SEL}}}[{c.RATE}]))",
                   legend=PORT_LEGEND + " rx"),
            c.prom(f"sum by ({PORT}) (rate(fabric_infiniband_port_transmit_bytes_total{{{SEL}}}[{c.RATE}]))",
                   legend=PORT_LEGEND + " tx")], "Bps",
            "Bytes per second each way (port_rcv_data / port_xmit_data × 4)."),
        c.timeseries("Utilisation of link rate", [c.prom(
            f"""max by ({PORT}) (
                  label_replace(rate(fabric_infiniband_port_receive_bytes_total{{{SEL}}}[{c.RATE}]), "direction", "rx", "", "")
                  or label_replace(rate(fabric_infiniband_port_transmit_bytes_total{{{SEL}}}[{c.RATE}]), "direction", "tx", "", ""))
                / on ({PORT}) group_left max by ({PORT}) (fabric_infiniband_port_rate_bytes_per_second{{{SEL}}} > 0)""",
            legend=PORT_LEGEND)], "percentunit",
            "The busier direction of each port against its negotiated link rate."),
        c.timeseries("RoCE congestion and drops", [c.prom(
            f"""sum by ({PORT}, counter) (rate(fabric_infiniband_port_hw_counter_total{{{SEL}, counter=~"{ROCE_COUNTERS}"}}[{c.RATE}]))""",
            legend=PORT_LEGEND + " {{counter}}")], "eps",
            "RoCE ECN marks, congestion notifications (CNP) and out-of-buffer / out-of-sequence drops per second."),
        c.timeseries("Link rate", [c.prom(f"max by ({PORT}) (fabric_infiniband_port_rate_bytes_per_second{{{SEL}}})",
                                          legend=PORT_LEGEND)], "Bps",
                     "Negotiated link rate: a drop means the link trained down (fewer lanes or lower speed)."),
    ]
    return c.dashboard(__file__, TITLE, "InfiniBand/RoCE port state, errors, BER, traffic and flaps.",
                       c.fleet_variables(c.node_variable(), device_variable()), panels,
                       annotation_scope=("cluster", "node", "device"))
