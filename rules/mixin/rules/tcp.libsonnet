// TCP RTT excess: its p99 per host and the rolling baseline a microburst is judged
// against (alerts/tcp.libsonnet).
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-tcp.rules',
        interval: c.cfg.intervals.tcp,
        rules: [
          {
            // p99 of the RTT excess (each sample minus its connection's min RTT: the
            // queueing above the path's floor) per host over the rate window. Not smoothed
            // RTT: on a request/response server that measured the clients' think time
            // (docs/ebpf.md). Hosts with no samples in the window get no value (rather
            // than NaN), so the rolling average below is taken over real measurements only.
            record: 'node:fabric_tcp_rtt_excess_seconds:p99_1m',
            // The quantile is taken of each scraped histogram (one a host) and only its
            // result is grouped by host: aggregating the buckets first (sum by le) hashed
            // every bucket series (123 a host) every 10 s for the same answer.
            expr: |||
              max by (%(host)s) (histogram_quantile(0.99, rate(fabric_tcp_rtt_excess_seconds_bucket[%(w)s])))
              and on (%(host)s)
              (sum by (%(host)s) (rate(fabric_tcp_rtt_excess_seconds_count[%(w)s])) > 0)
            ||| % { host: c.host, w: c.w.tcpRate },
          },
          {
            // The baseline a burst is compared with: the average p99 over the 5 minutes
            // *before* the current rate window, so a burst never inflates its own
            // baseline (p99 > 3× the rolling 5-minute average).
            record: 'node:fabric_tcp_rtt_excess_seconds_p99:avg5m',
            expr: 'avg_over_time(node:fabric_tcp_rtt_excess_seconds:p99_1m[%s] offset %s)'
                  % [c.w.tcpBaseline, c.w.tcpRate],
          },
        ],
      },
    ],
  },
}
