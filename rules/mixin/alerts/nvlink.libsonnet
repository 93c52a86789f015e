// NVLink: a link down after it worked, errors over their rate thresholds, and throughput
// collapsing on one link of a busy GPU (rules/nvlink.libsonnet records the rates).
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-nvlink.alerts',
        interval: c.cfg.intervals.nvlink,
        rules: [
          c.alert(
            'FabricNvlinkLinkDown',
            c.sev.nvlinkDown,
            // The exporter's sightings exist only for links with a down history (a few
            // of a fleet's), so selecting them by name reads those alone, where a value
            // filter on fabric_nvlink_state reads every link (144 a node) each evaluation.
            // Down: seen inactive since last seen active (a link never seen active has
            // no active sighting, and no alert unless it is already alerted).
            |||
              %(inactive)s
              unless on (%(link)s)
              (%(active)s >= %(inactive)s)
              and on (%(link)s)
              (
                %(recent)s
              )
            ||| % {
              link: c.link,
              active: 'fabric_nvlink_last_active_timestamp_seconds',
              inactive: 'fabric_nvlink_last_inactive_timestamp_seconds',
              recent: utils.indent(utils.alertedOrWasWorking(
                'FabricNvlinkLinkDown',
                'time() - fabric_nvlink_last_active_timestamp_seconds < %d' % utils.seconds(c.w.ibWasActive)
              )),
            },
            c.forOf.nvlinkDown,
            'An NVLink link that was active is inactive.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} is inactive after being active; '
            + 'this alert lasts until the link is active again.',
          ),
          c.alert(
            'FabricNvlinkErrors',
            c.sev.nvlinkErrors,
            // Errors counted in a window in which the link also went down are that
            // link-down incident's (the precursor errors of a failing link): they ticket
            // neither while it is down nor after it is back (the exporter's last inactive
            // sighting, which only links with a down history have).
            '(\n  ' + std.join('\n  or\n  ', [
              'rate(fabric_nvlink_errors_total{type="%s"}[%s]) > %s'
              % [type, c.w.nvlinkErrorRate, c.num(c.th.nvlinkErrorRates[type])]
              for type in std.objectFields(c.th.nvlinkErrorRates)
            ]) + '\n)\nunless on (%s)\ntime() - fabric_nvlink_last_inactive_timestamp_seconds < %d\n'
            % [c.link, utils.seconds(c.w.nvlinkErrorRate)],
            c.forOf.nvlinkErrors,
            'An NVLink link is counting errors faster than its threshold.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} counts {{ $value | printf "%.3g" }} {{ $labels.type }} errors per second.',
          ),
          c.alert(
            'FabricNvlinkThroughputCollapse',
            c.sev.nvlinkCollapse,
            |||
              gpu_link:fabric_nvlink_bytes:rate5m
              < %(f)s * (gpu_link:fabric_nvlink_bytes:rate30m_before > %(busy)s)
              and on (%(gpu)s)
              (gpu:fabric_nvlink_bytes:rate5m > %(gpuBusy)s)
            ||| % {
              f: c.num(c.th.nvlinkCollapseFraction),
              busy: c.num(c.th.nvlinkBusyBytesPerSecond),
              gpu: c.gpu,
              gpuBusy: c.num(c.th.nvlinkGpuStillBusyBytesPerSecond),
            },
            c.forOf.nvlinkCollapse,
            'Traffic on a busy NVLink link collapsed while the other links of its GPU stay busy.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} carries {{ $value | humanize }}B/s, under '
            + c.num(c.th.nvlinkCollapseFraction * 100) + '% of its average over the ' + c.w.nvlinkBaseline + ' before.',
          ),
        ],
      },
    ],
  },
}
