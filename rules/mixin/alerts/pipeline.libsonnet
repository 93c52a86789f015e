// The monitoring pipeline itself: exporter targets down, collectors failing, eBPF lost,
// rule groups evaluated late.
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-pipeline.alerts',
        interval: c.cfg.intervals.pipeline,
        rules: [
          c.alert(
            'FabricExporterDown',
            c.sev.exporterDown,
            '%s == 0' % utils.selector('up', c.cfg.selectors.exporter),
            c.forOf.exporterDown,
            'Prometheus cannot scrape the fabricscope exporter of a node.',
            'The exporter target {{ $labels.instance }} ({{ $labels.node }}) has been down for ' + c.forOf.exporterDown
            + ': fabric faults on that node go unseen.',
          ),
          c.alert(
            'FabricCollectorFailing',
            c.sev.collectorFailing,
            'fabric_scrape_collector_success == 0',
            c.forOf.collectorFailing,
            'A fabricscope collector fails on every scrape.',
            'Collector {{ $labels.collector }} on {{ $labels.node }} has failed for ' + c.forOf.collectorFailing
            + '; its metrics are missing.',
          ),
          c.alert(
            'FabricEbpfUnavailable',
            c.sev.ebpfUnavailable,
            // Nothing attached at all; a node where some programs still serve is
            // FabricEbpfProgramNotAttached's.
            |||
              fabric_ebpf_available == 0
              and ignoring (reason)
              (max_over_time(fabric_ebpf_available[%s]) == 1)
              unless on (cluster, job, node)
              (fabric_ebpf_program_attached == 1)
            ||| % c.w.ebpfWasAvailable,
            c.forOf.ebpfUnavailable,
            'eBPF telemetry stopped on a node where it was working.',
            'eBPF on {{ $labels.node }} is unavailable ({{ $labels.reason }}) after working within the last '
            + c.w.ebpfWasAvailable + ': TCP RTT, scheduler and NCCL uprobe metrics are missing.',
          ),
          c.alert(
            'FabricEbpfProgramNotAttached',
            c.sev.ebpfProgramNotAttached,
            // The reason is fabric_ebpf_available's (the first detached program's); the
            // exporter's log names each program's own.
            |||
              (fabric_ebpf_program_attached == 0)
              + on (cluster, job, node) group_left (reason)
              (0 * (fabric_ebpf_available == 0))
            |||,
            c.forOf.ebpfProgramNotAttached,
            'A declared eBPF program is not attached while others on the node serve.',
            'eBPF program {{ $labels.program }} on {{ $labels.node }} is not attached ({{ $labels.reason }}) '
            + 'for ' + c.forOf.ebpfProgramNotAttached + ': the metrics it feeds are missing there.',
          ),
          c.alert(
            'FabricRuleGroupIterationsMissed',
            c.sev.ruleGroupMissed,
            'increase(%s[%s]) > 0'
            % [utils.selector('prometheus_rule_group_iterations_missed_total', c.cfg.selectors.prometheus), c.w.ruleGroupMissed],
            c.forOf.ruleGroupMissed,
            'Prometheus skipped rule-group evaluations because they took longer than their interval.',
            'Rule group {{ $labels.rule_group }} on {{ $labels.instance }} missed {{ $value | printf "%.0f" }} evaluations in the last '
            + c.w.ruleGroupMissed + '; detection there is running late.',
          ),
        ],
      },
    ],
  },
}
