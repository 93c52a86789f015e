// Everything an operator (or a test harness) may want to change lives here: selectors,
// thresholds, windows, for-durations, evaluation intervals, severities and the runbook
// base URL. The rule files (alerts/*.libsonnet, rules/*.libsonnet) only read `$._config`.
//
// Override any leaf without editing this file:
//   python -m fabricscope.rules.render --overrides o.json out   (o.json: {"for": {"ncclHang": "10s"}})
// (render.jsonnet deep-merges `overrides` and refuses keys that do not exist here; render.py
// also passes it the exporter's declared quantile windows, which are not defined here).
{
  _config+:: {
    // Labels that identify where a series comes from. `cluster` is a target label or
    // an external label; aggregations keep it so one Prometheus can watch many clusters.
    clusterLabel: 'cluster',
    nodeLabel: 'node',

    // Selectors (PromQL label matchers without braces).
    selectors: {
      // The fabricscope exporter's scrape job, for `up` and the self-metrics.
      exporter: 'job="fabricscope"',
      // Prometheus' own metrics (rule-group health); empty matches any job.
      prometheus: '',
      // Ops compared across ranks for stragglers. Point-to-point Send/Recv differ by
      // rank by design (pipeline stages), so they form no cohort.
      stragglerOps: 'op!~"Send|Recv"',
    },

    // Wider sources of the same count: on RoCE ports the mlx5 driver keeps 64-bit PHY
    // counters (ethtool -S, exported by the netdev collector as
    // fabric_netdev_ethtool_counter_total on the port's netdev). The BER and flap rules
    // count these too, so a saturated 16/8-bit sysfs counter does not blind them.
    ibWiderCounters: {
      symbol_error: 'rx_symbol_err_phy',
      link_downed: 'link_down_events_phy',
    },

    // The driver's Xid for an NVLink failure. Logged the moment a link fails, before the
    // link-state alert's for: runs out: its alert is the incident's page, stays raised
    // while a link of the node is alerted down, and silences that link-down alert
    // (alertmanager.yml), so one failed link pages once.
    nvlinkXid: '74',

    runbookUrlBase: 'https://github.com/fabricscope/fabricscope/blob/main/docs/runbooks/',

    // Rule-group evaluation intervals. Short where the signal is short-lived
    // (microbursts, hangs), a minute elsewhere. '' leaves a group on Prometheus'
    // global evaluation_interval (handy for a fast demo).
    intervals: {
      // A microburst alerts within 30 s: a scrape, then the recording and the alert
      // groups each wait up to one interval.
      tcp: '10s',
      nccl: '30s',
      infiniband: '1m',
      nvlink: '1m',
      kernel: '1m',
      pipeline: '1m',
    },

    // Range windows used inside expressions.
    windows: {
      // The p99 RTT excess is the exporter's, over the window its declaration names
      // (exporter/bpf/tcp.yaml, window_quantile; passed in by rules/render.py): not here.
      tcpBaseline: '5m',  // rolling average of the p99 over 5 minutes
      ncclLag: '1m',  // per-rank mean arrival lag and collective rate (straggler detection)
      // A node's offset against the comm's earliest rank (cross-node join): its least over
      // the joins of this window, added to its ranks' lag (comm_rank:...:mean1m, panels).
      // FabricNcclStragglerNode reads the latest join instead (ncclNodeOffsetHold).
      ncclNodeOffset: '20s',
      // How long the latest cross-node join stands for the node (FabricNcclStragglerNode)
      // while no newer one lines up: longer than a rule interval plus the time between two
      // boundaries, so the alert's for: runs on between joins; a newer join replaces it at once.
      ncclNodeOffsetHold: '1m',
      // A node's clock against Prometheus': the smallest (node clock - scrape timestamp)
      // seen over this window (docs/nccl.md, "Clocks").
      ncclClockOffset: '5m',
      // A clock whose offset moved by more than ncclClockOffsetMaxStepSeconds between
      // the last ncclClockOffsetRecent and the whole ncclClockOffset window was stepped
      // or slewed: its offset estimate is stale.
      ncclClockOffsetRecent: '1m',
      // A node's offset estimate is used once this much of its scrapes is behind it and
      // the scrapes of this last stretch lowered it by no more than
      // ncclClockOffsetMaxStepSeconds (a fresh exporter's first scrapes are slow).
      ncclClockOffsetSettle: '1m',
      // What a late or hung rank's NIC port and NVLinks showed recently (errors, flaps,
      // down): the alerts' diagnosis. Recorded series keep their `10m` names.
      attributionCause: '10m',
      ibBer: '1h',  // IBTA BER boundary is expressed per hour
      ibFlap: '10m',  // "link_downed 3+ times in 10 minutes"
      ibRepeatedDegradation: '1h',
      ibWasActive: '6h',  // a port/link counts as "was up" if seen up within this
      // An alert started by a long evidence window (BER over an hour, 3 non-fatal events
      // in an hour, 3 flaps in 10 minutes) stays raised only while its signal shows in
      // this recent window: it resolves at most this long after the signal is back to
      // normal, not when the long window has emptied (docs/alertmanager.md, Lifecycles).
      signalRecent: '5m',
      // Also how long after a link was last seen inactive its errors stay that incident's
      // (the exporter keeps the sighting a day: exporter/nvml/history.py RETENTION_SECONDS).
      nvlinkErrorRate: '5m',
      // A link's throughput now. The exporter reads per-link bytes once every
      // nvlink.link_sample_interval_seconds (120 s by default), so its counters step every
      // 2 minutes: the window must always hold a step, or every link of a GPU reads 0 at
      // every other evaluation and FabricNvlinkThroughputCollapse's for: never completes
      // (rules/tests/nvlink.yaml, the 15 s-scrape case). 5m holds two or three.
      nvlinkRate: '5m',
      nvlinkBaseline: '30m',
      // How long a log line keeps its alert raised. A line is an event with no end to
      // wait for: the alert announces it (long enough for Alertmanager's group_wait and
      // a retry) and resolves this long after the last such line.
      kernelLogFatal: '5m',
      kernelLogNonFatal: '5m',
      ebpfWasAvailable: '1h',
      ruleGroupMissed: '10m',
    },

    thresholds: {
      // A microburst: p99 RTT excess (queueing over each connection's min RTT) > 3.0 ×
      // its rolling 5-minute average.
      microburstMultiplier: 3.0,
      microburstCriticalMultiplier: 6.0,
      // Below this p99 (seconds) a multiple of a tiny baseline is jitter, not a burst: a
      // 40 us loopback-class RTT tripling to 120 us costs a collective nothing. 0.5 ms is
      // where a p99 starts to cost a small-message collective (a few tens of us when
      // healthy) an order of magnitude; it lets a 150 us -> 960 us data-centre burst
      // alert, which a 1 ms floor would mute (docs/rules.md).
      microburstMinP99Seconds: 0.0005,
      // A hang itself (elapsed > hang_multiplier x the rolling average) is judged by the
      // exporter's tracker (exporter/nccl/tracker.py) alone; the rules read its
      // fabric_nccl_hanging verdict and add only this floor.
      // An op in flight for less than this is never called a hang, however small the
      // average (a scrape that lands mid-operation sees a few milliseconds).
      ncclHangMinElapsedSeconds: 10,
      // A rank that issued nothing for this long while its peers did.
      ncclRankStalledSeconds: 120,
      ncclRankStalledCriticalSeconds: 600,
      // "Its peers continue": the comm's newest call is at most this old.
      ncclPeersActiveSeconds: 60,
      // Straggler: a rank's mean arrival lag exceeds the comm's median by more than
      // k × MAD across ranks (raw MAD, not scaled by 1.4826)...
      stragglerMadMultiplier: 5,
      // ...and by more than this many seconds (MAD ≈ 0 when ranks agree; on one node
      // the lag's noise is tens of microseconds)...
      stragglerMinDeviationSeconds: 0.001,
      // ...and the wait costs the job more than this share of its time (lag × collectives
      // per second): a 2 ms lag in a 1 s step is not worth a ticket.
      stragglerMinStepShare: 0.05,
      // Fewer ranks than this and a median is not a cohort.
      stragglerMinRanks: 3,
      // A whole node late against the comm's earliest rank on another node, after each
      // node's clock offset against Prometheus' is taken out (docs/nccl.md, "Clocks":
      // the estimate's error, measured, stays well under this).
      stragglerNodeMinOffsetSeconds: 0.002,
      // A node clock's offset estimate moved by more than this: the clock was stepped or
      // is slewing, and the node's cross-node offset is not judged until it settles.
      ncclClockOffsetMaxStepSeconds: 0.001,
      // IBTA 10^-12 BER boundary: 120 symbol errors per hour. The only home of this
      // number: the exporter's node-local thresholds no longer judge it (docs/rules.md).
      ibSymbolErrorsPerHour: 120,
      ibFlapDownTransitions: 3,
      ibRepeatedNonFatalEvents: 3,
      // Largest value of each PortCounters error field (IBA widths: 16, 8 or 4 bits).
      // Many HCAs stop these counters at their maximum instead of wrapping; from then on
      // a rule or threshold on the counter sees no new errors.
      ibCounterMax: {
        symbol_error: 65535,
        link_error_recovery: 255,
        link_downed: 255,
        port_rcv_errors: 65535,
        port_rcv_remote_physical_errors: 65535,
        port_rcv_switch_relay_errors: 65535,
        port_xmit_discards: 65535,
        port_xmit_constraint_errors: 255,
        port_rcv_constraint_errors: 255,
        local_link_integrity_errors: 15,
        excessive_buffer_overrun_errors: 15,
        VL15_dropped: 65535,
      },
      // NVLink error counter rates (per second) by error type.
      nvlinkErrorRates: {
        crc_flit: 1,
        crc_data: 0.1,
        replay: 1,
        recovery: 0.01,
      },
      // Collapse: now below this fraction of the 30-minute average...
      nvlinkCollapseFraction: 0.1,
      // ...when that average was above this (bytes/s, tx+rx): the link was busy...
      nvlinkBusyBytesPerSecond: 1e9,
      // ...and the GPU's other links still carry at least this much (bytes/s), so the
      // end of a job (every link goes quiet together) is not a collapse.
      nvlinkGpuStillBusyBytesPerSecond: 1e9,
    },

    'for': {
      microburst: '0s',
      ncclHang: '1m',
      ncclRankStalled: '1m',
      // Longer than a step's effect lasts (the 5m offset window): a clock that keeps moving.
      ncclClockUnsettled: '5m',
      straggler: '2m',
      ibPortDown: '1m',
      ibDeviceMissing: '1m',
      ibPortFatal: '1m',
      ibFatalCounter: '1m',
      ibDegraded: '5m',
      // Any hour over the boundary is a warning (the count is exact, never extrapolated).
      ibBer: '0s',
      ibFlap: '0s',
      ibRepeatedDegradation: '0s',
      ibAnomaly: '15m',
      ibCounterSaturated: '5m',
      nvlinkDown: '1m',
      // Short: a burst of errors shows in the 5m rate window for 5 minutes, so a longer
      // for: would never see a one-minute burst of 60,000 CRC errors.
      nvlinkErrors: '1m',
      nvlinkCollapse: '10m',
      kernelLog: '0s',
      exporterDown: '5m',
      collectorFailing: '5m',
      ebpfUnavailable: '5m',
      // A program that did not attach at start-up stays detached until the exporter is
      // restarted with what it lacked (tracefs, privileges): no reason to wait long.
      ebpfProgramNotAttached: '5m',
      ruleGroupMissed: '0s',
    },

    // Event-like conditions clear on their own within a minute; keep them raised long
    // enough for Alertmanager to notify (its group_wait is up to a minute), and no
    // longer: the resolve bound is the 1m rate window plus this (docs/alertmanager.md).
    keepFiringFor: {
      microburst: '2m',
    },

    severities: {
      microburst: 'warning',
      microburstCritical: 'critical',
      ncclHang: 'critical',
      ncclRankStalled: 'warning',
      ncclClockUnsettled: 'warning',
      ncclRankStalledCritical: 'critical',
      straggler: 'warning',
      ibPortDown: 'critical',
      ibDeviceMissing: 'critical',
      ibPortFatal: 'critical',
      ibFatalCounter: 'critical',
      ibDegraded: 'warning',
      ibBer: 'warning',
      ibFlap: 'critical',
      // Repeated non-fatal events are escalated to fatal.
      ibRepeatedDegradation: 'critical',
      ibAnomaly: 'warning',
      // Detection on that counter is blind until someone clears it: a ticket.
      ibCounterSaturated: 'warning',
      nvlinkDown: 'critical',
      nvlinkErrors: 'warning',
      nvlinkCollapse: 'warning',
      kernelLogFatal: 'critical',
      kernelLogNonFatal: 'warning',
      xidFatal: 'critical',
      xidNonFatal: 'warning',
      exporterDown: 'critical',
      collectorFailing: 'warning',
      ebpfUnavailable: 'warning',
      ebpfProgramNotAttached: 'warning',
      ruleGroupMissed: 'warning',
    },
  },
}
