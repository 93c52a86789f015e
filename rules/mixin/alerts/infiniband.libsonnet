// InfiniBand/RoCE ports and devices: down, fatal, counter breaches, pre-failure BER,
// flaps, repeated degradation, anomalies and saturated counters.
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  // A port that stopped working after it worked. Codes 4 (ACTIVE) and 5 (ACTIVE_DEFER)
  // both carry traffic, as the exporter's own verdict says (exporter/health/link_state.py).
  // `state` is dropped from the identity: a port bouncing between DOWN and INIT is one
  // fault, not a new alert on every change. "Worked" is "seen working within the
  // look-back, or already alerted" (utils.alertedOrWasWorking): a port that stays down
  // (or stuck in INIT) keeps alerting for as long as it lasts.
  local ibPortDownExpr = |||
    max without (state) (fabric_infiniband_port_state) < 4
    and on (%(port)s)
    (
      %(recent)s
    )
  ||| % {
    port: c.port,
    recent: utils.indent(utils.alertedOrWasWorking(
      'FabricInfinibandPortDown',
      // rules/infiniband.libsonnet records when each port last carried traffic.
      'time() - port:fabric_infiniband_port_state:last_active_timestamp < %d' % utils.seconds(c.w.ibWasActive)
    )),
  },

  // How much a counter rose over `range`, counted from the raw samples in the window and
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

  // Whether a counter rose within `range` (> 0 where it did, 0 where it did not): all
  // that "a down within the recent window" asks. One pass over the window instead of
  // counted()'s four: increase() is above 0 exactly when the samples rose, across a reset
  // too, and its extrapolation never makes a 0 positive.
  local rose(series, range) = 'increase(%s[%s])\n' % [series, range],

  // The BER hour and the flap windows are counted from records this group writes at each
  // evaluation (stepRecords, ahead of the alerts): how much each source rose since the
  // previous evaluation, kept only where it rose. A window's count is the sum of its
  // evaluations' records: sum_over_time over the window less half a step holds exactly
  // its last range/step records, whether the engine's range is closed at its start
  // (Prometheus 2) or open (3), and they add up to the rise between the latest scrape at
  // the window's start and the latest one now: every scrape of the window and none from
  // before it. The hour reads 60 records of the few ports that had errors instead of
  // 120-240 raw samples of every source of every port (4 range functions each).
  // The step is the group's interval; with '' (the engine's global interval, unknown
  // here) the alerts count the raw series as before. vmalert writes records
  // asynchronously, so there an alert may read only the previous evaluations' records: a
  // window one step shorter, its newest rise seen an evaluation later (docs/scale.md).
  local step = c.cfg.intervals.infiniband,
  local stepped = step != '',
  local stepWindow(range) = utils.duration(utils.seconds(range) - utils.seconds(step) / 2),

  // What a counter rose since the previous evaluation (a step), only where it rose:
  // the latest scrape less the latest scrape a step ago, exact between two scrapes, where
  // the counter was not cleared in the step; where there is no scrape a step ago (a
  // series that appeared, or came back after a failed scrape's staleness), or the counter
  // was cleared between the two steps' scrapes, from its first scrape in the step (the
  // latest less the least: a counter); increase() across a clear within the step (what
  // counted() does across one, for the same reason). Six selections of the series: each
  // costs the engine a pass over every port, whatever it reads.
  local stepRise(series) = |||
    (
      (%(s)s - %(s)s offset %(i)s) > 0
      or
      (%(s)s - min_over_time(%(s)s[%(i)s])) > 0
    )
    unless
    resets(%(s)s[%(i)s]) > 0
    or
    increase(%(s)s[%(i)s]) > 0
  ||| % { s: series, i: step },

  local ibRecorded = std.objectFields(c.cfg.ibWiderCounters),
  local ibSelector(counters) = 'counter=~"%s"' % std.join('|', counters),
  // The sources the BER and flap alerts count, each its record's name and raw series.
  local rises = {
    fabric_infiniband_port_counter_total: {
      record: 'port_counter:fabric_infiniband_port_counter_total:rise1m',
      series: 'fabric_infiniband_port_counter_total{%s}' % ibSelector(ibRecorded),
    },
    fabric_netdev_ethtool_counter_total: {
      record: 'interface_counter:fabric_netdev_ethtool_counter_total:rise1m',
      series: 'fabric_netdev_ethtool_counter_total{%s}'
              % ibSelector([c.cfg.ibWiderCounters[k] for k in ibRecorded]),
    },
    fabric_infiniband_port_down_transitions_total: {
      record: 'port:fabric_infiniband_port_down_transitions_total:rise1m',
      series: 'fabric_infiniband_port_down_transitions_total',
    },
  },
  // A port state's drop from ACTIVE (or ACTIVE_DEFER) to any other state since the
  // previous evaluation (the state clamped to 3..4, so DOWN <-> INIT bouncing while down
  // is not a drop): 1 where it dropped.
  local stateDrops = {
    record: 'port:fabric_infiniband_port_state:drops1m',
    expr: |||
      (
        clamp(max without (state) (fabric_infiniband_port_state offset %(i)s), 3, 4)
        -
        clamp(max without (state) (fabric_infiniband_port_state), 3, 4)
      ) > 0
    ||| % { i: step },
  },
  local stepRecords =
    if !stepped then []
    else [{ record: rises[m].record, expr: stepRise(rises[m].series) } for m in std.objectFields(rises)]
         + [stateDrops],

  // What `metric{sel}` counted over `range`: the records' sum, or (no step) raw.
  // `raw` is counted (the exact rise) or rose (only whether it rose: cheaper).
  local counterOver(metric, sel, range, raw=counted) =
    if stepped then 'sum_over_time(%s[%s])\n' % [utils.selector(rises[metric].record, sel), stepWindow(range)]
    else raw(utils.selector(metric, sel), range),

  // What a port counter counted over `range`, also from the wider source of the same
  // count where the port has one (a RoCE port's 64-bit ethtool PHY counter on its
  // netdev), so a saturated sysfs counter does not hide new errors. Each source is its
  // own series (no jump when one of them is briefly unreadable); the caller takes the
  // larger count per port. Returns `or`-joined terms.
  local ibCounterCounts(counter, range, raw=counted) =
    local wider = std.get(c.cfg.ibWiderCounters, counter, null);
    counterOver('fabric_infiniband_port_counter_total', 'counter="%s"' % counter, range, raw)
    + (if wider == null then '' else |||
      or
      (
        %(counted)s
      )
      * on (%(iface)s) group_left (device, port)
      label_replace(fabric_infiniband_port_info, "interface", "$1", "netdev", "(.+)")
    ||| % {
      counted: utils.indent(counterOver('fabric_netdev_ethtool_counter_total', 'counter="%s"' % wider, range, raw)),
      iface: c.by([c.cfg.nodeLabel, 'interface']),
    }),

  // The times a port went from ACTIVE to not ACTIVE within `range`, from every source
  // that sees it, largest per port: the exporter's own count of the transitions it
  // scraped, the link_downed counter (and its 64-bit PHY twin), and the port state
  // series itself (its drops from ACTIVE at each evaluation, or counted by resets() over
  // the state clamped to 3..4 at each step of a subquery). link_downed is 8 bits wide
  // and stops at 255; from then on the other sources still count the flaps.
  local ibPortDowns(range, raw=counted) = |||
    max by (%(port)s) (
      %(transitions)s
      or
      %(downed)s
      or
      label_replace(
        %(drops)s,
        "source", "state", "", ""
      )
    )
  ||| % {
    port: c.port,
    transitions: utils.indent(counterOver('fabric_infiniband_port_down_transitions_total', '', range, raw)),
    downed: utils.indent(ibCounterCounts('link_downed', range, raw)),
    drops: if stepped then 'sum_over_time(%s[%s])' % [stateDrops.record, stepWindow(range)]
           else 'resets(clamp(max without (state) (fabric_infiniband_port_state), 3, 4)[%s:])' % range,
  },

  // Port error counters stopped at the largest value their PortCounters field holds.
  local saturatedCounters = std.join('\nor\n', [
    'fabric_infiniband_port_counter_total{counter="%s"} >= %s' % [counter, c.num(c.th.ibCounterMax[counter])]
    for counter in std.objectFields(c.th.ibCounterMax)
  ]) + '\n',

  local ibStateName = '{{ if eq $value 1.0 }}DOWN{{ else if eq $value 2.0 }}INIT{{ else if eq $value 3.0 }}ARMED'
                      + '{{ else }}in state {{ $value }}{{ end }}',

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-infiniband.alerts',
        interval: c.cfg.intervals.infiniband,
        // The per-evaluation records the BER and flap alerts sum, ahead of them: the
        // alerts read this evaluation's records.
        rules: stepRecords + [
          c.alert(
            'FabricInfinibandFatalCounterBreach',
            c.sev.ibFatalCounter,
            // A counter stopped at its maximum keeps its last breach latched for ever and
            // counts nothing new: FabricInfinibandCounterSaturated tickets it, and leaving
            // it out here lets a later link flap on that port page on its own (a raised
            // link_downed breach keeps the flap alert down: FabricInfinibandLinkFlap).
            // A breach raised while its port is down is that port-down incident's (the
            // down itself moves link_downed). It waits while the port-down alert is
            // pending (its for: restarts, so the port-down alert fires first and
            // Alertmanager silences the breach behind it), and from the evaluation in
            // which the port is active again until signalRecent after the port-down alert
            // resolved it is kept down here, so it neither pages the moment that silence
            // lifts nor before the repair (counters cleared) clears it.
            // It is evaluated ahead of FabricInfinibandPortDown (it reads that alert's
            // state of the previous evaluation): Prometheus sends each rule's alerts as
            // that rule is evaluated, so the breach's resolution reaches Alertmanager
            // before the port-down's. In the other order Alertmanager held the breach
            // firing and no longer silenced for the moment between the two, and a group
            // flush falling into it paged the breach as a second page of the incident.
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
                  (
                    ALERTS{alertname="FabricInfinibandPortDown", alertstate="firing"}
                    unless on (%(port)s)
                    max without (state) (fabric_infiniband_port_state) >= 4
                  )
                )
              )
            ||| % { port: c.port, saturated: utils.indent(saturatedCounters), recent: c.w.signalRecent },
            c.forOf.ibFatalCounter,
            'An InfiniBand/RoCE port counter crossed a fatal threshold.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) breached its fatal threshold.',
          ),
          c.alert(
            'FabricInfinibandPortDown',
            c.sev.ibPortDown,
            ibPortDownExpr,
            c.forOf.ibPortDown,
            'An InfiniBand/RoCE port that was active is no longer active.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} is ' + ibStateName
            + ' after being ACTIVE; this alert lasts until the port is ACTIVE again.',
          ),
          c.alert(
            'FabricInfinibandDeviceMissing',
            c.sev.ibDeviceMissing,
            'fabric_infiniband_device_missing == 1',
            c.forOf.ibDeviceMissing,
            'An InfiniBand/RoCE device the node had disappeared.',
            'Device {{ $labels.device }} on {{ $labels.node }} was present before and is gone from /sys/class/infiniband.',
          ),
          c.alert(
            'FabricInfinibandPortFatal',
            c.sev.ibPortFatal,
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
            ||| % { port: c.port, down: utils.indent(ibPortDownExpr) },
            c.forOf.ibPortFatal,
            'The exporter reports an InfiniBand/RoCE port in a fatal condition.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} is fatal '
            + '(state DOWN or phys_state Disabled) and has not been ACTIVE since the exporter has watched it '
            + '(at most the last ' + c.w.ibWasActive + ').',
          ),
          c.alert(
            'FabricInfinibandDegraded',
            c.sev.ibDegraded,
            'fabric_infiniband_port_counter_breached{severity="non_fatal"} == 1',
            c.forOf.ibDegraded,
            'An InfiniBand/RoCE port counter crossed a degradation threshold.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) breached its non-fatal threshold; the link still works but is degrading.',
          ),
          c.alert(
            'FabricInfinibandPreFailureBER',
            c.sev.ibBer,
            // Judged on the hour's count alone, however the errors arrive: in bursts
            // minutes apart, across a counter cleared between them (counted() takes
            // increase() over a reset). It stays raised for the hour it describes and
            // resolves when the hour's count falls to the boundary or below: a marginal
            // cable that errors in bursts under load is what it exists to catch.
            |||
              max by (%(port)s) (
                %(hour)s
              ) > %(n)s
            ||| % {
              port: c.port,
              hour: utils.indent(ibCounterCounts('symbol_error', c.w.ibBer)),
              n: c.num(c.th.ibSymbolErrorsPerHour),
            },
            c.forOf.ibBer,
            'Symbol errors on an InfiniBand port exceed the IBTA 10^-12 bit-error-rate boundary.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} counted {{ $value | printf "%.0f" }} symbol errors in the '
            + c.w.ibBer + ' from {{ with query "vector(time() - ' + c.num(utils.seconds(c.w.ibBer)) + ')" }}{{ . | first | value | humanizeTimestamp }}{{ end }}'
            + ' to {{ with query "vector(time())" }}{{ . | first | value | humanizeTimestamp }}{{ end }} (boundary '
            + c.num(c.th.ibSymbolErrorsPerHour) + '; it resolves when that count is ' + c.num(c.th.ibSymbolErrorsPerHour)
            + ' or less): the link is likely to fail once FEC is exhausted.',
          ),
          c.alert(
            'FabricInfinibandLinkFlap',
            c.sev.ibFlap,
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
              keep: c.w.signalRecent,
              port: c.port,
              n: c.num(c.th.ibFlapDownTransitions),
              flaps: std.rstripChars(ibPortDowns(c.w.ibFlap), '\n'),
              recent: std.rstripChars(ibPortDowns(c.w.signalRecent, rose), '\n'),
            },
            c.forOf.ibFlap,
            'An InfiniBand/RoCE link keeps going down and coming back.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} went down {{ $value | printf "%.0f" }} times in the last '
            + c.w.ibFlap + ' (alert at ' + c.num(c.th.ibFlapDownTransitions) + ').',
          ),
          c.alert(
            'FabricInfinibandRepeatedDegradation',
            c.sev.ibRepeatedDegradation,
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
              port: c.port,
              events: utils.indent(counted('fabric_infiniband_port_health_events_total{severity="non_fatal"}',
                                     c.w.ibRepeatedDegradation)),
              n: c.num(c.th.ibRepeatedNonFatalEvents),
            },
            c.forOf.ibRepeatedDegradation,
            'An InfiniBand/RoCE port keeps reporting non-fatal degradation.',
            '{{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} raised {{ $value | printf "%.0f" }} non-fatal health events in the last '
            + c.w.ibRepeatedDegradation + ' (escalated at ' + c.num(c.th.ibRepeatedNonFatalEvents) + ').',
          ),
          c.alert(
            'FabricInfinibandPortAnomaly',
            c.sev.ibAnomaly,
            'fabric_infiniband_port_anomaly == 1',
            c.forOf.ibAnomaly,
            'An InfiniBand/RoCE port looks miswired or unlike its siblings.',
            'Port {{ $labels.device }}:{{ $labels.port }} on {{ $labels.node }} fails the {{ $labels.check }} check.',
          ),
          c.alert(
            'FabricInfinibandCounterSaturated',
            c.sev.ibCounterSaturated,
            saturatedCounters,
            c.forOf.ibCounterSaturated,
            'An InfiniBand port error counter stopped at its maximum and counts nothing new.',
            'Counter {{ $labels.counter }} on {{ $labels.device }}:{{ $labels.port }} ({{ $labels.node }}) is at '
            + '{{ $value | printf "%.0f" }}, the largest value its PortCounters field holds: the BER, flap and '
            + 'threshold checks on it see no new errors until it is cleared (perfquery -R); where the port has a '
            + '64-bit ethtool counter for it, the BER and flap rules keep counting from that.',
          ),
        ],
      },
    ],
  },
}
