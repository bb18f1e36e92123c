// Robustness across ranks: calls that disagree fail on every rank with the same clear message
// (and the group keeps working), capacity overflows are caught before any row moves, a rank that
// never calls makes the others time out naming it, and misuse of the split-phase API is refused.
#include <string>

#include "ep_test_util.h"

namespace fathom::ep::test {
namespace {

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(EpErrors, DifferentHiddenSizesFailOnEveryRankAndTheGroupRecovers) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  EpHandle h = (*g)->new_handle();
  Rng rng(shared_seed("EpErrors.Hidden") + static_cast<uint64_t>(world_rank()));
  const int odd = world_size() - 1;
  Routing r = random_routing(rng, 20, world_rank() == odd ? o.hidden - 16 : o.hidden, o.topk, o.num_experts);
  DispatchOutput out;
  Status s = (*g)->dispatch(r.input(WireFormat::kBF16), &h, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s, "hidden size")) << s.message();
  EXPECT_TRUE(contains(s, "rank " + std::to_string(odd) + " has " + std::to_string(o.hidden - 16)))
      << s.message();
  // The failed dispatch left the handle unfilled: combining with it is refused everywhere.
  std::vector<float> y(16), got(static_cast<size_t>(20 * o.hidden));
  s = (*g)->combine(Tensor::contiguous(DType::kF32, {0, o.hidden}, y.data()), h,
                    Tensor::contiguous(DType::kF32, {20, o.hidden}, got.data()));
  EXPECT_TRUE(contains(s, "never filled")) << s.message();
  // Low-latency mode too: the mismatch travels with the rows and fails ll_dispatch_recv everywhere.
  LowLatencyOutput ll;
  EP_ASSERT_OK((*g)->ll_dispatch_send(r.input(WireFormat::kBF16)));
  s = (*g)->ll_dispatch_recv(&ll);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "hidden size")) << s.message();
  // Then everyone agrees again and both modes work.
  Routing ok = random_routing(rng, 20, o.hidden, o.topk, o.num_experts);
  EP_EXPECT_OK((*g)->dispatch(ok.input(WireFormat::kBF16), &h, &out));
  EP_EXPECT_OK((*g)->ll_dispatch(ok.input(WireFormat::kBF16), &ll));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, DifferentOperationsOnDifferentRanksFailOnEveryRank) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  EpHandle h = (*g)->new_handle();
  Rng rng(shared_seed("EpErrors.Op") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 12, o.hidden, o.topk, o.num_experts);
  DispatchOutput out;
  EP_ASSERT_OK((*g)->dispatch(r.input(WireFormat::kF32), &h, &out));
  std::vector<float> y(static_cast<size_t>(out.x.dim(0) * o.hidden), 1.0f),
      got(static_cast<size_t>(12 * o.hidden));
  Status s;
  if (world_rank() == 0) {  // rank 0 combines while the others dispatch again
    s = (*g)->combine(Tensor::contiguous(DType::kF32, {out.x.dim(0), o.hidden}, y.data()), h,
                      Tensor::contiguous(DType::kF32, {12, o.hidden}, got.data()));
  } else {
    s = (*g)->dispatch(r.input(WireFormat::kF32), &h, &out);
  }
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "ranks disagree on the operation: rank 0 has combine, rank 1 has dispatch"))
      << s.message();
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, ABadExpertIdOnOneRankFailsTheDispatchOnEveryRank) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  EpHandle h = (*g)->new_handle();
  Rng rng(shared_seed("EpErrors.BadId") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 10, o.hidden, o.topk, o.num_experts);
  if (world_rank() == 0) r.idx[5] = o.num_experts + 3;
  DispatchOutput out;
  Status s = (*g)->dispatch(r.input(WireFormat::kF32), &h, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "rank 0 could not make it")) << s.message();
  EXPECT_TRUE(contains(s, "selects expert " + std::to_string(o.num_experts + 3))) << s.message();
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, NormalModeCapacityOverflowIsCaughtBeforeRowsMove) {
  EpOptions o = base_options();
  o.max_recv_tokens = 40;
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  EpHandle h = (*g)->new_handle();
  Rng rng(shared_seed("EpErrors.Capacity") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 30, o.hidden, o.topk, o.num_experts, 0.0, 1.0, 0);  // all to expert 0
  DispatchOutput out;
  Status s = (*g)->dispatch(r.input(WireFormat::kF32), &h, &out);
  if (world_size() * 30 > 40) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(contains(s, "rank 0 would receive")) << s.message();
  }
  Routing small = random_routing(rng, 5, o.hidden, o.topk, o.num_experts);
  EP_EXPECT_OK((*g)->dispatch(small.input(WireFormat::kF32), &h, &out));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, LowLatencyCapacityOverflowFailsOnEveryRank) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  Rng rng(shared_seed("EpErrors.LlCapacity") + static_cast<uint64_t>(world_rank()));
  const int big = world_size() - 1;
  Routing r = random_routing(rng, world_rank() == big ? o.max_tokens_per_rank + 1 : 8, o.hidden, o.topk,
                             o.num_experts);
  EP_ASSERT_OK((*g)->ll_dispatch_send(r.input(WireFormat::kF32)));
  LowLatencyOutput ll;
  Status s = (*g)->ll_dispatch_recv(&ll);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(contains(s, "rank " + std::to_string(big) + " could not make it")) << s.message();
  EXPECT_TRUE(contains(s, "max_tokens_per_rank")) << s.message();
  Routing ok = random_routing(rng, 8, o.hidden, o.topk, o.num_experts);
  EP_EXPECT_OK((*g)->ll_dispatch(ok.input(WireFormat::kF32), &ll));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, MisorderedSplitPhaseCallsAreRefused) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  LowLatencyOutput ll;
  EXPECT_EQ((*g)->ll_dispatch_recv(&ll).code(), StatusCode::kFailedPrecondition);
  std::vector<float> w(8);
  EXPECT_EQ((*g)->ll_combine_recv(w.data(), Tensor{}).code(), StatusCode::kFailedPrecondition);
  Rng rng(shared_seed("EpErrors.Order") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 8, o.hidden, o.topk, o.num_experts);
  EP_ASSERT_OK((*g)->ll_dispatch_send(r.input(WireFormat::kF32)));
  EXPECT_EQ((*g)->ll_dispatch_send(r.input(WireFormat::kF32)).code(), StatusCode::kFailedPrecondition);
  EP_EXPECT_OK((*g)->ll_dispatch_recv(&ll));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, DifferentOptionsAtCreationFailOnEveryRank) {
  EpOptions o = base_options();
  if (world_rank() == 1) o.topk += 1;
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(contains(g.status(), "topk")) << g.status().message();
  EXPECT_TRUE(contains(g.status(), "rank 1")) << g.status().message();
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpErrors, ARankThatNeverCallsMakesTheOthersTimeOutNamingIt) {
  // Seconds of waiting by design: run where the ctest entry asks (shared memory, MPI, mixed).
  if (env_int("FATHOM_EP_TEST_TIMEOUTS", 0) == 0) GTEST_SKIP() << "FATHOM_EP_TEST_TIMEOUTS=1 runs it";
  EpOptions o = base_options();
  o.timeout_ms = 1500;
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok());
  EpHandle h = (*g)->new_handle();
  Rng rng(shared_seed("EpErrors.Timeout") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 16, o.hidden, o.topk, o.num_experts);
  const int absent = world_size() - 1;
  if (world_rank() != absent) {
    DispatchOutput out;
    Status s = (*g)->dispatch(r.input(WireFormat::kF32), &h, &out);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kTimeout);
    EXPECT_TRUE(contains(s, "waiting for rank " + std::to_string(absent))) << s.message();
    EXPECT_TRUE(contains(s, "dispatch #1")) << s.message();
    // The group is now unusable, and says why.
    Status again = (*g)->dispatch(r.input(WireFormat::kF32), &h, &out);
    EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(contains(again, "earlier timeout")) << again.message();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Low-latency mode: the absent rank never sends.
  auto g2 = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g2.ok());
  if (world_rank() != absent) {
    ASSERT_TRUE((*g2)->ll_dispatch_send(r.input(WireFormat::kF32)).ok());
    LowLatencyOutput ll;
    Status s = (*g2)->ll_dispatch_recv(&ll);
    EXPECT_EQ(s.code(), StatusCode::kTimeout);
    EXPECT_TRUE(contains(s, "waiting for rank " + std::to_string(absent))) << s.message();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

}  // namespace
}  // namespace fathom::ep::test
