// NVLink throughput per link and per GPU, and each link's earlier average: what
// FabricNvlinkThroughputCollapse (alerts/nvlink.libsonnet) compares. When each link was
// last seen active and inactive is the exporter's (exporter/nvml/history.py), not a record.
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  // tx + rx bytes per second of each link: the exporter counts both directions of a
  // link in one counter (per-direction counters are an opt-in, nvlink.series: full).
  local nvlinkBytesRate(range, offset='') = |||
    sum by (%(link)s) (rate(fabric_nvlink_bytes_total[%(range)s]%(offset)s))
  ||| % { link: c.link, range: range, offset: if offset == '' then '' else ' offset ' + offset },

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-nvlink.rules',
        interval: c.cfg.intervals.nvlink,
        rules: [
          {
            // Bytes per second over one link, both directions.
            record: 'gpu_link:fabric_nvlink_bytes:rate5m',
            expr: nvlinkBytesRate(c.w.nvlinkRate),
          },
          {
            // The link's average over the 30 minutes before the current window: what
            // "busy" meant for this link before a collapse.
            // From the link's recorded 5-minute rates (one sample a minute), not its raw
            // counter over 30 minutes (2-4 samples a minute a link, 144 links a node).
            record: 'gpu_link:fabric_nvlink_bytes:rate30m_before',
            expr: 'avg_over_time(gpu_link:fabric_nvlink_bytes:rate5m[%s] offset %s)' % [c.w.nvlinkBaseline, c.w.nvlinkRate],
          },
          {
            record: 'gpu:fabric_nvlink_bytes:rate5m',
            expr: 'sum by (%s) (gpu_link:fabric_nvlink_bytes:rate5m)' % c.gpu,
          },
        ],
      },
    ],
  },
}
