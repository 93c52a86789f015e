// TCP RTT excess: its p99 per host and the rolling baseline a microburst is judged
// against (alerts/tcp.libsonnet).
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),
  // The exporter's p99 window (exporter/bpf/tcp.yaml): the record's name says p99.
  local win = $._exporterWindows.tcpRttExcess,

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-tcp.rules',
        interval: c.cfg.intervals.tcp,
        rules: [
          {
            // p99 of the RTT excess (each sample minus its connection's min RTT: the
            // queueing above the path's floor) per host over the exporter's window. Not
            // smoothed RTT: on a request/response server that measured the clients' think
            // time (docs/ebpf.md). The exporter computes it from its histogram (what
            // histogram_quantile over rate(..._bucket[window]) answered) and exports one
            // gauge: the rule selects one series a host instead of 122 bucket series and the count.
            // Hosts with no samples in the window have no gauge, so get no value (rather
            // than NaN), and the rolling average below is taken over real measurements only.
            record: 'node:fabric_tcp_rtt_excess_seconds:p99_1m',
            expr:
              assert win.quantile == '0.99' : "the p99 record needs the exporter's 0.99 quantile, got " + win.quantile;
              |||
                max by (%(host)s) (%(gauge)s{quantile="%(q)s"})
              ||| % { host: c.host, gauge: win.gauge, q: win.quantile },
          },
          {
            // The baseline a burst is compared with: the average p99 over the 5 minutes
            // *before* the current window, so a burst never inflates its own baseline
            // (p99 > 3× the rolling 5-minute average).
            record: 'node:fabric_tcp_rtt_excess_seconds_p99:avg5m',
            expr: 'avg_over_time(node:fabric_tcp_rtt_excess_seconds:p99_1m[%s] offset %s)'
                  % [c.w.tcpBaseline, utils.duration(win.seconds)],
          },
        ],
      },
    ],
  },
}
