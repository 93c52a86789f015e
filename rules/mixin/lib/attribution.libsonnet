// Attribution in alert annotations: where a slow or hung rank runs (node, GPU, NIC port)
// and what is wrong along that path, read from the series rules/attribution.libsonnet
// records. The straggler and hang alerts (alerts/nccl.libsonnet) carry a `diagnosis`
// annotation that names the rank's node, GPU and NIC port and whatever that port and
// that GPU's NVLinks show in the last `windows.attributionCause` (errors, flaps, a port
// not ACTIVE, NVLinks down), or says that they show nothing.
//   local attribution = (import '../lib/attribution.libsonnet')(c);  // c: utils.context
local utils = import 'utils.libsonnet';

function(c) {
  // What one port / one GPU shows, as "; <finding>" fragments, or the all-clear. `L` is
  // the template expression holding the rank's labels ($labels, or a loop variable).
  local causes(L) =
    local sel(labels) = std.join(',', ['%s="%%s"' % l for l in labels]);
    local args(labels) = std.join(' ', ['%s.%s' % [L, l] for l in labels]);
    local portQ(metric, cond) = 'query (printf `%s{%s} %s` %s)' % [metric, sel([c.cluster, c.node, 'device', 'port']), cond, args([c.cluster, c.node, 'device', 'port'])];
    local gpuQ(metric, cond) = 'query (printf `%s{%s} %s` %s)' % [metric, sel([c.cluster, c.node, 'gpu']), cond, args([c.cluster, c.node, 'gpu'])];
    local nic = '{{ %(L)s.device }} port {{ %(L)s.port }}' % { L: L };
    '{{ $found := false }}'
    + '{{ if %s.device }}' % L
    + '{{ with %s }}{{ $found = true }}; %s symbol errors {{ . | first | value | printf "%%.0f" }}/h{{ end }}'
      % [portQ('port:fabric_infiniband_symbol_errors:per_hour10m', '> 0'), nic]
    + '{{ with %s }}{{ $found = true }}; %s link went down {{ . | first | value | printf "%%.0f" }}x in %s{{ end }}'
      % [portQ('port:fabric_infiniband_down_transitions:increase10m', '>= 1'), nic, c.w.attributionCause]
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
      % [L, '{{ if %s.device }}NIC port or {{ end }}NVLinks' % L, c.w.attributionCause],

  // "rank 5 (gpu-node-1 GPU 1, mlx5_1 port 1)"
  local where(L) =
    'rank {{ %(L)s.rank }} ({{ %(L)s.%(node)s }}{{ if %(L)s.gpu }} GPU {{ %(L)s.gpu }}{{ else }}, GPU unknown{{ end }}'
    % { L: L, node: c.node }
    + '{{ if %(L)s.device }}, {{ %(L)s.device }} port {{ %(L)s.port }}{{ end }})' % { L: L },

  // An alert expression over (cluster, node, comm, rank) series, with the rank's gpu,
  // device and port (or only the `labels` asked for) added where its location is known;
  // unchanged where it is not. The node is already the rank's: every per-node panel and
  // route sees an alert that names a rank.
  locate(expr, labels=['gpu', 'device', 'port'])::
    |||
      (
        %(expr)s
      )
      * on (%(rank)s) group_left (%(labels)s)
      %(location)s
      or on (%(rank)s)
      (
        %(expr)s
      )
    ||| % {
      expr: utils.indent(expr),
      rank: c.rank,
      labels: std.join(', ', labels),
      // One series per rank whatever `labels` leaves out (a GPU's NIC is one row).
      location: if labels == ['gpu', 'device', 'port'] then 'comm_rank:fabric_nccl_rank_location:info'
                else 'max by (%s, %s) (comm_rank:fabric_nccl_rank_location:info{gpu!=""})' % [c.rank, std.join(', ', labels)],
    },

  stragglerDiagnosis::
    where('$labels') + ' enters each collective {{ $value | humanizeDuration }} later than the median rank'
    + causes('$labels') + '.',

  // Per culprit of a hung comm, with its location where known.
  hangDiagnosis(commSel, commArgs)::
    ('{{ range $i, $c := query (printf `comm_rank:fabric_nccl_hang_culprit{%(sel)s} * on (%(rank)s) group_left (gpu, device, port) '
     + 'comm_rank:fabric_nccl_rank_location:info or on (%(rank)s) comm_rank:fabric_nccl_hang_culprit{%(sel)s}` %(args)s %(args)s) '
     + '| sortByLabel "rank" }}{{ if $i }} | {{ end }}')
    % { sel: commSel, args: commArgs, rank: c.rank }
    + where('$c.Labels')
    + '{{ if eq $c.Labels.reason "not_entered" }} has not entered the collective its peers wait in'
    + '{{ else }} is stuck inside its NCCL call{{ end }}' + causes('$c.Labels')
    + '{{ else }}no culprit identified{{ end }}',
}
