// AVX-512 (F/BW/VL/DQ) fp32-FMA path for f32, f16, bf16 and fp8 weights (bf16/fp8 here only on
// CPUs without vdpbf16ps: activations are the bf16-rounded fp32 copy), and the AVX-512 activation
// preparation (fp32 -> bf16, fp32 -> per-32-block int8) used by every AVX-512 path.
//  - m <= 4: row-wise matrix-vector, 4 weight rows at a time, fp8 scale folded per 16 weights.
//  - m > 4: blocked GEMM (matmul_gemm_impl.h), 8x48 micro-kernel over a [kc][48] fp32 panel;
//    fp8 block scales applied per 128-column k-block in the epilogue.
#include <cstring>

#include "base/check.h"
#include "kernels/matmul_gemm_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

inline const uint8_t* row_ptr(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) +
         r * static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols)));
}

// 16 weights of a row from column k (n valid, the rest zero) as fp32, without the fp8 scale.
template <DType D>
inline __m512 load_w16(const uint8_t* row, int64_t k, int64_t n, const E4m3ToBf16* conv) {
  const __mmask16 mk = lanes16(n);
  const bool full = n >= 16;
  if constexpr (D == DType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + k;
    return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mk, p);
  } else if constexpr (D == DType::kF16 || D == DType::kBF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + k;
    const __m256i h =
        full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(mk, p);
    return D == DType::kF16 ? _mm512_cvtph_ps(h) : bf16_to_f32x16(h);
  } else {
    const __m128i b =
        full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)) : _mm_maskz_loadu_epi8(mk, row + k);
    return bf16_to_f32x16(_mm512_castsi512_si256(conv->convert(_mm256_castsi128_si256(b))));
  }
}

inline void store_y(float* y, bool accumulate, float v) {
  *y = accumulate ? *y + v : v;
}

template <DType D, int R, int M>
void matvec_group(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                  const E4m3ToBf16* conv) {
  __m512 acc[R][M];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) acc[i][m] = _mm512_setzero_ps();
  }
  const uint8_t* rows[R];
  const float* scales[R];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    rows[i] = row_ptr(w, r + i);
    scales[i] = D == DType::kF8E4M3 ? fp8_scale_row(w, r + i) : nullptr;
  }
  const int64_t K = w.cols;
  auto step = [&](int64_t k, int64_t n) {  // 16 columns from k, n of them valid
    __m512 xv[M];
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) {
      xv[m] = n >= 16 ? _mm512_loadu_ps(x.f32 + m * x.stride + k)
                      : _mm512_maskz_loadu_ps(lanes16(n), x.f32 + m * x.stride + k);
    }
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      __m512 wv = load_w16<D>(rows[i], k, n, conv);
      if constexpr (D == DType::kF8E4M3) wv = _mm512_mul_ps(wv, _mm512_set1_ps(scales[i][k / 128]));
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) acc[i][m] = _mm512_fmadd_ps(wv, xv[m], acc[i][m]);
    }
  };
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) step(k, 16);
  if (k < K) step(k, K - k);
  FATHOM_UNROLL
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) {
      alignas(16) float s[4];
      _mm_store_ps(s, hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
      FATHOM_UNROLL
      for (int i = 0; i < 4; ++i) store_y(y + m * ldy + r + i, accumulate, s[i]);
    } else {
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) store_y(y + m * ldy + r + i, accumulate, _mm512_reduce_add_ps(acc[i][m]));
    }
  }
}

// R weight rows against every activation row, in groups of 4, while the rows stay in L1.
template <DType D, int R>
void matvec_all(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                const E4m3ToBf16* conv) {
  int64_t i = 0;
  for (; i + 4 <= x.m; i += 4)
    matvec_group<D, R, 4>(w, act_rows(x, i, 4), y + i * ldy, ldy, accumulate, r, conv);
  switch (x.m - i) {
    case 1:
      matvec_group<D, R, 1>(w, act_rows(x, i, 1), y + i * ldy, ldy, accumulate, r, conv);
      break;
    case 2:
      matvec_group<D, R, 2>(w, act_rows(x, i, 2), y + i * ldy, ldy, accumulate, r, conv);
      break;
    case 3:
      matvec_group<D, R, 3>(w, act_rows(x, i, 3), y + i * ldy, ldy, accumulate, r, conv);
      break;
    default:
      break;
  }
}

template <DType D>
void matvec_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1) {
  const E4m3ToBf16 conv;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) matvec_all<D, 4>(w, x, y, ldy, accumulate, r, &conv);
  for (; r < r1; ++r) matvec_all<D, 1>(w, x, y, ldy, accumulate, r, &conv);
}

template <DType D>
struct F32Gemm {
  static constexpr int kNR = 48;
  static constexpr int kMR = 8;
  static constexpr int64_t kKC = 128;
  struct Panel {
    alignas(64) float b[kKC * kNR];
    alignas(64) float scale[kNR];
  };

  static int64_t kc_step(const WeightView&) { return kKC; }

  static void pack(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    const E4m3ToBf16 conv;
    for (int v = 0; v < kNR / 16; ++v) {
      const uint8_t* rows[16];
      FATHOM_UNROLL
      for (int i = 0; i < 16; ++i) rows[i] = 16 * v + i < nr ? row_ptr(w, n0 + 16 * v + i) : nullptr;
      for (int64_t kk = 0; kk < kc; kk += 16) {
        __m512i t[16];
        FATHOM_UNROLL
        for (int i = 0; i < 16; ++i) {
          t[i] = rows[i] != nullptr ? _mm512_castps_si512(load_w16<D>(rows[i], k0 + kk, kc - kk, &conv))
                                    : _mm512_setzero_si512();
        }
        transpose16x16_epi32(t);
        float* dst = p.b + kk * kNR + 16 * v;
        FATHOM_UNROLL
        for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * kNR, t[j]);
      }
    }
    if constexpr (D == DType::kF8E4M3) {
      for (int64_t j = 0; j < kNR; ++j) p.scale[j] = j < nr ? fp8_scale_row(w, n0 + j)[k0 / 128] : 0.0f;
    }
  }

  template <int MR>
  static void micro(const ActView& x, int64_t m0, int64_t k0, int64_t kc, const Panel& p, float* c,
                    int64_t ldc, int64_t nr, bool overwrite) {
    __m512 acc[MR][3];
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = acc[m][2] = _mm512_setzero_ps();
    const float* a = x.f32 + m0 * x.stride + k0;
    const float* b = p.b;
    for (int64_t k = 0; k < kc; ++k, b += kNR) {
      const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), b2 = _mm512_load_ps(b + 32);
      FATHOM_UNROLL
      for (int m = 0; m < MR; ++m) {
        const __m512 av = _mm512_set1_ps(a[m * x.stride + k]);
        acc[m][0] = _mm512_fmadd_ps(av, b0, acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(av, b1, acc[m][1]);
        acc[m][2] = _mm512_fmadd_ps(av, b2, acc[m][2]);
      }
    }
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) {
      FATHOM_UNROLL
      for (int v = 0; v < 3; ++v) {
        __m512 r = acc[m][v];
        if constexpr (D == DType::kF8E4M3) r = _mm512_mul_ps(r, _mm512_load_ps(p.scale + 16 * v));
        store_tile16(c + m * ldc + 16 * v, r, nr - 16 * v, overwrite);
      }
    }
  }
};

template <DType D>
void rows_typed(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                int64_t r1) {
  if (x.m <= matvec_max_m(D, SimdLevel::kAvx512)) {
    matvec_rows<D>(w, x, y, ldy, accumulate, r0, r1);
  } else {
    gemm_rows<F32Gemm<D>>(w, x, y, ldy, accumulate, r0, r1);
  }
}

}  // namespace

void rows_f32family_avx512(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                           int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kF32);
  switch (w.dtype) {
    case DType::kF32:
      rows_typed<DType::kF32>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kF16:
      rows_typed<DType::kF16>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kBF16:
      rows_typed<DType::kBF16>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    case DType::kF8E4M3:
      rows_typed<DType::kF8E4M3>(w, x, y, y_stride, accumulate, r0, r1);
      return;
    default:
      CHECK_MSG(false, "rows_f32family_avx512: {}", dtype_name(w.dtype));
  }
}

void act_to_bf16_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                             int64_t i0, int64_t i1, bool perm64) {
  auto load32 = [&](const float* xi, int64_t c) {  // 32 values from column c as bf16, zero past k
    const __m512 v0 = c < k ? _mm512_maskz_loadu_ps(lanes16(k - c), xi + c) : _mm512_setzero_ps();
    const __m512 v1 =
        c + 16 < k ? _mm512_maskz_loadu_ps(lanes16(k - c - 16), xi + c + 16) : _mm512_setzero_ps();
    return _mm512_inserti64x4(_mm512_castsi256_si512(f32_to_bf16_rne(v0)), f32_to_bf16_rne(v1), 1);
  };
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * x_stride;
    uint16_t* oi = out + i * stride;
    for (int64_t c = 0; c < stride; c += 64) {  // stride is a multiple of 64
      __m512i a = load32(xi, c), b = load32(xi, c + 32);
      if (perm64) {  // 128-bit lanes (8 values): a = x0-7 | 8-15 | 16-23 | 24-31, b = x32-39 | ...
        const __m512i pa = _mm512_shuffle_i64x2(a, b, 0x88), pb = _mm512_shuffle_i64x2(a, b, 0xdd);
        a = pa;
        b = pb;
      }
      _mm512_storeu_si512(oi + c, a);
      _mm512_storeu_si512(oi + c + 32, b);
    }
  }
}

void act_quant_q8_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t stride, int8_t* q,
                              float* d, int32_t* corr_block, int32_t* corr_lane, float* d_lane, int64_t i0,
                              int64_t i1) {
  const int64_t nb = stride / kQBlock;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * x_stride;
    int8_t* qi = q + i * stride;
    for (int64_t b = 0; b < nb; ++b) {
      float* di = d + i * nb + b;
      int32_t* cb = corr_block + i * nb + b;
      if (b * kQBlock >= k) {  // padding block
        std::memset(qi + b * kQBlock, 0, kQBlock);
        *di = 0;
        *cb = 0;
        continue;
      }
      const __m512 v0 = _mm512_loadu_ps(xi + b * kQBlock), v1 = _mm512_loadu_ps(xi + b * kQBlock + 16);
      const __m512 a0 = _mm512_and_ps(v0, abs_mask), a1 = _mm512_and_ps(v1, abs_mask);
      const bool finite =
          (_mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ)) == 0;
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
      __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
      if (!finite) {
        *di = __builtin_nanf("");
      } else {
        const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        *di = amax / 127.0f;
        q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));  // MXCSR default: round half to even
        q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
      }
      *cb = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qi + b * kQBlock), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qi + b * kQBlock + 16), _mm512_cvtepi32_epi8(q1));
    }
    // per-lane (group of 4) corrections for the matrix-vector kernels: -128 * sum of 4 values
    int32_t* cl = corr_lane + i * (stride / 4);
    for (int64_t c = 0; c < stride; c += 64) {
      const __m512i s =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), _mm512_loadu_si512(qi + c));
      _mm512_storeu_si512(cl + c / 4, _mm512_mullo_epi32(s, _mm512_set1_epi32(-128)));
    }
    // per-lane block scales: lanes 0-7 of each 64-column group take block 2g, lanes 8-15 block 2g+1
    float* dl = d_lane + i * (stride / 4);
    for (int64_t b = 0; b < nb; ++b) _mm256_storeu_ps(dl + b * 8, _mm256_set1_ps(d[i * nb + b]));
  }
}

}  // namespace fathom::matmul_internal
