// Low-latency dispatch and combine across ranks: against the MPI_Alltoallv oracle's unpacked
// layout (bit for bit), against normal-mode rows of the same tokens, and against Σ_k w_k f(x).
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "ep_test_util.h"

namespace fathom::ep::test {
namespace {

// Expert function of local expert e on this rank: a distinct scale.
float expert_scale(int rank, int e) {
  return 1.0f + static_cast<float>(e) / 4 + static_cast<float>(rank) / 8;
}

// Normal-mode rows keyed by (source rank, source token).
std::map<std::pair<int, int>, int64_t> rows_by_source(const DispatchOutput& out) {
  std::map<std::pair<int, int>, int64_t> m;
  for (int s = 0; s + 1 < static_cast<int>(out.rank_offset.size()); ++s)
    for (int32_t i = out.rank_offset[s]; i < out.rank_offset[s + 1]; ++i)
      m[{s, out.src_token.ptr<int32_t>()[i]}] = i;
  return m;
}

// The same rows, scales and source info as the oracle's output, expert by expert.
void expect_same_ll(const LowLatencyOutput& ll, const LowLatencyOutput& ref, const std::string& what) {
  const int64_t slots = ll.x.dim(1);
  for (int e = 0; e < ll.x.dim(0); ++e) {
    ASSERT_EQ(ll.count[e], ref.count[e]) << what << ", expert " << e;
    const int64_t first = e * slots;
    const uint64_t rb = ll.x.row_bytes();
    EXPECT_EQ(
        0, std::memcmp(ll.x.ptr<uint8_t>() + first * rb, ref.x.ptr<uint8_t>() + first * rb, ll.count[e] * rb))
        << what << ", rows of expert " << e;
    EXPECT_EQ(0, std::memcmp(ll.src_info.ptr<int32_t>() + first * 2, ref.src_info.ptr<int32_t>() + first * 2,
                             ll.count[e] * 8))
        << what << ", source info of expert " << e;
    if (ll.x_scales.data) {
      const int64_t S = ll.x_scales.cols();
      EXPECT_EQ(0, std::memcmp(ll.x_scales.ptr<float>() + first * S, ref.x_scales.ptr<float>() + first * S,
                               ll.count[e] * S * 4))
          << what << ", scales of expert " << e;
    }
  }
}

TEST(EpLowLatency, DispatchMatchesTheOracleAndNormalMode) {
  EpOptions o = base_options();
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto oracle = AlltoallvBaseline::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(oracle.ok());
  EpGroup& ep = **g;
  EpHandle h = ep.new_handle();
  const int L = ep.local_experts();
  const int64_t slots = world_size() * o.max_tokens_per_rank;
  Rng rng(shared_seed("EpLowLatency.Dispatch") + static_cast<uint64_t>(world_rank()) * 65537);
  for (WireFormat fmt : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8}) {
    const int64_t tokens =
        world_rank() == 0 && fmt == WireFormat::kBF16 ? 0 : 1 + static_cast<int64_t>(rng.below(96));
    Routing r = random_routing(rng, tokens, o.hidden, o.topk, o.num_experts, 0.1, 0.3, 1);
    LowLatencyOutput ll, ref;
    EP_ASSERT_OK(ep.ll_dispatch(r.input(fmt), &ll));
    EP_ASSERT_OK((*oracle)->dispatch_ll(r.input(fmt), &ref));
    ASSERT_EQ(ll.x.dim(0), L);
    ASSERT_EQ(ll.x.dim(1), slots);
    expect_same_ll(ll, ref, std::string(wire_format_name(fmt)));
    // The low-latency rows are copies of the normal-mode rows of the same tokens.
    std::vector<uint8_t> ll_rows(static_cast<size_t>(ll.x.nbytes()));
    std::memcpy(ll_rows.data(), ll.x.data, ll_rows.size());
    std::vector<int32_t> ll_src(ll.src_info.ptr<int32_t>(), ll.src_info.ptr<int32_t>() + ll.src_info.numel());
    std::vector<int32_t> counts(ll.count.begin(), ll.count.end());
    DispatchOutput normal;
    EP_ASSERT_OK(ep.dispatch(r.input(fmt), &h, &normal));
    auto by_src = rows_by_source(normal);
    const uint64_t rb = normal.x.row_bytes();
    for (int e = 0; e < L; ++e)
      for (int32_t i = 0; i < counts[static_cast<size_t>(e)]; ++i) {
        const int64_t slot = e * slots + i;
        auto it =
            by_src.find({ll_src[static_cast<size_t>(2 * slot)], ll_src[static_cast<size_t>(2 * slot + 1)]});
        ASSERT_NE(it, by_src.end()) << "low-latency row without a normal-mode row";
        EXPECT_EQ(0, std::memcmp(ll_rows.data() + static_cast<uint64_t>(slot) * rb,
                                 normal.x.ptr<uint8_t>() + it->second * rb, rb));
        bool selects = false;
        for (int k = 0; k < o.topk; ++k)
          selects |= normal.topk_idx.ptr<int32_t>()[it->second * o.topk + k] == e;
        EXPECT_TRUE(selects) << "row " << i << " of expert " << e << " did not select it";
      }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

// Rows written straight into the receivers' outputs by their senders, and rows the receivers copy
// from the senders' staging (a rank with ll_direct_write off; a lower rank that publishes late, so
// a higher one stages its first rows, or all of them, before it can place them) give the oracle's
// outputs. Rows of whole 64-byte lines, so the streaming encoder runs (hidden 1088: 8.5 FP8
// groups, a partial one).
TEST(EpLowLatency, DirectWritesAndStagedCopiesGiveTheOraclesOutputs) {
  for (int variant = 0; variant < 2; ++variant) {
    EpOptions o = base_options();
    o.hidden = 1088;
    o.max_tokens_per_rank = 512;  // enough blocks of tokens for a late rank to appear among them
    o.ll_direct_write = variant == 0 || world_rank() % 2 == 0;  // variant 1: odd ranks stage
    auto g = EpGroup::create(MPI_COMM_WORLD, o);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    auto oracle = AlltoallvBaseline::create(MPI_COMM_WORLD, o);
    ASSERT_TRUE(oracle.ok());
    Rng rng(shared_seed("EpLowLatency.Direct") + static_cast<uint64_t>(world_rank()) * 7919 +
            static_cast<uint64_t>(variant));
    int iter = 0;
    for (int delay_us : {0, 20, 60, 150, 400, 1500, 40000, 0, 300, 3000}) {
      const WireFormat fmt = iter % 2 == 0 ? WireFormat::kFP8 : WireFormat::kBF16;
      // The late rank: rank 0 first (every other rank waits on it), then ranks 1 and 2 (modulo the
      // ranks; with 4, rank 2 late leaves ranks 0-1 direct and rank 3 staging).
      const int late = iter < 8 ? 0 : (iter - 8 + 1) % world_size();
      ++iter;
      const int64_t tokens = o.max_tokens_per_rank - static_cast<int64_t>(rng.below(8));
      Routing r = random_routing(rng, tokens, o.hidden, o.topk, o.num_experts, 0.05);
      if (world_rank() == late) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      LowLatencyOutput ll, ref;
      EP_ASSERT_OK((*g)->ll_dispatch(r.input(fmt), &ll));
      EP_ASSERT_OK((*oracle)->dispatch_ll(r.input(fmt), &ref));
      expect_same_ll(ll, ref,
                     "variant " + std::to_string(variant) + ", rank " + std::to_string(late) + " late by " +
                         std::to_string(delay_us) + " us");
    }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

// Fills expert outputs f_e(x) = scale(rank, e) * x for the valid rows of a low-latency output.
void run_experts(const LowLatencyOutput& ll, int rank, Tensor dst) {
  const int64_t slots = ll.x.dim(1), h = ll.x.cols();
  std::vector<float> row(static_cast<size_t>(h));
  for (int64_t e = 0; e < ll.x.dim(0); ++e)
    for (int32_t i = 0; i < ll.count[static_cast<size_t>(e)]; ++i) {
      const int64_t at = e * slots + i;
      const Tensor flat = Tensor::contiguous(ll.x.dtype, {ll.x.dim(0) * slots, h}, ll.x.data);
      const Tensor scales =
          ll.x_scales.data
              ? Tensor::contiguous(DType::kF32, {ll.x.dim(0) * slots, ll.x_scales.cols()}, ll.x_scales.data)
              : Tensor{};
      row_to_f32(flat, scales, at, row.data());
      const float s = expert_scale(rank, static_cast<int>(e));
      for (int64_t j = 0; j < h; ++j) {
        const float v = s * row[static_cast<size_t>(j)];
        if (dst.dtype == DType::kF32)
          dst.ptr<float>()[at * h + j] = v;
        else
          dst.ptr<uint16_t>()[at * h + j] = f32_to_bf16(v);
      }
    }
}

void run_ll_cycles(WireFormat fmt, WireFormat combine, const char* name) {
  EpOptions o = base_options();
  o.combine_format = combine;
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto oracle = AlltoallvBaseline::create(MPI_COMM_WORLD, o);
  ASSERT_TRUE(oracle.ok());
  EpGroup& ep = **g;
  const int L = ep.local_experts();
  const int64_t slots = world_size() * o.max_tokens_per_rank;
  std::vector<float> experts(static_cast<size_t>(L * slots * o.hidden));
  Rng rng(shared_seed(name) + static_cast<uint64_t>(world_rank()) * 2654435761u);
  for (int iter = 0; iter < 5; ++iter) {  // repeated cycles exercise both staging parities
    int64_t tokens = 1 + static_cast<int64_t>(rng.below(96));
    if (iter == 2 && world_rank() == 1 % world_size()) tokens = 0;
    Routing r = random_routing(rng, tokens, o.hidden, o.topk, o.num_experts);
    EP_ASSERT_OK(ep.ll_dispatch_send(r.input(fmt)));
    volatile double overlap = 0;  // work while the rows travel
    for (int i = 0; i < 20000; ++i) overlap = overlap + std::sqrt(static_cast<double>(i));
    LowLatencyOutput ll;
    EP_ASSERT_OK(ep.ll_dispatch_recv(&ll));
    const bool zero_copy = iter % 2 == 1;
    Tensor in = zero_copy ? ep.ll_combine_buffer(o.hidden)
                          : Tensor::contiguous(DType::kF32, {L, slots, o.hidden}, experts.data());
    run_experts(ll, world_rank(), in);
    std::vector<float> got(static_cast<size_t>(tokens * o.hidden)), want(got.size());
    EP_ASSERT_OK(ep.ll_combine_send(in));
    EP_ASSERT_OK(ep.ll_combine_recv(r.weights.data(),
                                    Tensor::contiguous(DType::kF32, {tokens, o.hidden}, got.data())));
    // The oracle, given the same expert outputs, must produce the same bits.
    LowLatencyOutput ref;
    EP_ASSERT_OK((*oracle)->dispatch_ll(r.input(fmt), &ref));
    std::vector<float> ref_in(static_cast<size_t>(L * slots * o.hidden), 0.0f);
    Tensor ref_t = Tensor::contiguous(DType::kF32, {L, slots, o.hidden}, ref_in.data());
    run_experts(ref, world_rank(), ref_t);
    if (combine == WireFormat::kBF16)  // expert outputs were rounded to bf16 on the group's side
      for (auto& v : ref_in) v = bf16_to_f32(f32_to_bf16(v));
    EP_ASSERT_OK((*oracle)->combine_ll(ref_t, r.weights.data(),
                                       Tensor::contiguous(DType::kF32, {tokens, o.hidden}, want.data())));
    EXPECT_TRUE(same_floats(got, want)) << "low-latency combine differs from the oracle";
    // And the math: Σ_k w_k · scale(rank of e_k, local e_k) · x.
    double tol = 1e-5 + (fmt == WireFormat::kBF16 ? 1.0 / 256 : 0) + (fmt == WireFormat::kFP8 ? 0.08 : 0) +
                 (combine == WireFormat::kBF16 ? 1.0 / 256 : 0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < o.hidden; ++j) {
        double w = 0, mag = 0;
        for (int k = 0; k < o.topk; ++k) {
          const int32_t e = r.idx[static_cast<size_t>(t * o.topk + k)];
          if (e < 0) continue;
          const double v = r.weights[static_cast<size_t>(t * o.topk + k)] * expert_scale(e / L, e % L) *
                           r.x[static_cast<size_t>(t * o.hidden + j)];
          w += v, mag += std::fabs(v);
        }
        ASSERT_NEAR(got[static_cast<size_t>(t * o.hidden + j)], w,
                    tol * mag + (fmt == WireFormat::kFP8 ? 1e-3 : 1e-6))
            << "token " << t << " value " << j << " iteration " << iter;
      }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpLowLatency, SplitPhaseCyclesMatchOracleAndWeightedSumF32) {
  run_ll_cycles(WireFormat::kF32, WireFormat::kF32, "EpLowLatency.CyclesF32");
}
TEST(EpLowLatency, SplitPhaseCyclesFp8DispatchBf16Combine) {
  run_ll_cycles(WireFormat::kFP8, WireFormat::kBF16, "EpLowLatency.CyclesFp8Bf16");
}

}  // namespace
}  // namespace fathom::ep::test
