// The hang's two judgements, as expressions over the exporters' own series. The recording
// rules (rules/nccl.libsonnet) record them for panels and annotations; FabricNcclHang
// (alerts/nccl.libsonnet) evaluates the same expressions itself, so that its for: starts
// at the first alert evaluation after the scrape that shows the hang, not one recording
// group later (up to a whole rule interval: docs/nccl.md, "Across nodes, measured").
//   local hang = (import '../lib/nccl_hang.libsonnet')(c);  // c: utils.context
local utils = import 'utils.libsonnet';

function(c) {
  // Per rank: the in-flight operation's elapsed time where the exporter calls it hanging
  // (fabric_nccl_hanging == 1: the tracker's hang_multiplier x the rolling average of the
  // last `window` completed ops, judged once `min_completed` exist), above the alert-side
  // floor. The multiplier is not re-applied here: the tracker is its one home, and it
  // knows an average of 0 and a too-short history apart. Both series come from the same
  // target with the same labels, so `and` matches them one to one.
  hanging: |||
    max by (%(rank)s) (
      fabric_nccl_inflight_elapsed_seconds > %(floor)s
      and
      fabric_nccl_hanging == 1
    )
  ||| % { rank: c.rank, floor: c.num(c.th.ncclHangMinElapsedSeconds) },

  // The ranks holding a hung comm up: what the exporters name (they see the ranks of
  // their node), or, across nodes, a rank whose sequence number is behind the comm's
  // newest (it never entered the op its peers wait in) while the comm hangs (`hanging`:
  // the expression above, or its recorded series).
  culprit(hanging): |||
    max by (%(rankReason)s) (fabric_nccl_hang_culprit == 1)
    or
    max by (%(rankReason)s) (
      label_replace(
        0 * (
          (
            max by (%(comm)s) (fabric_nccl_operation_sequence)
            - on (%(comm)s) group_right
            fabric_nccl_operation_sequence
          ) > 0
        ) + 1,
        "reason", "not_entered", "", ""
      )
      and on (%(comm)s)
      %(hanging)s
    )
  ||| % { rankReason: c.by([c.node, 'comm', 'rank', 'reason']), comm: c.comm,
          hanging: utils.indent(hanging) },
}
