// Compute orders of DualPipe and DualPipeV, following the eight phases of deepseek-ai/DualPipe's
// step(): 1 nF0, 2 nF0F1, 3 nB1W1F1 (zero bubble), 4 nF0B1F1B0 (the overlapped main phase),
// 5 nB1F1B0, 6 nB1B0 (second half zero bubble), 7 nWB0, 8 nW. "Phase 0" is the chunk whose
// micro-batches a rank sees first; on DualPipe's second half of ranks that is the reverse
// direction. Backward ops marked zero-bubble compute the input gradient now and push the weight
// gradient to a FIFO that W ops pop; we resolve each W's task here by running the same FIFO.
//
// DualPipeV ("cut-in-half") is the same program on n ranks with 2n stages: rank r holds stage r
// and stage 2n-1-r, all micro-batches enter at rank 0, and the last rank turns them around
// locally. It equals the first n ranks of DualPipe on 2n ranks with twice the micro-batches.
#include <deque>

#include "base/check.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

namespace {

class DualPipeBuilder {
 public:
  DualPipeBuilder(const ScheduleParams& p, int rank) : rank_(rank), p_(p.n_ranks) {
    v_ = p.kind == ScheduleKind::kDualPipeV;
    if (v_) {
      half_ranks_ = p_;
      half_rank_ = rank;
      half_chunks_ = p.n_microbatches;
      middle_ = rank == p_ - 1;
      second_half_ = false;
    } else {
      half_ranks_ = p_ / 2;
      half_rank_ = std::min(rank, p_ - 1 - rank);
      half_chunks_ = p.n_microbatches / 2;
      middle_ = rank == p_ / 2 - 1 || rank == p_ / 2;
      second_half_ = rank >= p_ / 2;
    }
  }

  std::vector<Op> build();

 private:
  // The task of the next forward (or backward) of `phase`, advancing its counter.
  Task next(int phase, bool backward) {
    const int chunk = phase ^ static_cast<int>(second_half_);
    int& counter = backward ? b_count_[chunk] : f_count_[chunk];
    Task t;
    if (v_) {
      t = Task{0, chunk == 0 ? rank_ : 2 * p_ - 1 - rank_, counter};
    } else {
      t = Task{chunk, chunk == 0 ? rank_ : p_ - 1 - rank_, counter + chunk * half_chunks_};
    }
    ++counter;
    return t;
  }
  void forward(int phase) { ops_.push_back(Op{.kind = OpKind::kForward, .task = next(phase, false)}); }
  void backward(int phase, bool zero_bubble) {
    const Task t = next(phase, true);
    if (zero_bubble) {
      ops_.push_back(Op{.kind = OpKind::kBackwardInput, .task = t});
      fifo_.push_back(t);
    } else {
      ops_.push_back(Op{.kind = OpKind::kBackward, .task = t});
    }
  }
  void forward_backward(int phase_f, int phase_b) {
    const Task f = next(phase_f, false);
    const Task b = next(phase_b, true);
    ops_.push_back(Op{.kind = OpKind::kForwardBackward, .task = f, .task2 = b});
  }
  void weight() {
    CHECK(!fifo_.empty());
    ops_.push_back(Op{.kind = OpKind::kWeight, .task = fifo_.front()});
    fifo_.pop_front();
  }

  int rank_, p_;
  bool v_ = false, middle_ = false, second_half_ = false;
  int half_ranks_ = 0, half_rank_ = 0, half_chunks_ = 0;
  int f_count_[2] = {0, 0};
  int b_count_[2] = {0, 0};
  std::deque<Task> fifo_;
  std::vector<Op> ops_;
};

std::vector<Op> DualPipeBuilder::build() {
  const int hr = half_rank_, nh = half_ranks_;
  for (int i = 0; i < (nh - hr - 1) * 2; ++i) forward(0);  // 1: nF0
  for (int i = 0; i < hr + 1; ++i) {                       // 2: nF0F1
    forward(0);
    forward(1);
  }
  for (int i = 0; i < nh - hr - 1; ++i) {  // 3: nB1W1F1
    backward(1, true);
    weight();
    forward(1);
  }
  for (int i = 0; i < half_chunks_ - 2 * nh + hr + 1; ++i) {  // 4: nF0B1F1B0
    if (i == 0 && middle_) {
      forward(0);  // the middle ranks keep these two apart to shorten the bubble
      backward(1, false);
    } else {
      forward_backward(0, 1);
    }
    forward_backward(1, 0);
  }
  for (int i = 0; i < nh - hr - 1; ++i) {  // 5: nB1F1B0
    backward(1, false);
    forward_backward(1, 0);
  }
  const int step6 = hr + 1;  // 6: nB1B0, the second half zero bubble
  bool zero_bubble = false;
  for (int i = 0; i < step6; ++i) {
    if (i == step6 / 2 && hr % 2 == 1) zero_bubble = true;
    backward(1, zero_bubble);
    if (i == step6 / 2 && hr % 2 == 0) zero_bubble = true;
    backward(0, zero_bubble);
  }
  for (int i = 0; i < nh - hr - 1; ++i) {  // 7: nWB0
    weight();
    backward(0, true);
  }
  for (int i = 0; i < hr + 1; ++i) weight();  // 8: nW
  CHECK(fifo_.empty());
  return std::move(ops_);
}

}  // namespace

std::vector<Op> dualpipe_order(const ScheduleParams& p, int rank) {
  return DualPipeBuilder(p, rank).build();
}

}  // namespace fathom::pipeline
