// FP8 (e4m3 + 128x128 block scales) kernels on AVX-512 BF16, templated on the e4m3 -> bf16
// converter; included by matmul_avx512bf16.cpp (register-table converter, any AVX-512 BW CPU) and
// matmul_fp8vbmi_avx512bf16.cpp (vpermi2b converter, CPUs with AVX-512 VBMI).
//
// A converter turns 64 e4m3 bytes into two vectors of 32 bf16 values, in an order the activations
// are prepared in (ActView::bf16_perm64): natural order for the register table, and for VBMI the
// byte-interleaved order unpacklo/unpackhi produce (see fp8_perm64_index). Products are exact;
// each 128-column block is summed in fp32 and multiplied by its scale.
//  - m = 1: row-wise matrix-vector, 4 rows at a time, 64 columns per step; where address_order_wanted
//    holds (AMD CPUs), one row at a time instead (fp8_stream_matvec).
//  - 2 <= m <= kFp8MatvecMaxM (16): row-wise too (on CPUs with AVX-512 FP16, 2-4 rows take the
//    fp16 kernel of matmul_fp8f16_avx512fp16.cpp instead, and on AMX CPUs 5-16 the tiles), two
//    weight rows against chunks of up to four
//    activation rows (fp8_mv_rows; with the VBMI converter and whole 128-column blocks, through
//    its assembly pair kernel, fp8_pair, and chunks of up to five, five rows through
//    pair_kernel5). m = 2 went through fp8_matvec_rows<2> before, whose
//    one-thread cache-resident ceiling was half of fp8_mv_rows' (17.8 against 35.1 GB/s, `bench
//    gemm --dtype fp8 --m 2 --n 1408 --k 2048 --ceiling`).
//  - m > 16: the blocked GEMM with a 6x64 micro-kernel (panel [64 pairs][64 columns] per 128-column
//    k-block, converted once) and the block scale applied per column in the epilogue.
//  - m = 12-32 or 62-64 with the VBMI converter and no usable AMX, whole 128-column blocks: the
//    activation rows across the lanes instead (fp8_lanes_rows, matmul_fp8vbmi_avx512bf16.cpp).
#pragma once

#include <immintrin.h>

#include <cstring>

#include "base/cpu.h"
#include "kernels/matmul_gemm_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

inline __mmask64 lanes64(int64_t n) {
  return n >= 64 ? ~static_cast<__mmask64>(0) : (static_cast<__mmask64>(1) << n) - 1;
}

// Natural order: A = bytes 0-31, B = bytes 32-63, through the 4-register magnitude table.
struct Fp8TableConv {
  E4m3ToBf16 t;
  inline void convert64(const uint8_t* p, __mmask64 mask, __m512i& a, __m512i& b) const {
    const __m512i v = _mm512_maskz_loadu_epi8(mask, p);
    a = t.convert(_mm512_castsi512_si256(v));
    b = t.convert(_mm512_extracti64x4_epi64(v, 1));
  }
};

// Up to R rows from r (those below r1) to prefetch at the columns being read; none when r >= r1.
struct AheadRows {
  const uint8_t* p = nullptr;
  int n = 0;
};
inline AheadRows rows_ahead(const WeightView& w, int64_t r, int64_t r1, int R) {
  const int64_t n = std::min<int64_t>(R, r1 - r);
  return n > 0 ? AheadRows{fp8_row(w, r), static_cast<int>(n)} : AheadRows{};
}
// The far rows: rows_ahead while whole groups of R rows remain before r1, then R rows' worth of
// the bytes the thread reads next (t_next_weights), as far past their start as r is past r1; none
// where neither holds R rows.
inline AheadRows far_rows(const WeightView& w, int64_t r, int64_t r1, int R) {
  if (r + R <= r1) return AheadRows{fp8_row(w, r), R};
  if (const uint8_t* p = t_next_weights.at(std::max<int64_t>(r - r1, 0) * w.cols, R * w.cols))
    return AheadRows{p, R};
  return rows_ahead(w, r, r1, R);
}

inline __m512bh bh(__m512i v) {
  return (__m512bh)v;
}

template <int R, int M>
inline void fp8_reduce_store(__m512 (&acc)[R][M], float* y, int64_t ldy, bool accumulate, int64_t r) {
  FATHOM_UNROLL
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) {
      alignas(16) float s[4];
      _mm_store_ps(s, hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
      FATHOM_UNROLL
      for (int i = 0; i < 4; ++i) y[m * ldy + r + i] = accumulate ? y[m * ldy + r + i] + s[i] : s[i];
    } else {
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) {
        const float s = _mm512_reduce_add_ps(acc[i][m]);
        y[m * ldy + r + i] = accumulate ? y[m * ldy + r + i] + s : s;
      }
    }
  }
}

// Weight rows [r, r + R) against M activation rows (xb, stride xs): each 64-column step converts
// the R rows once and dots them with every activation row; per 128-column block the sums are scaled
// and added up in fp32. C accumulation chains per (weight row, activation row): 2 (the a and b
// halves apart) when R * M is too small to hide the FMA latency, else 1.
// `next`: rows to prefetch into L1, at the same columns as these rows are read: rows of a few KiB
// are too short for the hardware prefetcher to ramp up on its own, and without this a
// matrix-vector product reads DRAM at a quarter of the bandwidth (1 byte per weight leaves many
// rows per cache line of arithmetic). `far`: rows further ahead, requested into L2 only (see
// kFp8FarRowsMatvec).
template <class Conv, int R, int M, int C = 1>
void fp8_mv_chunk(const Conv& conv, const WeightView& w, const uint16_t* xb, int64_t xs, float* y,
                  int64_t ldy, bool accumulate, int64_t r, AheadRows next = {}, AheadRows far = {}) {
  static_assert(C == 1 || C == 2);
  __m512 tot[R][M];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) tot[i][m] = _mm512_setzero_ps();
  }
  const int64_t K = w.cols;
  const uint8_t* row0 = static_cast<const uint8_t*>(w.data) + r * K;
  const float* scales[R];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) scales[i] = fp8_scale_row(w, r + i);
  for (int64_t k0 = 0; k0 < K; k0 += 128) {
    __m512 blk[R][M][C];
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        FATHOM_UNROLL
        for (int h = 0; h < C; ++h) blk[i][m][h] = _mm512_setzero_ps();
      }
    }
    const int64_t kend = std::min<int64_t>(K, k0 + 128);
    for (int64_t k = k0; k < kend; k += 64) {
      for (int i = 0; i < next.n; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(next.p + i * K + k), _MM_HINT_T0);
      for (int i = 0; i < far.n; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(far.p + i * K + k), _MM_HINT_T1);
      const __mmask64 mask = lanes64(K - k);
      __m512i wa[R], wb[R];
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) conv.convert64(row0 + i * K + k, mask, wa[i], wb[i]);
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512bh xa = bh(_mm512_loadu_si512(xb + m * xs + k));
        const __m512bh xbv = bh(_mm512_loadu_si512(xb + m * xs + k + 32));
        FATHOM_UNROLL
        for (int i = 0; i < R; ++i) {
          blk[i][m][0] = _mm512_dpbf16_ps(blk[i][m][0], bh(wa[i]), xa);
          blk[i][m][C - 1] = _mm512_dpbf16_ps(blk[i][m][C - 1], bh(wb[i]), xbv);
        }
      }
    }
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      const __m512 sc = _mm512_set1_ps(scales[i][k0 / 128]);
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512 sum = C == 2 ? _mm512_add_ps(blk[i][m][0], blk[i][m][C - 1]) : blk[i][m][0];
        tot[i][m] = _mm512_fmadd_ps(sum, sc, tot[i][m]);
      }
    }
  }
  fp8_reduce_store<R, M>(tot, y, ldy, accumulate, r);
}

// Far prefetch of the row-wise kernels: besides the rows a few groups ahead requested into L1, the
// rows this many ahead are requested into L2 (`prefetcht1`) at the same columns. A core's L1 misses
// in flight are bounded by its fill buffers (16 on these Xeons' cores), which a loop that also
// converts and multiplies does not keep busy; requests that end in L2 add misses the core does not
// wait on (the explanation fits the figures; it was not measured). Two threads, [1408 x 2048] fp8
// (`bench gemm`, model-167 Xeon VM, 2026-12-06), fraction of the read bandwidth without / with: m =
// 2 0.54-0.60 / 0.79-0.84, m = 3 0.47-0.51 / 0.62-0.69 (the pair kernel: 6-12 rows ahead alike, 32
// 0.77 / 0.64, 64 0.73 / 0.63; partly from the L3, see PERFORMANCE.md "bench gemm's rotation"; with
// the weights truly from memory 4-12 rows ahead, and 2-6 rows into L1, alike again). m = 1: 16 rows
// ahead, with the L1 requests one group ahead (fp8_matvec_rows); from memory [1408 x 2048] and
// [2048 x 1408] read 0.85-0.89 / 0.87-0.90 against 0.75-0.79 / 0.82-0.84 with the L1 requests four
// groups and these 32 rows ahead (chosen before against weights partly in the L3); farther is
// slower (64 rows 0.70-0.72, 96 0.66-0.68).
inline constexpr int64_t kFp8FarRowsMatvec = 16;
inline constexpr int64_t kFp8FarRowsPair = 8;

// The m = 1 kernel's L1 distance in weight rows (whole groups of four), by machine kind: on the
// Xeons (AMX, model 167) one group ahead, with the rows kFp8FarRowsMatvec ahead requested into L2,
// made `bench moe --ab` 1.13x faster at one token than four groups and 32 rows and the engine's
// single-stream decode step 1.07x (docs/PERFORMANCE.md, "m = 1 prefetch distances from memory");
// on the AMD EPYC (Zen 5) VM two groups made the single-stream decode step 1.04-1.10x faster than
// one in three runs (`bench serve --concurrency 1 --ab`; three groups alike, less with the L2
// requests at 32 rows: "m = 1 prefetch distances on Zen 5" there).
inline int64_t fp8_matvec_ahead_rows() {
  static const int64_t rows = cpu_features().vendor == "AuthenticAMD" ? 8 : 4;
  return rows;
}

// m = 1: four weight rows at a time, two accumulation chains each.
template <class Conv>
void fp8_matvec_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate,
                     int64_t r0, int64_t r1) {
  const Conv conv;
  constexpr int R = 4;
  // The groups fp8_matvec_ahead_rows ahead are prefetched into L1 and the rows kFp8FarRowsMatvec
  // ahead into L2 (see there).
  const int64_t kAhead = fp8_matvec_ahead_rows();
  constexpr int64_t kFar = kFp8FarRowsMatvec;
  prefetch_range_l1(fp8_row(w, r0), std::min<int64_t>(kAhead, r1 - r0) * w.cols);
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    fp8_mv_chunk<Conv, R, 1, 2>(conv, w, x.bf16, x.stride, y, ldy, accumulate, r,
                                rows_ahead(w, r + kAhead, r1, R), far_rows(w, r + kFar, r1, R));
  }
  for (; r < r1; ++r) fp8_mv_chunk<Conv, 1, 1, 2>(conv, w, x.bf16, x.stride, y, ldy, accumulate, r);
}

// m = 1 on CPUs where address_order_wanted holds, whole 128-column blocks: one weight row at a time,
// so the call's rows [r0, r1), which lie one after another, are read as one run of addresses
// (kStreamL1Bytes in matmul_impl.h: why, and the requests ahead). Per 128-column block: both
// halves converted, four products in one chain (blocks overlap out of order), the sum times the
// block scale into the row's total.
template <class Conv>
void fp8_stream_matvec(const WeightView& w, const ActView& x, float* y, bool accumulate, int64_t r0,
                       int64_t r1) {
  const Conv conv;
  const int64_t K = w.cols, nb = K / 128;
  const uint8_t *begin = fp8_row(w, r0), *end = fp8_row(w, r1);
  const NextWeights nw = t_next_weights;
  prefetch_range_l1(begin, std::min<int64_t>(kStreamL1Bytes, end - begin));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = fp8_row(w, r);
    const float* scale = fp8_scale_row(w, r);
    const bool inside = end - wr >= K + kStreamL2Bytes;  // every request of this row lands within the call
    __m512 tot = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = wr + 128 * b;
      STREAM_REQUEST(p, kStreamL2Bytes, _MM_HINT_T1, inside, end, nw);
      STREAM_REQUEST(p + 64, kStreamL2Bytes, _MM_HINT_T1, inside, end, nw);
      __m512i a0, b0, a1, b1;
      conv.convert64(p, ~__mmask64{0}, a0, b0);
      conv.convert64(p + 64, ~__mmask64{0}, a1, b1);
      const uint16_t* xb = x.bf16 + 128 * b;
      __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), bh(a0), bh(_mm512_loadu_si512(xb)));
      s = _mm512_dpbf16_ps(s, bh(b0), bh(_mm512_loadu_si512(xb + 32)));
      s = _mm512_dpbf16_ps(s, bh(a1), bh(_mm512_loadu_si512(xb + 64)));
      s = _mm512_dpbf16_ps(s, bh(b1), bh(_mm512_loadu_si512(xb + 96)));
      tot = _mm512_fmadd_ps(s, _mm512_set1_ps(scale[b]), tot);
    }
    const float v = _mm512_reduce_add_ps(tot);
    y[r] = accumulate ? y[r] + v : v;
  }
}

// 2 <= m <= 16 (a few tokens per expert in a batched decode): fp8_mv_chunk over chunks of at most
// kChunk activation rows, one chain each (two weight rows by four activation rows keep
// accumulators, operands and the converter's tables within the 32 registers). Without this, 5-16
// rows went through the GEMM, which converts and transposes a whole panel for a handful of rows
// (0.14-0.23 of the read bandwidth).
inline constexpr int64_t kChunk = 4;

// One chunk of mc (1..kChunk, or 5 for fp8_mv_rows' five-row chunks) activation rows starting at row m0,
// against weight rows [r, r + R).
template <class Conv, int R>
void fp8_mv_chunk_any(const Conv& conv, const WeightView& w, const ActView& x, float* y, int64_t ldy,
                      bool accumulate, int64_t r, int64_t m0, int mc, AheadRows next, AheadRows far) {
  const uint16_t* xb = x.bf16 + m0 * x.stride;
  float* yc = y + m0 * ldy;
  switch (mc) {
    case 1:
      fp8_mv_chunk<Conv, R, 1>(conv, w, xb, x.stride, yc, ldy, accumulate, r, next, far);
      break;
    case 2:
      fp8_mv_chunk<Conv, R, 2>(conv, w, xb, x.stride, yc, ldy, accumulate, r, next, far);
      break;
    case 3:
      fp8_mv_chunk<Conv, R, 3>(conv, w, xb, x.stride, yc, ldy, accumulate, r, next, far);
      break;
    case 4:
      fp8_mv_chunk<Conv, R, 4>(conv, w, xb, x.stride, yc, ldy, accumulate, r, next, far);
      break;
    default:  // the last odd row of a five-row chunk (fp8_mv_rows with pair_kernel5)
      CHECK(mc == 5);
      fp8_mv_chunk<Conv, R, 5>(conv, w, xb, x.stride, yc, ldy, accumulate, r, next, far);
      break;
  }
}

// Weight rows in blocks of kMvBlockRows; within a block, chunk by chunk of activation rows (balanced:
// 7 -> 3, 4), so one chunk of x (4 rows) and the block's converted weight rows stay in L1 while the
// block is swept; the first sweep streams the weights from memory, prefetching two groups ahead.
inline constexpr int64_t kMvBlockRows = 8;

// Converters with a two-row assembly kernel (Conv::pair_kernel) take it in fp8_mv_rows for whole
// 128-column blocks: see fp8_pair.
template <class Conv>
concept HasPairKernel = Conv::kPairKernel;

// Converters whose pair kernel also takes five activation rows at once (Conv::pair_kernel5).
template <class Conv>
concept HasPairKernel5 = Conv::kPairRows5 == 5;

// Weight rows r and r + 1 against activation rows [m0, m0 + mc) through Conv::pair_kernel (mc <=
// kChunk) or Conv::pair_kernel5 (mc = 5), which leave per-lane totals ([2][mc's kernel rows][16])
// to reduce here; pf, pf + K: the rows to prefetch into L1, far, far + K: the rows to request into
// L2 (these rows again when there are none), in address order with address_order. r is even, so r +
// 1 starts no 128-row group and both rows share a scale row. (An earlier try at L2 requests, the
// rows 16 ahead as a burst before each pair, made batched decode steps 5.6% slower; these far
// requests, spread over the loop, came with steps 1.05-1.10x faster: docs/PERFORMANCE.md,
// "Serving".)
template <class Conv>
void fp8_pair(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
              int64_t m0, int mc, const uint8_t* pf, const uint8_t* far, bool address_order) {
  alignas(64) float tot[2 * 5 * 16];
  int rows = kChunk;  // activation rows per weight row in tot
  const uint16_t* xb = x.bf16 + m0 * x.stride;
  if constexpr (HasPairKernel5<Conv>) {
    if (mc == 5) {
      Conv::pair_kernel5(fp8_row(w, r), w.cols, xb, x.stride, fp8_scale_row(w, r), pf, far, address_order,
                         tot);
      rows = 5;
    }
  }
  if (rows == kChunk)
    Conv::pair_kernel(mc, fp8_row(w, r), w.cols, xb, x.stride, fp8_scale_row(w, r), pf, far, address_order,
                      tot);
  for (int i = 0; i < mc; ++i) {
    float* yr = y + (m0 + i) * ldy + r;
    const float s0 = _mm512_reduce_add_ps(_mm512_load_ps(tot + i * 16));
    const float s1 = _mm512_reduce_add_ps(_mm512_load_ps(tot + (rows + i) * 16));
    yr[0] = accumulate ? yr[0] + s0 : s0;
    yr[1] = accumulate ? yr[1] + s1 : s1;
  }
}

template <class Conv>
void fp8_mv_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1) {
  const Conv conv;
  constexpr int R = 2;
  [[maybe_unused]] const bool pairs = HasPairKernel<Conv> && w.cols % 128 == 0 && r0 % 2 == 0;
  [[maybe_unused]] const bool address_order = address_order_wanted();  // the pair kernels' request order
  prefetch_range_l1(fp8_row(w, r0), std::min<int64_t>(2 * R, r1 - r0) * w.cols);  // the first two groups
  const int64_t m = x.m;
  // with the five-row kernel, chunks of at most five (5 -> 5, 9 -> 4 + 5, 10 -> 5 + 5, 13 -> 4 + 4 +
  // 5; 6-8, 11, 12 and 16 split as before)
  const bool five = HasPairKernel5<Conv> && pairs;
  const int64_t n_chunks = five ? (m + 4) / 5 : (m + kChunk - 1) / kChunk;
  for (int64_t rb = r0; rb < r1; rb += kMvBlockRows) {
    const int64_t re = std::min(r1, rb + kMvBlockRows);
    int64_t m0 = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int mc = static_cast<int>((m - m0) / (n_chunks - c));
      int64_t r = rb;
      for (; r + R <= re; r += R) {
        // the first chunk's sweep reads the rows from memory; later chunks find them in L1
        const AheadRows next = c == 0 ? rows_ahead(w, r + 2 * R, r1, R) : AheadRows{},
                        far = c == 0 ? far_rows(w, r + kFp8FarRowsPair, r1, R) : AheadRows{};
        if constexpr (HasPairKernel<Conv>) {
          if (pairs) {  // the pair kernel takes two whole rows each (these rows again when there are none)
            fp8_pair<Conv>(w, x, y, ldy, accumulate, r, m0, mc, next.n == R ? next.p : fp8_row(w, r),
                           far.n == R ? far.p : fp8_row(w, r), address_order);
            continue;
          }
        }
        fp8_mv_chunk_any<Conv, R>(conv, w, x, y, ldy, accumulate, r, m0, mc, next, far);
      }
      for (; r < re; ++r) fp8_mv_chunk_any<Conv, 1>(conv, w, x, y, ldy, accumulate, r, m0, mc, {}, {});
      m0 += mc;
    }
  }
}

template <class Conv>
struct Fp8Gemm {
  static constexpr int kNR = 64;
  static constexpr int kMR = 5;
  static constexpr int64_t kKC = 128;
  struct Panel {
    alignas(64) uint32_t b[kKC / 2 * kNR];
    alignas(64) float scale[kNR];
  };

  static int64_t kc_step(const WeightView&) { return kKC; }

  static void pack(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    const Conv conv;
    for (int v = 0; v < kNR / 16; ++v) {
      const uint8_t* rows[16];
      FATHOM_UNROLL
      for (int i = 0; i < 16; ++i) rows[i] = 16 * v + i < nr ? fp8_row(w, n0 + 16 * v + i) : nullptr;
      for (int64_t kk = 0; kk < kc; kk += 64) {
        __m512i ta[16], tb[16];
        const __mmask64 mask = lanes64(kc - kk);
        FATHOM_UNROLL
        for (int i = 0; i < 16; ++i) {
          if (rows[i] != nullptr) {
            conv.convert64(rows[i] + k0 + kk, mask, ta[i], tb[i]);
          } else {
            ta[i] = tb[i] = _mm512_setzero_si512();
          }
        }
        transpose16x16_epi32(ta);
        transpose16x16_epi32(tb);
        uint32_t* dst = p.b + (kk / 2) * kNR + 16 * v;
        FATHOM_UNROLL
        for (int j = 0; j < 16; ++j) {
          _mm512_store_si512(dst + j * kNR, ta[j]);
          _mm512_store_si512(dst + (16 + j) * kNR, tb[j]);
        }
      }
    }
    // the panel's block scales: one per row's 128-row group, so a single value where the panel lies in
    // one group (every panel of a call starting on a multiple of 64 rows): a broadcast instead of a
    // scale-row lookup per row, `bench gemm --dtype fp8 --m 24|48|96 --n 1408 --k 2048 --ab` 1.01 /
    // 1.04 / 1.03x, `bench moe --tokens 256|512 --ab` 1.03 / 1.02x (Zen 5)
    if (n0 % 128 + nr <= 128) {
      const __m512 s = _mm512_set1_ps(fp8_scale_row(w, n0)[k0 / 128]);
      FATHOM_UNROLL
      for (int v = 0; v < kNR / 16; ++v)
        _mm512_store_ps(p.scale + 16 * v, _mm512_maskz_mov_ps(lanes16(std::max<int64_t>(0, nr - 16 * v)), s));
    } else {
      for (int64_t j = 0; j < kNR; ++j) p.scale[j] = j < nr ? fp8_scale_row(w, n0 + j)[k0 / 128] : 0.0f;
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
    // pairs beyond kc are zero in both the panel (masked loads) and x (padding) only up to the next
    // 64; the panel always holds whole 64-column groups, so run over them
    const int64_t np = (kc + 63) / 64 * 32;
    const uint32_t* b = p.b;
    for (int64_t q = 0; q < np; ++q, b += kNR) {
      const __m512bh b0 = bh(_mm512_load_si512(b)), b1 = bh(_mm512_load_si512(b + 16));
      const __m512bh b2 = bh(_mm512_load_si512(b + 32)), b3 = bh(_mm512_load_si512(b + 48));
      FATHOM_UNROLL
      for (int m = 0; m < MR; ++m) {
        int32_t pair;
        std::memcpy(&pair, a + m * x.stride + 2 * q, 4);
        const __m512bh av = bh(_mm512_set1_epi32(pair));
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], av, b0);
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], av, b1);
        acc[m][2] = _mm512_dpbf16_ps(acc[m][2], av, b2);
        acc[m][3] = _mm512_dpbf16_ps(acc[m][3], av, b3);
      }
    }
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) {
      FATHOM_UNROLL
      for (int v = 0; v < 4; ++v) {
        store_tile16(c + m * ldc + 16 * v, _mm512_mul_ps(acc[m][v], _mm512_load_ps(p.scale + 16 * v)),
                     nr - 16 * v, overwrite);
      }
    }
  }
};

template <class Conv>
void rows_fp8(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
              int64_t r1) {
  switch (x.m) {
    case 1:
      if (w.cols % 128 == 0 && address_order_wanted()) {
        fp8_stream_matvec<Conv>(w, x, y, accumulate, r0, r1);
      } else {
        fp8_matvec_rows<Conv>(w, x, y, ldy, accumulate, r0, r1);
      }
      return;
    default:
      if (x.m <= kFp8MatvecMaxM) {
        fp8_mv_rows<Conv>(w, x, y, ldy, accumulate, r0, r1);
        return;
      }
      gemm_rows<Fp8Gemm<Conv>>(w, x, y, ldy, accumulate, r0, r1);
      return;
  }
}

}  // namespace
}  // namespace fathom::matmul_internal
