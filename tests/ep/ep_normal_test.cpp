// Normal-mode dispatch and combine across ranks, against the MPI_Alltoallv oracle (bit for bit)
// and against references computed on the dispatching rank (Σ_k w_k · f(x), in double).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "ep/eplb.h"
#include "ep_test_util.h"

namespace fathom::ep::test {
namespace {

struct Fixture {
  std::unique_ptr<EpGroup> group;
  std::unique_ptr<AlltoallvBaseline> oracle;
  EpHandle handle;
};

Fixture make(const EpOptions& o) {
  Fixture f;
  auto g = EpGroup::create(MPI_COMM_WORLD, o);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return f;
  f.group = std::move(*g);
  auto b = AlltoallvBaseline::create(MPI_COMM_WORLD, o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (b.ok()) f.oracle = std::move(*b);
  f.handle = f.group->new_handle();
  return f;
}

// Dispatch outputs must equal the oracle's byte for byte.
void expect_same_dispatch(const DispatchOutput& a, const DispatchOutput& b, bool cached) {
  const int64_t n = a.x.dim(0);
  ASSERT_EQ(n, b.x.dim(0));
  EXPECT_TRUE(same_bytes(a.x, b.x, n)) << "received rows differ from MPI_Alltoallv's";
  if (a.x.dtype == DType::kU8) {
    EXPECT_TRUE(same_bytes(a.x_scales, b.x_scales, n)) << "FP8 scales differ";
  }
  if (cached) return;
  EXPECT_TRUE(same_bytes(a.topk_idx, b.topk_idx, n)) << "local top-k ids differ";
  EXPECT_TRUE(same_bytes(a.topk_weights, b.topk_weights, n)) << "top-k weights differ";
  EXPECT_TRUE(same_bytes(a.src_token, b.src_token, n))
      << "source token ids differ: first rows " << (n ? a.src_token.ptr<int32_t>()[0] : -1) << " vs "
      << (n ? b.src_token.ptr<int32_t>()[0] : -1) << ", last " << (n ? a.src_token.ptr<int32_t>()[n - 1] : -1)
      << " vs " << (n ? b.src_token.ptr<int32_t>()[n - 1] : -1);
}

// The per-expert grouping lists exactly the (row, k) pairs whose local id is that expert.
void expect_grouping(const DispatchOutput& out, int L, int K) {
  const int32_t* idx = out.topk_idx.ptr<int32_t>();
  const float* w = out.topk_weights.ptr<float>();
  int64_t pairs = 0;
  for (int64_t i = 0; i < out.x.dim(0) * K; ++i) pairs += idx[i] >= 0;
  ASSERT_EQ(static_cast<int64_t>(out.expert_rows.size()), pairs);
  for (int e = 0; e < L; ++e) {
    int32_t prev = -1;
    ASSERT_EQ(out.tokens_per_expert[e], out.expert_offset[e + 1] - out.expert_offset[e]);
    for (int32_t j = out.expert_offset[e]; j < out.expert_offset[e + 1]; ++j) {
      const int32_t row = out.expert_rows[j];
      EXPECT_GT(row, prev);
      prev = row;
      bool found = false;
      for (int k = 0; k < K; ++k) found |= idx[row * K + k] == e && w[row * K + k] == out.expert_weights[j];
      EXPECT_TRUE(found) << "expert " << e << " lists row " << row;
    }
  }
}

// Identity experts: row i becomes Σ_{k local} w_ik · x_i (decoded to f32).
std::vector<float> identity_experts(const DispatchOutput& out, const std::vector<float>& w,
                                    const std::vector<int32_t>& idx, int K) {
  const int64_t n = out.x.dim(0), h = out.x.cols();
  std::vector<float> y(static_cast<size_t>(n * h), 0.0f), row(static_cast<size_t>(h));
  for (int64_t i = 0; i < n; ++i) {
    row_to_f32(out.x, out.x_scales, i, row.data());
    for (int k = 0; k < K; ++k) {
      if (idx[static_cast<size_t>(i * K + k)] < 0) continue;
      const float wk = w[static_cast<size_t>(i * K + k)];
      for (int64_t j = 0; j < h; ++j) y[static_cast<size_t>(i * h + j)] += wk * row[static_cast<size_t>(j)];
    }
  }
  return y;
}

std::vector<float> copy_f32(const Tensor& t) {
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
}
std::vector<int32_t> copy_i32(const Tensor& t) {
  return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel());
}

// |out - Σ_k w_k x| within tol_rel of Σ_k |w_k x| (+ an absolute floor), per element.
::testing::AssertionResult near_weighted_sum(const Routing& r, const std::vector<float>& out, double tol_rel,
                                             double tol_abs = 1e-6) {
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int64_t j = 0; j < r.hidden; ++j) {
      double want = 0, mag = 0;
      for (int k = 0; k < r.topk; ++k) {
        if (r.idx[static_cast<size_t>(t * r.topk + k)] < 0) continue;
        const double v = static_cast<double>(r.weights[static_cast<size_t>(t * r.topk + k)]) *
                         r.x[static_cast<size_t>(t * r.hidden + j)];
        want += v, mag += std::fabs(v);
      }
      const double got = out[static_cast<size_t>(t * r.hidden + j)];
      if (std::fabs(got - want) > tol_rel * mag + tol_abs)
        return ::testing::AssertionFailure()
               << "token " << t << " value " << j << ": got " << got << ", want " << want << " (tolerance "
               << tol_rel << " x " << mag << ")";
    }
  return ::testing::AssertionSuccess();
}

double tolerance(WireFormat dispatch, WireFormat combine, int ranks) {
  double tol = 2e-6;
  if (dispatch == WireFormat::kBF16) tol += 1.0 / 256;
  if (dispatch == WireFormat::kFP8) tol += 1.0 / 16 + 1.0 / 64;
  if (combine == WireFormat::kBF16) tol += ranks / 256.0;
  return tol;
}

// The ctest entry says how many nodes its launcher made (shared memory, ranks_per_node, TCP,
// network-namespace hosts); the group must find exactly those.
TEST(EpNormal, TheGroupSeesTheNodesTheLauncherMade) {
  const int expect = env_int("FATHOM_EP_TEST_EXPECT_NODES", 0);
  auto g = EpGroup::create(MPI_COMM_WORLD, base_options());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  if (expect > 0) {
    EXPECT_EQ((*g)->num_nodes(), expect);
  }
  for (int r = 1; r < world_size(); ++r) EXPECT_GE((*g)->node_of_rank(r), (*g)->node_of_rank(r - 1));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpNormal, DispatchMatchesTheAlltoallvOracleInEveryWireFormat) {
  EpOptions o = base_options();
  Fixture f = make(o);
  ASSERT_TRUE(f.group && f.oracle);
  Rng rng(shared_seed("EpNormal.DispatchMatchesOracle") + static_cast<uint64_t>(world_rank()) * 7919);
  for (WireFormat fmt : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8}) {
    for (int iter = 0; iter < 2; ++iter) {
      const int64_t tokens = (iter == 1 && world_rank() == 1) ? 0 : 1 + static_cast<int64_t>(rng.below(96));
      Routing r = random_routing(rng, tokens, o.hidden - 16 * iter, o.topk, o.num_experts);
      DispatchOutput out, ref;
      EP_ASSERT_OK(f.group->dispatch(r.input(fmt), &f.handle, &out));
      EP_ASSERT_OK(f.oracle->dispatch(r.input(fmt), &ref));
      expect_same_dispatch(out, ref, false);
      expect_grouping(out, f.group->local_experts(), o.topk);
      EXPECT_EQ(out.rank_offset.back(), out.x.dim(0));
      for (int s = 0; s < world_size(); ++s)
        for (int32_t i = out.rank_offset[s] + 1; i < out.rank_offset[s + 1]; ++i)
          EXPECT_LT(out.src_token.ptr<int32_t>()[i - 1], out.src_token.ptr<int32_t>()[i])
              << "rows not in token order";
    }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

void run_identity_combine(WireFormat dispatch_fmt, WireFormat combine_fmt, double hot_prob,
                          const char* name) {
  EpOptions o = base_options();
  o.combine_format = combine_fmt;
  Fixture f = make(o);
  ASSERT_TRUE(f.group && f.oracle);
  Rng rng(shared_seed(name) + static_cast<uint64_t>(world_rank()) * 104729);
  for (int iter = 0; iter < 3; ++iter) {
    int64_t tokens = 1 + static_cast<int64_t>(rng.below(96));
    if (iter == 1 && world_rank() == world_size() - 1) tokens = 0;  // a rank with nothing to send
    Routing r = random_routing(rng, tokens, o.hidden, o.topk, o.num_experts, 0.1, hot_prob, 0);
    for (int64_t t = 0; t < tokens; t += 7)  // rows that go nowhere
      for (int k = 0; k < o.topk; ++k) r.idx[static_cast<size_t>(t * o.topk + k)] = -1;
    DispatchOutput out, ref;
    EP_ASSERT_OK(f.group->dispatch(r.input(dispatch_fmt), &f.handle, &out));
    EP_ASSERT_OK(f.oracle->dispatch(r.input(dispatch_fmt), &ref));
    expect_same_dispatch(out, ref, false);
    const std::vector<float> y =
        identity_experts(out, copy_f32(out.topk_weights), copy_i32(out.topk_idx), o.topk);
    std::vector<float> got(static_cast<size_t>(tokens * o.hidden), -1.0f), want(got.size(), -2.0f);
    Tensor yt = Tensor::contiguous(DType::kF32, {out.x.dim(0), o.hidden}, const_cast<float*>(y.data()));
    if (iter == 2) {  // zero-copy: write the expert outputs straight into the shared combine buffer
      Tensor buf = f.group->combine_buffer(f.handle, o.hidden);
      std::vector<float> tmp(static_cast<size_t>(o.hidden));
      for (int64_t i = 0; i < out.x.dim(0); ++i) {
        if (buf.dtype == DType::kF32)
          std::memcpy(buf.ptr<float>() + i * o.hidden, y.data() + i * o.hidden,
                      static_cast<size_t>(o.hidden) * 4);
        else
          for (int64_t j = 0; j < o.hidden; ++j)
            buf.ptr<uint16_t>()[i * o.hidden + j] = f32_to_bf16(y[static_cast<size_t>(i * o.hidden + j)]);
      }
      yt = buf;
    }
    EP_ASSERT_OK(
        f.group->combine(yt, f.handle, Tensor::contiguous(DType::kF32, {tokens, o.hidden}, got.data())));
    EP_ASSERT_OK(f.oracle->combine(
        Tensor::contiguous(DType::kF32, {out.x.dim(0), o.hidden}, const_cast<float*>(y.data())),
        Tensor::contiguous(DType::kF32, {tokens, o.hidden}, want.data())));
    if (!o.hierarchical) {
      EXPECT_TRUE(same_floats(got, want)) << "combine differs from MPI_Alltoallv's";
    }
    // FP8 subnormals err by up to amax/448/512 whatever the value: an absolute term covers it.
    EXPECT_TRUE(near_weighted_sum(r, got, tolerance(dispatch_fmt, combine_fmt, world_size()),
                                  dispatch_fmt == WireFormat::kFP8 ? 2e-4 : 1e-6));
    for (int64_t t = 0; t < tokens; t += 7)
      for (int64_t j = 0; j < o.hidden; ++j) ASSERT_EQ(got[static_cast<size_t>(t * o.hidden + j)], 0.0f);
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpNormal, DispatchIdentityCombineEqualsWeightedSumF32) {
  run_identity_combine(WireFormat::kF32, WireFormat::kF32, 0.0, "EpNormal.IdentityCombineF32");
}
TEST(EpNormal, DispatchIdentityCombineEqualsWeightedSumBf16) {
  run_identity_combine(WireFormat::kBF16, WireFormat::kBF16, 0.0, "EpNormal.IdentityCombineBf16");
}
TEST(EpNormal, Fp8DispatchRoundTripsWithinTheCodecTolerance) {
  run_identity_combine(WireFormat::kFP8, WireFormat::kF32, 0.0, "EpNormal.Fp8RoundTrip");
}
TEST(EpNormal, SkewedRoutingWithEmptyRanksAndUnroutedTokens) {
  run_identity_combine(WireFormat::kBF16, WireFormat::kF32, 0.9, "EpNormal.Skewed");
}

// Transfers over stream_min_bytes write rows with non-temporal stores: the same bytes arrive.
TEST(EpNormal, StreamingStoresDeliverTheSameBytes) {
  EpOptions o = base_options();
  o.stream_min_bytes = 0;  // rows of 272 f32 values are 1088 bytes: streamed, with a tail
  Fixture f = make(o);
  ASSERT_TRUE(f.group && f.oracle);
  Rng rng(shared_seed("EpNormal.Streaming") + static_cast<uint64_t>(world_rank()) * 977);
  for (WireFormat fmt : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8}) {
    Routing r = random_routing(rng, 90, o.hidden, o.topk, o.num_experts);
    DispatchOutput out, ref;
    EP_ASSERT_OK(f.group->dispatch(r.input(fmt), &f.handle, &out));
    EP_ASSERT_OK(f.oracle->dispatch(r.input(fmt), &ref));
    expect_same_dispatch(out, ref, false);
    const std::vector<float> y =
        identity_experts(out, copy_f32(out.topk_weights), copy_i32(out.topk_idx), o.topk);
    std::vector<float> got(static_cast<size_t>(r.tokens * o.hidden)), want(got.size());
    Tensor yt = Tensor::contiguous(DType::kF32, {out.x.dim(0), o.hidden}, const_cast<float*>(y.data()));
    EP_ASSERT_OK(
        f.group->combine(yt, f.handle, Tensor::contiguous(DType::kF32, {r.tokens, o.hidden}, got.data())));
    EP_ASSERT_OK(f.oracle->combine(yt, Tensor::contiguous(DType::kF32, {r.tokens, o.hidden}, want.data())));
    if (!o.hierarchical) {
      EXPECT_TRUE(same_floats(got, want));
    }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpNormal, Fp8RowsDecodeWithinPerGroupBounds) {
  EpOptions o = base_options();
  Fixture f = make(o);
  ASSERT_TRUE(f.group);
  Rng rng(shared_seed("EpNormal.Fp8Bounds") + static_cast<uint64_t>(world_rank()));
  Routing r = random_routing(rng, 64, o.hidden, o.topk, o.num_experts);
  for (int64_t t = 0; t < r.tokens; ++t)  // wide dynamic range inside a row
    for (int64_t j = 0; j < o.hidden; ++j)
      r.x[static_cast<size_t>(t * o.hidden + j)] *=
          static_cast<float>(std::ldexp(1.0, static_cast<int>(j % 24) - 12));
  DispatchOutput out;
  EP_ASSERT_OK(f.group->dispatch(r.input(WireFormat::kFP8), &f.handle, &out));
  std::vector<float> row(static_cast<size_t>(o.hidden));
  const int me = world_rank();
  for (int32_t i = out.rank_offset[me]; i < out.rank_offset[me + 1]; ++i) {  // rows this rank sent itself
    const int64_t t = out.src_token.ptr<int32_t>()[i];
    row_to_f32(out.x, out.x_scales, i, row.data());
    for (int64_t g = 0; g < o.hidden; g += 128) {
      double amax = 0;
      for (int64_t j = g; j < std::min<int64_t>(g + 128, o.hidden); ++j)
        amax = std::max(amax, std::fabs(static_cast<double>(r.x[static_cast<size_t>(t * o.hidden + j)])));
      for (int64_t j = g; j < std::min<int64_t>(g + 128, o.hidden); ++j) {
        const double x = r.x[static_cast<size_t>(t * o.hidden + j)];
        const double bound = std::fabs(x) / 16 + amax / 448 / 512 + 1e-6 * amax;
        ASSERT_LE(std::fabs(row[static_cast<size_t>(j)] - x), bound) << "token " << t << " value " << j;
      }
    }
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

TEST(EpNormal, CachedDispatchReusesTheRoutesOfAnEarlierDispatch) {
  EpOptions o = base_options();
  Fixture f = make(o);
  ASSERT_TRUE(f.group && f.oracle);
  Rng rng(shared_seed("EpNormal.Cached") + static_cast<uint64_t>(world_rank()) * 31);
  Routing r = random_routing(rng, 1 + static_cast<int64_t>(rng.below(96)), o.hidden, o.topk, o.num_experts);
  DispatchOutput first;
  EP_ASSERT_OK(f.group->dispatch(r.input(WireFormat::kF32), &f.handle, &first));
  const std::vector<float> w = copy_f32(first.topk_weights);
  const std::vector<int32_t> idx = copy_i32(first.topk_idx);
  EpHandle other = f.group->new_handle();  // an unrelated dispatch in between (another layer)
  Routing r2 = random_routing(rng, 50, o.hidden, o.topk, o.num_experts);
  DispatchOutput unrelated;
  EP_ASSERT_OK(f.group->dispatch(r2.input(WireFormat::kF32), &other, &unrelated));
  for (auto& v : r.x) v = static_cast<float>(rng.normal());  // new rows, same routes
  DispatchOutput cached, ref;
  EP_ASSERT_OK(f.group->dispatch_cached(r.x_view(), WireFormat::kBF16, f.handle, &cached));
  EP_ASSERT_OK(f.oracle->dispatch(r.input(WireFormat::kBF16), &ref));
  expect_same_dispatch(cached, ref, true);
  DispatchOutput fake = cached;
  fake.topk_idx =
      Tensor::contiguous(DType::kI32, {cached.x.dim(0), o.topk}, const_cast<int32_t*>(idx.data()));
  const std::vector<float> y = identity_experts(fake, w, idx, o.topk);
  std::vector<float> got(static_cast<size_t>(r.tokens * o.hidden));
  EP_ASSERT_OK(f.group->combine(
      Tensor::contiguous(DType::kF32, {cached.x.dim(0), o.hidden}, const_cast<float*>(y.data())), f.handle,
      Tensor::contiguous(DType::kF32, {r.tokens, o.hidden}, got.data())));
  EXPECT_TRUE(near_weighted_sum(r, got, tolerance(WireFormat::kBF16, WireFormat::kF32, world_size())));
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

// EPLB end to end: skewed logical loads, a plan with redundant experts, tokens routed to
// replicas, dispatch over physical experts, experts that compute their logical function.
TEST(EpNormal, DispatchOverEplbPhysicalExpertsMatchesTheLogicalModel) {
  EpOptions o = base_options();
  Fixture f = make(o);
  ASSERT_TRUE(f.group);
  const int R = world_size(), logical = 6 * R, physical = o.num_experts;
  Rng rng(shared_seed("EpNormal.Eplb") + static_cast<uint64_t>(world_rank()) * 17);
  std::vector<double> load(static_cast<size_t>(logical));
  for (int e = 0; e < logical; ++e) load[static_cast<size_t>(e)] = e == 0 ? 5000 : 50 + 10 * (e % 5);
  EplbParams p{.num_physical = physical,
               .num_groups = f.group->num_nodes(),
               .num_nodes = f.group->num_nodes(),
               .num_ranks = R};
  auto plan = rebalance_experts(load.data(), 1, logical, p);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_GE(plan->logcnt[0], 2) << "the hot expert was not replicated";
  Routing r = random_routing(rng, 80, o.hidden, o.topk, logical, 0.05, 0.8, 0);
  std::vector<int32_t> logical_idx = r.idx;
  std::vector<int> node_of(static_cast<size_t>(R));
  for (int q = 0; q < R; ++q) node_of[static_cast<size_t>(q)] = f.group->node_of_rank(q);
  for (ReplicaRouting routing : {ReplicaRouting::kRoundRobin, ReplicaRouting::kNearest}) {
    RouteParams rp{.rank = world_rank(),
                   .num_ranks = R,
                   .node_of_rank = node_of,
                   .token_offset = world_rank() * 1000,
                   .routing = routing};
    EP_ASSERT_OK(route_to_replicas(*plan, rp, logical_idx.data(), r.tokens, o.topk, r.idx.data()));
    DispatchOutput out;
    EP_ASSERT_OK(f.group->dispatch(r.input(WireFormat::kF32), &f.handle, &out));
    const int L = f.group->local_experts();
    std::vector<float> y(static_cast<size_t>(out.x.dim(0) * o.hidden), 0.0f);
    for (int e = 0; e < L; ++e) {
      const int lg = plan->phy2log[static_cast<size_t>(world_rank() * L + e)];
      const float scale = 1.0f + static_cast<float>(lg) / 8;
      for (int32_t j = out.expert_offset[e]; j < out.expert_offset[e + 1]; ++j) {
        const int32_t row = out.expert_rows[j];
        for (int64_t i = 0; i < o.hidden; ++i)
          y[static_cast<size_t>(row * o.hidden + i)] +=
              out.expert_weights[j] * scale * out.x.ptr<float>()[row * o.hidden + i];
      }
    }
    std::vector<float> got(static_cast<size_t>(r.tokens * o.hidden));
    EP_ASSERT_OK(f.group->combine(Tensor::contiguous(DType::kF32, {out.x.dim(0), o.hidden}, y.data()),
                                  f.handle,
                                  Tensor::contiguous(DType::kF32, {r.tokens, o.hidden}, got.data())));
    Routing scaled = r;  // the logical model: weight w * (1 + l/8) on expert l
    for (size_t i = 0; i < scaled.idx.size(); ++i)
      if (logical_idx[i] >= 0) scaled.weights[i] *= 1.0f + static_cast<float>(logical_idx[i]) / 8;
    EXPECT_TRUE(near_weighted_sum(scaled, got, 1e-5));
  }
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

}  // namespace
}  // namespace fathom::ep::test
