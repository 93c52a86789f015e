// Alerting rules. Every alert: CamelCase with the `Fabric` prefix, a `severity` label
// (critical pages, warning tickets, info routes nowhere), a one-sentence summary, a
// templated description and a runbook_url (docs/runbooks/<AlertName>.md).
local util = import 'util.libsonnet';

{
  local cfg = $._config,
  local th = cfg.thresholds,
  local w = cfg.windows,
  local forOf = cfg['for'],
  local sev = cfg.severities,
  local by = function(labels) util.by(cfg, labels),
  local num = util.num,
  local host = by([cfg.nodeLabel]),

  local alert(name, severity, expr, forDuration, summary, description, keepFiringFor=null) = {
    alert: name,
    expr: expr,
    'for': forDuration,
    labels: { severity: severity },
    annotations: {
      summary: summary,
      description: description,
      runbook_url: cfg.runbookUrlBase + name + '.md',
    },
  } + (if keepFiringFor == null then {} else { keep_firing_for: keepFiringFor }),

  // ---- TCP microbursts -------------------------------------------------------------
  // The warning tier stands down while the critical tier is raised: both are held by
  // keep_firing_for after the burst, and a warning outliving the critical by a few
  // evaluations would notify a burst that is already over (an inhibition only holds
  // while its source fires).
  local microburst(multiplier, severity, unlessTier=null) = alert(
    'FabricTcpMicroburst',
    severity,
    |||
      (
        node:fabric_tcp_rtt_excess_seconds:p99_1m
        / on (%(host)s)
        (node:fabric_tcp_rtt_excess_seconds_p99:avg5m > 0)
      ) > %(m)s
      and on (%(host)s)
      node:fabric_tcp_rtt_excess_seconds:p99_1m > %(floor)s
    ||| % { host: host, m: num(multiplier), floor: num(th.microburstMinP99Seconds) }
    + (if unlessTier == null then '' else |||
      unless on (%(host)s)
      ALERTS{alertname="FabricTcpMicroburst", severity="%(tier)s"}
    ||| % { host: host, tier: unlessTier }),
    forOf.microburst,
    'TCP round-trip latency on a GPU node jumped far above its recent baseline.',
    'p99 TCP RTT excess (queueing above each connection\'s min RTT) on {{ $labels.node }} is {{ printf "%.2f" $value }}x its average over the previous '
    + w.tcpBaseline + ' (alert at ' + num(multiplier) + 'x; p99 above '
    + num(th.microburstMinP99Seconds) + 's).',
    keepFiringFor=cfg.keepFiringFor.microburst,
  ),

  // ---- InfiniBand ---------------------------------------------------------------------
  local port = by([cfg.nodeLabel, 'device', 'port']),

  // A port that stopped working after it worked. Codes 4 (ACTIVE) and 5 (ACTIVE_DEFER)
  // both carry traffic, as the exporter's own verdict says (exporter/health/link_state.py).
  // `state` is dropped from the identity: a port bouncing between DOWN and INIT is one
  // fault, not a new alert on every change. "Worked" is "seen working within the
  // look-back, or already alerted": the ALERTS term keeps a port that stays down (or
  // stuck in INIT) alerting under this name, and its inhibitions in force, for as long
  // as it lasts, not only for the look-back.
  local alertedOrWasWorking(name, working) = |||
    %(working)s
    or
    ALERTS{alertname="%(name)s"}
  ||| % { name: name, working: working },

  local ibPortDownExpr = |||
    max without (state) (fabric_infiniband_port_state) < 4
    and on (%(port)s)
    (
      %(recent)s
    )
  ||| % {
    port: port,
    recent: std.strReplace(std.rstripChars(alertedOrWasWorking(
      'FabricInfinibandPortDown',
      'max without (state) (max_over_time(fabric_infiniband_port_state{state=~"ACTIVE|ACTIVE_DEFER"}[%s]))' % w.ibWasActive
    ), '\n'), '\n', '\n  '),
  },

  // How much a counter rose over `range`, counted from the samples in the window and
  // never extrapolated: increase() scales the rise between the first and last sample
  // up to the whole window, so exactly 120 errors an hour with scrapes offset from the
  // errors read as 120.5 and crossed a "> 120" boundary. A counter only goes down when
  // it is cleared; across such a reset the difference means nothing and increase()
  // (which handles resets) is used instead.
  local counted(series, range) = |||
    (
      max_over_time(%(s)s[%(r)s]) - min_over_time(%(s)s[%(r)s])
      unless
      resets(%(s)s[%(r)s]) > 0
    )
    or
    increase(%(s)s[%(r)s])
  ||| % { s: series, r: range },

  // What a port counter counted over `range`, also from the wider source of the same
  // count where the port has one (a RoCE port's 64-bit ethtool PHY counter on its
  // netdev), so a saturated sysfs counter does not hide new errors. Each source is its
  // own series (no jump when one of them is briefly unreadable); the caller takes the
  // larger count per port. Returns `or`-joined terms.
  local ibCounterCounts(counter, range) =
    local wider = std.get(cfg.ibWiderCounters, counter, null);
    counted('fabric_infiniband_port_counter_total{counter="%s"}' % counter, range)
    + (if wider == null then '' else |||
      or
      (
        %(counted)s
      )
      * on (%(iface)s) group_left (device, port)
      label_replace(fabric_infiniband_port_info, "interface", "$1", "netdev", "(.+)")
    ||| % {
      counted: indent(counted('fabric_netdev_ethtool_counter_total{counter="%s"}' % wider, range)),
      iface: by([cfg.nodeLabel, 'interface']),
    }),

  // The times a port went from ACTIVE to not ACTIVE within `range`, from every source
  // that sees it, largest per port: the exporter's own count of the transitions it
  // scraped, the link_downed counter (and its 64-bit PHY twin), and the port state
  // series itself (a drop from ACTIVE, counted by resets() over the state clamped to
  // 3..4, so DOWN <-> INIT bouncing while down is not counted again). link_downed is 8
  // bits wide and stops at 255; from then on the other sources still count the flaps.
  local ibPortDowns(range) = |||
    max by (%(port)s) (
      %(transitions)s
      or
      %(downed)s
      or
      label_replace(
        resets(clamp(max without (state) (fabric_infiniband_port_state), 3, 4)[%(r)s:]),
        "source", "state", "", ""
      )
    )
  ||| % {
    port: port,
    r: range,
    transitions: indent(counted('fabric_infiniband_port_down_transitions_total', range)),
    downed: indent(ibCounterCounts('link_downed', range)),
  },

  // Port error counters stopped at the largest value their PortCounters field holds.
  local saturatedCounters = std.join('\nor\n', [
    'fabric_infiniband_port_counter_total{counter="%s"} >= %s' % [counter, num(th.ibCounterMax[counter])]
    for counter in std.objectFields(th.ibCounterMax)
  ]) + '\n',

  local indent(text) = std.strReplace(std.rstripChars(text, '\n'), '\n', '\n  '),

  local ibStateName = '{{ if eq $value 1.0 }}DOWN{{ else if eq $value 2.0 }}INIT{{ else if eq $value 3.0 }}ARMED'
                      + '{{ else }}in state {{ $value }}{{ end }}',

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-tcp.alerts',
        interval: cfg.intervals.tcp,
        rules: [
          microburst(th.microburstMultiplier, sev.microburst, unlessTier=sev.microburstCritical),
          microburst(th.microburstCriticalMultiplier, sev.microburstCritical),
        ],
      },
      {
        name: 'fabric-infiniband.alerts',
        interval: cfg.intervals.infiniband,
        rules: [
          alert(
            'FabricInfinibandPortDown',
            sev.ibPortDown,
            ibPortDownExpr,
            forOf.ibPortDown,
            'An InfiniBand/RoCE port that was active is no longer active.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} is ' + ibStateName
            + ' after being ACTIVE; this alert lasts until the port is ACTIVE again.',
          ),
          alert(
            'FabricInfinibandDeviceMissing',
            sev.ibDeviceMissing,
            'fabric_infiniband_device_missing == 1',
            forOf.ibDeviceMissing,
            'An InfiniBand/RoCE device the node had disappeared.',
            'Device {{ $labels.device }} on {{ $labels.node }} was present before and is gone from /sys/class/infiniband.',
          ),
          alert(
            'FabricInfinibandPortFatal',
            sev.ibPortFatal,
            // One page per fault: FabricInfinibandPortDown covers a port that went
            // down, FabricInfinibandFatalCounterBreach a fatal counter; this one covers
            // the rest (phys Disabled, down since boot).
            |||
              fabric_infiniband_port_fatal == 1
              unless on (%(port)s)
              (
                %(down)s
              )
              unless on (%(port)s)
              fabric_infiniband_port_counter_breached{severity="fatal"} == 1
            ||| % { port: port, down: std.strReplace(std.rstripChars(ibPortDownExpr, '\n'), '\n', '\n  ') },
            forOf.ibPortFatal,
            'The exporter reports an InfiniBand/RoCE port in a fatal condition.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} is fatal '
            + '(state DOWN or phys_state Disabled) and has not been ACTIVE since the exporter has watched it '
            + '(at most the last ' + w.ibWasActive + ').',
          ),
          alert(
            'FabricInfinibandFatalCounterBreach',
            sev.ibFatalCounter,
            // A counter stopped at its maximum keeps its last breach latched for ever and
            // counts nothing new: FabricInfinibandCounterSaturated tickets it, and leaving
            // it out here lets a later link flap on that port page on its own (a raised
            // link_downed breach keeps the flap alert down: FabricInfinibandLinkFlap).
            // A breach raised while its port is down is that port-down incident's (the
            // down itself moves link_downed). It waits while the port-down alert is
            // pending (its for: restarts, so the port-down alert fires first and
            // Alertmanager silences the breach behind it), and for signalRecent after
            // the port-down alert resolved it is kept down here, so it neither pages the
            // moment that silence lifts nor before the repair (counters cleared) clears it.
            |||
              fabric_infiniband_port_counter_breached{severity="fatal"} == 1
              unless on (%(port)s, counter)
              (
                %(saturated)s
              )
              unless on (%(port)s)
              (
                ALERTS{alertname="FabricInfinibandPortDown", alertstate="pending"}
                or
                (
                  max_over_time(ALERTS{alertname="FabricInfinibandPortDown", alertstate="firing"}[%(recent)s])
                  unless on (%(port)s)
                  ALERTS{alertname="FabricInfinibandPortDown", alertstate="firing"}
                )
              )
            ||| % { port: port, saturated: indent(saturatedCounters), recent: w.signalRecent },
            forOf.ibFatalCounter,
            'An InfiniBand/RoCE port counter crossed a fatal threshold.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) breached its fatal threshold.',
          ),
          alert(
            'FabricInfinibandDegraded',
            sev.ibDegraded,
            'fabric_infiniband_port_counter_breached{severity="non_fatal"} == 1',
            forOf.ibDegraded,
            'An InfiniBand/RoCE port counter crossed a degradation threshold.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) breached its non-fatal threshold; the link still works but is degrading.',
          ),
          alert(
            'FabricInfinibandPreFailureBER',
            sev.ibBer,
            // The hour starts the alert; the recent window keeps it: once the errors are
            // back to background the alert resolves within signalRecent, not an hour later.
            |||
              max by (%(port)s) (
                %(hour)s
              ) > %(n)s
              and on (%(port)s)
              max by (%(port)s) (
                %(recent)s
              ) > %(keep)s
            ||| % {
              port: port,
              hour: indent(ibCounterCounts('symbol_error', w.ibBer)),
              recent: indent(ibCounterCounts('symbol_error', w.signalRecent)),
              n: num(th.ibSymbolErrorsPerHour),
              keep: num(th.ibSymbolErrorsPerHour * th.ibBerKeepFraction
                        * util.seconds(w.signalRecent) / util.seconds(w.ibBer)),
            },
            forOf.ibBer,
            'Symbol errors on an InfiniBand port exceed the IBTA 10^-12 bit-error-rate boundary.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} counted {{ $value | printf "%.0f" }} symbol errors in the last '
            + w.ibBer + ' (boundary ' + num(th.ibSymbolErrorsPerHour) + '): the link is likely to fail once FEC is exhausted.',
          ),
          alert(
            'FabricInfinibandLinkFlap',
            sev.ibFlap,
            // Three downs in the flap window start it; a down in the recent window keeps
            // it: it resolves signalRecent after the last down, not a whole window later.
            // One page per incident: where the port's link_downed breach already paged
            // (a first down that stayed up long enough), the flap is not a page of its
            // own while that breach fires and for signalRecent after; once the flap alert
            // fires, a breach that fires later does not take it down (Alertmanager
            // silences the breach behind it). While the port is down the breach waits
            // (FabricInfinibandFatalCounterBreach), so a fast flap pages as this alert. A
            // breach on a counter stopped at 255 is never raised, so later flaps page.
            |||
              %(flaps)s >= %(n)s
              and on (%(port)s)
              %(recent)s > 0
              unless on (%(port)s)
              (
                max_over_time(ALERTS{alertname="FabricInfinibandFatalCounterBreach", counter="link_downed", alertstate="firing"}[%(keep)s])
                unless on (%(port)s)
                ALERTS{alertname="FabricInfinibandLinkFlap", alertstate="firing"}
              )
            ||| % {
              keep: w.signalRecent,
              port: port,
              n: num(th.ibFlapDownTransitions),
              flaps: std.rstripChars(ibPortDowns(w.ibFlap), '\n'),
              recent: std.rstripChars(ibPortDowns(w.signalRecent), '\n'),
            },
            forOf.ibFlap,
            'An InfiniBand/RoCE link keeps going down and coming back.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} went down {{ $value | printf "%.0f" }} times in the last '
            + w.ibFlap + ' (alert at ' + num(th.ibFlapDownTransitions) + ').',
          ),
          alert(
            'FabricInfinibandRepeatedDegradation',
            sev.ibRepeatedDegradation,
            // The hour of events starts it; a non-fatal breach still flagged on the port
            // keeps it (the exporter clears a velocity breach once a full window is back
            // under its limit), so it resolves with the degradation, not an hour later.
            |||
              max by (%(port)s) (
                %(events)s
              ) >= %(n)s
              and on (%(port)s)
              max by (%(port)s) (fabric_infiniband_port_counter_breached{severity="non_fatal"}) == 1
            ||| % {
              port: port,
              events: indent(counted('fabric_infiniband_port_health_events_total{severity="non_fatal"}',
                                     w.ibRepeatedDegradation)),
              n: num(th.ibRepeatedNonFatalEvents),
            },
            forOf.ibRepeatedDegradation,
            'An InfiniBand/RoCE port keeps reporting non-fatal degradation.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} raised {{ $value | printf "%.0f" }} non-fatal health events in the last '
            + w.ibRepeatedDegradation + ' (escalated at ' + num(th.ibRepeatedNonFatalEvents) + ').',
          ),
          alert(
            'FabricInfinibandPortAnomaly',
            sev.ibAnomaly,
            'fabric_infiniband_port_anomaly == 1',
            forOf.ibAnomaly,
            'An InfiniBand/RoCE port looks miswired or unlike its siblings.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} fails the {{ $labels.check }} check.',
          ),
          alert(
            'FabricInfinibandCounterSaturated',
            sev.ibCounterSaturated,
            saturatedCounters,
            forOf.ibCounterSaturated,
            'An InfiniBand port error counter stopped at its maximum and counts nothing new.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) is at '
            + '{{ $value | printf "%.0f" }}, the largest value its PortCounters field holds: the BER, flap and '
            + 'threshold checks on it see no new errors until it is cleared (perfquery -R); where the port has a '
            + '64-bit ethtool counter for it, the BER and flap rules keep counting from that.',
          ),
        ],
      },
      {
        name: 'fabric-nvlink.alerts',
        interval: cfg.intervals.nvlink,
        rules: [
          alert(
            'FabricNvlinkLinkDown',
            sev.nvlinkDown,
            |||
              fabric_nvlink_state == 0
              and on (%(link)s)
              (
                %(recent)s
              )
            ||| % {
              link: by([cfg.nodeLabel, 'gpu', 'link']),
              recent: std.strReplace(std.rstripChars(alertedOrWasWorking(
                'FabricNvlinkLinkDown', 'max_over_time(fabric_nvlink_state[%s]) == 1' % w.ibWasActive
              ), '\n'), '\n', '\n  '),
            },
            forOf.nvlinkDown,
            'An NVLink link that was active is inactive.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} is inactive after being active; '
            + 'this alert lasts until the link is active again.',
          ),
          alert(
            'FabricNvlinkErrors',
            sev.nvlinkErrors,
            // Errors counted in a window in which the link also went down are that
            // link-down incident's (the precursor errors of a failing link): they ticket
            // neither while it is down nor after it is back.
            '(\n  ' + std.join('\n  or\n  ', [
              'rate(fabric_nvlink_errors_total{type="%s"}[%s]) > %s'
              % [type, w.nvlinkErrorRate, num(th.nvlinkErrorRates[type])]
              for type in std.objectFields(th.nvlinkErrorRates)
            ]) + '\n)\nunless on (%s)\nmin_over_time(fabric_nvlink_state[%s]) == 0\n'
            % [by([cfg.nodeLabel, 'gpu', 'link']), w.nvlinkErrorRate],
            forOf.nvlinkErrors,
            'An NVLink link is counting errors faster than its threshold.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} counts {{ $value | printf "%.3g" }} {{ $labels.type }} errors per second.',
          ),
          alert(
            'FabricNvlinkThroughputCollapse',
            sev.nvlinkCollapse,
            |||
              gpu_link:fabric_nvlink_bytes:rate5m
              < %(f)s * (gpu_link:fabric_nvlink_bytes:rate30m_before > %(busy)s)
              and on (%(gpu)s)
              (gpu:fabric_nvlink_bytes:rate5m > %(gpuBusy)s)
            ||| % {
              f: num(th.nvlinkCollapseFraction),
              busy: num(th.nvlinkBusyBytesPerSecond),
              gpu: by([cfg.nodeLabel, 'gpu']),
              gpuBusy: num(th.nvlinkGpuStillBusyBytesPerSecond),
            },
            forOf.nvlinkCollapse,
            'Traffic on a busy NVLink link collapsed while the other links of its GPU stay busy.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} carries {{ $value | humanize }}B/s, under '
            + num(th.nvlinkCollapseFraction * 100) + '% of its average over the ' + w.nvlinkBaseline + ' before.',
          ),
        ],
      },
      {
        name: 'fabric-kernel.alerts',
        interval: cfg.intervals.kernel,
        rules: [
          alert(
            rule.name,
            rule.severity,
            // A counter born with its first event has no increase; the second clause
            // catches a series that did not exist one window ago.
            |||
              increase(%(m)s{severity="%(s)s"}[%(w)s]) > 0
              or
              (%(m)s{severity="%(s)s"} > 0 unless %(m)s{severity="%(s)s"} offset %(w)s)
            ||| % { m: rule.metric, s: rule.seriesSeverity, w: rule.window }
            + std.get(rule, 'holdWhile', ''),
            forOf.kernelLog,
            rule.summary,
            rule.description,
          )
          for rule in [
            {
              name: 'FabricKernelLogFatal',
              severity: sev.kernelLogFatal,
              metric: 'fabric_kernel_log_events_total',
              seriesSeverity: 'fatal',
              window: w.kernelLogFatal,
              summary: 'The kernel logged a deterministic NIC/driver failure.',
              description: '{{ $labels.source }} on {{ $labels.node }} logged "{{ $labels.pattern }}" in the last ' + w.kernelLogFatal + ': a fatal hardware or driver condition.',
            },
            {
              name: 'FabricKernelLogNonFatal',
              severity: sev.kernelLogNonFatal,
              metric: 'fabric_kernel_log_events_total',
              seriesSeverity: 'non_fatal',
              window: w.kernelLogNonFatal,
              summary: 'The kernel logged a NIC/driver warning.',
              description: '{{ $labels.source }} on {{ $labels.node }} logged "{{ $labels.pattern }}" in the last ' + w.kernelLogNonFatal + '.',
            },
            {
              name: 'FabricGpuXidFatal',
              severity: sev.xidFatal,
              metric: 'fabric_kernel_log_xid_events_total',
              seriesSeverity: 'fatal',
              window: w.kernelLogFatal,
              // The NVLink Xid is the page of a failed link: it stays raised while a link
              // of its node is alerted down (and silences that alert), so the link-down
              // alert neither pages beside it nor lets it page again when it resolves.
              holdWhile: |||
                or
                (
                  fabric_kernel_log_xid_events_total{severity="fatal", xid="%(xid)s"}
                  and on (%(node)s, xid)
                  ALERTS{alertname="FabricGpuXidFatal", alertstate="firing"}
                  and on (%(node)s)
                  ALERTS{alertname="FabricNvlinkLinkDown"}
                )
              ||| % { xid: cfg.nvlinkXid, node: host },
              summary: 'The NVIDIA driver reported a critical Xid error.',
              description: 'Xid {{ $labels.xid }} on {{ $labels.node }} in the last ' + w.kernelLogFatal + ': the GPU needs attention before it takes work again.',
            },
            {
              name: 'FabricGpuXidNonFatal',
              severity: sev.xidNonFatal,
              metric: 'fabric_kernel_log_xid_events_total',
              seriesSeverity: 'non_fatal',
              window: w.kernelLogNonFatal,
              summary: 'The NVIDIA driver reported a non-critical Xid error.',
              description: 'Xid {{ $labels.xid }} on {{ $labels.node }} in the last ' + w.kernelLogNonFatal + '.',
            },
          ]
        ],
      },
      {
        name: 'fabric-pipeline.alerts',
        interval: cfg.intervals.pipeline,
        rules: [
          alert(
            'FabricExporterDown',
            sev.exporterDown,
            '%s == 0' % util.selector('up', cfg.selectors.exporter),
            forOf.exporterDown,
            'Prometheus cannot scrape the fabricscope exporter of a node.',
            'The exporter target {{ $labels.instance }} ({{ $labels.node }}) has been down for ' + forOf.exporterDown
            + ': fabric faults on that node go unseen.',
          ),
          alert(
            'FabricCollectorFailing',
            sev.collectorFailing,
            'fabric_scrape_collector_success == 0',
            forOf.collectorFailing,
            'A fabricscope collector fails on every scrape.',
            'Collector {{ $labels.collector }} on {{ $labels.node }} has failed for ' + forOf.collectorFailing
            + '; its metrics are missing.',
          ),
          alert(
            'FabricEbpfUnavailable',
            sev.ebpfUnavailable,
            |||
              fabric_ebpf_available == 0
              and ignoring (reason)
              (max_over_time(fabric_ebpf_available[%s]) == 1)
            ||| % w.ebpfWasAvailable,
            forOf.ebpfUnavailable,
            'eBPF telemetry stopped on a node where it was working.',
            'eBPF on {{ $labels.node }} is unavailable ({{ $labels.reason }}) after working within the last '
            + w.ebpfWasAvailable + ': TCP RTT, scheduler and NCCL uprobe metrics are missing.',
          ),
          alert(
            'FabricRuleGroupIterationsMissed',
            sev.ruleGroupMissed,
            'increase(%s[%s]) > 0'
            % [util.selector('prometheus_rule_group_iterations_missed_total', cfg.selectors.prometheus), w.ruleGroupMissed],
            forOf.ruleGroupMissed,
            'Prometheus skipped rule-group evaluations because they took longer than their interval.',
            'Rule group {{ $labels.rule_group }} on {{ $labels.instance }} missed {{ $value | printf "%.0f" }} evaluations in the last '
            + w.ruleGroupMissed + '; detection there is running late.',
          ),
        ],
      },
    ],
  },
}
