// TCP microbursts: the p99 RTT excess far above its own recent baseline
// (rules/tcp.libsonnet records both).
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  // The warning tier stands down while the critical tier is raised: both are held by
  // keep_firing_for after the burst, and a warning outliving the critical by a few
  // evaluations would notify a burst that is already over (an inhibition only holds
  // while its source fires).
  local microburst(multiplier, severity, unlessTier=null) = c.alert(
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
    ||| % { host: c.host, m: c.num(multiplier), floor: c.num(c.th.microburstMinP99Seconds) }
    + (if unlessTier == null then '' else |||
      unless on (%(host)s)
      ALERTS{alertname="FabricTcpMicroburst", severity="%(tier)s"}
    ||| % { host: c.host, tier: unlessTier }),
    c.forOf.microburst,
    'TCP round-trip latency on a GPU node jumped far above its recent baseline.',
    'p99 TCP RTT excess (queueing above each connection\'s min RTT) on {{ $labels.node }} is {{ printf "%.2f" $value }}x its average over the previous '
    + c.w.tcpBaseline + ' (alert at ' + c.num(multiplier) + 'x; p99 above '
    + c.num(c.th.microburstMinP99Seconds) + 's).',
    keepFiringFor=c.cfg.keepFiringFor.microburst,
  ),

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-tcp.alerts',
        interval: c.cfg.intervals.tcp,
        rules: [
          microburst(c.th.microburstMultiplier, c.sev.microburst, unlessTier=c.sev.microburstCritical),
          microburst(c.th.microburstCriticalMultiplier, c.sev.microburstCritical),
        ],
      },
    ],
  },
}
