// The blocked GEMM driver shared by the SIMD paths (included by *_avx512*.cpp files only, so it is
// compiled for their ISA; internal linkage keeps the instantiations apart).
//
// For weight rows [r0, r1) in panels of NR output columns: for each k-block the panel is converted
// ONCE (dequantised, transposed into the micro-kernel's layout) into a stack tile that stays in L1,
// then every row of x runs against it in groups of MR rows. The fp32 result tile lives in y itself
// (L2-resident for one panel); each k-block adds its contribution, so fp8's per-128 block scales
// and the quantised types' per-block scales are applied where the block ends.
//
// Traits T provides: kNR, kMR, kKC (largest k-block), `Panel` (the tile type), kc_step(w),
// pack(w, n0, nr, k0, kc, panel) and template<int MR> micro(x, m0, k0, kc, panel, c, ldc, nr,
// overwrite).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/matmul_impl.h"

namespace fathom::matmul_internal {
namespace {

template <class T, int MR>
inline void micro_tail(int64_t rem, const ActView& x, int64_t m0, int64_t k0, int64_t kc,
                       const typename T::Panel& p, float* c, int64_t ldc, int64_t nr, bool overwrite) {
  if constexpr (MR >= 1) {
    if (rem == MR) {
      T::template micro<MR>(x, m0, k0, kc, p, c, ldc, nr, overwrite);
    } else {
      micro_tail<T, MR - 1>(rem, x, m0, k0, kc, p, c, ldc, nr, overwrite);
    }
  }
}

// Prefetches bytes [0, bytes) of rows [r0, r1) of a matrix at base with rows row_bytes apart into
// L1 (a panel block of this call's weights, or the next weights' first one: NextWeights).
inline void prefetch_rows_l1(const uint8_t* base, int64_t row_bytes, int64_t r0, int64_t r1, int64_t bytes) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(base + r * row_bytes);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
  }
}

// Prefetches weight rows [n0, n0 + nr), columns [k0, k0 + kc), into L1. A panel reads 64 rows a
// k-block at a time (128 bytes of each FP8 row), 64 short strided streams that the hardware
// prefetcher does not follow: without this, packing waits on DRAM latency for every line and a
// GEMM of a few rows (grouped experts with 5-30 tokens each) runs at a fraction of bandwidth.
inline void prefetch_panel_block(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc) {
  const int64_t row_bytes = static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols)));
  const int64_t b0 = static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(k0))) & ~int64_t{63};
  const int64_t b1 = static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(k0 + kc)));
  prefetch_rows_l1(static_cast<const uint8_t*>(w.data) + n0 * row_bytes + b0, row_bytes, 0, nr, b1 - b0);
}

template <class T>
void gemm_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
               int64_t r1) {
  alignas(64) typename T::Panel panel;
  const int64_t kc_step = T::kc_step(w);
  // The next block's requests go out a share before each micro-kernel call of this block
  // instead of in one burst before packing: the burst (128 lines for an fp8 panel) queued behind the
  // core's few line-fill buffers and stalled the packing and products behind it until most of the
  // block had arrived. Spread, the lines arrive under the products: on the AMD EPYC (Zen 5) VM,
  // two threads from memory, `bench gemm --n 1408 --k 2048 --ab`, fp8 at m = 24 / 32 / 48 / 64
  // 1.40 / 1.38 / 1.32 / 1.33x, bf16 and q8_0 at m = 32 1.12 / 1.14x, m = 512 1.01-1.04x
  // (docs/PERFORMANCE.md, "The GEMM's next block requested under its products").
  const int64_t calls = (x.m + T::kMR - 1) / T::kMR;
  for (int64_t n0 = r0; n0 < r1; n0 += T::kNR) {
    const int64_t nr = std::min<int64_t>(T::kNR, r1 - n0);
    for (int64_t k0 = 0; k0 < w.cols; k0 += kc_step) {
      const int64_t kc = std::min(kc_step, w.cols - k0);
      // the block after this one: the next k-block of this panel, or the first of the next panel
      int64_t pn0 = n0, pnr = 0, pk0 = k0 + kc, pkc = 0;
      if (k0 + kc < w.cols) {
        pnr = nr;
        pkc = std::min(kc_step, w.cols - k0 - kc);
      } else if (n0 + T::kNR < r1) {
        pn0 = n0 + T::kNR;
        pnr = std::min<int64_t>(T::kNR, r1 - pn0);
        pk0 = 0;
        pkc = std::min(kc_step, w.cols);
      }
      // after the call's last block: the first block of the weights the thread reads next, where
      // their row length is known (the experts' next task, whose first block was otherwise read
      // cold): `bench moe --ab` fp8 1.07-1.08 / 1.04-1.05x at 256 / 512 tokens, q8_0 1.05-1.07x
      // (Zen 5; 0.996-1.01x at 64)
      const NextWeights nw = pnr == 0 ? t_next_weights : NextWeights{};
      const int64_t nw_rows = nw.row_bytes > 0 ? std::min<int64_t>(T::kNR, nw.bytes / nw.row_bytes) : 0;
      const int64_t nw_block = std::min<int64_t>(
          nw.row_bytes, static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(kc_step))) + 64);
      if (calls < 2) {
        prefetch_panel_block(w, pn0, pnr, pk0, pkc);
        prefetch_rows_l1(nw.p, nw.row_bytes, 0, nw_rows, nw_block);
      }
      T::pack(w, n0, nr, k0, kc, panel);
      const bool overwrite = !accumulate && k0 == 0;
      // the rows in calls of at most kMR, split evenly (32 rows at kMR = 5: 4, 4, 4, 5, 5, 5, 5, not a
      // last call of 2 whose few sums leave the FMA pipes idle: 1.14 / 1.06 / 1.02x at m = 17 / 24 /
      // 32 from memory, two threads), each preceded by its share of the next block's requests
      int64_t m0 = 0, requested = 0;
      for (int64_t call = 0; call < calls; ++call) {
        const int64_t rows = (x.m - m0) / (calls - call);
        if (calls >= 2) {  // rows [requested, (call + 1) * pnr / calls) of the next block
          const int64_t upto = (call + 1) * pnr / calls;
          prefetch_panel_block(w, pn0 + requested, upto - requested, pk0, pkc);
          requested = upto;
          prefetch_rows_l1(nw.p, nw.row_bytes, call * nw_rows / calls, (call + 1) * nw_rows / calls,
                           nw_block);
        }
        micro_tail<T, T::kMR>(rows, x, m0, k0, kc, panel, y + m0 * ldy + n0, ldy, nr, overwrite);
        m0 += rows;
      }
    }
  }
}

}  // namespace
}  // namespace fathom::matmul_internal
