// InfiniBand/RoCE ports: when each was last seen carrying traffic, what
// FabricInfinibandPortDown and FabricInfinibandPortFatal (alerts/infiniband.libsonnet)
// ask of "worked within the look-back".
local utils = import '../lib/utils.libsonnet';

{
  local c = utils.context($._config),

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-infiniband.rules',
        interval: c.cfg.intervals.infiniband,
        rules: [
          {
            // Now while the port is ACTIVE or ACTIVE_DEFER (the codes that carry traffic),
            // else this rule's own last value carried forward: one sample per port read
            // each cycle instead of every port's state over the whole look-back (6 h).
            // An evaluator stopped longer than the lookback delta (5 m) forgets the ports
            // that were down across it; ALERTS keeps those already firing.
            record: 'port:fabric_infiniband_port_state:last_active_timestamp',
            expr: |||
              max by (%(port)s) (timestamp(fabric_infiniband_port_state{state=~"ACTIVE|ACTIVE_DEFER"}))
              or
              port:fabric_infiniband_port_state:last_active_timestamp
            ||| % { port: c.port },
          },
        ],
      },
    ],
  },
}
