// matmul against its float64 reference on fresh random inputs, for every dtype, every SIMD level
// this CPU has (capped with set_simd_level_cap), decode (m <= 4) and GEMM (m > 4) shapes, odd sizes,
// strides and accumulation; the activation preparation bit for bit against the scalar quantiser;
// error paths; determinism across thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>

#include "base/check.h"
#include "kernels/kernels_test_util.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"

namespace fathom {
namespace {

using testing::abs_dot;
using testing::random_floats;
using testing::random_weight;
using testing::SimdCap;
using testing::supported_levels;
using testing::test_seed;

const DType kAllTypes[] = {DType::kF32,    DType::kF16,  DType::kBF16,
                           DType::kF8E4M3, DType::kQ8_0, DType::kQ4_0};

bool is_quant(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0;
}

// Tolerance relative to sum |x w|: fp32 accumulation of up to ~1000 products in any order.
constexpr double kRelTol = 2e-5;
// fp8 weights at 2..kFp8F16MaxM rows on AVX-512 FP16 CPUs: each 128-column block is summed per lane
// in fp16 (two blocks: 8 fused products and the halves' sum, each rounding at most u = 2^-11 of a
// partial sum bounded by the lane's sum |x w|), then in fp32. The tolerance is 2u: these tests'
// errors stay below 0.4u (about what the bf16 rounding of the activations already costs), and a
// lost block, a wrong scale or a misplaced column is off by far more.
constexpr double kF16RelTol = 2.0 / 2048;
bool takes_f16(const WeightView& w, int64_t m) {
  return matmul_internal::fp8_f16_wanted(w.dtype, simd_level(), m, w.cols);
}

struct Case {
  int64_t rows, cols, m;
  bool accumulate;
  int64_t x_pad, y_pad;
};

// Runs one case at the current SIMD level on the activations xdense ([m, cols]) and compares with
// matmul_ref.
void check_case_x(Rng& rng, const WeightView& w, const Case& c, ThreadPool& pool, const std::string& what,
                  const std::vector<float>& xdense) {
  const int64_t xs = w.cols + c.x_pad, ys = w.rows + c.y_pad;
  std::vector<float> x(static_cast<size_t>(c.m * xs), 777.0f), y(static_cast<size_t>(c.m * ys), 0.0f);
  for (int64_t i = 0; i < c.m; ++i)
    std::memcpy(x.data() + i * xs, xdense.data() + i * w.cols, static_cast<size_t>(w.cols) * 4);
  // 16 guard rows past the m output rows (a kernel's lane group): nothing may write there
  std::vector<float> y0 = random_floats(rng, (c.m + 16) * ys);
  y = y0;
  matmul(w, x.data(), c.m, y.data(), pool,
         MatmulOptions{.x_stride = xs, .y_stride = ys, .accumulate = c.accumulate});
  for (int64_t i = c.m * ys; i < (c.m + 16) * ys; ++i)
    ASSERT_EQ(y[static_cast<size_t>(i)], y0[static_cast<size_t>(i)]) << what << " wrote past its m rows";
  std::vector<double> ref(static_cast<size_t>(c.m * w.rows));
  matmul_ref(w, xdense.data(), c.m, ref.data());
  const std::vector<double> scale = abs_dot(w, xdense.data(), c.m);
  const double rel_tol = takes_f16(w, c.m) ? kF16RelTol : kRelTol;
  int bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t r = 0; r < ys; ++r) {
      const size_t yi = static_cast<size_t>(i * ys + r);
      if (r >= w.rows) {  // padding must be untouched
        ASSERT_EQ(y[yi], y0[yi]) << what << " wrote outside its rows";
        continue;
      }
      const size_t ri = static_cast<size_t>(i * w.rows + r);
      const double want = ref[ri] + (c.accumulate ? y0[yi] : 0.0);
      const double tol = rel_tol * scale[ri] + 1e-6 * std::fabs(want) + 1e-30;
      if (!(std::fabs(y[yi] - want) <= tol) && ++bad < 5) {
        ADD_FAILURE() << what << " m=" << i << " r=" << r << ": got " << y[yi] << " want " << want << " tol "
                      << tol;
      }
    }
  }
  ASSERT_EQ(bad, 0) << what;
}

// The same on fresh standard-normal activations.
void check_case(Rng& rng, const WeightView& w, const Case& c, ThreadPool& pool, const std::string& what) {
  check_case_x(rng, w, c, pool, what, random_floats(rng, c.m * w.cols));
}

std::string describe(DType t, SimdLevel l, const Case& c) {
  return fmt::format("{} {} [{}x{}] m={} acc={} xpad={} ypad={}", dtype_name(t), simd_level_name(l), c.rows,
                     c.cols, c.m, c.accumulate, c.x_pad, c.y_pad);
}

TEST(Matmul, MatchesReferenceForEveryDtypeAndSimdLevel) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(3);
  const int64_t float_cols[] = {1, 7, 33, 130, 257};
  const int64_t quant_cols[] = {32, 96, 160, 288};
  const int64_t rows_list[] = {1, 5, 67, 130};
  const int64_t ms[] = {1, 2, 3, 4, 5, 7, 13};
  for (DType t : kAllTypes) {
    for (SimdLevel level : supported_levels()) {
      SimdCap cap(level);
      for (int trial = 0; trial < 6; ++trial) {
        const int64_t cols = is_quant(t) ? quant_cols[rng.below(4)] : float_cols[rng.below(5)];
        Case c{rows_list[rng.below(4)],
               cols,
               ms[rng.below(7)],
               rng.below(2) == 1,
               static_cast<int64_t>(rng.below(3)),
               static_cast<int64_t>(rng.below(3))};
        auto w = random_weight(rng, t, c.rows, c.cols, trial % 3 == 2);
        check_case(rng, w.view, c, *pool, describe(t, level, c));
      }
    }
  }
}

TEST(Matmul, EveryMUpToTwoGemmTilesAtEveryLevel) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (DType t : kAllTypes) {
    auto w = random_weight(rng, t, 70, is_quant(t) ? 64 : 45);
    for (SimdLevel level : supported_levels()) {
      SimdCap cap(level);
      for (int64_t m = 1; m <= 17; ++m) {
        Case c{70, w.view.cols, m, false, 0, 0};
        check_case(rng, w.view, c, *pool, describe(t, level, c));
      }
    }
  }
}

// Whole 128-column blocks (every checkpoint's shapes) take the fp8 pair kernel on VBMI CPUs for 2-16
// activation rows; odd row counts leave a single trailing row to the generic path.
TEST(Matmul, Fp8WholeBlocksEveryMAndRowParity) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t cols_list[] = {128, 256, 384, 1024};
  const int64_t rows_list[] = {2, 9, 70, 131, 300};
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t cols : cols_list) {
      auto w = random_weight(rng, DType::kF8E4M3, rows_list[rng.below(5)], cols);
      for (int64_t m = 1; m <= 17; ++m) {
        Case c{w.view.rows, cols, m, rng.below(2) == 1, static_cast<int64_t>(rng.below(3)),
               static_cast<int64_t>(rng.below(3))};
        check_case(rng, w.view, c, *pool, describe(DType::kF8E4M3, level, c));
      }
    }
  }
}

// Weights of type t with k a multiple of col_unit (up to max_units of them) and 8j + (0..7) rows
// (one or two 128-row scale groups for fp8), raw bits (every code) in a third of the cases, at each
// of ms activation rows and every SIMD level; returns how many cases at the top level the lanes
// kernel takes.
int run_row_counts(Rng& rng, ThreadPool& pool, DType t, int64_t col_unit, int max_units,
                   std::span<const int64_t> ms) {
  int lanes = 0;
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t m : ms) {
      const int64_t cols = col_unit * static_cast<int64_t>(1 + rng.below(static_cast<uint64_t>(max_units)));
      const int64_t rows =
          8 * static_cast<int64_t>(1 + rng.below(20)) + (rng.below(2) == 0 ? 0 : rng.below(8));
      auto w = random_weight(rng, t, rows, cols, rng.below(3) == 0);
      Case c{rows,
             cols,
             m,
             rng.below(2) == 1,
             static_cast<int64_t>(rng.below(3)),
             static_cast<int64_t>(rng.below(3))};
      const bool top = level == supported_levels().back();
      lanes += top && (matmul_internal::fp8_lanes_wanted(t, simd_level(), m, cols) ||
                       matmul_internal::bf16_lanes_wanted(t, simd_level(), m, cols))
                   ? 1
                   : 0;
      check_case(rng, w.view, c, pool, describe(t, level, c));
    }
  }
  return lanes;
}

// fp8 weights with whole 128-column blocks at 11-65 activation rows: at 12-32 and 62-64 on VBMI CPUs
// without usable AMX the kernel with the activation rows across the lanes (lanes past the rows
// empty; weight rows eight at a time, the last few through the pair kernels or the GEMM), at the
// other counts and elsewhere the pair kernels, the GEMM or the tiles.
TEST(Matmul, Fp8WholeBlocksElevenToSixtyFiveRows) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t ms[] = {11, 12, 13, 16, 17, 24, 31, 32, 33, 48, 61, 62, 63, 64, 65};
  const int lanes = run_row_counts(rng, *pool, DType::kF8E4M3, 128, 4, ms);
  if (matmul_internal::fp8_use_vbmi(SimdLevel::kAvx512Bf16) && !amx_bf16_usable()) {
    EXPECT_EQ(lanes, 10) << "12-32 and 62-64 rows take the lanes kernel";
  }
}

// bf16 weights with k a multiple of 32 at 11-33 activation rows: at 12-32 on AVX-512 BF16 CPUs
// without usable AMX the kernel with the activation rows across the lanes, at the other counts
// and elsewhere the row-wise kernel, the GEMM or the tiles.
TEST(Matmul, Bf16ElevenToThirtyThreeRows) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t ms[] = {11, 12, 15, 16, 17, 29, 32, 33};
  const int lanes = run_row_counts(rng, *pool, DType::kBF16, 32, 40, ms);
  if (supported_levels().back() >= SimdLevel::kAvx512Bf16 && !amx_bf16_usable()) {
    EXPECT_EQ(lanes, 6) << "12-32 rows take the lanes kernel";
  }
}

TEST(Matmul, LargerShapesSpanSeveralKBlocksAndPanels) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (DType t : kAllTypes) {
    for (SimdLevel level : supported_levels()) {
      SimdCap cap(level);
      // 600 columns: several k-blocks (128/256) with a ragged tail; 200 rows: 3+ panels and a tail.
      const int64_t cols = is_quant(t) ? 608 : 600;
      Case c{200, cols, static_cast<int64_t>(1 + rng.below(2) * 20), true, 0, 0};
      auto w = random_weight(rng, t, c.rows, c.cols);
      check_case(rng, w.view, c, *pool, describe(t, level, c));
    }
  }
}

// The quantised GEMM at a prefill's expert row counts: whole 64-row panels of whole block pairs
// (pack_panel<true>) beside a ragged last panel and a 96-column k tail with a lone last block
// (pack_panel<false>), 3-row register tiles with 4- and 5-row calls split 2 + 2 and 3 + 2.
TEST(Matmul, QuantisedGemmAtPrefillRowCounts) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (SimdLevel level : supported_levels()) {
      SimdCap cap(level);
      for (const int64_t m : {19, 22, 48, 50}) {
        Case c{150, 608, m, m % 2 == 0, 0, 0};
        auto w = random_weight(rng, t, c.rows, c.cols);
        check_case(rng, w.view, c, *pool, describe(t, level, c));
      }
    }
  }
}

TEST(Matmul, Fp8DecodesAllFiniteCodesAndPropagatesNaN) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  // every byte value 0..255 except the two NaNs appears in every 256-column row
  const int64_t rows = 9, cols = 256;
  Buffer data = Buffer::allocate(rows * cols);
  std::vector<float> scale = {0.75f, 2.0f};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t b = static_cast<uint8_t>((c * 7 + r) & 0xff);
      if ((b & 0x7f) == 0x7f) b = 0;
      data.data()[r * cols + c] = b;
    }
  WeightView w{DType::kF8E4M3, rows, cols, data.data(), scale.data()};
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t m : {1, 6, 8})
      check_case(rng, w, Case{rows, cols, m, false, 0, 0}, *pool,
                 describe(w.dtype, level, {rows, cols, m, false, 0, 0}));
  }
  data.data()[3 * cols + 17] = 0x7f;  // NaN in row 3
  std::vector<float> x = random_floats(rng, 8 * cols), y(8 * rows);
  for (SimdLevel level : supported_levels()) {
    SimdCap cap(level);
    for (int64_t m : {1, 2, 3, 4, 5, 6, 8}) {
      std::fill(y.begin(), y.end(), 0.0f);  // no NaN left from the previous call
      matmul(w, x.data(), m, y.data(), *pool);
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_TRUE(std::isnan(y[static_cast<size_t>(i * rows + 3)])) << simd_level_name(level) << " m=" << m;
        EXPECT_FALSE(std::isnan(y[static_cast<size_t>(i * rows + 2)]))
            << simd_level_name(level) << " m=" << m;
      }
    }
  }
}

// fp8 weights at 2-7 activation rows on AVX-512 FP16 CPUs (fp16 arithmetic, activations scaled by
// powers of two and by each column block's scale; the pair kernel at 2-4 rows, the single-row
// kernel with interleaved activations at 5-7): rows of very different magnitudes (products that
// overflow fp16 without the scaling, or fall below its range), every e4m3 code but NaN, scales
// spread over a 128-row group, odd block counts (the kernels sum blocks in pairs), odd row counts
// and second scale groups; the same cases with the fp16 kernel turned off take the bf16 or tile
// path, checked at its own tolerance.
TEST(Matmul, Fp8F16KernelMatchesReferenceAtEveryActivationScale) {
  if (!matmul_internal::fp8_use_f16(SimdLevel::kAvx512Bf16) || simd_level() < SimdLevel::kAvx512Bf16)
    GTEST_SKIP() << "no AVX-512 FP16";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t cols_list[] = {128, 384, 1408, 2048};
  const int64_t rows_list[] = {2, 7, 130, 300};
  const double row_exps[] = {0, 4.5, -4, 30, -30};  // log10 of a row's magnitude
  for (int f16 : {1, 0}) {
    matmul_internal::set_fp8_f16_override(f16);
    for (int trial = 0; trial < 21; ++trial) {
      // every activation row count of the fp16 range, three times each
      Case c{rows_list[rng.below(4)],
             cols_list[rng.below(4)],
             2 + trial % (matmul_internal::kFp8F16MaxM - 1),
             rng.below(2) == 1,
             static_cast<int64_t>(rng.below(3)),
             static_cast<int64_t>(rng.below(3))};
      auto w = random_weight(rng, DType::kF8E4M3, c.rows, c.cols, trial % 2 == 1);
      ASSERT_EQ(takes_f16(w.view, c.m), f16 == 1);
      std::vector<float> x = random_floats(rng, c.m * c.cols);
      for (int64_t i = 0; i < c.m; ++i) {
        const double e = row_exps[(trial + i) % 5];
        for (int64_t k = 0; k < c.cols; ++k) {
          // within a row, blocks up to 2^6 apart as well
          const double block = std::ldexp(1.0, static_cast<int>((k / 128 * 7 + i) % 7));
          x[static_cast<size_t>(i * c.cols + k)] *= static_cast<float>(std::pow(10.0, e) * block);
        }
      }
      check_case_x(rng, w.view, c, *pool,
                   fmt::format("f16={} {}", f16, describe(w.view.dtype, simd_level(), c)), x);
    }
  }
  matmul_internal::set_fp8_f16_override(-1);
}

// A 128-row group whose column-block scales spread beyond 2^14 would leave the small-scale blocks'
// products as fp16 subnormals; such a group runs on the bf16 path (the activations are scaled up
// where the scales are small, so those blocks carry as much as the others and losing their bits
// would be far beyond the tolerance). Groups with a zero scale stay on the fp16 kernel.
TEST(Matmul, Fp8F16GroupsWithWideScaleSpreadStayExact) {
  if (!matmul_internal::fp8_use_f16(SimdLevel::kAvx512Bf16) || simd_level() < SimdLevel::kAvx512Bf16)
    GTEST_SKIP() << "no AVX-512 FP16";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t rows = 256, cols = 512;
  auto w = random_weight(rng, DType::kF8E4M3, rows, cols);
  // group 0: scales 1, 1.37 * 2^-26, 1.91 * 2^-29, 1.13 * 2^-31; group 1: 1, 0, 0.7, 0.3
  const float spread[] = {1.0f, 1.37f * 0x1p-26f, 1.91f * 0x1p-29f, 1.13f * 0x1p-31f, 1.0f, 0.0f, 0.7f, 0.3f};
  for (int i = 0; i < 8; ++i) w.scale[static_cast<size_t>(i)] = spread[i];
  for (int64_t m = 2; m <= matmul_internal::kFp8F16MaxM; ++m) {
    std::vector<float> x = random_floats(rng, m * cols);
    for (int64_t i = 0; i < m; ++i)  // every block of group 0 contributes alike
      for (int64_t k = 128; k < cols; ++k) x[static_cast<size_t>(i * cols + k)] /= spread[k / 128];
    Case c{rows, cols, m, false, 0, 0};
    check_case_x(rng, w.view, c, *pool, describe(w.view.dtype, simd_level(), c), x);
  }
}

// The fp16 activation rows (ActView::f16) bit for bit against the scalar reference: zero rows,
// rows with inf or NaN (power of two 1), huge and tiny rows (the clamp), k not a multiple of 16
// (zero padding).
TEST(Matmul, Fp16ActivationRowsMatchTheScalarReferenceBitForBit) {
  if (!matmul_internal::fp8_f16_available()) GTEST_SKIP() << "no AVX-512 FP16";
  Rng rng(test_seed());
  for (int64_t k : {7, 64, 130, 2048}) {
    const int64_t m = 9, stride = (k + 63) / 64 * 64;
    std::vector<float> x = random_floats(rng, m * k);
    const float row_scale[] = {1.0f, 0.0f, 1e30f, 1e-30f, 3e-39f, 65504.0f, 1.0f, 1.0f, 1e-3f};
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < k; ++c) x[static_cast<size_t>(i * k + c)] *= row_scale[i];
    x[static_cast<size_t>(6 * k + k / 2)] = __builtin_inff();
    x[static_cast<size_t>(7 * k + k - 1)] = __builtin_nanf("");
    std::vector<uint16_t> a(static_cast<size_t>(m * stride), 0xdead), b(a.size(), 0xbeef);
    std::vector<float> ua(static_cast<size_t>(m)), ub(static_cast<size_t>(m));
    matmul_internal::act_to_f16_rows_scalar(x.data(), k, k, stride, a.data(), ua.data(), 0, m);
    matmul_internal::act_to_f16_rows_avx512fp16(x.data(), k, k, stride, b.data(), ub.data(), 0, m);
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_EQ(ua[static_cast<size_t>(i)], ub[static_cast<size_t>(i)]) << "k=" << k << " row " << i;
      for (int64_t c = 0; c < stride; ++c) {
        const uint16_t va = a[static_cast<size_t>(i * stride + c)],
                       vb = b[static_cast<size_t>(i * stride + c)];
        const bool nan = (va & 0x7c00) == 0x7c00 && (va & 0x3ff) != 0;
        if (nan) {
          EXPECT_TRUE((vb & 0x7c00) == 0x7c00 && (vb & 0x3ff) != 0)
              << "k=" << k << " row " << i << " col " << c;
        } else {
          ASSERT_EQ(va, vb) << "k=" << k << " row " << i << " col " << c;
        }
        if (c >= k) {
          ASSERT_EQ(va, 0) << "padding";
        }
      }
    }
    // a plain row's largest magnitude lands in [2^9, 2^10) and unscale undoes the power of two
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(f16_to_f32(a[static_cast<size_t>(c)])));
    EXPECT_GE(amax, 512.0f);
    EXPECT_LT(amax, 1024.0f);
    EXPECT_EQ(f16_to_f32(a[0]) * ua[0] / 256.0f, bf16_to_f32(f32_to_bf16(x[0])));
    EXPECT_EQ(ua[1], 256.0f);  // the zero row keeps 2^0
  }
}

TEST(Matmul, Fp8TableAndVbmiConvertersBothMatchReference) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  if (simd_level_supported() < SimdLevel::kAvx512Bf16) GTEST_SKIP() << "no AVX-512 BF16";
  for (int vbmi : {0, 1}) {
    matmul_internal::set_fp8_vbmi_override(vbmi);
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t cols = 1 + static_cast<int64_t>(rng.below(400)),
                    rows = 1 + static_cast<int64_t>(rng.below(150));
      const int64_t m = 1 + static_cast<int64_t>(rng.below(12));
      auto w = random_weight(rng, DType::kF8E4M3, rows, cols, trial % 2 == 1);
      Case c{rows, cols, m, trial % 3 == 0, 0, 1};
      check_case(rng, w.view, c, *pool,
                 fmt::format("vbmi={} {}", vbmi, describe(w.view.dtype, simd_level(), c)));
    }
  }
  matmul_internal::set_fp8_vbmi_override(-1);
}

// The matrix-vector kernels in both read orders (address_order_wanted, taken on AMD CPUs): at one
// activation row bf16 and fp8 one row at a time or four rows side by side, at 2-5 rows the fp8 pair
// kernels with their requests in address or column order. Each matches the reference on every CPU
// with AVX-512 BF16, fp8 with either converter, over whole 128-column blocks and ragged widths (the
// one-row kernels need whole blocks), row counts that leave partial groups, and with the next
// weights hinted or not (the requests run on into them past the last row and must not change a
// result). Q8_0 and Q4_0 alike (one weight row at a time or four side by side at 1-3 activation
// rows), over block counts that fill, split and leave odd the one-row kernel's 16-block chunks.
TEST(Matmul, MatvecsInBothReadOrdersMatchReference) {
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  if (simd_level_supported() < SimdLevel::kAvx512Bf16) GTEST_SKIP() << "no AVX-512 BF16";
  auto other = random_weight(rng, DType::kBF16, 64, 1024);
  for (int stream : {0, 1}) {
    matmul_internal::set_address_order_override(stream);
    EXPECT_EQ(matmul_internal::address_order_wanted(), stream == 1);
    // bf16; fp8 with the table converter; fp8 with VBMI; Q8_0; Q4_0
    for (int conv : {0, 1, 2, 3, 4}) {
      const DType t = conv == 0   ? DType::kBF16
                      : conv <= 2 ? DType::kF8E4M3
                      : conv == 3 ? DType::kQ8_0
                                  : DType::kQ4_0;
      matmul_internal::set_fp8_vbmi_override(conv == 2 ? 1 : 0);
      const int64_t blocks[] = {1, 3, 16, 17, 44, 65};  // Q8_0 / Q4_0 widths in 32-column blocks
      for (int trial = 0; trial < 8; ++trial) {
        const int64_t cols = is_quant(t)  ? 32 * blocks[trial % 6]
                             : trial == 7 ? 64 * static_cast<int64_t>(1 + rng.below(9)) + 32
                                          : 128 * static_cast<int64_t>(1 + rng.below(8));
        const int64_t rows = 1 + static_cast<int64_t>(rng.below(300));
        auto w = random_weight(rng, t, rows, cols, trial % 2 == 1);
        const int64_t hint = trial % 3 == 0 ? 0 : static_cast<int64_t>(rng.below(128 * 1024));
        matmul_internal::NextWeightsScope next(other.data.data(), hint);
        const int64_t m = trial < 4 ? 1 : 2 + static_cast<int64_t>(rng.below(4));
        Case c{rows,
               cols,
               m,
               trial % 3 == 1,
               static_cast<int64_t>(rng.below(3)),
               static_cast<int64_t>(rng.below(3))};
        check_case(rng, w.view, c, *pool,
                   fmt::format("stream={} vbmi={} hint={} {}", stream, conv == 2, hint,
                               describe(w.view.dtype, simd_level(), c)));
      }
    }
  }
  matmul_internal::set_fp8_vbmi_override(-1);
  matmul_internal::set_address_order_override(-1);
}

// On CPUs with AMX the bf16 and fp8 GEMMs with k a multiple of 64 run on tiles from m = 2 and 4; the
// same cases with AMX turned off take the AVX-512 kernels, so both are checked here. Rows cover
// tail panels and a second 128-row fp8 scale group; columns a 64-wide last block; m one and
// several 16-row activation tiles with a tail.
TEST(Matmul, AmxTilesAndAvx512KernelsBothMatchReference) {
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX BF16 in this process";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t cols_list[] = {64, 192, 576, 1024};
  const int64_t rows_list[] = {16, 40, 144, 200};
  const int64_t ms[] = {4, 5, 9, 15, 16, 17, 33, 40};
  for (bool amx : {true, false}) {
    set_amx_enabled(amx);
    for (DType t : {DType::kBF16, DType::kF8E4M3}) {
      for (int trial = 0; trial < 10; ++trial) {
        Case c{rows_list[rng.below(4)], cols_list[rng.below(4)], ms[rng.below(8)], rng.below(2) == 1,
               static_cast<int64_t>(rng.below(3)), static_cast<int64_t>(rng.below(3))};
        EXPECT_EQ(matmul_internal::amx_wanted(t, simd_level(), c.m, c.cols),
                  amx && !takes_f16(WeightView{t, c.rows, c.cols, nullptr, nullptr}, c.m));
        auto w = random_weight(rng, t, c.rows, c.cols, trial % 3 == 2);
        check_case(rng, w.view, c, *pool, fmt::format("amx={} {}", amx, describe(t, simd_level(), c)));
      }
    }
  }
  set_amx_enabled(true);
}

// bf16 weights at 2-16 activation rows run the panel-pair tile loop (amx_rows), which fp8 weights
// take only above 16 rows: every m of that range against the float64 reference, with row counts
// that end in a pair of panels, a single tail panel, a short pair and a short single panel, and a
// 64-column last block (which loop runs is not observable here; this checks its results).
TEST(Matmul, AmxBf16AtTwoToSixteenRowsMatchesReference) {
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX BF16 in this process";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (int64_t m = matmul_internal::amx_min_m(DType::kBF16); m <= 16; ++m) {
    for (int64_t rows : {32, 48, 40, 24}) {
      const int64_t cols = m % 2 == 0 ? 192 : 256;
      ASSERT_TRUE(matmul_internal::amx_wanted(DType::kBF16, simd_level(), m, cols));
      Case c{rows, cols, m, m % 3 == 0, m % 2, 1};
      auto w = random_weight(rng, DType::kBF16, rows, cols, false);
      check_case(rng, w.view, c, *pool, fmt::format("bf16 tiles {}", describe(DType::kBF16, simd_level(), c)));
    }
  }
}

// The m > 16 tile path's cache blocking, shrunk so small shapes take several activation passes
// (a last short one included), several column ranges (a 64-column last block with bf16) and
// several weight-panel groups (a last short panel included).
TEST(Matmul, AmxCacheBlockingMatchesReference) {
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX BF16 in this process";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t cols_list[] = {192, 576, 1088};
  const int64_t rows_list[] = {40, 144, 200};
  const int64_t ms[] = {17, 40, 70, 150};
  struct Restore {  // the defaults come back however the test ends
    ~Restore() { matmul_internal::set_amx_blocking({}); }
  } restore;
  for (const matmul_internal::AmxBlocking b :
       {matmul_internal::AmxBlocking{16 << 10, 2, 2}, matmul_internal::AmxBlocking{48 << 10, 3, 3}}) {
    matmul_internal::set_amx_blocking(b);
    for (DType t : {DType::kBF16, DType::kF8E4M3}) {
      for (int trial = 0; trial < 6; ++trial) {
        Case c{rows_list[rng.below(3)],
               cols_list[rng.below(3)],
               ms[rng.below(4)],
               rng.below(2) == 1,
               static_cast<int64_t>(rng.below(3)),
               static_cast<int64_t>(rng.below(3))};
        ASSERT_TRUE(matmul_internal::amx_wanted(t, simd_level(), c.m, c.cols));
        auto w = random_weight(rng, t, c.rows, c.cols, trial % 3 == 2);
        check_case(rng, w.view, c, *pool,
                   fmt::format("blocking {}/{}/{} {}", b.chunk_bytes, b.min_tiles, b.group_panels,
                               describe(t, simd_level(), c)));
      }
    }
  }
}

// The transposed column pairs the AMX tiles read (ActView::xt), word for word, including the zero
// columns past the last row, and through act_rows.
TEST(Matmul, AmxTransposedActivationsMatchTheRows) {
  using namespace matmul_internal;
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX BF16 in this process";
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  for (int64_t m : {4, 15, 16, 37}) {
    for (int64_t k : {64, 192, 1408}) {
      std::vector<float> x = random_floats(rng, m * k);
      std::vector<uint8_t> scratch(act_scratch_bytes(ActKind::kBF16, DType::kBF16, m, k) + 64);
      void* al = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
      const ActView a = prepare_activations(DType::kBF16, simd_level(), x.data(), m, k, k, al, *pool);
      ASSERT_NE(a.xt, nullptr) << "m=" << m << " k=" << k;
      ASSERT_GE(a.xt_stride, m + 16);
      const auto* words = reinterpret_cast<const uint32_t*>(a.bf16);
      for (int64_t kp = 0; kp < a.stride / 2; ++kp) {
        for (int64_t i = 0; i < a.xt_stride; ++i) {
          const uint32_t want = i < m ? words[i * (a.stride / 2) + kp] : 0u;
          ASSERT_EQ(a.xt[kp * a.xt_stride + i], want)
              << "m=" << m << " k=" << k << " kp=" << kp << " i=" << i;
        }
      }
      const ActView sub = act_rows(a, 1, m - 1);
      EXPECT_EQ(sub.xt[3 * sub.xt_stride], words[1 * (a.stride / 2) + 3]);
    }
  }
}

TEST(Matmul, PreparedActivationsMatchTheScalarQuantiserBitForBit) {
  using namespace matmul_internal;
  Rng rng(test_seed());
  auto pool = ThreadPool::create(2);
  const int64_t m = 5, k = 160;
  std::vector<float> x = random_floats(rng, m * k, 3.0f);
  x[7] = 0.0f;
  for (int j = 32; j < 64; ++j) x[static_cast<size_t>(j)] = 0.0f;  // an all-zero block
  x[100] = 127.0f * 0.5f;                                          // ties appear after scaling
  for (SimdLevel level : supported_levels()) {
    // q8 path
    std::vector<uint8_t> scratch(act_scratch_bytes(ActKind::kQ8, DType::kQ8_0, m, k) + 64);
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) / 64 * 64);
    const ActView a = prepare_activations(DType::kQ8_0, level, x.data(), m, k, k, aligned, *pool);
    ASSERT_EQ(a.kind, ActKind::kQ8);
    for (int64_t i = 0; i < m; ++i) {
      std::vector<int8_t> q(k);
      std::vector<float> d(k / 32);
      std::vector<int32_t> cb(k / 32), cl(k / 4);
      quantize_act_row_ref(x.data() + i * k, k, q.data(), d.data(), cb.data(), cl.data());
      for (int64_t c = 0; c < a.stride; ++c) {
        ASSERT_EQ(a.q[i * a.stride + c], c < k ? q[static_cast<size_t>(c)] : 0)
            << simd_level_name(level) << " q " << i << "," << c;
      }
      for (int64_t b = 0; b < a.stride / 32; ++b) {
        const bool real = b < k / 32;
        ASSERT_EQ(a.qd[i * (a.stride / 32) + b], real ? d[static_cast<size_t>(b)] : 0.0f)
            << simd_level_name(level);
        ASSERT_EQ(a.qcorr_block[i * (a.stride / 32) + b], real ? cb[static_cast<size_t>(b)] : 0)
            << simd_level_name(level);
      }
      for (int64_t l = 0; l < a.stride / 4; ++l) {
        ASSERT_EQ(a.qcorr_lane[i * (a.stride / 4) + l], l < k / 4 ? cl[static_cast<size_t>(l)] : 0)
            << simd_level_name(level);
      }
    }
    if (level < SimdLevel::kAvx512Bf16) continue;
    std::vector<uint8_t> s2(act_scratch_bytes(ActKind::kBF16, DType::kBF16, m, k) + 64);
    void* al2 = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(s2.data()) + 63) / 64 * 64);
    std::vector<float> xb = x;
    xb[3] = __builtin_nanf("");
    xb[4] = -__builtin_inff();
    xb[5] = 1e-40f;  // subnormal
    for (DType t : {DType::kBF16, DType::kF8E4M3}) {
      const ActView b = prepare_activations(t, level, xb.data(), m, k, k, al2, *pool);
      ASSERT_EQ(b.kind, ActKind::kBF16);
      ASSERT_EQ(b.bf16_perm64, t == DType::kF8E4M3 && fp8_use_vbmi(level));
      std::vector<uint16_t> want(static_cast<size_t>(m * b.stride));
      act_to_bf16_rows_scalar(xb.data(), k, k, b.stride, want.data(), 0, m, b.bf16_perm64);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t c = 0; c < b.stride; ++c) {
          const int64_t pos = b.bf16_perm64 ? fp8_perm64_index(c) : c;
          ASSERT_EQ(b.bf16[i * b.stride + pos], c < k ? f32_to_bf16(xb[static_cast<size_t>(i * k + c)]) : 0)
              << i << "," << c;
          ASSERT_EQ(b.bf16[i * b.stride + pos], want[static_cast<size_t>(i * b.stride + pos)]);
        }
      }
    }
  }
}

TEST(Matmul, ActivationPrecisionStaysWithinItsStatedBound) {
  Rng rng(test_seed());
  // bf16 rounding: |x - bf16(x)| <= 2^-9 |x|, so the error is <= 2^-9 * sum |x w|.
  // q8: |x - q d| <= d/2 = amax/254 per element, bounded here by amax_row/254 * sum |w|.
  for (DType t : {DType::kBF16, DType::kF8E4M3, DType::kQ8_0}) {
    auto w = random_weight(rng, t, 40, 256);
    std::vector<float> x = random_floats(rng, 3 * 256);
    std::vector<double> got(3 * 40), exact(3 * 40);
    matmul_ref(w.view, x.data(), 3, got.data());
    matmul_exact_ref(w.view, x.data(), 3, exact.data());
    const std::vector<double> scale = abs_dot(w.view, x.data(), 3);
    std::vector<float> row(256);
    for (int64_t i = 0; i < 3; ++i) {
      float amax = 0;
      for (int64_t c = 0; c < 256; ++c) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i * 256 + c)]));
      for (int64_t r = 0; r < 40; ++r) {
        dequantize_weight_row(w.view, r, row.data());
        double wabs = 0;
        for (float v : row) wabs += std::fabs(v);
        const size_t j = static_cast<size_t>(i * 40 + r);
        const double bound =
            t == DType::kQ8_0 ? amax / 254.0 * wabs * 1.0001 : std::ldexp(scale[j], -9) * 1.0001;
        EXPECT_LE(std::fabs(got[j] - exact[j]), bound) << dtype_name(t);
      }
    }
  }
}

TEST(Matmul, ResultsDoNotDependOnThreadCount) {
  Rng rng(test_seed());
  for (DType t : kAllTypes) {
    auto w = random_weight(rng, t, 300, 256);
    for (int64_t m : {1, 3, 37}) {
      std::vector<float> x = random_floats(rng, m * 256);
      std::vector<float> base;
      for (int threads : {1, 2, 3, 5}) {
        auto pool = ThreadPool::create(threads);
        std::vector<float> y(static_cast<size_t>(m * 300));
        matmul(w.view, x.data(), m, y.data(), *pool);
        if (base.empty()) {
          base = y;
        } else {
          ASSERT_EQ(0, std::memcmp(base.data(), y.data(), y.size() * 4))
              << dtype_name(t) << " m=" << m << " threads=" << threads;
        }
      }
    }
  }
}

// NextWeightsScope (the grouped experts' "what this thread reads next") only moves prefetches: with
// it pointing at other weights, at a range shorter than the kernel's far distance or at nothing,
// every kernel form gives the same bits (one thread, whose calls see the scope, at each SIMD level).
TEST(Matmul, NextWeightsHintDoesNotChangeResults) {
  Rng rng(test_seed());
  for (DType t : kAllTypes) {
    auto w = random_weight(rng, t, 296, 512);
    auto other = random_weight(rng, t, 64, 512);
    const int64_t other_bytes = static_cast<int64_t>(dtype_bytes(t, 64 * 512));
    auto pool = ThreadPool::create(1);
    for (SimdLevel level : supported_levels()) {
      SimdCap cap(level);
      for (int64_t m : {1, 2, 3, 5, 8, 16, 40}) {  // 40: the GEMM, which requests the next first block
        std::vector<float> x = random_floats(rng, m * 512);
        std::vector<float> y0(static_cast<size_t>(m * 296)), y1(y0.size());
        matmul(w.view, x.data(), m, y0.data(), *pool);
        for (int64_t bytes : {other_bytes, int64_t{512}, int64_t{0}}) {
          // with the next weights' row length (the GEMM's request) and without
          const int64_t row_bytes = bytes == other_bytes ? static_cast<int64_t>(dtype_bytes(t, 512)) : 0;
          matmul_internal::NextWeightsScope next(other.data.data(), bytes, row_bytes);
          std::fill(y1.begin(), y1.end(), 0.0f);
          matmul(w.view, x.data(), m, y1.data(), *pool);
          ASSERT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * 4))
              << dtype_name(t) << " " << simd_level_name(level) << " m=" << m << " hint bytes " << bytes;
        }
      }
    }
  }
  EXPECT_EQ(matmul_internal::t_next_weights.p, nullptr);  // the scope clears it
}

// Weights that start mid cache line (a mapped safetensors checkpoint's tensors, base/mmap.h) give
// the aligned result bit for bit on every kernel form: row-wise, fp16, one-tile and the tile pair
// loop (m = 1, 3, 8, 32, 48) and the blocked GEMM (m = 200), at every SIMD level.
TEST(Matmul, WeightsStartingMidLineGiveTheAlignedResult) {
  Rng rng(test_seed());
  for (DType t : kAllTypes) {
    auto w = random_weight(rng, t, 272, 512);
    const uint64_t bytes = dtype_bytes(t, 272 * 512);
    for (int64_t into : {8, 56}) {
      Buffer mid = Buffer::allocate(bytes + 64);
      std::memcpy(mid.data() + into, w.data.data(), bytes);
      WeightView v = w.view;
      v.data = mid.data() + into;
      for (SimdLevel level : supported_levels()) {
        SimdCap cap(level);
        for (int64_t m : {1, 3, 8, 32, 48, 200}) {
          std::vector<float> x = random_floats(rng, m * 512);
          std::vector<float> y0(static_cast<size_t>(m * 272)), y1(y0.size());
          matmul(w.view, x.data(), m, y0.data(), default_pool());
          matmul(v, x.data(), m, y1.data(), default_pool());
          ASSERT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * 4))
              << dtype_name(t) << " " << simd_level_name(level) << " m=" << m << " " << into << " bytes in";
        }
      }
    }
  }
}

TEST(Matmul, ValidateWeightNamesTheProblem) {
  float f[64] = {};
  WeightView ok{DType::kF32, 2, 32, f, nullptr};
  EXPECT_TRUE(validate_weight(ok, "w").ok());
  WeightView bad = ok;
  bad.dtype = DType::kQ4_K;
  auto s = validate_weight(bad, "blk.0.ffn_down");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("blk.0.ffn_down"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("q4_k"), std::string::npos) << s.message();
  bad = ok;
  bad.dtype = DType::kQ8_0;
  bad.cols = 48;
  EXPECT_FALSE(validate_weight(bad, "w").ok());
  bad = ok;
  bad.dtype = DType::kF8E4M3;
  s = validate_weight(bad, "q_b_proj");
  EXPECT_NE(s.message().find("weight_scale_inv"), std::string::npos) << s.message();
  bad = ok;
  bad.scale_inv = f;
  EXPECT_FALSE(validate_weight(bad, "w").ok());
  bad = ok;
  bad.data = nullptr;
  EXPECT_FALSE(validate_weight(bad, "w").ok());
  bad = ok;
  bad.rows = 0;
  EXPECT_FALSE(validate_weight(bad, "w").ok());
}

TEST(Matmul, SliceRowsKeepsFp8ScaleGridAligned) {
  Rng rng(test_seed());
  auto w = random_weight(rng, DType::kF8E4M3, 384, 200);
  EXPECT_FALSE(slice_rows(w.view, 64, 200).ok());
  EXPECT_FALSE(slice_rows(w.view, 0, 385).ok());
  auto s = slice_rows(w.view, 128, 384);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::vector<float> x = random_floats(rng, 2 * 200), full(2 * 384), part(2 * 256);
  auto pool = ThreadPool::create(2);
  matmul(w.view, x.data(), 2, full.data(), *pool);
  matmul(*s, x.data(), 2, part.data(), *pool);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t r = 0; r < 256; ++r)
      EXPECT_EQ(part[static_cast<size_t>(i * 256 + r)], full[static_cast<size_t>(i * 384 + 128 + r)]);
  auto q = random_weight(rng, DType::kQ8_0, 10, 64);
  auto qs = slice_rows(q.view, 3, 7);
  ASSERT_TRUE(qs.ok());
  std::vector<float> ya(2 * 10), yb(2 * 4);
  std::vector<float> xq = random_floats(rng, 2 * 64);
  matmul(q.view, xq.data(), 2, ya.data(), *pool);
  matmul(*qs, xq.data(), 2, yb.data(), *pool);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t r = 0; r < 4; ++r)
      EXPECT_EQ(yb[static_cast<size_t>(i * 4 + r)], ya[static_cast<size_t>(i * 10 + 3 + r)]);
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

TEST(Matmul, DequantizeWeightRowMatchesTheExactWeights) {
  Rng rng(testing::test_seed());
  for (DType t : kAllTypes) {
    const int64_t rows = 130, cols = is_quant(t) ? 64 : 37;
    auto w = testing::random_weight(rng, t, rows, cols, true);
    std::vector<float> onehot(static_cast<size_t>(cols * cols), 0.0f), row(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) onehot[static_cast<size_t>(c * cols + c)] = 1.0f;
    std::vector<double> exact(static_cast<size_t>(cols * rows));
    matmul_exact_ref(w.view, onehot.data(), cols, exact.data());  // exact[c, r] = W[r, c]
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_weight_row(w.view, r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const double want = exact[static_cast<size_t>(c * rows + r)];
        ASSERT_NEAR(row[static_cast<size_t>(c)], want, 6e-8 * std::fabs(want))
            << dtype_name(t) << " " << r << "," << c;
      }
    }
  }
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

TEST(Matmul, NonFiniteActivationsGiveNaNNotGarbageForQuantisedWeights) {
  Rng rng(testing::test_seed());
  auto pool = ThreadPool::create(2);
  for (SimdLevel level : testing::supported_levels()) {
    testing::SimdCap cap(level);
    for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
      auto w = testing::random_weight(rng, t, 20, 96);
      for (int64_t m : {1, 7, 14}) {  // 14: the GEMM
        std::vector<float> x = testing::random_floats(rng, m * 96), y(static_cast<size_t>(m * 20));
        x[40] = INFINITY;            // row 0, block 1
        if (m > 1) x[96 + 5] = NAN;  // row 1, block 0
        matmul(w.view, x.data(), m, y.data(), *pool);
        for (int64_t r = 0; r < 20; ++r) {
          EXPECT_TRUE(std::isnan(y[static_cast<size_t>(r)]))
              << simd_level_name(level) << " " << dtype_name(t);
          if (m > 1) {
            EXPECT_TRUE(std::isnan(y[static_cast<size_t>(20 + r)]));
            EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(40 + r)]));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace fathom
