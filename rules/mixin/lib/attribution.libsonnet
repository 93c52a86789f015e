// Attribution in alert annotations: where a slow or hung rank runs (node, GPU, NIC port)
// and what is wrong along that path, asked of that port's and GPU's own series. The
// straggler and hang alerts (alerts/nccl.libsonnet) carry a `diagnosis` annotation that
// names the rank's node, GPU and NIC port and whatever that port and that GPU's NVLinks show in the last `windows.attributionCause` (errors, flaps, a port
// not ACTIVE, NVLinks down), or says that they show nothing.
//   local attribution = (import '../lib/attribution.libsonnet')(c);  // c: utils.context
local utils = import 'utils.libsonnet';

function(c) {
  // What one port / one GPU shows, as "; <finding>" fragments, or the all-clear. `L` is
  // the template expression holding the rank's labels ($labels, or a loop variable).
  // Each finding is asked of the raw series of that one port or GPU when the annotation
  // is rendered (only while a straggler or hang alert is active), not recorded for every
  // port, GPU and NVLink of the fleet each cycle for the few an alert names.
  local causes(L) =
    local w = c.w.attributionCause;
    local sel(labels) = std.join(',', ['%s="%%s"' % l for l in labels]);
    local args(labels) = std.join(' ', ['%s.%s' % [L, l] for l in labels]);
    local portLabels = [c.cluster, c.node, 'device', 'port'], gpuLabels = [c.cluster, c.node, 'gpu'];
    // `expr` with {P} where the port's (or {G} the GPU's) label matchers go.
    local portQ(expr) = 'query (printf `%s` %s)' % [std.strReplace(expr, '{P}', sel(portLabels)), args(portLabels)];
    local gpuQ(expr) = 'query (printf `%s` %s)' % [std.strReplace(expr, '{G}', sel(gpuLabels)), args(gpuLabels)];
    local nic = '{{ %(L)s.device }} port {{ %(L)s.port }}' % { L: L };
    '{{ $found := false }}'
    + '{{ if %s.device }}' % L
    + '{{ with %s }}{{ $found = true }}; %s symbol errors {{ . | first | value | printf "%%.0f" }}/h{{ end }}'
      % [portQ('max(rate(fabric_infiniband_port_counter_total{counter="symbol_error",{P}}[%s])) * 3600 > 0' % w), nic]
    // Times the link went down: the exporter's own ACTIVE -> not ACTIVE count, or the
    // port's link_downed counter, whichever saw more.
    + '{{ with %s }}{{ $found = true }}; %s link went down {{ . | first | value | printf "%%.0f" }}x in %s{{ end }}'
      % [portQ('max(increase(fabric_infiniband_port_down_transitions_total{{P}}[%(w)s]) or increase(fabric_infiniband_port_counter_total{counter="link_downed",{P}}[%(w)s])) >= 1' % { w: w }), nic, w]
    // Not ACTIVE/ACTIVE_DEFER (codes 4, 5).
    + '{{ with %s }}{{ $found = true }}; %s is not ACTIVE now{{ end }}'
      % [portQ('max(fabric_infiniband_port_state{{P}}) < 4'), nic]
    + '{{ end }}'
    + '{{ if %s.gpu }}' % L
    + '{{ with %s }}{{ $found = true }}; GPU {{ %s.gpu }} NVLink errors {{ . | first | value | printf "%%.3g" }}/s{{ end }}'
      % [gpuQ('sum(rate(fabric_nvlink_errors_total{{G}}[%s])) > 0' % w), L]
    + '{{ with %s }}{{ $found = true }}; GPU {{ %s.gpu }} has {{ . | first | value | printf "%%.0f" }} NVLink(s) down{{ end }}'
      % [gpuQ('count(fabric_nvlink_state{{G}} == 0)'), L]
    + '{{ end }}'
    // The all-clear only where something was looked at: a rank of unknown GPU says so in where().
    + '{{ if and (not $found) %s.gpu }}; no errors, flaps or down links on its %s in the last %s{{ end }}'
      % [L, '{{ if %s.device }}NIC port or {{ end }}NVLinks' % L, w],

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
