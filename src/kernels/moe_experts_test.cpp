// Grouped expert SwiGLU against its float64 reference for every weight dtype and SIMD level:
// decode (1 token) and prefill-like batches, skipped slots, experts not held here, accumulation,
// independence from the thread count, and validation errors.
//
// Tolerance: fp32 summation differences (1e-5 of sum |w h|) plus, for the activation-rounded
// dtypes, the exact effect of any element of h that lies so close to a rounding boundary (bf16
// or the q8 grid) that the fast path's fp32 h and the reference's float64 h may round apart.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/kernels_test_util.h"
#include "kernels/moe.h"

namespace fathom {
namespace {

using testing::random_floats;
using testing::random_weight;
using testing::SimdCap;
using testing::supported_levels;
using testing::test_seed;
using testing::TestWeight;

struct Experts {
  std::vector<TestWeight> storage;
  std::vector<ExpertWeights> views;
};

Experts make_experts(Rng& rng, const MoeExpertsParams& p, DType gate_type, DType down_type,
                     int64_t missing = -1) {
  Experts ex;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    ex.storage.push_back(random_weight(rng, gate_type, p.inter, p.hidden));
    ex.storage.push_back(random_weight(rng, gate_type, p.inter, p.hidden));
    ex.storage.push_back(random_weight(rng, down_type, p.hidden, p.inter));
  }
  for (int64_t e = 0; e < p.n_experts; ++e) {
    ExpertWeights w{ex.storage[static_cast<size_t>(3 * e)].view,
                    ex.storage[static_cast<size_t>(3 * e + 1)].view,
                    ex.storage[static_cast<size_t>(3 * e + 2)].view};
    if (e == missing) w = ExpertWeights{};
    ex.views.push_back(w);
  }
  return ex;
}

// Distinct experts per token (never `missing`), some slots skipped (-1).
void random_routing(Rng& rng, const MoeExpertsParams& p, int64_t T, int64_t missing,
                    std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(static_cast<size_t>(T * p.top_k), -1);
  w.assign(ids.size(), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < p.top_k; ++j) {
      if (rng.below(6) == 0) continue;
      int32_t e;
      bool dup;
      do {
        e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(p.n_experts)));
        dup = e == missing;
        for (int i = 0; i < j; ++i) dup |= ids[static_cast<size_t>(t * p.top_k + i)] == e;
      } while (dup);
      ids[static_cast<size_t>(t * p.top_k + j)] = e;
      w[static_cast<size_t>(t * p.top_k + j)] = static_cast<float>(rng.uniform() * 2.0);
    }
  }
}

// Per output element: the bound described at the top of the file.
std::vector<double> tolerance(const MoeExpertsParams& p, const Experts& ex, const float* x, int64_t T,
                              const std::vector<int32_t>& ids, const std::vector<float>& w) {
  std::vector<double> tol(static_cast<size_t>(T * p.hidden), 1e-30);
  std::vector<double> g(static_cast<size_t>(p.inter)), u(static_cast<size_t>(p.inter));
  std::vector<float> drow(static_cast<size_t>(p.inter));
  std::vector<double> h(static_cast<size_t>(p.inter)), step(static_cast<size_t>(p.inter));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < p.top_k; ++j) {
      const int32_t e = ids[static_cast<size_t>(t * p.top_k + j)];
      if (e < 0) continue;
      const ExpertWeights& ew = ex.views[static_cast<size_t>(e)];
      matmul_ref(ew.gate, x + t * p.hidden, 1, g.data());
      matmul_ref(ew.up, x + t * p.hidden, 1, u.data());
      double hmax = 0;
      for (int64_t i = 0; i < p.inter; ++i) {
        h[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] / (1.0 + std::exp(-g[static_cast<size_t>(i)])) *
                                    u[static_cast<size_t>(i)];
        hmax = std::max(hmax, std::fabs(h[static_cast<size_t>(i)]));
      }
      const double delta = 1e-5 * hmax;  // how far the fast path's h may sit from this one
      const DType dt = ew.down.dtype;
      for (int64_t i = 0; i < p.inter; ++i) {
        const double hi = h[static_cast<size_t>(i)];
        double s = 0;
        if (dt == DType::kBF16 || dt == DType::kF8E4M3) {
          const float a = bf16_to_f32(f32_to_bf16(static_cast<float>(hi - delta)));
          const float b = bf16_to_f32(f32_to_bf16(static_cast<float>(hi + delta)));
          s = std::fabs(static_cast<double>(b) - a);
        } else if (dt == DType::kQ8_0 || dt == DType::kQ4_0) {
          double amax = 0;
          for (int64_t c = i / 32 * 32; c < i / 32 * 32 + 32; ++c)
            amax = std::max(amax, std::fabs(h[static_cast<size_t>(c)]));
          const double d = amax / 127.0, v = d > 0 ? hi / d : 0.0, dv = d > 0 ? delta / d + 127 * 1e-5 : 0.0;
          s = std::nearbyint(v - dv) != std::nearbyint(v + dv) ? 1.01 * d : 0.0;
        }
        step[static_cast<size_t>(i)] = s;
      }
      for (int64_t r = 0; r < p.hidden; ++r) {
        dequantize_weight_row(ew.down, r, drow.data());
        double sum_abs = 0, flips = 0;
        for (int64_t i = 0; i < p.inter; ++i) {
          sum_abs += std::fabs(drow[static_cast<size_t>(i)] * h[static_cast<size_t>(i)]);
          flips += std::fabs(drow[static_cast<size_t>(i)]) * step[static_cast<size_t>(i)];
        }
        tol[static_cast<size_t>(t * p.hidden + r)] +=
            std::fabs(w[static_cast<size_t>(t * p.top_k + j)]) * (1e-5 * sum_abs + flips);
      }
    }
  }
  return tol;
}

void run_case(Rng& rng, DType gate_type, DType down_type, int64_t T, ThreadPool& pool,
              const std::string& what) {
  const bool quant = gate_type == DType::kQ8_0 || down_type == DType::kQ8_0 || gate_type == DType::kQ4_0;
  MoeExpertsParams p{.n_experts = 7, .hidden = quant ? 96 : 90, .inter = quant ? 160 : 70, .top_k = 3};
  const int64_t missing = 5;
  Experts ex = make_experts(rng, p, gate_type, down_type, missing);
  ASSERT_TRUE(validate_experts(p, ex.views).ok());
  std::vector<float> x = random_floats(rng, T * p.hidden);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(rng, p, T, missing, ids, w);
  auto ws = MoeWorkspace::create(p, 40);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const bool accumulate = rng.below(2) == 1;
  std::vector<float> y0 = random_floats(rng, T * p.hidden), y = y0;
  moe_experts(p, ex.views, x.data(), T, ids.data(), w.data(), y.data(), accumulate, **ws, pool);
  std::vector<double> ref(static_cast<size_t>(T * p.hidden));
  moe_experts_ref(p, ex.views, x.data(), T, ids.data(), w.data(), ref.data());
  const std::vector<double> tol = tolerance(p, ex, x.data(), T, ids, w);
  for (size_t i = 0; i < ref.size(); ++i) {
    const double want = ref[i] + (accumulate ? y0[i] : 0.0);
    ASSERT_NEAR(y[i], want, tol[i] + 1e-6 * std::fabs(want))
        << what << " token " << i / static_cast<size_t>(p.hidden);
  }
}

TEST(MoeExperts, MatchesReferenceForEveryDtypeAndLevel) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(3);
  const std::pair<DType, DType> types[] = {{DType::kBF16, DType::kBF16}, {DType::kF8E4M3, DType::kF8E4M3},
                                           {DType::kQ8_0, DType::kQ8_0}, {DType::kF32, DType::kF32},
                                           {DType::kQ4_0, DType::kQ8_0}, {DType::kF16, DType::kBF16}};
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (auto [gt, dt] : types) {
      for (int64_t T : {1, 2, 23}) {
        run_case(rng, gt, dt, T, *pool,
                 fmt::format("{}/{} {} T={}", dtype_name(gt), dtype_name(dt), simd_level_name(level), T));
      }
    }
  }
}

TEST(MoeExperts, ResultsDoNotDependOnThreadCountAndEmptyRoutingZeroes) {
  Rng rng(test_seed());
  MoeExpertsParams p{.n_experts = 5, .hidden = 64, .inter = 96, .top_k = 2};
  Experts ex = make_experts(rng, p, DType::kBF16, DType::kQ8_0);
  const int64_t T = 19;
  std::vector<float> x = random_floats(rng, T * p.hidden);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(rng, p, T, -1, ids, w);
  auto ws = MoeWorkspace::create(p, T);
  ASSERT_TRUE(ws.ok());
  std::vector<float> base;
  for (int threads : {1, 2, 3}) {
    auto pool = ThreadPool::create(threads);
    std::vector<float> y(static_cast<size_t>(T * p.hidden), 9.0f);
    moe_experts(p, ex.views, x.data(), T, ids.data(), w.data(), y.data(), false, **ws, *pool);
    if (base.empty()) {
      base = y;
    } else {
      ASSERT_EQ(0, std::memcmp(base.data(), y.data(), y.size() * 4)) << threads << " threads";
    }
  }
  std::vector<int32_t> none(ids.size(), -1);
  std::vector<float> y(static_cast<size_t>(T * p.hidden), 9.0f);
  auto pool = ThreadPool::create(2);
  moe_experts(p, ex.views, x.data(), T, none.data(), w.data(), y.data(), false, **ws, *pool);
  for (float v : y) ASSERT_EQ(v, 0.0f);
}

TEST(MoeExperts, ValidationNamesTheExpertAndShape) {
  Rng rng(test_seed());
  MoeExpertsParams p{.n_experts = 3, .hidden = 64, .inter = 32, .top_k = 2};
  Experts ex = make_experts(rng, p, DType::kBF16, DType::kBF16);
  EXPECT_TRUE(validate_experts(p, ex.views).ok());
  Experts bad = make_experts(rng, MoeExpertsParams{.n_experts = 3, .hidden = 64, .inter = 48, .top_k = 2},
                             DType::kBF16, DType::kBF16);
  auto s = validate_experts(p, bad.views);
  EXPECT_NE(s.message().find("expert 0"), std::string::npos) << s.message();
  std::vector<ExpertWeights> mixed = ex.views;
  Experts q = make_experts(rng, p, DType::kQ8_0, DType::kBF16);
  mixed[2] = q.views[2];
  EXPECT_FALSE(validate_experts(p, mixed).ok());
  EXPECT_FALSE(validate_experts(p, std::span<const ExpertWeights>(ex.views.data(), 2)).ok());
  EXPECT_FALSE(
      MoeWorkspace::create(MoeExpertsParams{.n_experts = 3, .hidden = 64, .inter = 32, .top_k = 65}, 4).ok());
  EXPECT_FALSE(MoeWorkspace::create(p, 0).ok());
}

}  // namespace
}  // namespace fathom
