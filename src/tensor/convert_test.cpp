// Conversions against exact references computed independently (ldexp, double arithmetic).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/rng.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace fathom {
namespace {

// E4M3 value of a code from its definition, in double.
double e4m3_reference(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -v : v;
}

TEST(E4M3, DecodesAll256CodesExactly) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_reference(c);
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1.0p-9f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(E4M3, EncodesEveryCodeBackToItself) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
}

// Nearest code by exhaustive search, ties to the even mantissa, saturating at 448.
int e4m3_nearest(double x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min(std::fabs(x), 448.0);
  int best = 0;
  double best_err = 1e300;
  for (int c = 0; c < 0x7f; ++c) {
    double err = std::fabs(e4m3_reference(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

TEST(E4M3, EncodesWithRoundToNearestEvenAndSaturates) {
  // Every midpoint between adjacent codes, and points just either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_reference(c), hi = e4m3_reference(c + 1);
    const double mid = (lo + hi) / 2;
    for (double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9), -mid}) {
      const float xf = static_cast<float>(x);
      EXPECT_EQ(f32_to_e4m3(xf), e4m3_nearest(xf)) << "x=" << x;
    }
  }
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  Rng rng(1);
  for (int i = 0; i < 100000; ++i) {
    const float x = static_cast<float>(std::ldexp(rng.uniform() * 2 - 1, static_cast<int>(rng.below(24)) - 14));
    ASSERT_EQ(f32_to_e4m3(x), e4m3_nearest(x)) << x;
  }
}

TEST(BF16, RoundsToNearestEvenOnTies) {
  // 1 + 2^-8 is exactly between bf16 1.0 (even) and 1 + 2^-7: ties to 1.0.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3*2^-8 is between 1 + 2^-7 (odd mantissa) and 1 + 2^-6 (even): ties up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0x1.0p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xc020);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(F16, RoundTripsAllValuesAndRoundsTiesToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    const int e = (h >> 10) & 31;
    const int m = h & 1023;
    double want = e == 0 ? std::ldexp(m, -24) : e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25);
    if (h & 0x8000) want = -want;
    ASSERT_EQ(static_cast<double>(f), want) << h;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00);                // tie to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1.0p-11f), 0x3c02);            // tie to even (up)
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // rounds to inf
  EXPECT_EQ(f32_to_f16(0x1.0p-25f), 0x0000);                        // tie between 0 and 2^-24
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);                        // 1.5 ulp ties to even 2
}

TEST(Q8_0, MatchesGgmlReferenceArithmetic) {
  std::vector<float> x(64);
  Rng rng(3);
  for (auto& v : x) v = rng.uniform_f(-3, 3);
  x[5] = -7.0f;  // block 0 amax
  std::vector<BlockQ8_0> q(2);
  quantize_row_q8_0(x.data(), q.data(), 64);
  const float d = 7.0f / 127.0f;
  EXPECT_EQ(q[0].d, f32_to_f16(d));
  EXPECT_EQ(q[0].qs[5], -127);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], static_cast<int8_t>(std::roundf(x[j] * (1.0f / d))));
  std::vector<float> y(64);
  dequantize_row_q8_0(q.data(), y.data(), 64);
  for (int j = 0; j < 64; ++j) {
    const float dd = f16_to_f32(q[j / 32].d);
    EXPECT_EQ(y[j], q[j / 32].qs[j % 32] * dd);
    EXPECT_NEAR(y[j], x[j], dd * 0.51f + 1e-3f);
  }
  std::vector<float> zeros(32, 0.0f);
  quantize_row_q8_0(zeros.data(), q.data(), 32);
  EXPECT_EQ(q[0].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], 0);
}

TEST(Q4_0, PacksNibblesAsGgmlDoes) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j - 16) / 2.0f;  // -8 .. 7.5
  BlockQ4_0 b;
  quantize_row_q4_0(x.data(), &b, 32);
  EXPECT_EQ(f16_to_f32(b.d), 1.0f);  // max magnitude -8 -> d = -8/-8
  // x[0] = -8 -> -8/1 + 8.5 = 0.5 -> 0 ; x[16] = 0 -> 8
  EXPECT_EQ(b.qs[0] & 0xf, 0);
  EXPECT_EQ(b.qs[0] >> 4, 8);
  std::vector<float> y(32);
  dequantize_row_q4_0(&b, y.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_NEAR(y[static_cast<size_t>(j)], x[static_cast<size_t>(j)], 0.5f);
}

TEST(Fp8Blocks, QuantiseWithCeilDivScaleGridAndDequantise) {
  const int64_t rows = 130, cols = 200;  // 2x2 scale grid with ragged edges
  std::vector<float> w(static_cast<size_t>(rows * cols));
  Rng rng(9);
  for (auto& v : w) v = rng.uniform_f(-0.1f, 0.1f);
  w[static_cast<size_t>(129 * cols + 199)] = 2.0f;
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(4);
  quantize_fp8_blocks(w.data(), rows, cols, q.data(), s.data());
  EXPECT_FLOAT_EQ(s[3], 2.0f / 448.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r : {0L, 127L, 128L, 129L}) {
    dequantize_fp8_block_row(q.data(), s.data(), rows, cols, r, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      const float want = w[static_cast<size_t>(r * cols + c)];
      const float blk = s[static_cast<size_t>((r / 128) * 2 + c / 128)];
      EXPECT_NEAR(row[static_cast<size_t>(c)], want, std::fabs(want) * 0.0625f + blk * 0x1.0p-9f) << r << "," << c;
    }
  }
}

TEST(Convert, RoundTripsThroughEveryComputableDtype) {
  std::vector<float> x(64), y(64);
  Rng rng(5);
  for (auto& v : x) v = rng.uniform_f(-1, 1);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> buf(dtype_bytes(t, 64));
    ASSERT_TRUE(from_f32(t, x.data(), buf.data(), 64).ok());
    ASSERT_TRUE(to_f32(t, buf.data(), y.data(), 64).ok());
    const float tol = t == DType::kF32 ? 0 : t == DType::kQ4_0 ? 0.15f : t == DType::kF8E4M3 ? 0.07f : 0.01f;
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], tol) << dtype_name(t);
  }
  std::vector<uint8_t> buf(64);
  EXPECT_EQ(to_f32(DType::kQ4_K, buf.data(), y.data(), 256).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(from_f32(DType::kQ8_0, x.data(), buf.data(), 33).code(), StatusCode::kInvalidArgument);
}

TEST(Tensor, ViewsComputeStridesBytesAndSlices) {
  OwnedTensor t = OwnedTensor::zeros(DType::kBF16, {3, 4, 8});
  EXPECT_EQ(t.view.numel(), 96);
  EXPECT_EQ(t.view.nbytes(), 192u);
  EXPECT_EQ(t.view.stride[0], 64);
  EXPECT_EQ(t.view.stride[2], 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view.data) % 64, 0u);
  Tensor s = t.view.slice0(1, 3);
  EXPECT_EQ(s.shape_string(), "[2, 4, 8]");
  EXPECT_EQ(static_cast<uint8_t*>(s.data) - static_cast<uint8_t*>(t.view.data), 64);
  Tensor q = Tensor::contiguous(DType::kQ8_0, {10, 64}, nullptr);
  EXPECT_EQ(q.row_bytes(), 68u);
  EXPECT_EQ(q.nbytes(), 680u);
  EXPECT_EQ(*parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(*parse_dtype("fp8"), DType::kF8E4M3);
  EXPECT_FALSE(parse_dtype("f13").ok());
}

// Buffer::allocate_huge (benchmarks' weight arenas): 2 MiB aligned, zeroed, the requested size, and
// moves and frees like any Buffer.
TEST(Buffer, AllocateHugeIsAlignedZeroedAndMovable) {
  for (size_t bytes : {size_t{1}, size_t{(3u << 20) + 5}, size_t{4u << 20}}) {
    Buffer b = Buffer::allocate_huge(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; ++i) nonzero += b.data()[i] != 0;
    EXPECT_EQ(nonzero, 0u);
    b.data()[bytes - 1] = 7;
    Buffer moved = std::move(b);
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(moved.data()[bytes - 1], 7);
  }
  EXPECT_EQ(Buffer::allocate_huge(0).data(), nullptr);
}

}  // namespace
}  // namespace fathom
