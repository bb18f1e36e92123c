// The validator rejects each kind of broken schedule with the rule it breaks, and agrees with the
// simulator on random mutations (valid means it runs to the end).
#include <gtest/gtest.h>

#include <cstdio>

#include "base/rng.h"
#include "base/timer.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {
namespace {

Schedule make(ScheduleKind kind, int p, int m) {
  auto s = make_schedule({.kind = kind, .n_ranks = p, .n_microbatches = m});
  EXPECT_TRUE(s.ok());
  return *s;
}

// Index of the first op on `rank` matching pred.
template <typename Pred>
size_t find_op(const Schedule& s, int rank, Pred pred) {
  const auto& ops = s.ranks[size_t(rank)];
  for (size_t i = 0; i < ops.size(); ++i) {
    if (pred(ops[i])) return i;
  }
  ADD_FAILURE() << "no such op on rank " << rank;
  return 0;
}

std::string error_of(const Schedule& s) {
  Status st = validate(s);
  EXPECT_FALSE(st.ok());
  return st.message();
}

TEST(PipelineValidate, AMissingWeightGradientIsReported) {
  Schedule s = make(ScheduleKind::kZB1P, 3, 6);
  auto& ops = s.ranks[1];
  size_t last = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::kWeight) last = i;
  }
  ops.erase(ops.begin() + long(last));
  const std::string e = error_of(s);
  EXPECT_NE(e.find("left in the FIFO"), std::string::npos) << e;
}

TEST(PipelineValidate, ADuplicatedForwardIsReported) {
  Schedule s = make(ScheduleKind::kGPipe, 1, 3);
  auto& ops = s.ranks[0];
  ops.insert(ops.begin() + 1, ops[0]);
  const std::string e = error_of(s);
  EXPECT_NE(e.find("2 forwards"), std::string::npos) << e;
}

TEST(PipelineValidate, ABackwardBeforeItsForwardIsReported) {
  Schedule s = make(ScheduleKind::kOneFOneB, 1, 2);
  std::swap(s.ranks[0][0], s.ranks[0][1]);  // BW0 before F0
  const std::string e = error_of(s);
  EXPECT_NE(e.find("a backward before its forward"), std::string::npos) << e;
}

TEST(PipelineValidate, WeightGradientsOutOfFifoOrderAreReported) {
  Schedule s = make(ScheduleKind::kZB1P, 2, 4);
  auto& ops = s.ranks[1];
  const size_t a = find_op(s, 1, [](const Op& o) { return o.kind == OpKind::kWeight && o.task.mb == 2; });
  const size_t b = find_op(s, 1, [](const Op& o) { return o.kind == OpKind::kWeight && o.task.mb == 3; });
  std::swap(ops[a].task, ops[b].task);
  const std::string e = error_of(s);
  EXPECT_NE(e.find("pop the FIFO in order"), std::string::npos) << e;
}

TEST(PipelineValidate, AnOverlappedPairOnOneChunkIsReported) {
  Schedule s = make(ScheduleKind::kDualPipe, 2, 8);
  const size_t i = find_op(s, 0, [](const Op& o) { return o.kind == OpKind::kForwardBackward; });
  Op& op = s.ranks[0][i];
  op.task2 = op.task;  // the backward half on the forward's chunk
  const std::string e = error_of(s);
  EXPECT_NE(e.find("two different chunks"), std::string::npos) << e;
}

TEST(PipelineValidate, AMissingReceiveIsReported) {
  Schedule s = make(ScheduleKind::kOneFOneB, 2, 3);
  auto& ops = s.ranks[1];
  ops.erase(ops.begin() + long(find_op(s, 1, [](const Op& o) { return o.kind == OpKind::kRecv; })));
  const std::string e = error_of(s);
  EXPECT_NE(e.find("no receive for its activation"), std::string::npos) << e;
}

TEST(PipelineValidate, AMissingSendIsReported) {
  Schedule s = make(ScheduleKind::kOneFOneB, 2, 3);
  auto& ops = s.ranks[0];
  ops.erase(ops.begin() + long(find_op(s, 0, [](const Op& o) { return o.kind == OpKind::kSend; })));
  const std::string e = error_of(s);
  EXPECT_NE(e.find("never sent"), std::string::npos) << e;
}

TEST(PipelineValidate, AWrongTagOrPeerIsReported) {
  Schedule s = make(ScheduleKind::kDualPipe, 4, 8);
  Schedule t = s;
  const size_t i = find_op(s, 2, [](const Op& o) { return o.kind == OpKind::kRecv; });
  s.ranks[2][i].tag += 1;
  EXPECT_NE(error_of(s).find("expected tag"), std::string::npos);
  t.ranks[2][i].peer = 0;
  EXPECT_NE(error_of(t).find("receives no such payload from rank 0"), std::string::npos);
}

TEST(PipelineValidate, AReceivePostedAfterItsConsumerIsReported) {
  Schedule s = make(ScheduleKind::kOneFOneB, 2, 2);
  auto& ops = s.ranks[1];
  const size_t r = find_op(s, 1, [](const Op& o) { return o.kind == OpKind::kRecv && o.task.mb == 0; });
  const Op recv = ops[r];
  ops.erase(ops.begin() + long(r));
  const size_t f = find_op(s, 1, [](const Op& o) { return o.kind == OpKind::kForward && o.task.mb == 0; });
  ops.insert(ops.begin() + long(f) + 1, recv);
  const std::string e = error_of(s);
  EXPECT_NE(e.find("no receive for its activation (tag"), std::string::npos) << e;
}

// Rank 0 runs micro-batch 0 to the end before micro-batch 1; rank 1 does the opposite: each waits
// for the other.
TEST(PipelineValidate, ADeadlockIsReportedWithTheStuckOps) {
  Schedule s = make(ScheduleKind::kOneFOneB, 2, 2);
  auto order = [](int rank, std::initializer_list<std::pair<OpKind, int>> ops) {
    std::vector<Op> out;
    for (auto [k, mb] : ops) out.push_back(Op{.kind = k, .task = Task{0, rank, mb}});
    return out;
  };
  s.ranks[0] = insert_communication(
      s, 0,
      order(0,
            {{OpKind::kForward, 0}, {OpKind::kBackward, 0}, {OpKind::kForward, 1}, {OpKind::kBackward, 1}}));
  s.ranks[1] = insert_communication(
      s, 1,
      order(1,
            {{OpKind::kForward, 1}, {OpKind::kBackward, 1}, {OpKind::kForward, 0}, {OpKind::kBackward, 0}}));
  const std::string e = error_of(s);
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 waits"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 waits"), std::string::npos) << e;
}

TEST(PipelineValidate, AnOpOnTheWrongRankIsReported) {
  Schedule s = make(ScheduleKind::kOneFOneB, 2, 2);
  s.ranks[0][0].task.stage = 1;
  const std::string e = error_of(s);
  EXPECT_NE(e.find("belongs to rank 1"), std::string::npos) << e;
}

// Random swaps of two neighbouring ops: whenever the validator accepts the result, the simulator
// runs it to the end (and so would the executor); and compute-only swaps that keep dependencies
// are accepted.
TEST(PipelineValidate, RandomMutationsAgreeWithTheSimulator) {
  const uint64_t seed = now_ns();
  std::printf("validate mutation seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const ScheduleKind kinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZB1P,
                                ScheduleKind::kDualPipe, ScheduleKind::kDualPipeV};
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const ScheduleKind kind = kinds[rng.below(5)];
    const int p = kind == ScheduleKind::kDualPipe ? 2 * int(1 + rng.below(3)) : int(1 + rng.below(4));
    Schedule s = make(kind, p, 2 * p + 2 * int(rng.below(3)));
    auto& ops = s.ranks[rng.below(uint64_t(p))];
    if (ops.size() < 2) continue;
    const size_t i = rng.below(ops.size() - 1);
    std::swap(ops[i], ops[i + 1]);
    if (validate(s).ok()) {
      ++accepted;
      EXPECT_TRUE(simulate(s, Costs{}).ok());
    } else {
      ++rejected;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace fathom::pipeline
