// Alerting rules, one file per area; each alert is built by lib/utils.libsonnet's
// alert(). Groups render in the order of this list.
(import 'tcp.libsonnet')
+ (import 'infiniband.libsonnet')
+ (import 'nvlink.libsonnet')
+ (import 'kernel.libsonnet')
+ (import 'pipeline.libsonnet')
+ (import 'nccl.libsonnet')
