// Compute orders of the one-direction schedules: GPipe (all forwards, then all backwards), 1F1B
// (warm-up forwards, then one forward one backward) and ZB1P, the Zero Bubble paper's ZB-H1: 1F1B
// with the backward split into an input-gradient op and a weight-gradient op, where stage i defers
// up to i weight-gradient ops. Every stage then holds at most n_ranks micro-batch activations (as
// 1F1B's first stage does) and the deferred W ops fill the cool-down bubble, which shrinks from
// (p-1)(F+B) to (p-1)(F+B-2W) when W <= min(F, B-W).
#include <deque>

#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

namespace {
Op compute_op(OpKind kind, int stage, int mb) {
  return Op{.kind = kind, .task = Task{0, stage, mb}};
}
}  // namespace

std::vector<Op> gpipe_order(const ScheduleParams& p, int rank) {
  std::vector<Op> ops;
  for (int mb = 0; mb < p.n_microbatches; ++mb) ops.push_back(compute_op(OpKind::kForward, rank, mb));
  for (int mb = 0; mb < p.n_microbatches; ++mb) ops.push_back(compute_op(OpKind::kBackward, rank, mb));
  return ops;
}

std::vector<Op> one_f_one_b_order(const ScheduleParams& p, int rank) {
  const int m = p.n_microbatches;
  const int warmup = std::min(p.n_ranks - rank - 1, m);
  std::vector<Op> ops;
  for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpKind::kForward, rank, mb));
  for (int k = 0; k < m - warmup; ++k) {
    ops.push_back(compute_op(OpKind::kForward, rank, warmup + k));
    ops.push_back(compute_op(OpKind::kBackward, rank, k));
  }
  for (int mb = m - warmup; mb < m; ++mb) ops.push_back(compute_op(OpKind::kBackward, rank, mb));
  return ops;
}

std::vector<Op> zb1p_order(const ScheduleParams& p, int rank) {
  const int m = p.n_microbatches;
  const int warmup = std::min(p.n_ranks - rank - 1, m);
  const size_t deferred_max = static_cast<size_t>(rank);  // activations alive stay <= n_ranks
  std::vector<Op> ops;
  std::deque<int> pending;  // micro-batches whose W is still to run, oldest first
  auto input_grad = [&](int mb) {
    ops.push_back(compute_op(OpKind::kBackwardInput, rank, mb));
    pending.push_back(mb);
  };
  auto weight = [&] {
    ops.push_back(compute_op(OpKind::kWeight, rank, pending.front()));
    pending.pop_front();
  };
  for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpKind::kForward, rank, mb));
  for (int k = 0; k < m - warmup; ++k) {
    ops.push_back(compute_op(OpKind::kForward, rank, warmup + k));
    input_grad(k);
    if (pending.size() > deferred_max) weight();
  }
  for (int mb = m - warmup; mb < m; ++mb) {
    input_grad(mb);
    weight();
  }
  while (!pending.empty()) weight();
  return ops;
}

}  // namespace fathom::pipeline
