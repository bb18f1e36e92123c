// AVX2 (+FMA, F16C) paths for CPUs without AVX-512: dot-product form, 4 weight rows against up to
// 4 activation rows at a time (larger m loops over groups of 4 rows of x while the weight rows stay
// in cache). Floating weights are widened to fp32 (fp8 through F16C: an e4m3 byte placed in a
// binary16 is its value times 2^-8, subnormals included, folded into the block scale); Q8_0/Q4_0
// use maddubs on |w| and sign(w)*x (exact for every int8 w, -128 included), fp32 block scales.
// Also the AVX2 activation quantiser. Not tuned like the AVX-512 paths (no packed GEMM).
#include <immintrin.h>

#include <cstring>

#include "base/check.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"

namespace fathom::matmul_internal {
namespace {

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline const uint8_t* row_ptr(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) +
         r * static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols)));
}

// 8 weights from column k (k + 8 <= cols) as fp32; fp8 values carry a 2^-8 factor.
template <DType D>
inline __m256 load_w8(const uint8_t* row, int64_t k) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (D == DType::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k)));
  } else if constexpr (D == DType::kBF16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(sign, _mm_slli_epi16(mag, 7));
    const __m256 v = _mm256_cvtph_ps(h);
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
    return _mm256_or_ps(v, nan);  // all-ones lanes are NaN
  }
}

// Scalar weight value (fp8 with the same 2^-8 factor).
template <DType D>
inline float weight_at(const uint8_t* row, int64_t k) {
  if constexpr (D == DType::kF32) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  } else if constexpr (D == DType::kF16 || D == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return D == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
  } else {
    return e4m3_to_f32(row[k]) * 0x1.0p-8f;
  }
}

inline void store_y(float* y, bool accumulate, float v) {
  *y = accumulate ? *y + v : v;
}

// R weight rows x M activation rows, full reduction over k. fp8 scales fold per 128-block.
template <DType D, int R, int M>
void dot_group(const WeightView& w, const float* x, int64_t xs, float* y, int64_t ldy, bool accumulate,
               int64_t r) {
  constexpr bool kFp8 = D == DType::kF8E4M3;
  const int64_t K = w.cols;
  const uint8_t* rows[R];
  const float* scales[R];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    rows[i] = row_ptr(w, r + i);
    scales[i] = kFp8 ? fp8_scale_row(w, r + i) : nullptr;
  }
  __m256 acc[R][M];
  FATHOM_UNROLL
  for (auto& a : acc) FATHOM_UNROLL
  for (auto& v : a) v = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv[M];
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) xv[m] = _mm256_loadu_ps(x + m * xs + k);
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      __m256 wv = load_w8<D>(rows[i], k);
      if constexpr (kFp8) wv = _mm256_mul_ps(wv, _mm256_set1_ps(scales[i][k / 128] * 256.0f));
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) acc[i][m] = _mm256_fmadd_ps(wv, xv[m], acc[i][m]);
    }
  }
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) {
      float s = hsum8(acc[i][m]);
      for (int64_t t = k; t < K; ++t) {
        const float wt =
            kFp8 ? weight_at<D>(rows[i], t) * (scales[i][t / 128] * 256.0f) : weight_at<D>(rows[i], t);
        s += wt * x[m * xs + t];
      }
      store_y(y + m * ldy + r + i, accumulate, s);
    }
  }
}

template <DType D, int R>
void dot_rows_m(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r) {
  int64_t m = 0;
  for (; m + 4 <= x.m; m += 4)
    dot_group<D, R, 4>(w, x.f32 + m * x.stride, x.stride, y + m * ldy, ldy, accumulate, r);
  switch (x.m - m) {
    case 1:
      dot_group<D, R, 1>(w, x.f32 + m * x.stride, x.stride, y + m * ldy, ldy, accumulate, r);
      break;
    case 2:
      dot_group<D, R, 2>(w, x.f32 + m * x.stride, x.stride, y + m * ldy, ldy, accumulate, r);
      break;
    case 3:
      dot_group<D, R, 3>(w, x.f32 + m * x.stride, x.stride, y + m * ldy, ldy, accumulate, r);
      break;
    default:
      break;
  }
}

template <DType D>
void float_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) dot_rows_m<D, 4>(w, x, y, ldy, accumulate, r);
  for (; r < r1; ++r) dot_rows_m<D, 1>(w, x, y, ldy, accumulate, r);
}

// ---- int8 ----

template <DType D>
constexpr int64_t block_bytes() {
  return D == DType::kQ8_0 ? 34 : 18;
}

// Block b of a row as 32 signed int8 weights.
template <DType D>
inline __m256i load_q32(const uint8_t* row, int64_t b) {
  const uint8_t* p = row + b * block_bytes<D>() + 2;
  if constexpr (D == DType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    const __m128i n = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(n, m4)),
                                              _mm_and_si128(_mm_srli_epi16(n, 4), m4), 1);
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
  }
}

inline float load_d(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

template <DType D, int R, int M>
void qdot_group(const WeightView& w, const ActView& x, int64_t m0, float* y, int64_t ldy, bool accumulate,
                int64_t r) {
  constexpr int64_t bb = block_bytes<D>();
  const int64_t nb = w.cols / 32, xnb = x.stride / kQBlock;
  const uint8_t* rows[R];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) rows[i] = static_cast<const uint8_t*>(w.data) + (r + i) * nb * bb;
  __m256 acc[R][M];
  FATHOM_UNROLL
  for (auto& a : acc) FATHOM_UNROLL
  for (auto& v : a) v = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xq[M];
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m)
      xq[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + (m0 + m) * x.stride + b * 32));
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      const __m256i wq = load_q32<D>(rows[i], b);
      const __m256i aw = _mm256_abs_epi8(wq);  // |w| as u8 (128 for -128)
      const float dw = load_d(rows[i] + b * bb);
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq[m], wq));
        const __m256i p32 = _mm256_madd_epi16(p16, ones);
        const __m256 s = _mm256_set1_ps(dw * x.qd[(m0 + m) * xnb + b]);
        acc[i][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), s, acc[i][m]);
      }
    }
  }
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) FATHOM_UNROLL
  for (int m = 0; m < M; ++m) store_y(y + (m0 + m) * ldy + r + i, accumulate, hsum8(acc[i][m]));
}

template <DType D, int R>
void qdot_rows_m(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r) {
  int64_t m = 0;
  for (; m + 4 <= x.m; m += 4) qdot_group<D, R, 4>(w, x, m, y, ldy, accumulate, r);
  switch (x.m - m) {
    case 1:
      qdot_group<D, R, 1>(w, x, m, y, ldy, accumulate, r);
      break;
    case 2:
      qdot_group<D, R, 2>(w, x, m, y, ldy, accumulate, r);
      break;
    case 3:
      qdot_group<D, R, 3>(w, x, m, y, ldy, accumulate, r);
      break;
    default:
      break;
  }
}

template <DType D>
void quant_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) qdot_rows_m<D, 4>(w, x, y, ldy, accumulate, r);
  for (; r < r1; ++r) qdot_rows_m<D, 1>(w, x, y, ldy, accumulate, r);
}

}  // namespace

void rows_f32family_avx2(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                         int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kF32);
  switch (w.dtype) {
    case DType::kF32:
      float_rows<DType::kF32>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kF16:
      float_rows<DType::kF16>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kBF16:
      float_rows<DType::kBF16>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kF8E4M3:
      float_rows<DType::kF8E4M3>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    default:
      CHECK_MSG(false, "rows_f32family_avx2: {}", dtype_name(w.dtype));
  }
}

void rows_int8_avx2(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                    int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kQ8);
  if (w.dtype == DType::kQ8_0) {
    quant_rows<DType::kQ8_0>(w, x, y, y_stride, accumulate, r0, r1);
  } else {
    CHECK(w.dtype == DType::kQ4_0);
    quant_rows<DType::kQ4_0>(w, x, y, y_stride, accumulate, r0, r1);
  }
}

void act_quant_q8_rows_avx2(const float* x, int64_t x_stride, int64_t k, int64_t stride, int8_t* q, float* d,
                            int32_t* corr_block, int32_t* corr_lane, int64_t i0, int64_t i1) {
  const int64_t nb = stride / kQBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * x_stride;
    int8_t* qi = q + i * stride;
    for (int64_t b = 0; b < nb; ++b) {
      __m256i qv = _mm256_setzero_si256();
      float dv = 0;
      if (b * kQBlock < k) {
        __m256 v[4], a = _mm256_setzero_ps();
        int nonfinite = 0;
        for (int j = 0; j < 4; ++j) {
          v[j] = _mm256_loadu_ps(xi + b * kQBlock + 8 * j);
          const __m256 av = _mm256_and_ps(v[j], abs_mask);
          nonfinite |= _mm256_movemask_ps(_mm256_cmp_ps(av, inf, _CMP_NLT_UQ));
          a = _mm256_max_ps(a, av);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if (nonfinite != 0) {
          dv = __builtin_nanf("");
        } else {
          dv = amax / 127.0f;
          const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
          __m256i n[4];
          for (int j = 0; j < 4; ++j) n[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
          const __m256i p01 = _mm256_packs_epi32(n[0], n[1]), p23 = _mm256_packs_epi32(n[2], n[3]);
          qv = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        }
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qi + b * kQBlock), qv);
      d[i * nb + b] = dv;
      // sums of 4 and of 32 values: maddubs(1, q) adds pairs, madd(.., 1) adds pairs of pairs
      const __m256i s4 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv), _mm256_set1_epi16(1));
      const __m256i c4 = _mm256_mullo_epi32(s4, _mm256_set1_epi32(-128));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr_lane + i * (stride / 4) + b * 8), c4);
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      corr_block[i * nb + b] = -128 * _mm_cvtsi128_si32(s);
    }
  }
}

}  // namespace fathom::matmul_internal
