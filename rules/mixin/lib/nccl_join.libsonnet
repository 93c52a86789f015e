// The cross-node join behind FabricNcclStragglerNode, as recording rules that the NCCL
// alert group evaluates ahead of the alert (alerts/nccl.libsonnet): Prometheus evaluates a
// group's rules in order at one timestamp, and a later rule reads what the earlier ones
// recorded in that evaluation, so a join that shows a late node is judged at once, not one
// group interval later (docs/nccl.md, "Across nodes, measured").
//   local join = (import '../lib/nccl_join.libsonnet')(c);  // c: utils.context
// Signals (docs/nccl.md, "Across nodes"): per comm and node, the last few sequence boundaries
// every local rank holds (fabric_nccl_sequence_boundary{comm, slot}: boundary k in slot
// (k / boundary_ops) % slots) and when the node's first rank entered each
// (fabric_nccl_sequence_boundary_entry_timestamp_seconds{comm, slot}); each node's clock offset
// against Prometheus' (rules/nccl.libsonnet, "clocks"). Everything here reads the exporters'
// latest samples and recorded series: no range over raw series.

local utils = import 'utils.libsonnet';

function(c) {
  local commSlot = c.by(['comm', 'slot']),
  local nodeSlot = c.by(['comm', c.node, 'slot']),
  // Nodes (not ranks: the k is per node) that report each slot, and the comm at all.
  local nodesPerSlot = 'count by (%s) (count by (%s) (fabric_nccl_sequence_boundary))' % [commSlot, nodeSlot],
  // Each node's first entry into the joined boundary, on Prometheus' clock (its offset taken out).
  local entry = |||
    min by (%(commNode)s) (
      fabric_nccl_sequence_boundary_entry_timestamp_seconds
      and on (%(commSlot)s)
      comm:fabric_nccl_sequence_boundary:joined
    )
    - on (%(nodeOnly)s) group_left
    node:fabric_nccl_clock_offset_seconds:settled
  ||| % { commNode: c.commNode, commSlot: commSlot, nodeOnly: c.host },

  rules: [
    {
      // The slots every reporting node of the comm holds with the same boundary k (value k).
      // Scrapes of different nodes land at different times, so their latest boundaries may
      // differ, but an older one is still in every node's ring. A slot a node has not filled
      // (a fresh exporter), or has already refilled with a newer k (wrapped), does not join:
      // never a wrong k.
      record: 'comm_slot:fabric_nccl_sequence_boundary:joinable',
      expr: |||
        (
          max by (%(commSlot)s) (fabric_nccl_sequence_boundary)
          ==
          min by (%(commSlot)s) (fabric_nccl_sequence_boundary)
        )
        and on (%(commSlot)s)
        (
          %(nodesPerSlot)s
          == on (%(comm)s) group_left
          count by (%(comm)s) (count by (%(commNode)s) (fabric_nccl_sequence_boundary))
        )
        and on (%(commSlot)s)
        (%(nodesPerSlot)s > 1)
      ||| % { commSlot: commSlot, comm: c.comm, commNode: c.commNode, nodesPerSlot: nodesPerSlot },
    },
    {
      // The latest of them: the join of this evaluation (slot: where each node keeps it).
      record: 'comm:fabric_nccl_sequence_boundary:joined',
      expr: |||
        comm_slot:fabric_nccl_sequence_boundary:joinable
        == on (%(comm)s) group_left
        max by (%(comm)s) (comm_slot:fabric_nccl_sequence_boundary:joinable)
      ||| % { comm: c.comm },
    },
    {
      // How late a node's first rank enters the joined boundary op, against the comm's
      // first rank anywhere, clocks corrected: 0 for the first node; for others, what is
      // left of their clocks' disagreement after the offsets are taken out (docs/nccl.md
      // measures it). A node whose clock is not settled is neither judged nor the reference.
      record: 'comm_node:fabric_nccl_arrival_offset_seconds',
      expr: |||
        (
          %(entry)s
        )
        - on (%(comm)s) group_left
        min by (%(comm)s) (
          %(entry)s
        )
      ||| % { entry: utils.indent(entry), comm: c.comm },
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
      // The latest join, held while no join lines up (the nodes' rings share no boundary:
      // a fresh exporter, scrapes further apart than the ring), for ncclNodeOffsetHold: a
      // newer join (one an evaluation while the rings overlap) replaces it at once, early or
      // late. One late join is enough to make the node's condition true; the alert's for:
      // then needs every join of that time to be late (each replaces the last), so a single
      // scheduling spike (one-sided: it only ever makes a rank later) is a pending state until
      // the next boundary joins, never a page. A node whose clock is no longer settled drops its held
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
