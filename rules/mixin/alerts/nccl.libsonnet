// NCCL alerts: a hung communicator, a stalled rank, a node whose clock will not settle,
// straggler nodes and ranks. The signals and the rules they read: rules/nccl.libsonnet;
// the culprit's location and diagnosis: lib/attribution.libsonnet.
local utils = import '../lib/utils.libsonnet';
local attributionOf = import '../lib/attribution.libsonnet';
local hangOf = import '../lib/nccl_hang.libsonnet';
local joinOf = import '../lib/nccl_join.libsonnet';

{
  local c = utils.context($._config),
  local attribution = attributionOf(c),
  local hang = hangOf(c),
  local join = joinOf(c),

  // Query templates in annotations select one comm of one cluster.
  local commSel = c.cluster + '="%s",comm="%s"',
  local commArgs = '$labels.' + c.cluster + ' $labels.comm',

  local culpritList = |||
    {{ range $i, $c := printf `comm_rank:fabric_nccl_hang_culprit{%(sel)s}` %(args)s | query | sortByLabel "rank" }}{{ if $i }}, {{ end }}rank {{ $c.Labels.rank }} on {{ $c.Labels.%(node)s }} ({{ $c.Labels.reason }}){{ else }}none identified{{ end }}
  ||| % { sel: commSel, args: commArgs, node: c.node },
  local waitingCount = |||
    {{ with printf `count(comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging{%(sel)s} unless on (%(rank)s) comm_rank:fabric_nccl_hang_culprit)` %(args)s | query }}{{ . | first | value }}{{ else }}0{{ end }}
  ||| % { sel: commSel, args: commArgs, rank: c.by(['comm', 'rank']) },
  local stepShare(metric, labels) =
    '{{ with printf `%s{%s}` %s | query }}{{ . | first | value | humanizePercentage }}{{ end }}'
    % [metric, std.join(',', [l + '="%s"' for l in labels]), std.join(' ', ['$labels.' + l for l in labels])],

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'fabric-nccl.alerts',
        interval: c.cfg.intervals.nccl,
        // The cross-node join first (lib/nccl_join.libsonnet): FabricNcclStragglerNode below
        // reads what it records in the same evaluation.
        rules: join.rules + [
          c.alert(
            'FabricNcclHang',
            c.sev.ncclHang,
            // One alert per culprit rank, named by its node and GPU so that the node's
            // health and drill-downs show the hang (the communicator is still one
            // incident: Alertmanager groups NCCL alerts by comm); one alert for the
            // communicator, without a node, while no culprit is identified. The value
            // is the longest elapsed time among its ranks. Both judgements are evaluated
            // here from the exporters' series (lib/nccl_hang.libsonnet), not read from
            // their recorded copies: the for: starts one recording-group interval sooner.
            local hung = 'max by (%s) (\n  %s\n)' % [c.comm, utils.indent(hang.hanging)];
            attribution.locate(|||
              %(hung)s
              * on (%(comm)s) group_right ()
              max by (%(rank)s) (
                %(culprit)s
              )
            ||| % { hung: hung, comm: c.comm, rank: c.rank,
                    culprit: utils.indent(hang.culprit(hang.hanging)) },
            labels=['gpu'])
            + 'or on (%s)\n' % c.comm + hung + '\n',
            c.forOf.ncclHang,
            'An NCCL communicator is hung: its collectives have been in flight far longer than their recent average.',
            'Comm {{ $labels.comm }} has been hung for {{ $value | humanizeDuration }} (more than '
            + "the exporter's hang_multiplier x the average of its recent completed operations): "
            + std.rstripChars(waitingCount, '\n') + ' rank(s) waiting for ' + std.rstripChars(culpritList, '\n') + '.',
            annotations={
              culprit: std.rstripChars(culpritList, '\n'),
              diagnosis: attribution.hangDiagnosis(commSel, commArgs),
            },
          ),
        ] + [
          c.alert(
            'FabricNcclRankStalled',
            tier.severity,
            // Located: the rank's GPU is added where known.
            attribution.locate(|||
              (time() - comm_rank:fabric_nccl_last_call_timestamp_seconds:max) > %(stalled)s
              and on (%(comm)s)
              (time() - comm:fabric_nccl_last_call_timestamp_seconds:max) < %(peers)s
            ||| % { stalled: c.num(tier.seconds), comm: c.comm, peers: c.num(c.th.ncclPeersActiveSeconds) },
            labels=['gpu']),
            c.forOf.ncclRankStalled,
            'An NCCL rank stopped issuing collectives while the other ranks of its communicator continue.',
            'Rank {{ $labels.rank }} of comm {{ $labels.comm }} on {{ $labels.node }} has issued no NCCL call for '
            + '{{ $value | humanizeDuration }} (alert at ' + c.num(tier.seconds)
            + 's) while other ranks of the communicator called within the last '
            + c.num(c.th.ncclPeersActiveSeconds) + 's.',
          )
          for tier in [
            { severity: c.sev.ncclRankStalled, seconds: c.th.ncclRankStalledSeconds },
            { severity: c.sev.ncclRankStalledCritical, seconds: c.th.ncclRankStalledCriticalSeconds },
          ]
        ] + [
          c.alert(
            'FabricNcclNodeClockUnsettled',
            c.sev.ncclClockUnsettled,
            // The node's clock provably moved forward against Prometheus' (a recent scrape's
            // lower bound on its offset above an older scrape's upper bound), and keeps doing
            // so (stepped again and again, or slewing): its offset estimate is stale, and the
            // late-node judgement leaves it out. Slow or uneven scrapes cannot raise it
            // (rules/nccl.libsonnet, "clocks"): nodes sharing one clock never alert.
            'node:fabric_nccl_clock_offset_seconds:moved > %s' % c.num(c.th.ncclClockOffsetMaxStepSeconds),
            c.forOf.ncclClockUnsettled,
            "A node's clock keeps moving against Prometheus': late nodes are not judged on it.",
            'The clock of {{ $labels.node }} moved at least {{ $value | humanizeDuration }} against Prometheus\' within '
            + c.w.ncclClockOffset + ' (more than ' + c.num(c.th.ncclClockOffsetMaxStepSeconds * 1000) + ' ms): '
            + 'FabricNcclStragglerNode does not judge this node until its clock settles.',
          ),
          c.alert(
            'FabricNcclStragglerNode',
            c.sev.straggler,
            // Every rank of the node enters late against the comm's earliest rank
            // elsewhere, on the latest join (recorded above in this evaluation): the for:
            // holds it to account, a single late join is only pending. The floor is above
            // what NTP keeps between nodes.
            |||
              comm_node:fabric_nccl_arrival_offset_seconds:last > %(abs)s
              and
              comm_node:fabric_nccl_arrival_offset:step_share1m > %(share)s
            ||| % { abs: c.num(c.th.stragglerNodeMinOffsetSeconds), share: c.num(c.th.stragglerMinStepShare) },
            c.forOf.straggler,
            'Every NCCL rank on one node enters its collectives late: the whole job waits for this node.',
            'The ranks of comm {{ $labels.comm }} on {{ $labels.node }} enter each collective {{ $value | humanizeDuration }} '
            + 'after the earliest rank elsewhere (the latest join of their sequence boundaries); every step waits that long: '
            + stepShare('comm_node:fabric_nccl_arrival_offset:step_share1m', [c.cluster, 'comm', c.node])
            + ' of the job\'s time.',
          ),
          c.alert(
            'FabricNcclStragglerRank',
            c.sev.straggler,
            // Late against the comm's median rank by many median absolute deviations,
            // by more than the floors, in a cohort of enough ranks; a late node is
            // FabricNcclStragglerNode, not one alert per rank.
            // Located: the rank's gpu, device and port labels are added where known
            // (lib/attribution.libsonnet), so Alertmanager groups it with its NIC's alerts.
            attribution.locate(|||
              comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m
                > on (%(comm)s) group_left ()
              (%(k)s * comm:fabric_nccl_arrival_lag_seconds:mad1m)
              and
              comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m > %(abs)s
              and
              comm_rank:fabric_nccl_arrival_lag:step_share1m > %(share)s
              and on (%(comm)s)
              (comm:fabric_nccl_arrival_lag_seconds:ranks1m >= %(ranks)s)
              unless on (%(node)s)
              (
                comm_node:fabric_nccl_arrival_offset_seconds:last > %(nodeAbs)s
                and
                comm_node:fabric_nccl_arrival_offset:step_share1m > %(share)s
              )
            ||| % {
              comm: c.comm,
              node: c.commNode,
              k: c.num(c.th.stragglerMadMultiplier),
              abs: c.num(c.th.stragglerMinDeviationSeconds),
              share: c.num(c.th.stragglerMinStepShare),
              ranks: c.num(c.th.stragglerMinRanks),
              nodeAbs: c.num(c.th.stragglerNodeMinOffsetSeconds),
            }),
            c.forOf.straggler,
            'One NCCL rank enters its collectives late: every other rank of the communicator waits for it.',
            'Rank {{ $labels.rank }} ({{ $labels.node }}) of comm {{ $labels.comm }} enters each collective '
            + '{{ $value | humanizeDuration }} later than the median rank (mean over ' + c.w.ncclLag + '); its peers wait '
            + 'that long every time: '
            + stepShare('comm_rank:fabric_nccl_arrival_lag:step_share1m', [c.cluster, 'comm', 'rank'])
            + ' of the job\'s step time.',
            annotations={ diagnosis: attribution.stragglerDiagnosis },
          ),
        ],
      },
    ],
  },
}

