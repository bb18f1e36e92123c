// The blocked backward GEMMs against their float64 references on random odd shapes.
#include "train/gemm.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "base/cpu.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"
#include "train/train_test_util.h"

namespace fathom::train {
namespace {

template <class T>
void check_all(int64_t m, int64_t n, int64_t k, Rng& rng, double tol) {
  std::vector<T> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bt(static_cast<size_t>(n * k));
  std::vector<T> at(static_cast<size_t>(k * m)), c(static_cast<size_t>(m * n)), c0(c.size());
  for (auto* v : {&a, &b, &bt, &at, &c0}) {
    for (T& x : *v) x = static_cast<T>(2 * rng.uniform() - 1);
  }
  auto compare = [&](const char* what, const std::vector<double>& ref) {
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_NEAR(static_cast<double>(c[i]), ref[i], tol * static_cast<double>(k + 1))
          << what << " m=" << m << " n=" << n << " k=" << k;
    }
  };
  std::vector<double> ref(c.size());
  // nn, overwrite and accumulate
  std::fill(ref.begin(), ref.end(), 0.0);
  gemm_nn_ref(m, n, k, a.data(), b.data(), ref.data());
  gemm_nn(m, n, k, a.data(), b.data(), c.data(), false);
  compare("nn", ref);
  c = c0;
  for (size_t i = 0; i < c.size(); ++i) ref[i] = static_cast<double>(c0[i]);
  gemm_nn_ref(m, n, k, a.data(), b.data(), ref.data());
  gemm_nn(m, n, k, a.data(), b.data(), c.data(), true);
  compare("nn+=", ref);
  // tn always accumulates
  c = c0;
  for (size_t i = 0; i < c.size(); ++i) ref[i] = static_cast<double>(c0[i]);
  gemm_tn_ref(m, n, k, at.data(), b.data(), ref.data());
  gemm_tn(m, n, k, at.data(), b.data(), c.data());
  compare("tn", ref);
  // nt
  std::fill(ref.begin(), ref.end(), 0.0);
  gemm_nt_ref(m, n, k, a.data(), bt.data(), ref.data());
  gemm_nt(m, n, k, a.data(), bt.data(), c.data(), false);
  compare("nt", ref);
}

TEST(TrainGemm, BlockedKernelsMatchFloat64ReferencesOnOddShapes) {
  Rng rng(testing::fresh_seed("TrainGemm"));
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {17, 130, 65},
                               {64, 513, 70}, {129, 33, 257}, {2, 1030, 3}};
  for (const auto& s : shapes) {
    check_all<float>(s[0], s[1], s[2], rng, 2e-7);
    check_all<double>(s[0], s[1], s[2], rng, 1e-15);
  }
}

double bf16_round(float v) {
  return static_cast<double>(bf16_to_f32(f32_to_bf16(v)));
}

// GemmPrecision::kBf16: where AMX runs the shape, every product equals the float64 product of the
// operands rounded to bf16 (up to fp32 summation), and differs from the fp32 product by about the
// rounding; elsewhere (no AMX, k not a multiple of 64, fewer than 2 rows) the fp32 path runs
// unchanged, bit for bit. Both tn orientations (m >= n and m < n) are covered.
TEST(TrainGemm, Bf16PrecisionRoundsBothOperandsWhereAmxRuns) {
  Rng rng(testing::fresh_seed("TrainGemm bf16"));
  const bool amx = amx_bf16_usable();
  if (!amx) std::printf("no AMX BF16 here: only the fp32 fallback is checked\n");
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s : {Shape{64, 96, 128}, Shape{130, 70, 256}, Shape{40, 300, 64}, Shape{3, 64, 128},
                        Shape{1, 64, 128}, Shape{50, 80, 96}}) {
    const int64_t m = s.m, n = s.n, k = s.k;
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bt(b.size()),
        at(a.size()), c0(static_cast<size_t>(m * n));
    for (auto* v : {&a, &b, &bt, &at, &c0}) {
      for (float& x : *v) x = static_cast<float>(2 * rng.uniform() - 1);
    }
    // The shapes where kBf16 computes in bf16: rows of the activation operand at least the tiles'
    // minimum for bf16 weights (the smaller of m and n for tn), k a multiple of 64.
    const int64_t min_m = matmul_internal::amx_min_m(DType::kBF16);
    const bool nn_bf16 = amx && k % 64 == 0 && m >= min_m;
    const bool tn_bf16 = amx && k % 64 == 0 && std::min(m, n) >= min_m;
    for (const char* op : {"nn", "tn", "nt"}) {
      const std::string what = fmt::format("{} m={} n={} k={}", op, m, n, k);
      std::vector<float> c32 = c0, c16 = c0;
      auto run = [&](std::vector<float>& c) {
        if (op[0] == 'n' && op[1] == 'n') gemm_nn(m, n, k, a.data(), b.data(), c.data(), true);
        if (op[0] == 't') gemm_tn(m, n, k, at.data(), b.data(), c.data());
        if (op[1] == 't') gemm_nt(m, n, k, a.data(), bt.data(), c.data(), true);
      };
      set_gemm_precision(GemmPrecision::kF32);
      run(c32);
      set_gemm_precision(GemmPrecision::kBf16);
      run(c16);
      set_gemm_precision(GemmPrecision::kF32);
      const bool bf16 = op[0] == 't' ? tn_bf16 : nn_bf16;
      if (!bf16) {
        EXPECT_EQ(c16, c32) << what << ": not an AMX shape, so fp32 bit for bit";
        continue;
      }
      double max_diff = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = c0[static_cast<size_t>(i * n + j)];
          for (int64_t p = 0; p < k; ++p) {
            const float x =
                op[0] == 't' ? at[static_cast<size_t>(p * m + i)] : a[static_cast<size_t>(i * k + p)];
            const float y =
                op[1] == 't' ? bt[static_cast<size_t>(j * k + p)] : b[static_cast<size_t>(p * n + j)];
            ref += bf16_round(x) * bf16_round(y);
          }
          const size_t idx = static_cast<size_t>(i * n + j);
          ASSERT_NEAR(c16[idx], ref, 2e-7 * static_cast<double>(k + 1)) << what << " at " << i << "," << j;
          max_diff = std::max(max_diff, std::abs(static_cast<double>(c16[idx]) - c32[idx]));
        }
      }
      // bf16 keeps 8 bits: products of values in (-1, 1) move by ~2^-9 each.
      EXPECT_GT(max_diff, 1e-4) << what << ": the bf16 path did not run";
    }
  }
}

TEST(TrainGemm, EmptyShapesDoNothing) {
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 7.0f);
  gemm_tn<float>(2, 2, 0, a.data(), b.data(), c.data());
  EXPECT_EQ(c[0], 7.0f);
  gemm_nn<float>(2, 2, 0, a.data(), b.data(), c.data(), false);
  EXPECT_EQ(c[0], 0.0f);
}

}  // namespace
}  // namespace fathom::train
