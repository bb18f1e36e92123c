// BF16 weights on AVX-512 BF16: vdpbf16ps dot products of bf16 activations with bf16 weights,
// fp32 accumulation; FP8 weights dispatch to matmul_fp8_impl.h (register-table converter here, the
// VBMI converter in matmul_fp8vbmi_avx512bf16.cpp).
//  - m <= 16 (decode, a few tokens per expert): row-wise; each weight row is streamed once and
//    dotted with the m activation rows from L1 (fp8: matmul_fp8_impl.h has the row groupings).
//  - m > 16 (prefill): the blocked GEMM of matmul_gemm_impl.h with a 6x64 micro-kernel over a panel
//    of k-pairs x 64 output columns ([kc/2][64][2] bf16), transposed once per k-block.
//  - m = 12-32 without usable AMX, k a multiple of 32: the activation rows across the lanes
//    instead (bf16_lanes_rows).
#include <cstring>

#include "base/check.h"
#include "kernels/matmul_fp8_impl.h"
#include "kernels/matmul_gemm_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

inline const uint16_t* row_ptr(const WeightView& w, int64_t r) {
  return static_cast<const uint16_t*>(w.data) + r * w.cols;
}

inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

inline __m512bh bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return as_bh(_mm512_set1_epi32(v));
}

// 32 weights of a row starting at column k (n valid, rest zero).
inline __m512i load_w32(const uint16_t* row, int64_t k, int64_t n) {
  return n >= 32 ? _mm512_loadu_si512(row + k) : _mm512_maskz_loadu_epi16(lanes32(n), row + k);
}

// How many bytes ahead bf16_lanes requests each row's lines into L1 (1536 and 6144 measured within
// 2% of this for the [102400 x 2048] head at 16 and 32 rows, `bench gemm --ab`, Zen 5).
constexpr int64_t kBf16LanesAhead = 3072;

inline void store_y(float* y, bool accumulate, float v) {
  *y = accumulate ? *y + v : v;
}

// ---- matrix-vector: R rows x M activation rows ----

template <int R, int M>
inline void reduce_store(__m512 (&acc)[R][M], float* y, int64_t ldy, bool accumulate, int64_t r) {
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

// `next`: a later group of R rows, prefetched at the columns this group reads (one cache line per
// row per step): the hardware prefetcher alone left a decode's BF16 matrix-vector products (the
// lm_head, the absorbed attention weights) 4.4% of the decode step slower.
inline constexpr int64_t kBf16AheadBytes = 64 << 10;
template <int R, int M>
void matvec_bf16(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                 const uint16_t* next = nullptr) {
  __m512 acc[R][M];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) acc[i][m] = _mm512_setzero_ps();
  }
  const int64_t K = w.cols;
  const uint16_t* row0 = row_ptr(w, r);
  const uint16_t* xb = x.bf16;
  const int64_t xs = x.stride;
  // one step: 32 columns; `mask` all ones except in the last partial step
  auto step = [&](int64_t k, __mmask32 mask) {
    if (next != nullptr) {
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(next + i * K + k), _MM_HINT_T0);
    }
    __m512bh xv[M];
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) xv[m] = as_bh(_mm512_loadu_si512(xb + m * xs + k));
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      const __m512bh wv = as_bh(_mm512_maskz_loadu_epi16(mask, row0 + i * K + k));
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) acc[i][m] = _mm512_dpbf16_ps(acc[i][m], wv, xv[m]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) step(k, static_cast<__mmask32>(0xffffffffu));
  if (k < K) step(k, lanes32(K - k));
  reduce_store<R, M>(acc, y, ldy, accumulate, r);
}

// R weight rows against every activation row, in groups of 4, while the rows stay in L1.
template <int R>
void matvec_all(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                const uint16_t* next = nullptr) {
  int64_t i = 0;
  for (; i + 4 <= x.m; i += 4)
    matvec_bf16<R, 4>(w, act_rows(x, i, 4), y + i * ldy, ldy, accumulate, r, i == 0 ? next : nullptr);
  switch (x.m - i) {
    case 1:
      matvec_bf16<R, 1>(w, act_rows(x, i, 1), y + i * ldy, ldy, accumulate, r, i == 0 ? next : nullptr);
      break;
    case 2:
      matvec_bf16<R, 2>(w, act_rows(x, i, 2), y + i * ldy, ldy, accumulate, r, i == 0 ? next : nullptr);
      break;
    case 3:
      matvec_bf16<R, 3>(w, act_rows(x, i, 3), y + i * ldy, ldy, accumulate, r, i == 0 ? next : nullptr);
      break;
    default:
      break;
  }
}

// m = 1 where address_order_wanted holds, k a multiple of 128: one weight row at a time, the call's
// rows one run of addresses (kStreamL1Bytes in matmul_impl.h: why, and the requests ahead), four
// chains of 32-column products per row. The vocabulary head [102400 x 2048] from memory, two
// threads: 1.07-1.18x the four-row kernel (`bench gemm --dtype bf16 --m 1 --ab`, Zen 5).
void bf16_stream_matvec(const WeightView& w, const ActView& x, float* y, bool accumulate, int64_t r0,
                        int64_t r1) {
  const int64_t K = w.cols;
  const uint8_t* begin = reinterpret_cast<const uint8_t*>(row_ptr(w, r0));
  const uint8_t* end = reinterpret_cast<const uint8_t*>(row_ptr(w, r1));
  const NextWeights nw = t_next_weights;
  prefetch_range_l1(begin, std::min<int64_t>(kStreamL1Bytes, end - begin));
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* wr = row_ptr(w, r);
    const uint8_t* wb = reinterpret_cast<const uint8_t*>(wr);
    const bool inside =
        end - wb >= 2 * K + kStreamL2Bytes;  // every request of this row lands within the call
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < K; k += 128) {
      const uint8_t* p = wb + 2 * k;
      FATHOM_UNROLL
      for (int l = 0; l < 256; l += 64) STREAM_REQUEST(p + l, kStreamL2Bytes, _MM_HINT_T1, inside, end, nw);
      FATHOM_UNROLL
      for (int u = 0; u < 4; ++u)
        acc[u] = _mm512_dpbf16_ps(acc[u], as_bh(_mm512_loadu_si512(wr + k + 32 * u)),
                                  as_bh(_mm512_loadu_si512(x.bf16 + k + 32 * u)));
    }
    const float v =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    y[r] = accumulate ? y[r] + v : v;
  }
}

void matvec_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1) {
  int64_t r = r0;
  // The rows about 64 KiB ahead are prefetched (the ones in between were requested before): for
  // the lm_head's 4 KiB rows that is 16 rows, for the absorbed W_UK's 256-byte rows 256. Same-process
  // alternating V2-Lite FP8 decode steps: 1 group (4 rows) ahead was 2-4% slower than 16 rows,
  // and 16 rows 2-11% slower than 64 KiB.
  const int64_t row_bytes = w.cols * 2;
  const int64_t ahead = std::max<int64_t>(4, (kBf16AheadBytes / row_bytes + 3) / 4 * 4);
  prefetch_range_l1(row_ptr(w, r0), std::min<int64_t>(ahead, r1 - r0) * row_bytes);
  for (; r + 4 <= r1; r += 4)
    matvec_all<4>(w, x, y, ldy, accumulate, r, r + ahead + 4 <= r1 ? row_ptr(w, r + ahead) : nullptr);
  for (; r < r1; ++r) matvec_all<1>(w, x, y, ldy, accumulate, r);
}

// ---- GEMM: panel of [kc/2][64] bf16 pairs ----

struct Bf16Gemm {
  static constexpr int kNR = 64;
  static constexpr int kMR = 6;
  static constexpr int64_t kKC = 256;
  struct Panel {
    alignas(64) uint32_t b[kKC / 2 * kNR];
  };

  static int64_t kc_step(const WeightView&) { return kKC; }

  static void pack(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    for (int v = 0; v < kNR / 16; ++v) {
      const uint16_t* rows[16];
      int live = 0;
      FATHOM_UNROLL
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 16 * v + i;
        rows[i] = j < nr ? row_ptr(w, n0 + j) : nullptr;
        live += j < nr;
      }
      for (int64_t kk = 0; kk < kc; kk += 32) {
        __m512i t[16];
        FATHOM_UNROLL
        for (int i = 0; i < 16; ++i) {
          t[i] = rows[i] != nullptr ? load_w32(rows[i], k0 + kk, kc - kk) : _mm512_setzero_si512();
        }
        if (live > 0) transpose16x16_epi32(t);
        uint32_t* dst = p.b + (kk / 2) * kNR + 16 * v;
        FATHOM_UNROLL
        for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * kNR, t[j]);
      }
    }
  }

  template <int MR>
  static void micro(const ActView& x, int64_t m0, int64_t k0, int64_t kc, const Panel& p, float* c,
                    int64_t ldc, int64_t nr, bool overwrite) {
    __m512 acc[MR][4];
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) {
      FATHOM_UNROLL
      for (int v = 0; v < 4; ++v) acc[m][v] = _mm512_setzero_ps();
    }
    const uint16_t* a = x.bf16 + m0 * x.stride + k0;
    const int64_t np = (kc + 1) / 2;
    const uint32_t* b = p.b;
    for (int64_t q = 0; q < np; ++q, b += kNR) {
      const __m512bh b0 = as_bh(_mm512_load_si512(b)), b1 = as_bh(_mm512_load_si512(b + 16));
      const __m512bh b2 = as_bh(_mm512_load_si512(b + 32)), b3 = as_bh(_mm512_load_si512(b + 48));
      FATHOM_UNROLL
      for (int m = 0; m < MR; ++m) {
        const __m512bh av = bcast_pair(a + m * x.stride + 2 * q);
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], av, b0);
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], av, b1);
        acc[m][2] = _mm512_dpbf16_ps(acc[m][2], av, b2);
        acc[m][3] = _mm512_dpbf16_ps(acc[m][3], av, b3);
      }
    }
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) {
      FATHOM_UNROLL
      for (int v = 0; v < 4; ++v) store_tile16(c + m * ldc + 16 * v, acc[m][v], nr - 16 * v, overwrite);
    }
  }
};

// bf16 weights at 12-32 activation rows (the vocabulary head of a batched decode step;
// bf16_lanes_m): the activation rows across the lanes as in fp8_lanes_rows
// (matmul_fp8vbmi_avx512bf16.cpp), each weight pair broadcast straight from its row, so there is
// nothing to convert or pack and the sums run over the whole row. R weight rows against 16H
// activation rows (8 x 16 or 4 x 32), two chains per accumulator (even and odd pairs).
template <int R, int H>
void bf16_lanes(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                int64_t g, const uint16_t* next) {
  static_assert((R == 8 && H == 1) || (R == 4 && H == 2));
  const int64_t K = w.cols;
  const uint16_t* w0 = row_ptr(w, r);
  const uint32_t* xt = x.xt + g;
  const int64_t xts = x.xt_stride;
  __m512 acc[R][H][2];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int h = 0; h < H; ++h) acc[i][h][0] = acc[i][h][1] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; k += 32) {  // 16 column pairs: one line of each row
    // the line kBf16LanesAhead bytes ahead in each row (the next rows' first lines at the end)
    const int64_t ka = k + kBf16LanesAhead / 2;
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      const uint16_t* p = ka < K ? w0 + i * K + ka : next != nullptr ? next + i * K + (ka - K) : nullptr;
      if (p != nullptr) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    }
    const uint32_t* xk = xt + (k / 2) * xts;
    FATHOM_UNROLL
    for (int u = 0; u < 16; ++u) {
      __m512bh xv[H];
      FATHOM_UNROLL
      for (int h = 0; h < H; ++h) xv[h] = as_bh(_mm512_loadu_si512(xk + u * xts + 16 * h));
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) {
        const __m512bh wv = bcast_pair(w0 + i * K + k + 2 * u);
        FATHOM_UNROLL
        for (int h = 0; h < H; ++h) acc[i][h][u & 1] = _mm512_dpbf16_ps(acc[i][h][u & 1], xv[h], wv);
      }
    }
  }
  __m512 tot[R][H];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int h = 0; h < H; ++h) tot[i][h] = _mm512_add_ps(acc[i][h][0], acc[i][h][1]);
  }
  store_lanes<R, H>(tot, y, ldy, accumulate, r, g, std::min<int64_t>(16 * H, x.m - g));
}

// Rows [r0, r1) (r1 - r0 a multiple of 8) against x's 12-32 rows (bf16_lanes_m; K a multiple of 32):
// 8 weight rows against up to 16 activation rows, or 4 against up to 32.
void bf16_lanes_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate,
                     int64_t r0, int64_t r1) {
  CHECK(bf16_lanes_m(x.m) && w.cols % 32 == 0);
  for (int64_t r = r0; r < r1; r += 8) {
    const uint16_t* next8 = r + 8 < r1 ? row_ptr(w, r + 8) : nullptr;
    if (x.m <= 16) {
      bf16_lanes<8, 1>(w, x, y, ldy, accumulate, r, 0, next8);
      continue;
    }
    bf16_lanes<4, 2>(w, x, y, ldy, accumulate, r, 0, row_ptr(w, r + 4));
    bf16_lanes<4, 2>(w, x, y, ldy, accumulate, r + 4, 0, next8);
  }
}

}  // namespace

void rows_bf16_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                          int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kBF16);
  if (w.dtype == DType::kF8E4M3 && fp8_f16_rows_ok(w, x) && r0 % 2 == 0) {
    // fp16 arithmetic (a few activation rows, AVX-512 FP16); a last odd row takes the paths below
    r0 = rows_fp8_f16_avx512fp16(w, x, y, y_stride, accumulate, r0, r1);
    if (r0 == r1) return;
  }
  if (amx_rows_ok(w, x, r0)) {  // the activations were prepared for AMX (amx_wanted)
    rows_amx_avx512bf16(w, x, y, y_stride, accumulate, r0, r1);
    return;
  }
  if (w.dtype == DType::kF8E4M3) {
    if (x.bf16_perm64) {
      rows_fp8_vbmi_avx512bf16(w, x, y, y_stride, accumulate, r0, r1);
    } else {
      rows_fp8<Fp8TableConv>(w, x, y, y_stride, accumulate, r0, r1);
    }
    return;
  }
  CHECK(w.dtype == DType::kBF16);
  if (x.xt != nullptr && bf16_lanes_m(x.m) && w.cols % 32 == 0) {
    const int64_t r8 = r0 + (r1 - r0) / 8 * 8;  // the last few rows take the paths below
    bf16_lanes_rows(w, x, y, y_stride, accumulate, r0, r8);
    r0 = r8;
    if (r0 == r1) return;
  }
  if (x.m == 1 && w.cols % 128 == 0 && address_order_wanted()) {
    bf16_stream_matvec(w, x, y, accumulate, r0, r1);
    return;
  }
  if (x.m <= matvec_max_m(w.dtype, SimdLevel::kAvx512Bf16)) {
    matvec_rows(w, x, y, y_stride, accumulate, r0, r1);
    return;
  }
  gemm_rows<Bf16Gemm>(w, x, y, y_stride, accumulate, r0, r1);
}

}  // namespace fathom::matmul_internal
