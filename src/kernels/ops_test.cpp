// rms_norm, softmax, silu_mul and exp against float64 references on fresh random inputs, at every
// SIMD level this CPU has, odd sizes, strides, in place, every norm weight dtype, special values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/kernels_test_util.h"
#include "kernels/ops.h"

namespace fathom {
namespace {

using testing::random_floats;
using testing::SimdCap;
using testing::supported_levels;
using testing::test_seed;

TEST(Ops, ExpIsWithinTwoUlpAndHandlesSpecialValues) {
  Rng rng(test_seed());
  std::vector<float> x = random_floats(rng, 4099, 30.0f);
  const float specials[] = {0.0f,  -0.0f,       1.0f,         -1.0f,  88.7f,    -87.3f,
                            88.8f, -87.4f,      -104.0f,      1e-30f, INFINITY, -INFINITY,
                            NAN,   0.34657359f, -0.34657359f, 50.0f,  -50.0f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 7] = specials[i];
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    std::vector<float> y(x.size());
    exp_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(y[i])) << simd_level_name(level);
      } else if (want > std::numeric_limits<float>::max()) {
        EXPECT_EQ(y[i], INFINITY) << x[i] << " " << simd_level_name(level);
      } else if (want < std::numeric_limits<float>::min()) {  // below the normal range: 0 or the subnormal
        EXPECT_LE(y[i], std::numeric_limits<float>::min()) << x[i] << " " << simd_level_name(level);
        EXPECT_GE(y[i], 0.0f);
      } else {
        EXPECT_LE(std::fabs(y[i] - want), 2.5e-7 * want) << "exp(" << x[i] << ") " << simd_level_name(level);
      }
    }
  }
}

TEST(Ops, RmsNormMatchesReferenceForEveryWeightTypeStrideAndLevel) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(3);
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t dim : {1, 7, 16, 33, 100, 512, 2049}) {
      for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
        const int64_t rows = 1 + static_cast<int64_t>(rng.below(9));
        const int64_t xs = dim + static_cast<int64_t>(rng.below(3)),
                      ys = dim + static_cast<int64_t>(rng.below(3));
        std::vector<float> x = random_floats(rng, rows * xs, 2.0f), wf = random_floats(rng, dim);
        Buffer w = Buffer::allocate(dtype_bytes(wt, static_cast<uint64_t>(dim)));
        ASSERT_TRUE(from_f32(wt, wf.data(), w.data(), dim).ok());
        const bool with_weight = rng.below(4) != 0;
        RmsNormParams p{
            .n_rows = rows, .dim = dim, .eps = 1e-6f, .x_stride = xs, .y_stride = ys, .weight_dtype = wt};
        std::vector<float> y(static_cast<size_t>(rows * ys), 123.0f);
        rms_norm(p, x.data(), with_weight ? w.data() : nullptr, y.data(), *pool);
        std::vector<double> ref(static_cast<size_t>(rows * dim));
        rms_norm_ref(p, x.data(), with_weight ? w.data() : nullptr, ref.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < ys; ++i) {
            const float got = y[static_cast<size_t>(r * ys + i)];
            if (i >= dim) {
              ASSERT_EQ(got, 123.0f);
              continue;
            }
            const double want = ref[static_cast<size_t>(r * dim + i)];
            ASSERT_NEAR(got, want, 4e-6 * std::fabs(want) + 1e-7)
                << simd_level_name(level) << " dim " << dim << " " << dtype_name(wt);
          }
        }
        // in place
        std::vector<float> xi(x.begin(), x.begin() + rows * xs);
        rms_norm(
            RmsNormParams{
                .n_rows = rows, .dim = dim, .eps = 1e-6f, .x_stride = xs, .y_stride = xs, .weight_dtype = wt},
            xi.data(), with_weight ? w.data() : nullptr, xi.data(), *pool);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < dim; ++i)
            ASSERT_EQ(xi[static_cast<size_t>(r * xs + i)], y[static_cast<size_t>(r * ys + i)]);
      }
    }
  }
}

TEST(Ops, SoftmaxMatchesReferenceWithMaskedEntriesAndAllMaskedRows) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t n : {1, 3, 8, 17, 64, 255, 1000}) {
      const int64_t rows = 4, stride = n + 2;
      std::vector<float> x = random_floats(rng, rows * stride, 8.0f);
      for (int64_t i = 0; i < n; ++i) {
        if (rng.below(4) == 0) x[static_cast<size_t>(i)] = -INFINITY;  // row 0: some masked
        x[static_cast<size_t>(stride + i)] = -INFINITY;                // row 1: all masked
      }
      x[static_cast<size_t>(2 * stride)] = 80.0f;  // row 2: a large logit
      std::vector<double> ref(static_cast<size_t>(rows * n));
      softmax_ref(x.data(), rows, n, stride, ref.data());
      softmax(x.data(), rows, n, stride, *pool);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          const double want = ref[static_cast<size_t>(r * n + i)];
          ASSERT_NEAR(x[static_cast<size_t>(r * stride + i)], want, 3e-6 * want + 1e-9)
              << simd_level_name(level) << " n " << n << " row " << r;
        }
      }
    }
  }
}

// The cross-entropy row: scale * softmax into a separate output (or in place) and the row's
// log-sum-exp, against float64, at vocabulary sizes up to DeepSeek-V3's and with masked entries.
TEST(Ops, SoftmaxRowLseMatchesReferenceScaledOutOfPlaceAndInPlace) {
  Rng rng(test_seed());
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t n : {1, 7, 16, 33, 1000, 8192, 129280}) {
      std::vector<float> x = random_floats(rng, n, 3.0f);
      for (int64_t i = 0; i < n; i += 1 + static_cast<int64_t>(rng.below(50))) x[static_cast<size_t>(i)] = -INFINITY;
      // at least one finite entry; half the rows dominated by one large logit
      x[static_cast<size_t>(rng.below(static_cast<uint64_t>(n)))] = rng.below(2) == 0 ? 30.0f : 1.0f;
      std::vector<double> ref(static_cast<size_t>(n));
      softmax_ref(x.data(), 1, n, 0, ref.data());
      double mx = -INFINITY, sum = 0;
      for (float v : x) mx = std::max(mx, static_cast<double>(v));
      for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
      const double want_lse = mx + std::log(sum);
      const float scale = static_cast<float>(1e-3 * (1 + rng.below(1000)));
      const bool in_place = rng.below(2) == 0;
      std::vector<float> y = in_place ? x : std::vector<float>(static_cast<size_t>(n), NAN);
      const double lse = softmax_row_lse(x.data(), in_place ? x.data() : y.data(), n, scale);
      if (in_place) y = x;
      // exp to 2.5e-7 and sums of at most 64 terms per fp32 lane: a few 1e-7 of log(sum)
      EXPECT_NEAR(lse, want_lse, 5e-6) << simd_level_name(level) << " n " << n;
      for (int64_t i = 0; i < n; ++i) {
        const double want = scale * ref[static_cast<size_t>(i)];
        ASSERT_NEAR(y[static_cast<size_t>(i)], want, 3e-6 * want + 1e-12)
            << simd_level_name(level) << " n " << n << " i " << i << (in_place ? " in place" : "");
      }
    }
    std::vector<float> masked(37, -INFINITY), out(37, NAN);
    EXPECT_EQ(softmax_row_lse(masked.data(), out.data(), 37, 0.5f), -INFINITY);
    for (float v : out) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Ops, SiluMulMatchesReference) {
  Rng rng(test_seed());
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t n : {1, 5, 16, 31, 1408}) {
      std::vector<float> g = random_floats(rng, n, 6.0f), u = random_floats(rng, n);
      if (n > 4) {
        g[0] = -200.0f;
        g[1] = 200.0f;
        g[2] = 0.0f;
      }
      std::vector<float> out(static_cast<size_t>(n));
      std::vector<double> ref(static_cast<size_t>(n));
      silu_mul(g.data(), u.data(), out.data(), n);
      silu_mul_ref(g.data(), u.data(), ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = ref[static_cast<size_t>(i)];
        ASSERT_NEAR(out[static_cast<size_t>(i)], want, 1e-6 * std::fabs(want) + 1e-30)
            << simd_level_name(level) << " g=" << g[static_cast<size_t>(i)];
      }
      silu_mul(g.data(), u.data(), g.data(), n);  // in place
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g[static_cast<size_t>(i)], out[static_cast<size_t>(i)]);
    }
  }
}

TEST(Ops, ArgmaxIsTheFirstLargestAndSkipsNan) {
  Rng rng(test_seed());
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t n : {1, 7, 8, 15, 16, 17, 63, 64, 65, 100, 1000, 102400}) {
      for (int trial = 0; trial < 6; ++trial) {
        std::vector<float> x = random_floats(rng, n, 10.0f);
        const size_t at = rng.next_u64() % static_cast<size_t>(n);
        if (trial == 1) x[at] = 1e30f;  // one clear winner anywhere, the tail included
        if (trial == 2) {               // ties: the first of several equal maxima
          for (int j = 0; j < 3; ++j) x[rng.next_u64() % static_cast<size_t>(n)] = 50.0f;
        }
        if (trial == 3) {  // NaN and infinities among the values
          x[at] = NAN;
          x[rng.next_u64() % static_cast<size_t>(n)] = -INFINITY;
          if (n > 2) x[rng.next_u64() % static_cast<size_t>(n)] = NAN;
        }
        if (trial == 4) std::fill(x.begin(), x.end(), -INFINITY);  // a fully masked row: index 0
        if (trial == 5) {  // a NaN where the maximum would be, and +inf elsewhere
          x[at] = NAN;
          x[(at + static_cast<size_t>(n) / 2) % static_cast<size_t>(n)] = INFINITY;
        }
        const int64_t got = argmax(x.data(), n), want = argmax_ref(x.data(), n);
        ASSERT_EQ(got, want) << simd_level_name(level) << " n=" << n << " trial " << trial;
        if (trial != 3 && trial != 5) {  // without NaN: what std::max_element gives
          ASSERT_EQ(got, std::max_element(x.begin(), x.end()) - x.begin()) << simd_level_name(level);
        }
      }
    }
    std::vector<float> all_nan(37, NAN);
    EXPECT_EQ(argmax(all_nan.data(), 37), 0) << simd_level_name(level);
  }
}

}  // namespace
}  // namespace fathom
