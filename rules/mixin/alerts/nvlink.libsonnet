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
          {
            // When the link was last seen inactive, kept for the NVLink error window and
            // only for links seen inactive in it: FabricNvlinkErrors below leaves out the
            // errors of a link that went down in that window by reading these few series,
            // recorded in the same evaluation, instead of every link's raw state over the
            // whole window (144 links a node). The range is the group's interval (a minute
            // where it is left to the global one), so every scrape is seen by an evaluation.
            record: 'gpu_link:fabric_nvlink_state:last_down_timestamp',
            expr: |||
              max by (%(link)s) (timestamp(min_over_time(fabric_nvlink_state[%(seen)s]) == 0))
              or
              gpu_link:fabric_nvlink_state:last_down_timestamp > time() - %(keep)d
            ||| % {
              link: c.link,
              seen: if c.cfg.intervals.nvlink == '' then '1m' else c.cfg.intervals.nvlink,
              keep: utils.seconds(c.w.nvlinkErrorRate),
            },
          },
          c.alert(
            'FabricNvlinkLinkDown',
            c.sev.nvlinkDown,
            |||
              fabric_nvlink_state == 0
              and on (%(link)s)
              (
                %(recent)s
              )
            ||| % {
              link: c.link,
              recent: utils.indent(utils.alertedOrWasWorking(
                'FabricNvlinkLinkDown',
                'time() - gpu_link:fabric_nvlink_state:last_active_timestamp < %d' % utils.seconds(c.w.ibWasActive)
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
            // neither while it is down nor after it is back (recorded above: when each link
            // was last seen down).
            '(\n  ' + std.join('\n  or\n  ', [
              'rate(fabric_nvlink_errors_total{type="%s"}[%s]) > %s'
              % [type, c.w.nvlinkErrorRate, c.num(c.th.nvlinkErrorRates[type])]
              for type in std.objectFields(c.th.nvlinkErrorRates)
            ]) + '\n)\nunless on (%s)\ntime() - gpu_link:fabric_nvlink_state:last_down_timestamp < %d\n'
            % [c.link, utils.seconds(c.w.nvlinkErrorRate)],
            c.forOf.nvlinkErrors,
            'An NVLink link is counting errors faster than its threshold.',
            'NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} counts {{ $value | printf "%.3g" }} {{ $labels.type }} errors per second.',
          ),
          c.alert(
            'FabricNvlinkThroughputCollapse',
            c.sev.nvlinkCollapse,
            |||
              gpu_link:fabric_nvlink_bytes:rate1m
              < %(f)s * (gpu_link:fabric_nvlink_bytes:rate30m_before > %(busy)s)
              and on (%(gpu)s)
              (gpu:fabric_nvlink_bytes:rate1m > %(gpuBusy)s)
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
