"""Chaos / blast radius: what fails with a device. The sidecar's chaos API, read through
the Infinity datasource: the topology simulations run on, the devices to choose from, one
simulation of $device ($failure_type) submitted on load, and, once its simulation_id is
picked (a click on the submitted row), the result: impact score, affected counts and the
breadth-first path of the failure.

Opening this dashboard submits one simulation (POST, rate-limited per key by the
sidecar), so it does not auto-refresh."""
from __future__ import annotations

from grafanalib import core as g

from . import common as c

TITLE = "fabricscope / Chaos & blast radius"
UID = c.uid_for(__file__)

FAILURE_TYPES = ("device_failure", "power_failure", "rack_failure", "switch_failure")
RESULT_URL = "/graph/chaos-results/${simulation_id}"

TOPOLOGY = c.InfinityTarget(url="/graph/chaos-topology", root_selector="summary",
                            columns=[("name", "Topology", "string"), ("version", "Version", "string"),
                                     ("devices", "Devices", "number"), ("links", "Links", "number"),
                                     ("racks", "Racks", "number"), ("active_jobs", "Active jobs", "number")])
DEVICES = c.InfinityTarget(url="/graph/chaos-devices", root_selector="devices", params=[("limit", "5000")],
                           columns=[("name", "Device", "string"), ("kind", "Kind", "string"),
                                    ("rack", "Rack", "string")])
SUBMIT = c.InfinityTarget(url="/graph/chaos-simulate", method="POST",
                          body='{"device": "${device}", "failure_type": "${failure_type}", "include_jobs": true}',
                          columns=[("simulation_id", "Simulation", "string"), ("status", "Status", "string")])
IMPACT = c.InfinityTarget(url=RESULT_URL, columns=[
    ("impact_score", "Impact score", "number"), ("affected_device_count", "Affected devices", "number"),
    ("total_devices", "Devices", "number"), ("affected_job_count", "Affected jobs", "number"),
    ("total_active_jobs", "Active jobs", "number"), ("status", "Status", "string")])
PATH = c.InfinityTarget(url=RESULT_URL, root_selector="path",
                        columns=[("device", "Device", "string"), ("via", "Reached from", "string"),
                                 ("reason", "Reason", "string")])


def dashboard() -> g.Dashboard:
    variables = [
        c.sidecar_variable(),
        g.Template(name="device", label="Device", query="leaf-su0-r0", type="textbox", default="leaf-su0-r0"),
        g.Template(name="failure_type", label="Failure type", query=",".join(FAILURE_TYPES), type="custom",
                   default="switch_failure"),
        g.Template(name="simulation_id", label="Simulation", query="", type="textbox", default=""),
    ]
    result_link = ("Show this simulation's result",
                   "/d/" + UID + "?${__url_time_range}&var-device=${device}&var-failure_type=${failure_type}"
                   "&var-simulation_id=${__data.fields.Simulation}")
    panels = [
        c.row("Topology"),
        c.table("Topology simulated on", [TOPOLOGY], "none",
                "The cluster graph (inventory merged with live metrics) and its version (GET /graph/chaos-topology).",
                datasource=c.SIDECAR, hidden=(), size=c.Size(12, 5)),
        c.table("Submit: $device ($failure_type)", [SUBMIT], "none",
                "Submits one simulation of the chosen device and failure type on load "
                "(POST /graph/chaos-simulate). Click the row to show its result below.",
                datasource=c.SIDECAR, hidden=(), size=c.Size(12, 5), links=[result_link]),
        c.row("Result of simulation $simulation_id"),
        c.stat("Impact score", [IMPACT], "percentunit",
               "0.4 × affected devices / devices + 0.6 × affected jobs / active jobs "
               "(GET /graph/chaos-results/{id}).", datasource=c.SIDECAR, fields="/^Impact score$/",
               thresholds=[(None, "green"), (0.1, "orange"), (0.5, "red")], size=c.Size(6, 6)),
        c.table("Affected", [IMPACT], "none", "Devices and jobs cut off by the failure, against the totals.",
                datasource=c.SIDECAR, hidden=(), size=c.Size(18, 6)),
        c.table("Failure path (breadth-first)", [PATH], "none",
                "Each affected device, the device it was reached from and why it is lost.",
                datasource=c.SIDECAR, hidden=(), size=c.Size(12, 12)),
        c.table("Devices", [DEVICES], "none", "Every device a simulation can fail (GET /graph/chaos-devices).",
                datasource=c.SIDECAR, hidden=(), size=c.Size(12, 12)),
    ]
    board = c.dashboard(__file__, TITLE, "Blast radius of a simulated failure, from the sidecar's chaos API.",
                        variables, panels)
    board.refresh = ""
    board.annotations = g.Annotations(list=[])
    return board
