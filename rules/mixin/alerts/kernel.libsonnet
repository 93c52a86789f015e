// Kernel log: NIC/driver failures and NVIDIA Xid errors the exporter counts in the
// kernel log, fatal and non-fatal.
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-kernel.alerts',
        interval: c.cfg.intervals.kernel,
        rules: [
          c.alert(
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
            c.forOf.kernelLog,
            rule.summary,
            rule.description,
          )
          for rule in [
            {
              name: 'FabricKernelLogFatal',
              severity: c.sev.kernelLogFatal,
              metric: 'fabric_kernel_log_events_total',
              seriesSeverity: 'fatal',
              window: c.w.kernelLogFatal,
              summary: 'The kernel logged a deterministic NIC/driver failure.',
              description: '{{ $labels.source }} on {{ $labels.node }} logged "{{ $labels.pattern }}" in the last ' + c.w.kernelLogFatal + ': a fatal hardware or driver condition.',
            },
            {
              name: 'FabricKernelLogNonFatal',
              severity: c.sev.kernelLogNonFatal,
              metric: 'fabric_kernel_log_events_total',
              seriesSeverity: 'non_fatal',
              window: c.w.kernelLogNonFatal,
              summary: 'The kernel logged a NIC/driver warning.',
              description: '{{ $labels.source }} on {{ $labels.node }} logged "{{ $labels.pattern }}" in the last ' + c.w.kernelLogNonFatal + '.',
            },
            {
              name: 'FabricGpuXidFatal',
              severity: c.sev.xidFatal,
              metric: 'fabric_kernel_log_xid_events_total',
              seriesSeverity: 'fatal',
              window: c.w.kernelLogFatal,
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
              ||| % { xid: c.cfg.nvlinkXid, node: c.host },
              summary: 'The NVIDIA driver reported a critical Xid error.',
              description: 'Xid {{ $labels.xid }} on {{ $labels.node }} in the last ' + c.w.kernelLogFatal + ': the GPU needs attention before it takes work again.',
            },
            {
              name: 'FabricGpuXidNonFatal',
              severity: c.sev.xidNonFatal,
              metric: 'fabric_kernel_log_xid_events_total',
              seriesSeverity: 'non_fatal',
              window: c.w.kernelLogNonFatal,
              summary: 'The NVIDIA driver reported a non-critical Xid error.',
              description: 'Xid {{ $labels.xid }} on {{ $labels.node }} in the last ' + c.w.kernelLogNonFatal + '.',
            },
          ]
        ],
      },
    ],
  },
}
