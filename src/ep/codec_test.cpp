// Row codecs: the AVX-512 kernels against the scalar references, bit for bit, on fresh random
// rows of odd sizes; the FP8 reference against an independent brute-force definition of DeepEP's
// per_token_cast_to_fp8 (nearest e4m3 code of x * (448 / amax), ties to even).
#include "ep/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/rng.h"
#include "tensor/convert.h"

namespace fathom::ep::internal {
namespace {

const int64_t kSizes[] = {1, 7, 16, 17, 127, 128, 129, 272, 1000, 7168};

uint64_t print_seed(const char* what) {
  const uint64_t seed = std::random_device{}();
  std::printf("%s seed %llu\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

// Rows with a wide dynamic range, zeros, tiny values (FP8 subnormals) and exact FP8 ties.
std::vector<float> random_row(Rng& rng, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = rng.uniform();
    float v = static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.below(30)) - 15));
    if (u < 0.05)
      v = 0.0f;
    else if (u < 0.1)
      v = static_cast<float>((static_cast<int>(rng.below(17)) - 8) * std::ldexp(1.0, -10));  // ties
    x[static_cast<size_t>(i)] = v;
  }
  return x;
}

bool have_avx512() {
  return simd_level_supported() >= SimdLevel::kAvx512;
}

TEST(EpCodec, Avx512EncodeMatchesTheReferenceBitForBit) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Rng rng(print_seed("encode"));
  for (int64_t n : kSizes)
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> x = random_row(rng, n);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
      for (bool bf16 : {false, true})
        for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8}) {
          const void* src = bf16 ? static_cast<const void*>(xb.data()) : x.data();
          std::vector<uint8_t> a(wire_row_bytes(f, n) + 64, 0xAB), b = a;
          std::vector<float> sa(static_cast<size_t>(fp8_scale_cols(n)) + 1, -1.0f), sb = sa;
          encode_row_ref(src, bf16, f, n, a.data(), sa.data());
          encode_row_avx512(src, bf16, f, n, b.data(), sb.data());
          ASSERT_EQ(a, b) << "n " << n << " format " << wire_format_name(f) << " bf16 source " << bf16;
          ASSERT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * 4)) << "scales, n " << n;
        }
    }
}

// A group holding NaN or inf leaves the fast path (its codes and scale are unspecified, as the
// header says); the finite groups around it still match the reference bit for bit.
TEST(EpCodec, Avx512Fp8GroupsWithNanOrInfDoNotDisturbTheirNeighbours) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Rng rng(print_seed("fp8 non-finite"));
  const int64_t n = 512;
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<float> x = random_row(rng, n);
    const int64_t bad = 128 * static_cast<int64_t>(rng.below(4));
    x[static_cast<size_t>(bad + rng.below(128))] = rng.below(2) ? INFINITY : NAN;
    std::vector<uint8_t> a(static_cast<size_t>(n)), b(a.size());
    std::vector<float> sa(4), sb(4);
    encode_row_ref(x.data(), false, WireFormat::kFP8, n, a.data(), sa.data());
    encode_row_avx512(x.data(), false, WireFormat::kFP8, n, b.data(), sb.data());
    for (int64_t g = 0; g < 4; ++g) {
      if (g * 128 == bad) continue;
      ASSERT_EQ(sa[static_cast<size_t>(g)], sb[static_cast<size_t>(g)]) << "group " << g;
      ASSERT_EQ(0, std::memcmp(a.data() + g * 128, b.data() + g * 128, 128)) << "group " << g;
    }
  }
}

TEST(EpCodec, Avx512E4m3EncoderMatchesTheScalarOneOnArbitraryValues) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Rng rng(print_seed("e4m3"));
  // A 448 in every group makes the scale exactly 1, so the encoder sees the raw values.
  std::vector<float> x(128);
  std::vector<uint8_t> a(128), b(128);
  float sa, sb;
  for (int rep = 0; rep < 20000; ++rep) {
    for (int i = 0; i < 128; ++i) {
      uint32_t bits = static_cast<uint32_t>(rng.next_u64());
      bits = (bits & 0x80000000u) |
             (0x3a000000u + (bits & 0x7fffffffu) % (0x43e00001u - 0x3a000000u));  // <= 448
      x[static_cast<size_t>(i)] = i == 0 ? 448.0f : bits_to_f32(bits);
    }
    encode_row_ref(x.data(), false, WireFormat::kFP8, 128, a.data(), &sa);
    encode_row_avx512(x.data(), false, WireFormat::kFP8, 128, b.data(), &sb);
    ASSERT_EQ(sa, 1.0f);
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)])
          << "value " << x[static_cast<size_t>(i)];
      ASSERT_EQ(a[static_cast<size_t>(i)], f32_to_e4m3(x[static_cast<size_t>(i)]));
    }
  }
}

TEST(EpCodec, Avx512AccumulateAxpyAndDecodeMatchTheReferences) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Rng rng(print_seed("accumulate"));
  for (int64_t n : kSizes) {
    std::vector<float> x = random_row(rng, n), acc0 = random_row(rng, n);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16}) {
      const void* row = f == WireFormat::kBF16 ? static_cast<const void*>(xb.data()) : x.data();
      std::vector<float> a = acc0, b = acc0;
      accumulate_row_ref(a.data(), row, f, n);
      accumulate_row_avx512(b.data(), row, f, n);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "accumulate n " << n;
      const float w = rng.uniform_f(-2.0f, 2.0f);
      axpy_row_ref(a.data(), w, row, f, n);
      axpy_row_avx512(b.data(), w, row, f, n);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "axpy n " << n;
    }
    std::vector<uint8_t> q(static_cast<size_t>(n));
    std::vector<float> sc(static_cast<size_t>(fp8_scale_cols(n)));
    for (auto& v : q) v = static_cast<uint8_t>(rng.below(256));
    for (auto& v : sc) v = rng.uniform_f(0.001f, 2.0f);
    std::vector<float> da(q.size()), db(q.size());
    decode_fp8_row_ref(q.data(), sc.data(), n, da.data());
    decode_fp8_row_avx512(q.data(), sc.data(), n, db.data());
    for (size_t i = 0; i < q.size(); ++i) {
      if (std::isnan(da[i])) {
        ASSERT_TRUE(std::isnan(db[i])) << "code " << int{q[i]};
      } else {
        ASSERT_EQ(f32_to_bits(da[i]), f32_to_bits(db[i])) << "code " << int{q[i]};
      }
    }
  }
}

TEST(EpCodec, Avx512SumRowsMatchesTheReferenceIncludingNegativeZero) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  Rng rng(print_seed("sum rows"));
  for (int64_t n : kSizes)
    for (int rows_n = 0; rows_n <= 5; ++rows_n)
      for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16}) {
        std::vector<std::vector<float>> xs;
        std::vector<std::vector<uint16_t>> bs;
        std::vector<const void*> rows;
        for (int j = 0; j < rows_n; ++j) {
          xs.push_back(random_row(rng, n));
          for (auto& v : xs.back())
            if (rng.uniform() < 0.05) v = -0.0f;  // 0 + -0 must give +0 on both paths
          bs.emplace_back(xs.back().size());
          for (size_t i = 0; i < xs.back().size(); ++i) bs.back()[i] = f32_to_bf16(xs.back()[i]);
        }
        for (int j = 0; j < rows_n; ++j)
          rows.push_back(f == WireFormat::kBF16 ? static_cast<const void*>(bs[static_cast<size_t>(j)].data())
                                                : xs[static_cast<size_t>(j)].data());
        alignas(64) static float a[8192], b[8192], c[8192];
        sum_rows_ref(a, rows.data(), rows_n, f, n);
        sum_rows_avx512(b, rows.data(), rows_n, f, n, false);
        sum_rows_avx512(c, rows.data(), rows_n, f, n, true);
        stream_fence();
        ASSERT_EQ(0, std::memcmp(a, b, static_cast<size_t>(n) * 4)) << "n " << n << " rows " << rows_n;
        ASSERT_EQ(0, std::memcmp(a, c, static_cast<size_t>(n) * 4))
            << "streamed, n " << n << " rows " << rows_n;
        std::vector<float> acc(static_cast<size_t>(n), 0.0f);  // the same as accumulating row by row
        for (const void* r : rows) accumulate_row_ref(acc.data(), r, f, n);
        ASSERT_EQ(0, std::memcmp(a, acc.data(), static_cast<size_t>(n) * 4));
        std::vector<float> w(static_cast<size_t>(rows_n));
        for (auto& v : w) v = rng.uniform_f(-1.5f, 1.5f);
        weighted_sum_rows_ref(a, rows.data(), w.data(), rows_n, f, n);
        weighted_sum_rows_avx512(b, rows.data(), w.data(), rows_n, f, n);
        ASSERT_EQ(0, std::memcmp(a, b, static_cast<size_t>(n) * 4))
            << "weighted, n " << n << " rows " << rows_n;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = 0; j < rows_n; ++j)
          axpy_row_ref(acc.data(), w[static_cast<size_t>(j)], rows[static_cast<size_t>(j)], f, n);
        ASSERT_EQ(0, std::memcmp(a, acc.data(), static_cast<size_t>(n) * 4)) << "weighted vs axpy";
      }
}

TEST(EpCodec, StreamingRowCopyCopiesEveryByteAtAnyAlignmentAndSize) {
  Rng rng(print_seed("stream copy"));
  std::vector<uint8_t> src(20000), dst(20100);
  for (auto& v : src) v = static_cast<uint8_t>(rng.next_u64());
  for (uint64_t bytes :
       {uint64_t{0}, uint64_t{63}, uint64_t{1024}, uint64_t{1088}, uint64_t{14336}, uint64_t{14337}}) {
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{64}}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      uint8_t* d = dst.data() + ((64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64) + off;
      copy_row_stream(d, src.data() + 3, bytes);
      stream_fence();
      ASSERT_EQ(0, bytes ? std::memcmp(d, src.data() + 3, bytes) : 0) << bytes << " at +" << off;
      ASSERT_EQ(d[bytes], 0xEE) << "wrote past the end";
    }
  }
}

TEST(EpCodec, MultiDestinationStreamingCopyWritesEveryDestinationExactly) {
  Rng rng(print_seed("stream copy multi"));
  std::vector<uint8_t> src(20000);
  for (auto& v : src) v = static_cast<uint8_t>(rng.next_u64());
  constexpr int kMax = 5;
  constexpr uint64_t kStride = 20160;  // a multiple of 64
  std::vector<uint8_t> dst(kMax * kStride + 128);
  uint8_t* base = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  for (uint64_t bytes :
       {uint64_t{0}, uint64_t{63}, uint64_t{1024}, uint64_t{1088}, uint64_t{7168}, uint64_t{14337}}) {
    for (int n = 0; n <= kMax; ++n) {
      for (uint64_t off : {uint64_t{0}, uint64_t{1}}) {  // aligned (streaming) and not (memcpy)
        std::fill(dst.begin(), dst.end(), 0xEE);
        uint8_t* d[kMax];
        for (int k = 0; k < n; ++k) d[k] = base + static_cast<uint64_t>(n - 1 - k) * kStride + off;
        copy_row_stream_multi(d, n, src.data() + 3, bytes);
        stream_fence();
        for (int k = 0; k < kMax; ++k) {
          const uint8_t* at = base + static_cast<uint64_t>(k) * kStride + off;
          if (k < n) {
            ASSERT_EQ(0, bytes ? std::memcmp(at, src.data() + 3, bytes) : 0)
                << bytes << " to " << k << " of " << n;
            ASSERT_EQ(at[bytes], 0xEE) << "wrote past the end";
          } else {
            ASSERT_EQ(at[0], 0xEE) << "wrote to destination " << k << " of " << n;
          }
        }
      }
    }
  }
}

// The fused encode-and-stream equals encode_row followed by a copy into every destination: staging,
// scales and destinations, for each format and source dtype, aligned (streamed group by group) and
// not (the encode-then-copy fallback), with nothing written past a row or to unused destinations.
TEST(EpCodec, EncodeRowMultiEqualsEncodeThenCopyToEveryDestination) {
  Rng rng(print_seed("encode row multi"));
  constexpr int kMax = 4;
  constexpr uint64_t kStride = 4 * 7168 + 128;  // a multiple of 64, room for an f32 row of 7168
  std::vector<uint8_t> dst(kMax * kStride + 128), want(kStride), stage(kStride);
  std::vector<float> dsc(kMax * 64 + 1), want_sc(64), sc(64);
  uint8_t* base = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  for (int64_t n : {int64_t{1}, int64_t{127}, int64_t{128}, int64_t{200}, int64_t{1000}, int64_t{7168}}) {
    const std::vector<float> x = random_row(rng, n);
    std::vector<uint16_t> xb(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) xb[static_cast<size_t>(i)] = f32_to_bf16(x[static_cast<size_t>(i)]);
    for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8})
      for (bool bf16 : {false, true})
        for (int nd = 0; nd <= kMax; ++nd)
          for (uint64_t off : {uint64_t{0}, uint64_t{8}}) {
            const void* src = bf16 ? static_cast<const void*>(xb.data()) : x.data();
            const uint64_t bytes = wire_row_bytes(f, n);
            const size_t ns = static_cast<size_t>(fp8_scale_cols(n));
            encode_row_ref(src, bf16, f, n, want.data(), want_sc.data());
            std::fill(dst.begin(), dst.end(), 0xEE);
            std::fill(dsc.begin(), dsc.end(), -1.0f);
            uint8_t* d[kMax];
            float* ds[kMax];
            for (int k = 0; k < nd; ++k) {
              d[k] = base + static_cast<uint64_t>(nd - 1 - k) * kStride + off;
              ds[k] = k == 1 ? nullptr : dsc.data() + (nd - 1 - k) * 64;  // scales are optional
            }
            encode_row_multi(src, bf16, f, n, stage.data(), sc.data(), d, ds, nd);
            stream_fence();
            const std::string at = std::string(wire_format_name(f)) + (bf16 ? " from bf16" : " from f32") +
                                   " n " + std::to_string(n) + " to " + std::to_string(nd) + " +" +
                                   std::to_string(off);
            ASSERT_EQ(0, std::memcmp(stage.data(), want.data(), bytes)) << at;
            if (f == WireFormat::kFP8) {
              ASSERT_EQ(0, std::memcmp(sc.data(), want_sc.data(), ns * 4)) << at;
            }
            for (int k = 0; k < kMax; ++k) {
              const uint8_t* row = base + static_cast<uint64_t>(k) * kStride + off;
              const float* rs = dsc.data() + k * 64;
              const int who = nd - 1 - k;  // the destination index that wrote here, if any
              if (k < nd) {
                ASSERT_EQ(0, std::memcmp(row, want.data(), bytes)) << at << ", destination " << who;
                ASSERT_EQ(row[bytes], 0xEE) << at << ": wrote past the end";
                if (f == WireFormat::kFP8 && who != 1) {
                  ASSERT_EQ(0, std::memcmp(rs, want_sc.data(), ns * 4)) << at << ", scales " << who;
                } else {
                  ASSERT_EQ(rs[0], -1.0f) << at << ": scales written without a format or destination";
                }
              } else {
                ASSERT_EQ(row[0], 0xEE) << at << ": wrote to unused destination " << k;
              }
            }
          }
  }
}

// The nearest e4m3 code by search over all finite codes (ties to the even code), saturating.
uint8_t nearest_e4m3(float v) {
  int best = 0;
  double best_d = 1e300;
  for (int c = 0; c < 256; ++c) {
    const float d = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(d) || std::signbit(d) != std::signbit(v)) continue;
    const double dist = std::fabs(static_cast<double>(d) - v);
    if (dist < best_d || (dist == best_d && (c & 1) == 0)) best = c, best_d = dist;
  }
  return static_cast<uint8_t>(best);
}

TEST(EpCodec, Fp8FollowsDeepEPsPerTokenCastDefinition) {
  Rng rng(print_seed("fp8 definition"));
  for (int64_t n : {int64_t{1}, int64_t{129}, int64_t{300}}) {
    std::vector<float> x = random_row(rng, n);
    std::vector<uint8_t> q(static_cast<size_t>(n));
    std::vector<float> scales(static_cast<size_t>(fp8_scale_cols(n)));
    ASSERT_TRUE(
        per_token_cast_to_fp8(Tensor::contiguous(DType::kF32, {1, n}, x.data()), q.data(), scales.data())
            .ok());
    for (int64_t g = 0; g < n; g += 128) {
      float amax = 0;
      for (int64_t i = g; i < std::min(n, g + 128); ++i)
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
      amax = std::max(amax, 1e-4f);
      ASSERT_EQ(scales[static_cast<size_t>(g / 128)], amax / 448.0f);
      const float inv = 448.0f / amax;
      for (int64_t i = g; i < std::min(n, g + 128); ++i)
        ASSERT_EQ(q[static_cast<size_t>(i)], nearest_e4m3(x[static_cast<size_t>(i)] * inv))
            << "value " << x[static_cast<size_t>(i)];
    }
    std::vector<float> back(static_cast<size_t>(n));
    per_token_cast_back(q.data(), scales.data(), 1, n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      const float s = scales[static_cast<size_t>(i / 128)];
      const double bound = std::fabs(x[static_cast<size_t>(i)]) / 16 + s / 512 * 1.0001;
      ASSERT_LE(std::fabs(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]), bound) << i;
    }
  }
  EXPECT_FALSE(
      per_token_cast_to_fp8(Tensor::contiguous(DType::kI32, {1, 4}, nullptr), nullptr, nullptr).ok());
}

}  // namespace
}  // namespace fathom::ep::internal
