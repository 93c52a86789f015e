// Recording rules, one file per area: level:metric:operations. Names are fixed
// (dashboards, the query sidecar and the alerts read them); the windows behind them come
// from _config and the defaults are the ones the names spell out. Groups render in the
// order of this list.
(import 'tcp.libsonnet')
+ (import 'nvlink.libsonnet')
+ (import 'infiniband.libsonnet')
+ (import 'nccl.libsonnet')
+ (import 'attribution.libsonnet')
