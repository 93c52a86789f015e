// The cross-node join behind FabricNcclStragglerNode, as recording rules that the NCCL
// alert group evaluates ahead of the alert (alerts/nccl.libsonnet): Prometheus evaluates a
// group's rules in order at one timestamp, and a later rule reads what the earlier ones
// recorded in that evaluation, so a join that shows a late node is judged at once, not one
// group interval later (docs/nccl.md, "Across nodes, measured").
//   local join = (import '../lib/nccl_join.libsonnet')(c);  // c: utils.context
// Signals (docs/nccl.md, "Across nodes"): fabric_nccl_sequence_boundary{,_entry_timestamp_seconds}
// per rank, each node's clock offset against Prometheus' (rules/nccl.libsonnet, "clocks").

function(c) {
  rules: [
    {
      // Cross-node join: each rank's entry into the same boundary op, on
      // Prometheus' clock (its node's offset taken out), minus the comm's
      // earliest, taken only when every reporting rank is at the same boundary
      // (scrapes of different nodes land at different times).
      record: 'comm_rank:fabric_nccl_sequence_boundary_lag_seconds',
      expr: |||
        (
          max by (%(rank)s) (fabric_nccl_sequence_boundary_entry_timestamp_seconds)
          - on (%(nodeOnly)s) group_left
          node:fabric_nccl_clock_offset_seconds:settled
        )
        - on (%(comm)s) group_left
        min by (%(comm)s) (
          max by (%(rank)s) (fabric_nccl_sequence_boundary_entry_timestamp_seconds)
          - on (%(nodeOnly)s) group_left
          node:fabric_nccl_clock_offset_seconds:settled
        )
        and on (%(comm)s)
        (max by (%(comm)s) (fabric_nccl_sequence_boundary) == min by (%(comm)s) (fabric_nccl_sequence_boundary))
        and on (%(comm)s)
        (count by (%(comm)s) (fabric_nccl_sequence_boundary) > 1)
      ||| % { rank: c.rank, comm: c.comm, nodeOnly: c.host },
    },
    {
      // How late a node's earliest rank enters, against the comm's earliest rank
      // anywhere: 0 for the first node; for others, what is left of their clocks'
      // disagreement after the offsets are taken out (docs/nccl.md measures it).
      // A node whose clock is not settled has no boundary lag, so is not judged.
      record: 'comm_node:fabric_nccl_arrival_offset_seconds',
      expr: 'min by (%s) (comm_rank:fabric_nccl_sequence_boundary_lag_seconds)' % c.commNode,
    },
    {
      // The least over the window of the evaluations where the boundaries lined up:
      // a node late on every step is late on every join, while a busy node's
      // scheduling delays (one-sided: they only ever make a rank later) come and go.
      // What the node adds to its ranks' lag (comm_rank:...:mean1m, rules/nccl.libsonnet);
      // FabricNcclStragglerNode reads the latest join (:last), its for: drops a single spike.
      record: 'comm_node:fabric_nccl_arrival_offset_seconds:min',
      expr: 'min_over_time(comm_node:fabric_nccl_arrival_offset_seconds[%s])' % c.w.ncclNodeOffset,
    },
    {
      // The latest join, held while no join lines up (scrapes of different nodes between
      // two boundaries), for ncclNodeOffsetHold: a newer join replaces it at once, early or
      // late. One late join is enough to make the node's condition true; the alert's for:
      // then needs every join of that time to be late (each replaces the last), so a single
      // scheduling spike (one-sided: it only ever makes a rank later) is a pending state for
      // one boundary, never a page. A node whose clock is no longer settled drops its held
      // join at once, as it drops out of new ones.
      record: 'comm_node:fabric_nccl_arrival_offset_seconds:last',
      expr: |||
        last_over_time(comm_node:fabric_nccl_arrival_offset_seconds[%(hold)s])
        and on (%(nodeOnly)s)
        node:fabric_nccl_clock_offset_seconds:settled
      ||| % { hold: c.w.ncclNodeOffsetHold, nodeOnly: c.host },
    },
    {
      // Share of the job's time every other rank waits for the node, on the latest join.
      record: 'comm_node:fabric_nccl_arrival_offset:step_share1m',
      expr: |||
        comm_node:fabric_nccl_arrival_offset_seconds:last
        * on (%(node)s)
        max by (%(node)s) (comm_rank:fabric_nccl_collectives:rate1m)
      ||| % { node: c.commNode },
    },
  ],
}
