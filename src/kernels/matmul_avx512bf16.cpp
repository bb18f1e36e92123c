// BF16 and FP8 (e4m3, 128x128 block scales) weights on AVX-512 BF16: vdpbf16ps dot products of
// bf16 activations with bf16 weights (fp8 decoded exactly to bf16 through a register table), fp32
// accumulation.
//  - m <= 4 (decode): row-wise; each weight row is streamed once and dotted with the m activation
//    rows from L1; fp8 block scales applied per 128 columns.
//  - m > 4 (prefill): the blocked GEMM of matmul_gemm_impl.h with a 6x64 micro-kernel over a panel
//    of k-pairs x 64 output columns ([kc/2][64][2] bf16), converted once per k-block.
#include <cstring>

#include "base/check.h"
#include "kernels/matmul_gemm_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

inline const uint8_t* row_ptr(const WeightView& w, int64_t r) {
  const int64_t elem = w.dtype == DType::kF8E4M3 ? 1 : 2;
  return static_cast<const uint8_t*>(w.data) + r * w.cols * elem;
}

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

inline __m512bh bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return as_bh(_mm512_set1_epi32(v));
}

// 32 weights of row `row` starting at column k (n valid, rest zero) as bf16.
template <bool kFp8>
inline __m512i load_w32(const uint8_t* row, int64_t k, int64_t n, const E4m3ToBf16* conv) {
  if constexpr (kFp8) {
    const __m256i b = n >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k))
                              : _mm256_maskz_loadu_epi8(lanes32(n), row + k);
    return conv->convert(b);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + k;
    return n >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(lanes32(n), p);
  }
}

inline void store_y(float* y, bool accumulate, float v) { *y = accumulate ? *y + v : v; }

// ---- matrix-vector: R rows x M activation rows ----

template <int R, int M>
void matvec_bf16(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r) {
  __m512 acc[R][M];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = row_ptr(w, r + i);
  const int64_t K = w.cols;
  for (int64_t k = 0; k < K; k += 32) {
    __m512bh xv[M];
    for (int m = 0; m < M; ++m) xv[m] = as_bh(_mm512_loadu_si512(x.bf16 + m * x.stride + k));
    for (int i = 0; i < R; ++i) {
      const __m512bh wv = as_bh(load_w32<false>(rows[i], k, K - k, nullptr));
      for (int m = 0; m < M; ++m) acc[i][m] = _mm512_dpbf16_ps(acc[i][m], wv, xv[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) {
      alignas(16) float s[4];
      _mm_store_ps(s, hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
      for (int i = 0; i < 4; ++i) store_y(y + m * ldy + r + i, accumulate, s[i]);
    } else {
      for (int i = 0; i < R; ++i) store_y(y + m * ldy + r + i, accumulate, _mm512_reduce_add_ps(acc[i][m]));
    }
  }
}

template <int R, int M>
void matvec_fp8(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                const E4m3ToBf16& conv) {
  __m512 tot[R][M];
  for (auto& a : tot)
    for (auto& v : a) v = _mm512_setzero_ps();
  const uint8_t* rows[R];
  const float* scales[R];
  for (int i = 0; i < R; ++i) {
    rows[i] = row_ptr(w, r + i);
    scales[i] = fp8_scale_row(w, r + i);
  }
  const int64_t K = w.cols;
  for (int64_t k0 = 0; k0 < K; k0 += 128) {
    __m512 blk[R][M];
    for (auto& a : blk)
      for (auto& v : a) v = _mm512_setzero_ps();
    const int64_t kend = std::min<int64_t>(K, k0 + 128);
    for (int64_t k = k0; k < kend; k += 32) {
      __m512bh xv[M];
      for (int m = 0; m < M; ++m) xv[m] = as_bh(_mm512_loadu_si512(x.bf16 + m * x.stride + k));
      for (int i = 0; i < R; ++i) {
        const __m512bh wv = as_bh(load_w32<true>(rows[i], k, K - k, &conv));
        for (int m = 0; m < M; ++m) blk[i][m] = _mm512_dpbf16_ps(blk[i][m], wv, xv[m]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m512 s = _mm512_set1_ps(scales[i][k0 / 128]);
      for (int m = 0; m < M; ++m) tot[i][m] = _mm512_fmadd_ps(blk[i][m], s, tot[i][m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int i = 0; i < R; ++i) store_y(y + m * ldy + r + i, accumulate, _mm512_reduce_add_ps(tot[i][m]));
  }
}

template <int M>
void matvec_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1) {
  int64_t r = r0;
  if (w.dtype == DType::kF8E4M3) {
    const E4m3ToBf16 conv;
    constexpr int R = M <= 2 ? 4 : 2;
    for (; r + R <= r1; r += R) matvec_fp8<R, M>(w, x, y, ldy, accumulate, r, conv);
    for (; r < r1; ++r) matvec_fp8<1, M>(w, x, y, ldy, accumulate, r, conv);
  } else {
    for (; r + 4 <= r1; r += 4) matvec_bf16<4, M>(w, x, y, ldy, accumulate, r);
    for (; r < r1; ++r) matvec_bf16<1, M>(w, x, y, ldy, accumulate, r);
  }
}

// ---- GEMM: panel of [kc/2][64] bf16 pairs ----

template <bool kFp8>
struct Bf16Gemm {
  static constexpr int kNR = 64;
  static constexpr int kMR = 6;
  static constexpr int64_t kKC = 256;
  struct Panel {
    alignas(64) uint32_t b[kKC / 2 * kNR];
    alignas(64) float scale[kNR];
  };

  static int64_t kc_step(const WeightView&) { return kFp8 ? 128 : kKC; }

  static void pack(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    const E4m3ToBf16* conv_ptr = nullptr;
    E4m3ToBf16 conv_storage;  // cheap: four table loads per pack call
    if constexpr (kFp8) conv_ptr = &conv_storage;
    for (int v = 0; v < kNR / 16; ++v) {
      const uint8_t* rows[16];
      int live = 0;
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 16 * v + i;
        rows[i] = j < nr ? row_ptr(w, n0 + j) : nullptr;
        live += j < nr;
      }
      for (int64_t kk = 0; kk < kc; kk += 32) {
        __m512i t[16];
        for (int i = 0; i < 16; ++i) {
          t[i] = rows[i] != nullptr ? load_w32<kFp8>(rows[i], k0 + kk, kc - kk, conv_ptr) : _mm512_setzero_si512();
        }
        if (live > 0) transpose16x16_epi32(t);
        uint32_t* dst = p.b + (kk / 2) * kNR + 16 * v;
        for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * kNR, t[j]);
      }
    }
    if constexpr (kFp8) {
      for (int64_t j = 0; j < kNR; ++j) p.scale[j] = j < nr ? fp8_scale_row(w, n0 + j)[k0 / 128] : 0.0f;
    }
  }

  template <int MR>
  static void micro(const ActView& x, int64_t m0, int64_t k0, int64_t kc, const Panel& p, float* c, int64_t ldc,
                    int64_t nr, bool overwrite) {
    __m512 acc[MR][4];
    for (auto& a : acc)
      for (auto& v : a) v = _mm512_setzero_ps();
    const uint16_t* a = x.bf16 + m0 * x.stride + k0;
    const int64_t np = (kc + 1) / 2;
    const uint32_t* b = p.b;
    for (int64_t q = 0; q < np; ++q, b += kNR) {
      const __m512bh b0 = as_bh(_mm512_load_si512(b)), b1 = as_bh(_mm512_load_si512(b + 16));
      const __m512bh b2 = as_bh(_mm512_load_si512(b + 32)), b3 = as_bh(_mm512_load_si512(b + 48));
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512bh av = bcast_pair(a + m * x.stride + 2 * q);
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], av, b0);
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], av, b1);
        acc[m][2] = _mm512_dpbf16_ps(acc[m][2], av, b2);
        acc[m][3] = _mm512_dpbf16_ps(acc[m][3], av, b3);
      }
    }
    for (int m = 0; m < MR; ++m) {
      for (int v = 0; v < 4; ++v) {
        __m512 r = acc[m][v];
        if constexpr (kFp8) r = _mm512_mul_ps(r, _mm512_load_ps(p.scale + 16 * v));
        store_tile16(c + m * ldc + 16 * v, r, nr - 16 * v, overwrite);
      }
    }
  }
};

}  // namespace

void rows_bf16_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                          int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kBF16);
  CHECK(w.dtype == DType::kBF16 || w.dtype == DType::kF8E4M3);
  switch (x.m) {
    case 1: matvec_rows<1>(w, x, y, y_stride, accumulate, r0, r1); return;
    case 2: matvec_rows<2>(w, x, y, y_stride, accumulate, r0, r1); return;
    case 3: matvec_rows<3>(w, x, y, y_stride, accumulate, r0, r1); return;
    case 4: matvec_rows<4>(w, x, y, y_stride, accumulate, r0, r1); return;
    default: break;
  }
  if (w.dtype == DType::kF8E4M3) {
    gemm_rows<Bf16Gemm<true>>(w, x, y, y_stride, accumulate, r0, r1);
  } else {
    gemm_rows<Bf16Gemm<false>>(w, x, y, y_stride, accumulate, r0, r1);
  }
}

}  // namespace fathom::matmul_internal
