// AVX-512 building blocks shared by the *_avx512*.cpp kernel files (and only those: they are
// compiled with the AVX-512 flags). Everything has internal linkage so no instantiation leaks into
// a file compiled for a narrower ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tensor/convert.h"

namespace fathom::matmul_internal {
namespace {

// In-register transpose of a 16x16 matrix of 32-bit elements: r[i] holds row i on entry and
// column i on exit.
__attribute__((always_inline)) inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4g + j] now holds, in 128-bit lane L, column 4L + j of rows 4g..4g+3.
#pragma GCC unroll 16
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
  }
#pragma GCC unroll 16
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

// bf16 bit pattern of the e4m3 magnitude m (0..127): exact, subnormals included; 127 is NaN.
constexpr uint16_t e4m3_mag_to_bf16(int m) {
  if (m == 127) return 0x7fc0;
  const int exp = m >> 3, mant = m & 7;
  if (exp != 0) return static_cast<uint16_t>(((exp + 120) << 7) | (mant << 4));
  if (mant == 0) return 0;
  int p = 0;  // position of the leading bit: value = mant * 2^-9 = 1.f * 2^(p - 9)
  while ((mant >> (p + 1)) != 0) ++p;
  return static_cast<uint16_t>(((127 + p - 9) << 7) | ((mant - (1 << p)) << (7 - p)));
}

struct E4m3Table {
  alignas(64) uint16_t v[128];
  constexpr E4m3Table() : v() {
    for (int i = 0; i < 128; ++i) v[i] = e4m3_mag_to_bf16(i);
  }
};
inline constexpr E4m3Table kE4m3Bf16Table{};

// e4m3 -> bf16 bit patterns (exact: every e4m3 value is a bf16 value; NaN stays NaN) through the
// 128-entry magnitude table held in four registers.
struct E4m3ToBf16 {
  __m512i t0, t1, t2, t3;  // magnitudes 0-31, 32-63, 64-95, 96-127
  E4m3ToBf16()
      : t0(_mm512_load_si512(kE4m3Bf16Table.v)),
        t1(_mm512_load_si512(kE4m3Bf16Table.v + 32)),
        t2(_mm512_load_si512(kE4m3Bf16Table.v + 64)),
        t3(_mm512_load_si512(kE4m3Bf16Table.v + 96)) {}
  // 32 e4m3 bytes -> 32 bf16 values.
  __m512i convert(__m256i bytes) const {
    const __m512i idx = _mm512_cvtepu8_epi16(bytes);
    const __m512i lo = _mm512_permutex2var_epi16(t0, idx, t1);  // uses idx bits 0-5
    const __m512i hi = _mm512_permutex2var_epi16(t2, idx, t3);
    const __mmask32 upper = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
    const __m512i mag = _mm512_mask_mov_epi16(lo, upper, hi);
    const __m512i sign = _mm512_slli_epi16(idx, 8);  // bit 7 -> bit 15
    return _mm512_ternarylogic_epi32(mag, sign, _mm512_set1_epi16(static_cast<short>(0x8000)),
                                     0xf8);  // a | (b & c)
  }
};

// 16 floats -> 16 bf16 (round to nearest even, NaN made quiet: exactly f32_to_bf16).
inline __m256i f32_to_bf16_rne(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// bf16 (16 values in a __m256i) -> f32.
inline __m512 bf16_to_f32x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sums of 4 vectors each reduced horizontally: returns {sum(a), sum(b), sum(c), sum(d)}.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // fold 512 -> 256 for each, then interleave-add
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
  const __m256 ab = _mm256_hadd_ps(a8, b8);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(c8, d8);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Mask of the first n (0..16) lanes.
inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}
inline __mmask32 lanes32(int64_t n) {
  return n >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << n) - 1u);
}

// Epilogue of a GEMM tile: c[0..nr) (=|+=) acc (* scale), masked to nr lanes (nr may be <= 0).
inline void store_tile16(float* c, __m512 acc, int64_t nr, bool overwrite) {
  if (nr >= 16) {
    _mm512_storeu_ps(c, overwrite ? acc : _mm512_add_ps(_mm512_loadu_ps(c), acc));
  } else if (nr > 0) {
    const __mmask16 k = lanes16(nr);
    _mm512_mask_storeu_ps(c, k, overwrite ? acc : _mm512_add_ps(_mm512_maskz_loadu_ps(k, c), acc));
  }
}

// The lanes kernels' totals (fp8_lanes_rows, bf16_lanes_rows): tot[i][h] lane l is weight row
// r + i against activation row g + 16h + l; rows from g up to n (the lanes past x's rows hold
// zeros) are written (or added) at y[row * ldy + r + i].
template <int R, int H>
inline void store_lanes(const __m512 (&tot)[R][H], float* y, int64_t ldy, bool accumulate, int64_t r,
                        int64_t g, int64_t n) {
  alignas(64) float t[R][H * 16];
  for (int i = 0; i < R; ++i) {
    for (int h = 0; h < H; ++h) _mm512_store_ps(t[i] + 16 * h, tot[i][h]);
  }
  for (int64_t l = 0; l < n; ++l) {
    float* yl = y + (g + l) * ldy + r;
    for (int i = 0; i < R; ++i) yl[i] = accumulate ? yl[i] + t[i][l] : t[i][l];
  }
}

}  // namespace
}  // namespace fathom::matmul_internal
