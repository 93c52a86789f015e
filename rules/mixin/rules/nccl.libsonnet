// NCCL recording rules: hang and its culprit, arrival lag, node clocks, stragglers.
// alerts/nccl.libsonnet pages on them.
//
// Signals (docs/nccl.md):
// - fabric_nccl_arrival_lag_seconds{comm, rank}: per collective, the rank's entry time
//   minus the earliest entry among the comm's ranks on the same node.
// - fabric_nccl_sequence_boundary / _entry_timestamp_seconds{comm, slot}: per node, the last
//   few ops whose sequence number is a multiple of boundary_ops, and when the node's first
//   rank entered each. Nodes are joined on the same op (lib/nccl_join.libsonnet), so a late
//   *node* shows too. Each node's
//   timestamps are first put on Prometheus' clock: fabric_nccl_scrape_timestamp_seconds
//   (the node's clock when the scrape began) minus the scrape's own timestamp is the
//   node's clock offset plus the scrape's delay (never negative), so its minimum over a
//   window is the offset, whatever NTP does (docs/nccl.md, "Clocks").
// - fabric_nccl_operation_sequence{comm, rank}: collectives entered; during a hang the
//   rank that is behind never entered the op its peers wait in.
local utils = import '../lib/utils.libsonnet';
local hangOf = import '../lib/nccl_hang.libsonnet';

{
  local c = utils.context($._config),
  local hang = hangOf(c),

  prometheusRules+:: {
    groups+: [
      {
        name: 'fabric-nccl.rules',
        interval: c.cfg.intervals.nccl,
        rules: [
          // ---- hang ----------------------------------------------------------------
          {
            // Per rank: the in-flight operation's elapsed time where the exporter calls it
            // hanging, above the floor (lib/nccl_hang.libsonnet). The per-rank detail of
            // FabricNcclHang.
            record: 'comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging',
            expr: hang.hanging,
          },
          {
            // The ranks holding a hung comm up (lib/nccl_hang.libsonnet).
            record: 'comm_rank:fabric_nccl_hang_culprit',
            expr: hang.culprit('comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging'),
          },
          // ---- arrival lag -------------------------------------------------------------
          {
            // Mean lag behind the node's earliest rank, per rank.
            record: 'comm_rank:fabric_nccl_arrival_lag_seconds:local_mean1m',
            expr: |||
              sum by (%(rank)s) (rate(fabric_nccl_arrival_lag_seconds_sum[%(w)s]))
              /
              (sum by (%(rank)s) (rate(fabric_nccl_arrival_lag_seconds_count[%(w)s])) > 0)
            ||| % { rank: c.rank, w: c.w.ncclLag },
          },
          // ---- clocks ------------------------------------------------------------------
          // Each node's clock against Prometheus', from every scrape of the node: the
          // exporter reads its clock (fabric_nccl_scrape_timestamp_seconds) after Prometheus
          // stamped the scrape (timestamp(), whole milliseconds, rounded down) and before the
          // scrape ended (scrape_duration_seconds later). So each scrape brackets the offset:
          //   upper = value - timestamp                      (>= offset: the read came after)
          //   lower = upper - scrape duration - 1 ms          (<= offset: it came before the end)
          // A clock that stands still keeps every lower bound under every upper bound,
          // however slow or uneven the scrapes (a loaded host, nodes sharing one clock); only
          // a clock that moved can put a later lower bound above an earlier upper bound.
          // Recorded once per evaluation and per node, so the windows below read these
          // series, not a subquery over every node's raw samples.
          {
            record: 'node:fabric_nccl_clock_offset_seconds:upper',
            expr: |||
              min by (%(node)s) (fabric_nccl_scrape_timestamp_seconds - timestamp(fabric_nccl_scrape_timestamp_seconds))
            ||| % { node: c.host },
          },
          {
            // Absent where Prometheus (or the agent scraping for it) records no
            // scrape_duration_seconds: then no movement is ever proven (no alert below).
            record: 'node:fabric_nccl_clock_offset_seconds:lower',
            expr: |||
              max by (%(node)s) (
                fabric_nccl_scrape_timestamp_seconds - timestamp(fabric_nccl_scrape_timestamp_seconds)
                - on (instance, job) group_left ()
                scrape_duration_seconds
              ) - 0.001
            ||| % { node: c.host },
          },
          {
            // The offset: the least upper bound over the window, high by at most the
            // quickest scrape's delay before its read (sub-millisecond on a LAN): an
            // NTP-style minimum-delay filter. A node without the sample (an exporter older
            // than it) has no offset, and its ranks stay out of the join.
            record: 'node:fabric_nccl_clock_offset_seconds:min%(window)s' % { window: c.w.ncclClockOffset },
            expr: 'min_over_time(node:fabric_nccl_clock_offset_seconds:upper[%s])' % c.w.ncclClockOffset,
          },
          {
            // How far the recent least upper bound sits above the whole window's: a clock
            // stepped forward (or slewing) inside the window leaves the older, smaller
            // minimum in the estimate. A step back is taken up at once. Slow scrapes raise
            // it too (a busy node's delays), so it only holds the node out of the join
            // (settled, below): it proves nothing, and never alerts.
            record: 'node:fabric_nccl_clock_offset_seconds:unsettled',
            expr: |||
              min_over_time(node:fabric_nccl_clock_offset_seconds:upper[%(recent)s])
              - on (%(node)s)
              node:fabric_nccl_clock_offset_seconds:min%(window)s
            ||| % { node: c.host, recent: c.w.ncclClockOffsetRecent, window: c.w.ncclClockOffset },
          },
          {
            // How far the clock provably moved forward within the window: a recent lower
            // bound above the window's least upper bound. Never above 0 for a clock that
            // stands still (see above), whatever the scrapes' delays:
            // FabricNcclNodeClockUnsettled reads this.
            record: 'node:fabric_nccl_clock_offset_seconds:moved',
            expr: |||
              max_over_time(node:fabric_nccl_clock_offset_seconds:lower[%(recent)s])
              - on (%(node)s)
              node:fabric_nccl_clock_offset_seconds:min%(window)s
            ||| % { node: c.host, recent: c.w.ncclClockOffsetRecent, window: c.w.ncclClockOffset },
          },
          {
            // The offset the cross-node join takes out, only for a node whose estimate
            // can be trusted: not stepped (unsettled above) nor provably moving (moved: it
            // sees a drifting clock within its first minute, before the 1-minute minimum
            // has left the 5-minute one); with ncclClockOffsetSettle of
            // scrapes behind it; and not improved by more than the step within that time.
            // A fresh exporter's or fresh Prometheus' first scrapes give a minimum still
            // raised by their delays, milliseconds on a busy node (a rank of the node read
            // as that much earlier, its peers elsewhere as that much late: measured, a
            // false late-node pending in the first 20 s of tests/test_nccl_multinode.py on
            // a loaded 2-core machine); the estimate is used once a quicker scrape no
            // longer lowers it. A node left out is neither judged nor anyone's reference.
            record: 'node:fabric_nccl_clock_offset_seconds:settled',
            expr: |||
              node:fabric_nccl_clock_offset_seconds:min%(window)s
              unless on (%(node)s)
              (node:fabric_nccl_clock_offset_seconds:unsettled > %(step)s)
              unless on (%(node)s)
              (node:fabric_nccl_clock_offset_seconds:moved > %(step)s)
              and on (%(node)s)
              (
                node:fabric_nccl_clock_offset_seconds:min%(window)s
                - on (%(node)s)
                min_over_time(node:fabric_nccl_clock_offset_seconds:upper[%(window)s] offset %(settle)s)
                > -%(step)s
              )
            ||| % { node: c.host, window: c.w.ncclClockOffset, step: c.num(c.th.ncclClockOffsetMaxStepSeconds),
                    settle: c.w.ncclClockOffsetSettle },
          },
          // The cross-node join (comm:fabric_nccl_sequence_boundary:joined,
          // comm_node:fabric_nccl_arrival_offset_seconds, :min, :last) is recorded in the
          // alert group (lib/nccl_join.libsonnet): FabricNcclStragglerNode reads it in the
          // same evaluation; the rules below read it as of that group's last evaluation.
          {
            // The rank's mean lag behind the comm's earliest rank: the local lag plus its
            // node's offset; the local lag alone where the comm has one node (or the
            // boundaries never lined up); its node's mean offset where the rank is alone on
            // its node (no local lag: it is the node's first rank).
            record: 'comm_rank:fabric_nccl_arrival_lag_seconds:mean1m',
            expr: |||
              (
                comm_rank:fabric_nccl_arrival_lag_seconds:local_mean1m
                + on (%(node)s) group_left
                comm_node:fabric_nccl_arrival_offset_seconds:min
              )
              or
              comm_rank:fabric_nccl_arrival_lag_seconds:local_mean1m
              or
              (
                avg_over_time(comm_node:fabric_nccl_arrival_offset_seconds[%(w)s])
                + on (%(node)s) group_right
                0 * max by (%(rank)s) (fabric_nccl_operation_sequence)
              )
            ||| % { node: c.commNode, rank: c.rank, w: c.w.ncclLag },
          },
          {
            // The same over 5 minutes: panels and the straggler cost read this one.
            record: 'comm_rank:fabric_nccl_arrival_lag_seconds:mean5m',
            expr: 'avg_over_time(comm_rank:fabric_nccl_arrival_lag_seconds:mean1m[5m])',
          },
          {
            // Collectives per second per rank (Send/Recv excluded): every one of them
            // waits for the late rank, so lag x this rate is the share of time lost.
            record: 'comm_rank:fabric_nccl_collectives:rate1m',
            expr: 'sum by (%s) (rate(%s[%s]))'
                  % [c.rank, utils.selector('fabric_nccl_calls_total', c.cfg.selectors.stragglerOps), c.w.ncclLag],
          },
          // MAD across the comm's ranks, on the lag.
          {
            record: 'comm:fabric_nccl_arrival_lag_seconds:median1m',
            expr: 'quantile by (%s) (0.5, comm_rank:fabric_nccl_arrival_lag_seconds:mean1m)' % c.comm,
          },
          {
            record: 'comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m',
            expr: |||
              comm_rank:fabric_nccl_arrival_lag_seconds:mean1m
              - on (%(comm)s) group_left
              comm:fabric_nccl_arrival_lag_seconds:median1m
            ||| % { comm: c.comm },
          },
          {
            record: 'comm:fabric_nccl_arrival_lag_seconds:mad1m',
            expr: 'quantile by (%s) (0.5, abs(comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m))' % c.comm,
          },
          {
            record: 'comm:fabric_nccl_arrival_lag_seconds:ranks1m',
            expr: 'count by (%s) (comm_rank:fabric_nccl_arrival_lag_seconds:mean1m)' % c.comm,
          },
          {
            // Share of the job's time its other ranks spend waiting for this rank.
            record: 'comm_rank:fabric_nccl_arrival_lag:step_share1m',
            expr: |||
              clamp_min(comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m, 0)
              * on (%(rank)s)
              comm_rank:fabric_nccl_collectives:rate1m
            ||| % { rank: c.rank },
          },
          // ---- how late each rank is, a hung one included ----------------------------
          // A rank that never entered the op its peers wait in (or is stuck inside it)
          // has no arrival lag at all: it never arrives. While the hang lasts it is late
          // by the time since its peers entered (their in-flight elapsed time), all of
          // their time is lost to it, and every GPU of the communicator waits.
          {
            // How much later than the median rank each rank enters: the panels' "late by".
            record: 'comm_rank:fabric_nccl_lateness_seconds',
            expr: |||
              max by (%(rank)s) (comm_rank:fabric_nccl_hang_culprit)
              * on (%(comm)s) group_left ()
              max by (%(comm)s) (comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging)
              or
              comm_rank:fabric_nccl_arrival_lag_seconds:deviation1m
            ||| % { rank: c.rank, comm: c.comm },
          },
          {
            // Share of the job's time its other ranks spend waiting for this rank: all
            // of it (1) for a hang's culprit.
            record: 'comm_rank:fabric_nccl_lateness:step_share',
            expr: |||
              max by (%(rank)s) (comm_rank:fabric_nccl_hang_culprit)
              and on (%(comm)s)
              comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging
              or
              comm_rank:fabric_nccl_arrival_lag:step_share1m
            ||| % { rank: c.rank, comm: c.comm },
          },
          {
            // GPUs idle on average waiting for late ranks, per communicator: each rank's
            // share times the other ranks; while the communicator is hung, all its ranks.
            record: 'comm:fabric_nccl_idle_gpus',
            expr: |||
              count by (%(comm)s) (max by (%(rank)s) (fabric_nccl_operation_sequence))
              and on (%(comm)s)
              comm_rank:fabric_nccl_inflight_elapsed_seconds:hanging
              or
              sum by (%(comm)s) (
                comm_rank:fabric_nccl_arrival_lag:step_share1m
                * on (%(comm)s) group_left ()
                (comm:fabric_nccl_arrival_lag_seconds:ranks1m - 1)
              )
            ||| % { rank: c.rank, comm: c.comm },
          },
          // ---- a rank that stopped calling while its peers go on ------------------
          {
            record: 'comm_rank:fabric_nccl_last_call_timestamp_seconds:max',
            expr: 'max by (%s) (fabric_nccl_last_call_timestamp_seconds)' % c.by(['comm', 'rank', c.node]),
          },
          {
            record: 'comm:fabric_nccl_last_call_timestamp_seconds:max',
            expr: 'max by (%s) (comm_rank:fabric_nccl_last_call_timestamp_seconds:max)' % c.comm,
          },
        ],
      },
    ],
  },
}
