// Recording rules: level:metric:operations. Names are fixed (dashboards, the query
// sidecar and the alerts read them); the windows behind them come from _config and the
// defaults are the ones the names spell out.
local util = import 'util.libsonnet';

{
  local cfg = $._config,
  local by = function(labels) util.by(cfg, labels),

  // tx + rx bytes per second of each link: the exporter counts both directions of a
  // link in one counter (per-direction counters are an opt-in, nvlink.series: full).
  local nvlinkBytesRate(range, offset='') = |||
    sum by (%(link)s) (rate(fabric_nvlink_bytes_total[%(range)s]%(offset)s))
  ||| % { link: by([cfg.nodeLabel, 'gpu', 'link']), range: range, offset: if offset == '' then '' else ' offset ' + offset },

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-tcp.rules',
        interval: cfg.intervals.tcp,
        rules: [
          {
            // p99 of the RTT excess (each sample minus its connection's min RTT: the
            // queueing above the path's floor) per host over the rate window. Not smoothed
            // RTT: on a request/response server that measured the clients' think time
            // (docs/ebpf.md). Hosts with no samples in the window get no value (rather
            // than NaN), so the rolling average below is taken over real measurements only.
            record: 'node:fabric_tcp_rtt_excess_seconds:p99_1m',
            expr: |||
              histogram_quantile(0.99, sum by (%(le)s) (rate(fabric_tcp_rtt_excess_seconds_bucket[%(w)s])))
              and on (%(host)s)
              (sum by (%(host)s) (rate(fabric_tcp_rtt_excess_seconds_count[%(w)s])) > 0)
            ||| % { le: by([cfg.nodeLabel, 'le']), host: by([cfg.nodeLabel]), w: cfg.windows.tcpRate },
          },
          {
            // The baseline a burst is compared with: the average p99 over the 5 minutes
            // *before* the current rate window, so a burst never inflates its own
            // baseline (p99 > 3× the rolling 5-minute average).
            record: 'node:fabric_tcp_rtt_excess_seconds_p99:avg5m',
            expr: 'avg_over_time(node:fabric_tcp_rtt_excess_seconds:p99_1m[%s] offset %s)'
                  % [cfg.windows.tcpBaseline, cfg.windows.tcpRate],
          },
        ],
      },
      {
        name: 'fabric-nvlink.rules',
        interval: cfg.intervals.nvlink,
        rules: [
          {
            // Bytes per second over one link, both directions.
            record: 'gpu_link:fabric_nvlink_bytes:rate5m',
            expr: nvlinkBytesRate(cfg.windows.nvlinkRate),
          },
          {
            // The link's average over the 30 minutes before the current window: what
            // "busy" meant for this link before a collapse.
            record: 'gpu_link:fabric_nvlink_bytes:rate30m_before',
            expr: nvlinkBytesRate(cfg.windows.nvlinkBaseline, cfg.windows.nvlinkRate),
          },
          {
            record: 'gpu:fabric_nvlink_bytes:rate5m',
            expr: 'sum by (%s) (gpu_link:fabric_nvlink_bytes:rate5m)' % by([cfg.nodeLabel, 'gpu']),
          },
        ],
      },
    ],
  },
}
