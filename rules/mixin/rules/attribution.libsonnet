// Cross-layer attribution: rank -> GPU -> NIC port, and what is wrong along that path.
//
// Signals (docs/slow-rank-to-cable.md):
// - fabric_nccl_rank_info{comm, rank, nranks, gpu, job_id}: the GPU a local rank computes on.
// - fabric_gpu_nic_affinity_info{gpu, device, port, path}: the NIC port nearest each GPU
//   (one row per GPU, so the join on (node, gpu) is one-to-one).
// The straggler and hang alerts (alerts/nccl.libsonnet) read the location recorded here,
// and their `diagnosis` annotation (lib/attribution.libsonnet) reads the rest.
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-attribution.rules',
        interval: c.cfg.intervals.nccl,
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
              rankGpu: c.by([c.node, 'comm', 'rank', 'gpu', 'job_id']),
              gpu: c.gpu,
              gpuNic: c.by([c.node, 'gpu', 'device', 'port', 'path']),
              rank: c.rank,
            },
          },
          {
            // Symbol errors per hour over the recent window (the BER alert judges an hour).
            record: 'port:fabric_infiniband_symbol_errors:per_hour10m',
            expr: 'max by (%s) (rate(fabric_infiniband_port_counter_total{counter="symbol_error"}[%s])) * 3600'
                  % [c.port, c.w.attributionCause],
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
            ||| % { port: c.port, w: c.w.attributionCause },
          },
          {
            // 1 while the port is not ACTIVE/ACTIVE_DEFER (codes 4, 5).
            record: 'port:fabric_infiniband_port_state:not_active',
            expr: 'max by (%s) (fabric_infiniband_port_state) < bool 4' % c.port,
          },
          {
            record: 'gpu:fabric_nvlink_errors:rate10m',
            expr: 'sum by (%s) (rate(fabric_nvlink_errors_total[%s]))' % [c.gpu, c.w.attributionCause],
          },
          {
            record: 'gpu:fabric_nvlink_links_down:count',
            expr: 'count by (%s) (fabric_nvlink_state == 0)' % c.gpu,
          },
        ],
      },
    ],
  },
}

