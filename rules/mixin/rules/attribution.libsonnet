// Cross-layer attribution: rank -> GPU -> NIC port, and what is wrong along that path.
//
// Signals (docs/slow-rank-to-cable.md):
// - fabric_nccl_rank_info{comm, rank, nranks, gpu, job_id}: the GPU a local rank computes on.
// - fabric_gpu_nic_affinity_info{gpu, device, port, path}: the NIC port nearest each GPU
//   (one row per GPU, so the join on (node, gpu) is one-to-one).
// The straggler and hang alerts (alerts/nccl.libsonnet) read the location recorded here;
// their `diagnosis` annotation (lib/attribution.libsonnet) asks the port's and GPU's own
// series what is wrong along that path, only for the ranks an alert names.
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
        ],
      },
    ],
  },
}

