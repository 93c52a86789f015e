// Cross-layer attribution: rank -> GPU -> NIC port, and what is wrong along that path.
//
// Signals (docs/slow-rank-to-cable.md):
// - fabric_nccl_rank_info{comm, rank, nranks, gpu, job_id}: the GPU a local rank computes on.
// - fabric_gpu_nic_affinity_info{gpu, device, port, path}: the NIC port nearest each GPU
//   (one row per GPU, so the join on (node, gpu) is one-to-one).
// The straggler and hang alerts (nccl.libsonnet) read the location recorded here, and
// their `diagnosis` annotation names the rank's node, GPU and NIC port and whatever that
// port and that GPU's NVLinks show in the last `windows.attributionCause` (errors, flaps,
// a port not ACTIVE, NVLinks down), or says that they show nothing.
local util = import 'util.libsonnet';

{
  local cfg = $._config,
  local w = cfg.windows,
  local by = function(labels) util.by(cfg, labels),
  local node = cfg.nodeLabel,
  local cluster = cfg.clusterLabel,
  local rankBy = by([node, 'comm', 'rank']),
  local portBy = by([node, 'device', 'port']),
  local gpuBy = by([node, 'gpu']),

  // What one port / one GPU shows, as "; <finding>" fragments, or the all-clear. `L` is
  // the template expression holding the rank's labels ($labels, or a loop variable).
  local causes(L) =
    local sel(labels) = std.join(',', ['%s="%%s"' % l for l in labels]);
    local args(labels) = std.join(' ', ['%s.%s' % [L, l] for l in labels]);
    local portQ(metric, cond) = 'query (printf `%s{%s} %s` %s)' % [metric, sel([cluster, node, 'device', 'port']), cond, args([cluster, node, 'device', 'port'])];
    local gpuQ(metric, cond) = 'query (printf `%s{%s} %s` %s)' % [metric, sel([cluster, node, 'gpu']), cond, args([cluster, node, 'gpu'])];
    local nic = '{{ %(L)s.device }} port {{ %(L)s.port }}' % { L: L };
    '{{ $found := false }}'
    + '{{ if %s.device }}' % L
    + '{{ with %s }}{{ $found = true }}; %s symbol errors {{ . | first | value | printf "%%.0f" }}/h{{ end }}'
      % [portQ('port:fabric_infiniband_symbol_errors:per_hour10m', '> 0'), nic]
    + '{{ with %s }}{{ $found = true }}; %s link went down {{ . | first | value | printf "%%.0f" }}x in %s{{ end }}'
      % [portQ('port:fabric_infiniband_down_transitions:increase10m', '>= 1'), nic, w.attributionCause]
    + '{{ with %s }}{{ $found = true }}; %s is not ACTIVE now{{ end }}'
      % [portQ('port:fabric_infiniband_port_state:not_active', '== 1'), nic]
    + '{{ end }}'
    + '{{ if %s.gpu }}' % L
    + '{{ with %s }}{{ $found = true }}; GPU {{ %s.gpu }} NVLink errors {{ . | first | value | printf "%%.3g" }}/s{{ end }}'
      % [gpuQ('gpu:fabric_nvlink_errors:rate10m', '> 0'), L]
    + '{{ with %s }}{{ $found = true }}; GPU {{ %s.gpu }} has {{ . | first | value | printf "%%.0f" }} NVLink(s) down{{ end }}'
      % [gpuQ('gpu:fabric_nvlink_links_down:count', '> 0'), L]
    + '{{ end }}'
    // The all-clear only where something was looked at: a rank of unknown GPU says so in where().
    + '{{ if and (not $found) %s.gpu }}; no errors, flaps or down links on its %s in the last %s{{ end }}'
      % [L, '{{ if %s.device }}NIC port or {{ end }}NVLinks' % L, w.attributionCause],

  // "rank 5 (gpu-node-1 GPU 1, mlx5_1 port 1)"
  local where(L) =
    'rank {{ %(L)s.rank }} ({{ %(L)s.%(node)s }}{{ if %(L)s.gpu }} GPU {{ %(L)s.gpu }}{{ else }}, GPU unknown{{ end }}'
    % { L: L, node: node }
    + '{{ if %(L)s.device }}, {{ %(L)s.device }} port {{ %(L)s.port }}{{ end }})' % { L: L },

  _attribution:: {
    // An alert expression over (cluster, node, comm, rank) series, with the rank's gpu,
    // device and port added where its location is known; unchanged where it is not.
    locate(expr)::
      |||
        (
          %(expr)s
        )
        * on (%(rank)s) group_left (gpu, device, port)
        comm_rank:fabric_nccl_rank_location:info
        or on (%(rank)s)
        (
          %(expr)s
        )
      ||| % { expr: std.strReplace(std.rstripChars(expr, '\n'), '\n', '\n  '), rank: rankBy },

    stragglerDiagnosis:
      where('$labels') + ' enters each collective {{ $value | humanizeDuration }} later than the median rank'
      + causes('$labels') + '.',

    // Per culprit of a hung comm, with its location where known.
    hangDiagnosis(commSel, commArgs)::
      ('{{ range $i, $c := query (printf `comm_rank:fabric_nccl_hang_culprit{%(sel)s} * on (%(rank)s) group_left (gpu, device, port) '
       + 'comm_rank:fabric_nccl_rank_location:info or on (%(rank)s) comm_rank:fabric_nccl_hang_culprit{%(sel)s}` %(args)s %(args)s) '
       + '| sortByLabel "rank" }}{{ if $i }} | {{ end }}')
      % { sel: commSel, args: commArgs, rank: rankBy }
      + where('$c.Labels')
      + '{{ if eq $c.Labels.reason "not_entered" }} has not entered the collective its peers wait in'
      + '{{ else }} is stuck inside its NCCL call{{ end }}' + causes('$c.Labels')
      + '{{ else }}no culprit identified{{ end }}',
  },

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-attribution.rules',
        interval: cfg.intervals.nccl,
        rules: [
          {
            // Each local rank with its GPU and, where the GPU has one, its nearest NIC
            // port (path: same_switch ... cross_socket); ranks of unknown GPU keep gpu="".
            record: 'comm_rank:fabric_nccl_rank_location:info',
            expr: |||
              max by (%(rankGpu)s) (fabric_nccl_rank_info{gpu!=""})
              * on (%(gpu)s) group_left (device, port, path)
              max by (%(gpuNic)s) (fabric_gpu_nic_affinity_info)
              or on (%(rank)s)
              max by (%(rankGpu)s) (fabric_nccl_rank_info)
            ||| % {
              rankGpu: by([node, 'comm', 'rank', 'gpu', 'job_id']),
              gpu: gpuBy,
              gpuNic: by([node, 'gpu', 'device', 'port', 'path']),
              rank: rankBy,
            },
          },
          {
            // Symbol errors per hour over the recent window (the BER alert judges an hour).
            record: 'port:fabric_infiniband_symbol_errors:per_hour10m',
            expr: 'max by (%s) (rate(fabric_infiniband_port_counter_total{counter="symbol_error"}[%s])) * 3600'
                  % [portBy, w.attributionCause],
          },
          {
            // Times the link went down: the exporter's own ACTIVE -> not ACTIVE count, or
            // the port's link_downed counter, whichever saw more.
            record: 'port:fabric_infiniband_down_transitions:increase10m',
            expr: |||
              max by (%(port)s) (
                increase(fabric_infiniband_port_down_transitions_total[%(w)s])
                or
                increase(fabric_infiniband_port_counter_total{counter="link_downed"}[%(w)s])
              )
            ||| % { port: portBy, w: w.attributionCause },
          },
          {
            // 1 while the port is not ACTIVE/ACTIVE_DEFER (codes 4, 5).
            record: 'port:fabric_infiniband_port_state:not_active',
            expr: 'max by (%s) (fabric_infiniband_port_state) < bool 4' % portBy,
          },
          {
            record: 'gpu:fabric_nvlink_errors:rate10m',
            expr: 'sum by (%s) (rate(fabric_nvlink_errors_total[%s]))' % [gpuBy, w.attributionCause],
          },
          {
            record: 'gpu:fabric_nvlink_links_down:count',
            expr: 'count by (%s) (fabric_nvlink_state == 0)' % gpuBy,
          },
        ],
      },
    ],
  },
}
