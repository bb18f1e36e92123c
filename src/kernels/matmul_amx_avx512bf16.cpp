// bf16 and fp8 weights on AMX BF16 tiles (Sapphire Rapids and later Xeons; chosen at run time by
// amx_wanted). Compiled with -mamx-tile -mamx-bf16 -mavx512vbmi on top of the AVX-512 BF16 flags.
//
// Orientation: the tile product is y^T, C[16 weight rows][16 activation rows] += A . B, with
//   A = 16 weight rows x 32 columns as stored (bf16 rows tile-loaded where they lie; fp8 rows
//       converted exactly to bf16 by the VBMI converter into a 4 KiB L1 buffer, one 128-column
//       block = 4 tiles at a time, in the converter's column order), and
//   B = the activations' transposed column pairs (ActView::xt, built once per prepared view), whose
//       rows are k-pairs and columns activation rows, so any 16 consecutive activation rows (an
//       expert's tokens inside the gathered batch) are one strided tile load.
// Neither the weights nor the activations are ever transposed per tile: that is what makes a few
// activation rows (batched decode, 4-16 tokens per expert) cheap on AMX. Per 128-column block the
// block's product is stored from the tile and added to fp32 totals times the block's scale (fp8:
// one scale per 16-row panel and block, the panel lying inside one 128-row scale group), the same
// exact per-block scaling as the AVX-512 kernels; only the fp32 summation order differs. Rows of a
// tail panel past r1 are read from the last valid row and their results dropped; activation
// columns past m compute on whatever the tile holds and are dropped too (columns of C depend only
// on their own column of B).
//
// The tile registers are configured at the start of every call (LDTILECFG) and released at the
// end, so no thread carries tile state between calls (signal frames, other code on the thread).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "kernels/amx_tiles.h"
#include "kernels/matmul_fp8vbmi_conv.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"
#include "tensor/tensor.h"

namespace fathom::matmul_internal {
namespace {

// amx_rows' cache blocking (AmxBlocking, matmul_impl.h): 512 KiB of transposed activations is a
// quarter of a 2 MiB L2 (256-512 KiB measured alike, 1 MiB 5-20% slower); each pass converts the
// weights again, so it takes at least 8 activation tiles; the totals of a pass are 1 KiB per tile
// and panel. Measured on a Xeon (AMX) VM, fp8, 2 threads, against no blocking: [3072 x 2048] at
// m = 1024 1.23x, [7168 x 7168] at m = 512 1.51x, [2048 x 10944] at m = 1024 1.47x
// (docs/PERFORMANCE.md).
AmxBlocking g_blocking;

// Tile roles (all eight tiles 16 rows x 64 bytes, amx::configure_full_tiles): amx_rows on pairs of
// panels (pair_products): 0-1 A (one step of each panel), 4-5 B, 2-3 and 6-7 C; on a
// last single panel (block_all_m): 0-3 A (a block's four 32-column steps), 4-5 B, 6-7 C;
// amx_rows_one_tile (fp8): 0-1 A, 2-3 C, 4-7 B (a block's four steps).

// Grow-only per-thread fp32 totals ([m tiles][16 weight rows][16 activation rows]), as the
// prepared activations' scratch (matmul.cpp): allocated at the largest size seen, once per call.
float* totals_buffer(int64_t floats) {
  thread_local Buffer buffer;
  const size_t bytes = static_cast<size_t>(floats) * 4;
  if (buffer.size() < bytes) buffer = Buffer::allocate(bytes);
  return reinterpret_cast<float*>(buffer.data());
}

// __builtin_prefetch localities (GCC and clang both emit these instructions for them)
inline constexpr int kToL1 = 3;  // prefetcht0
inline constexpr int kToL2 = 2;  // prefetcht1

template <int kLocality = kToL1>
inline void prefetch_rows(const uint8_t* base, int64_t row_bytes, int64_t rows, int64_t bytes) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(base + r * row_bytes + b, 0, kLocality);
}

// The cache lines of the next weight block (up to two 16-row panels' rows), requested a few at a
// time between tile products (issue) instead of in one burst before them: a burst of 64 lines
// fills the core's miss buffers and stalls the products behind it until DRAM answers. Every line a
// row's bytes touch: a row that starts mid line (a mapped checkpoint's tensor, base/mmap.h) spans
// one more than bytes / 64, and the products stalled on the unrequested one (the pair loop read
// weights 56 bytes into a line 1.8x slower at m = 32 before; `bench gemm --weight-offset 56`).
struct LinePrefetch {
  explicit LinePrefetch(int64_t bytes_per_row) : bytes(bytes_per_row) {}
  const uint8_t* rows[32];  // each row's first line
  int8_t lines[32];         // the lines its bytes touch
  int n_rows = 0, n_lines = 0;
  const int64_t bytes;    // per row
  int row = 0, line = 0;  // the next line to request
  void add_rows(const uint8_t* base, int64_t row_bytes, int64_t n) {
    for (int64_t r = 0; r < n && n_rows < 32; ++r) {
      const uint8_t* p = base + r * row_bytes;
      const int64_t into = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) & 63);
      rows[n_rows] = p - into;
      lines[n_rows] = static_cast<int8_t>((into + bytes + 63) / 64);
      n_lines += lines[n_rows++];
    }
  }
  int total() const { return n_lines; }
  inline void issue(int k) {
    for (; k > 0 && row < n_rows; --k) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[row] + 64 * line), _MM_HINT_T0);
      if (++line == lines[row]) {
        line = 0;
        ++row;
      }
    }
  }
  void finish() { issue(total()); }
};

// B tile of k-pairs [kp, kp + 16) and activation rows [i0, i0 + 16).
inline const void* b_tile(const ActView& x, int64_t kp, int64_t i0) {
  return x.xt + kp * x.xt_stride + i0;
}

// GCC's tile intrinsics take tile numbers as literal tokens, so the C tile is a macro argument.
// AMX_ADD_BLOCK: totals += scale * C (stored through ctmp), lanes = activation rows.
#define AMX_ADD_BLOCK(C, TOT, SCALE, CTMP)                                                       \
  do {                                                                                           \
    _tile_stored(C, CTMP, 64);                                                                   \
    const __m512 s_ = _mm512_set1_ps(SCALE);                                                     \
    _Pragma("GCC unroll 16") for (int r_ = 0; r_ < 16; ++r_) _mm512_store_ps(                    \
        (TOT) + 16 * r_,                                                                         \
        _mm512_fmadd_ps(_mm512_load_ps((CTMP) + 16 * r_), s_, _mm512_load_ps((TOT) + 16 * r_))); \
  } while (0)

// AMX_BLOCK_PRODUCT: C = the block's steps (STEPS = 4 for 128 columns, 2 for a 64-column last
// block) against the m tile at activation row I0; A tiles 0..STEPS-1 are loaded.
#define AMX_BLOCK_PRODUCT(C, STEPS, X, KP0, I0)       \
  do {                                                \
    const int64_t bs_ = (X).xt_stride * 4;            \
    _tile_zero(C);                                    \
    _tile_loadd(4, b_tile(X, KP0, I0), bs_);          \
    _tile_dpbf16ps(C, 0, 4);                          \
    _tile_loadd(5, b_tile(X, (KP0) + 16, I0), bs_);   \
    _tile_dpbf16ps(C, 1, 5);                          \
    if constexpr ((STEPS) == 4) {                     \
      _tile_loadd(4, b_tile(X, (KP0) + 32, I0), bs_); \
      _tile_dpbf16ps(C, 2, 4);                        \
      _tile_loadd(5, b_tile(X, (KP0) + 48, I0), bs_); \
      _tile_dpbf16ps(C, 3, 5);                        \
    }                                                 \
  } while (0)

template <int kSteps>
inline void load_a(const void* base, int64_t stride_bytes, int64_t step_bytes) {
  const auto* p = static_cast<const uint8_t*>(base);
  _tile_loadd(0, p, stride_bytes);
  _tile_loadd(1, p + step_bytes, stride_bytes);
  if constexpr (kSteps == 4) {
    _tile_loadd(2, p + 2 * step_bytes, stride_bytes);
    _tile_loadd(3, p + 3 * step_bytes, stride_bytes);
  }
}

// All m tiles against the A tiles of one block; products alternate between C tiles 6 and 7 so
// one is stored while the other computes.
template <int kSteps>
inline void block_all_m(const ActView& x, int64_t kp0, int64_t i_base, int64_t n_mt, float* totals,
                        float scale, float* ctmp) {
  int64_t mt = 0;
  for (; mt + 2 <= n_mt; mt += 2) {
    AMX_BLOCK_PRODUCT(6, kSteps, x, kp0, i_base + 16 * mt);
    AMX_BLOCK_PRODUCT(7, kSteps, x, kp0, i_base + 16 * (mt + 1));
    AMX_ADD_BLOCK(6, totals + 256 * mt, scale, ctmp);
    AMX_ADD_BLOCK(7, totals + 256 * (mt + 1), scale, ctmp + 256);
  }
  if (mt < n_mt) {  // one m tile left: its steps alternate between C tiles (two short chains)
    const int64_t bs = x.xt_stride * 4, i0 = i_base + 16 * mt;
    _tile_zero(6);
    _tile_zero(7);
    _tile_loadd(4, b_tile(x, kp0, i0), bs);
    _tile_dpbf16ps(6, 0, 4);
    _tile_loadd(5, b_tile(x, kp0 + 16, i0), bs);
    _tile_dpbf16ps(7, 1, 5);
    if constexpr (kSteps == 4) {
      _tile_loadd(4, b_tile(x, kp0 + 32, i0), bs);
      _tile_dpbf16ps(6, 2, 4);
      _tile_loadd(5, b_tile(x, kp0 + 48, i0), bs);
      _tile_dpbf16ps(7, 3, 5);
    }
    _tile_stored(6, ctmp, 64);
    _tile_stored(7, ctmp + 256, 64);
    float* tot = totals + 256 * mt;
    const __m512 sv = _mm512_set1_ps(scale);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512 c = _mm512_add_ps(_mm512_load_ps(ctmp + 16 * r), _mm512_load_ps(ctmp + 256 + 16 * r));
      _mm512_store_ps(tot + 16 * r, _mm512_fmadd_ps(c, sv, _mm512_load_ps(tot + 16 * r)));
    }
  }
}

// y[i, n0 + r] (=|+=) totals[i / 16][r][i % 16] for rows r < nr, activation rows i < m: each
// 16 x 16 tile transposed in registers, rows written with a mask of nr lanes.
void write_out(const float* totals, int64_t m, int64_t nr, float* y, int64_t ldy, int64_t n0,
               bool accumulate) {
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    __m512i r[16];
    const float* t = totals + 16 * i0;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = _mm512_load_si512(t + 16 * j);
    transpose16x16_epi32(r);
    const int64_t mi = std::min<int64_t>(16, m - i0);
    for (int64_t i = 0; i < mi; ++i) {
      float* yi = y + (i0 + i) * ldy + n0;
      __m512 v = _mm512_castsi512_ps(r[i]);
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yi));
      _mm512_mask_storeu_ps(yi, mask, v);
    }
  }
}

// Where a block's A tiles are: tile j (32 columns) at p + j * step, rows `stride` bytes apart.
struct ATiles {
  const uint8_t* p;
  int64_t stride, step;
};

// Converts (fp8) or copies (bf16 tail panel) a block's 16 x kc weights into abuf ([step][row][32]),
// or points at the weights themselves (bf16, 16 rows).
template <bool kFp8>
inline ATiles stage_a(const Fp8VbmiConvert& conv, const uint8_t* panel, int64_t row_bytes, int64_t nr,
                      int64_t k0, int64_t kc, uint16_t (*abuf)[16][32]) {
  const ATiles staged{reinterpret_cast<const uint8_t*>(abuf), 64, sizeof(abuf[0])};
  if constexpr (kFp8) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* src = panel + std::min<int64_t>(r, nr - 1) * row_bytes + k0;
      __m512i a, b;
      conv.convert64(src, ~__mmask64{0}, a, b);
      _mm512_store_si512(abuf[0][r], a);
      _mm512_store_si512(abuf[1][r], b);
      if (kc == 128) {
        conv.convert64(src + 64, ~__mmask64{0}, a, b);
        _mm512_store_si512(abuf[2][r], a);
        _mm512_store_si512(abuf[3][r], b);
      }
    }
    return staged;
  } else {
    if (nr == 16) return {panel + 2 * k0, row_bytes, 64};
    for (int r = 0; r < 16; ++r) {
      const uint8_t* src = panel + std::min<int64_t>(r, nr - 1) * row_bytes + 2 * k0;
      for (int s = 0; s < kc / 32; ++s) std::memcpy(abuf[s][r], src + 64 * s, 64);
    }
    return staged;
  }
}

// Two 16-row panels against all m tiles, two m tiles at a time, over `steps` 32-column steps:
// A tiles 0 and 1 (step st of each panel at a.p + st * a.step), B tiles 4 and 5 (that step of two
// m tiles), C tiles 2 and 3 (panel 0) and 6 and 7 (panel 1). Each loaded tile serves two products,
// so a product costs one tile load (half of them from the staged panels in L1) instead of one B
// load from L2 plus a share of the A loads: the B loads from L2 are what bound block_all_m (about
// 50 cycles each on a model-167 Xeon VM). kScaled (fp8, one 128-column block per call): each C
// tile starts at zero and goes into its totals times the block's scale, as block_all_m's do.
// Otherwise (bf16: no block scale) each C tile starts from its totals (zero on a pass's first
// column range) and is stored back once, after all of the range's steps.
#define AMX_PAIR_BEGIN(C, TOT) \
  do {                         \
    if (kScaled || first) {    \
      _tile_zero(C);           \
    } else {                   \
      _tile_loadd(C, TOT, 64); \
    }                          \
  } while (0)
#define AMX_PAIR_END(C, TOT, S, CTMP) \
  do {                                \
    if constexpr (kScaled) {          \
      AMX_ADD_BLOCK(C, TOT, S, CTMP); \
    } else {                          \
      _tile_stored(C, TOT, 64);       \
    }                                 \
  } while (0)
// kSteps > 0 fixes the step count at compile time (fp8 blocks: 4, or 2 for a 64-column last one).
template <bool kScaled, int kSteps = 0>
inline void pair_products(const ActView& x, int64_t kp0, int64_t n_steps, int64_t i_base, int64_t n_mt,
                          const ATiles& a0, const ATiles& a1, float* tot0, float* tot1, float s0, float s1,
                          bool first, float* ctmp, LinePrefetch* pf = nullptr) {
  const int64_t bs = x.xt_stride * 4, steps = kSteps > 0 ? kSteps : n_steps;
  // the prefetch's lines spread evenly over the steps of all (n_mt + 1) / 2 m-tile iterations
  const int64_t all_steps = steps * ((n_mt + 1) / 2);
  const int per_step = pf != nullptr ? static_cast<int>((pf->total() + all_steps - 1) / all_steps) : 0;
  int64_t mt = 0;
  for (; mt + 2 <= n_mt; mt += 2) {
    const int64_t i0 = i_base + 16 * mt;
    AMX_PAIR_BEGIN(2, tot0 + 256 * mt);
    AMX_PAIR_BEGIN(3, tot0 + 256 * (mt + 1));
    AMX_PAIR_BEGIN(6, tot1 + 256 * mt);
    AMX_PAIR_BEGIN(7, tot1 + 256 * (mt + 1));
#pragma GCC unroll 4
    for (int64_t st = 0; st < steps; ++st) {
      if (pf != nullptr) pf->issue(per_step);
      _tile_loadd(0, a0.p + st * a0.step, a0.stride);
      _tile_loadd(4, b_tile(x, kp0 + 16 * st, i0), bs);
      _tile_dpbf16ps(2, 0, 4);
      _tile_loadd(1, a1.p + st * a1.step, a1.stride);
      _tile_dpbf16ps(6, 1, 4);
      _tile_loadd(5, b_tile(x, kp0 + 16 * st, i0 + 16), bs);
      _tile_dpbf16ps(3, 0, 5);
      _tile_dpbf16ps(7, 1, 5);
    }
    AMX_PAIR_END(2, tot0 + 256 * mt, s0, ctmp);
    AMX_PAIR_END(3, tot0 + 256 * (mt + 1), s0, ctmp + 256);
    AMX_PAIR_END(6, tot1 + 256 * mt, s1, ctmp);
    AMX_PAIR_END(7, tot1 + 256 * (mt + 1), s1, ctmp + 256);
  }
  if (mt < n_mt) {  // one m tile left: both panels against it
    const int64_t i0 = i_base + 16 * mt;
    AMX_PAIR_BEGIN(2, tot0 + 256 * mt);
    AMX_PAIR_BEGIN(6, tot1 + 256 * mt);
#pragma GCC unroll 4
    for (int64_t st = 0; st < steps; ++st) {
      if (pf != nullptr) pf->issue(per_step);
      _tile_loadd(4, b_tile(x, kp0 + 16 * st, i0), bs);
      _tile_loadd(0, a0.p + st * a0.step, a0.stride);
      _tile_dpbf16ps(2, 0, 4);
      _tile_loadd(1, a1.p + st * a1.step, a1.stride);
      _tile_dpbf16ps(6, 1, 4);
    }
    AMX_PAIR_END(2, tot0 + 256 * mt, s0, ctmp);
    AMX_PAIR_END(6, tot1 + 256 * mt, s1, ctmp + 256);
  }
}
#undef AMX_PAIR_END
#undef AMX_PAIR_BEGIN

// Where block `blk` of the panel at n0 starts, and how many of its rows there are (blocks past the
// panel's end continue into the next panel, whose rows are the next 16 up to r1; 0 rows past r1).
inline const uint8_t* block_rows(const uint8_t* wbase, int64_t row_bytes, int64_t elem_bytes, int64_t nb,
                                 int64_t n0, int64_t r1, int64_t blk, int64_t* rows) {
  const int64_t n = n0 + 16 * (blk / nb);
  *rows = n < r1 ? std::min<int64_t>(16, r1 - n) : 0;
  return wbase + n * row_bytes + elem_bytes * 128 * (blk % nb);
}

// Adds that block's rows to pf.
inline void add_block(LinePrefetch& pf, const uint8_t* wbase, int64_t row_bytes, int64_t elem_bytes,
                      int64_t nb, int64_t n0, int64_t r1, int64_t blk) {
  int64_t rows;
  const uint8_t* p = block_rows(wbase, row_bytes, elem_bytes, nb, n0, r1, blk, &rows);
  pf.add_rows(p, row_bytes, rows);
}

// Prefetches that block at once.
inline void prefetch_block(const uint8_t* wbase, int64_t row_bytes, int64_t elem_bytes, int64_t nb,
                           int64_t n0, int64_t r1, int64_t blk) {
  int64_t rows;
  const uint8_t* p = block_rows(wbase, row_bytes, elem_bytes, nb, n0, r1, blk, &rows);
  prefetch_rows(p, row_bytes, rows, 128 * elem_bytes);
}

inline void load_a_kc(const ATiles& a, int64_t kc) {
  if (kc == 128) {
    load_a<4>(a.p, a.stride, a.step);
  } else {
    load_a<2>(a.p, a.stride, a.step);
  }
}

// fp8 weights at m <= 16 (decode): one activation tile. The block loop is outside the panel loop,
// so a block's four B tiles (tiles 4-7) are loaded once and serve every 16-row panel of [r0, r1);
// per panel and block: the block's weights converted into abuf, four A loads alternating
// between tiles 0 and 1, four products into C (tile 2 or 3, alternating by panel), and that
// panel's previous product scaled into its totals after the next panel's products are issued.
// The totals of all panels live in a per-thread buffer ([panel][16 rows][16 columns]).
// Against the panel-outer loop of amx_rows (which reloads the four B tiles for every panel), one
// thread cache-resident: 12.5-13.2 against 9.5-9.8 GB/s of fp8 weights; two threads from DRAM
// 1.08-1.15x (same-process alternation, [1408 x 2048], m = 8 and 16). Tried and no faster:
// staging the next panel between this panel's products and the previous panel's scaling;
// prefetching the panel three ahead in sweep order instead of this panel's next block (5-8%
// slower from DRAM); before this loop order, converting the next block while the current block's
// products run, and four 16-row panels per B tile load.
// bf16 weights take amx_rows at every m >= amx_min_m instead: their A tiles load the rows where they
// lie, so there is no conversion to share, and this loop's sweep, 256 bytes of every row of the
// task in turn, leaves the tiles waiting on memory; amx_rows streams two panels at a time along
// whole rows. Two threads from memory (`bench gemm --dtype bf16`, model-167 Xeon VM, 2026-12-06),
// fraction of the read bandwidth here / there: [102400 x 2048] (a vocabulary head) m = 4 0.46-0.47
// / 0.99-1.01, m = 16 0.45-0.46 / 0.94-0.95; [2048 x 2048] m = 16 0.62 / 0.90. For fp8 rows, whose
// conversion is the bound, it is the other way round (m = 16 0.55-0.59 here, 0.50 there).
#define AMX_ONE_TILE_PRODUCTS(C, STEPS, A)              \
  do {                                                  \
    _tile_zero(C);                                      \
    _tile_loadd(0, (A).p, (A).stride);                  \
    _tile_dpbf16ps(C, 0, 4);                            \
    _tile_loadd(1, (A).p + (A).step, (A).stride);       \
    _tile_dpbf16ps(C, 1, 5);                            \
    if ((STEPS) == 4) {                                 \
      _tile_loadd(0, (A).p + 2 * (A).step, (A).stride); \
      _tile_dpbf16ps(C, 0, 6);                          \
      _tile_loadd(1, (A).p + 3 * (A).step, (A).stride); \
      _tile_dpbf16ps(C, 1, 7);                          \
    }                                                   \
  } while (0)

// amx_rows_one_tile requests each panel's rows of the block this far ahead into L2 (`prefetcht1`)
// besides the next block's into L1: a task's rows are read 128 bytes at a time from every row in
// turn, more streams than the hardware prefetcher follows, and one core's L1 misses alone do not
// cover the memory latency. Two threads, [1408 x 2048] fp8 from memory (`bench gemm`, model-167
// Xeon VM, 2026-12-06), fraction of the read bandwidth without / with (1, 2, 3 blocks ahead):
// m = 4 0.60 / 0.64, 0.70-0.76, 0.59-0.71; m = 16 0.49-0.52 / 0.51-0.52, 0.61-0.63, 0.57-0.59.
inline constexpr int64_t kOneTileFarBlocks = 2;

void amx_rows_one_tile(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate,
                       int64_t r0, int64_t r1) {
  const int64_t K = w.cols, nb = (K + 127) / 128, n_panels = (r1 - r0 + 15) / 16;
  const int64_t row_bytes = K, bs = x.xt_stride * 4;
  const auto* wbase = static_cast<const uint8_t*>(w.data);
  float* totals = totals_buffer(256 * n_panels);
  std::memset(totals, 0, static_cast<size_t>(256 * n_panels) * 4);
  alignas(64) uint16_t abuf[2][4][16][32];
  alignas(64) float ctmp[2][256];
  const Fp8VbmiConvert conv;
  amx::configure_full_tiles();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t k0 = 128 * b, kc = std::min<int64_t>(128, K - k0), kp0 = k0 / 2;
    _tile_loadd(4, b_tile(x, kp0, 0), bs);
    _tile_loadd(5, b_tile(x, kp0 + 16, 0), bs);
    if (kc == 128) {
      _tile_loadd(6, b_tile(x, kp0 + 32, 0), bs);
      _tile_loadd(7, b_tile(x, kp0 + 48, 0), bs);
    }
    float prev_scale = 0.0f;
    for (int64_t p = 0; p < n_panels; ++p) {
      const int64_t n0 = r0 + 16 * p, nr = std::min<int64_t>(16, r1 - n0);
      const uint8_t* panel = wbase + n0 * row_bytes;
      // this panel's rows of the next block into L1, where the staging reads them with vector
      // loads (or, at the last block, nothing: the task ends); the same lines issued through a
      // LinePrefetch made this loop 1.6x slower at m = 8-16 (not understood; measured 2026-12-06),
      // so it keeps the plain loop. Requested into L2 instead: 0.65-0.66 against 0.67-0.71 at m = 4.
      if (b + 1 < nb)
        prefetch_rows<kToL1>(panel + k0 + 128, row_bytes, nr, std::min<int64_t>(128, K - k0 - 128));
      // and the block kOneTileFarBlocks ahead into L2 (see there)
      if (b + kOneTileFarBlocks < nb)
        prefetch_rows<kToL2>(panel + k0 + 128 * kOneTileFarBlocks, row_bytes, nr,
                             std::min<int64_t>(128, K - k0 - 128 * kOneTileFarBlocks));
      const int cur = static_cast<int>(p & 1);
      const ATiles a = stage_a<true>(conv, panel, row_bytes, nr, k0, kc, abuf[cur]);
      const float scale = fp8_scale_row(w, n0)[b];
      if (cur == 0) {
        AMX_ONE_TILE_PRODUCTS(2, kc == 128 ? 4 : 2, a);
        if (p > 0) AMX_ADD_BLOCK(3, totals + 256 * (p - 1), prev_scale, ctmp[1]);
      } else {
        AMX_ONE_TILE_PRODUCTS(3, kc == 128 ? 4 : 2, a);
        AMX_ADD_BLOCK(2, totals + 256 * (p - 1), prev_scale, ctmp[0]);
      }
      prev_scale = scale;
    }
    if ((n_panels - 1) % 2 == 0) {
      AMX_ADD_BLOCK(2, totals + 256 * (n_panels - 1), prev_scale, ctmp[0]);
    } else {
      AMX_ADD_BLOCK(3, totals + 256 * (n_panels - 1), prev_scale, ctmp[1]);
    }
  }
  _tile_release();
  for (int64_t p = 0; p < n_panels; ++p) {
    const int64_t n0 = r0 + 16 * p;
    write_out(totals + 256 * p, x.m, std::min<int64_t>(16, r1 - n0), y, ldy, n0, accumulate);
  }
}

// fp8 weights at m > 16, bf16 from m = 2 (amx_min_m): weight panels two at a time against the activation
// tiles two at a time (2 x 2 C tiles; one activation tile at m <= 16), so each tile load serves two
// products (pair_products): bf16 weights accumulate a whole k range in the C tiles, fp8 blocks are
// staged per 128 columns and scaled into the totals per block. A last single panel takes
// block_all_m. Against one panel at a time (block_all_m only), two threads, [1408 x 2048],
// alternated runs on a model-167 Xeon VM: bf16 1.27-1.43x at m = 24, 1.29-1.30x at 48, 1.19-1.21x
// at 512; fp8 1.21x at 24, 1.15-1.19x at 48, 1.07-1.09x at 96-512 (docs/PERFORMANCE.md).
template <bool kFp8>
void amx_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
              int64_t r1) {
  const int64_t K = w.cols, m = x.m, n_mt = (m + 15) / 16;
  const int64_t elem = kFp8 ? 1 : 2, row_bytes = elem * K;
  const auto* wbase = static_cast<const uint8_t*>(w.data);
  // Cache blocking: a pass takes chunk_mt activation tiles over a k range of kr columns, whose
  // transposed activations (32 bytes per column and tile) stay in L2 while up to group_panels
  // weight panels run against them; totals persist across the k ranges of a pass.
  const AmxBlocking bl = g_blocking;
  int64_t chunk_mt = n_mt, kr = K;
  if (K * 32 * n_mt > bl.chunk_bytes) {
    chunk_mt = std::clamp<int64_t>(bl.chunk_bytes / (K * 32), std::min(bl.min_tiles, n_mt), n_mt);
    kr = std::max<int64_t>(128, bl.chunk_bytes / (chunk_mt * 32) / 128 * 128);
  }
  const int64_t group_rows = 16 * bl.group_panels;
  float* totals = totals_buffer(256 * chunk_mt * std::min(bl.group_panels, (r1 - r0 + 15) / 16));
  const int64_t nb = (K + 127) / 128;
  alignas(64) uint16_t abuf[4][16][32];  // A tiles of one block: [step][weight row][32 columns]
  alignas(64) uint16_t abuf1[4][16][32];  // the second panel's (pair_products)
  alignas(64) float ctmp[2][256];
  const Fp8VbmiConvert conv;
  amx::configure_full_tiles();
  for (int64_t g0 = r0; g0 < r1; g0 += group_rows) {
    const int64_t g1 = std::min(r1, g0 + group_rows);
    for (int64_t mt0 = 0; mt0 < n_mt; mt0 += chunk_mt) {
      const int64_t c_mt = std::min(chunk_mt, n_mt - mt0), i0 = 16 * mt0;
      std::memset(totals, 0, static_cast<size_t>(256 * c_mt * ((g1 - g0 + 15) / 16)) * 4);
      for (int64_t kr0 = 0; kr0 < K; kr0 += kr) {
        const int64_t kr1 = std::min(K, kr0 + kr);
        int64_t n0 = g0;
        for (; n0 + 16 < g1; n0 += 32) {  // two panels at a time (pair_products)
          float* tot0 = totals + 256 * c_mt * ((n0 - g0) / 16);
          float* tot1 = tot0 + 256 * c_mt;
          const uint8_t* panel0 = wbase + n0 * row_bytes;
          const uint8_t* panel1 = panel0 + 16 * row_bytes;
          if (!kFp8 && n0 + 32 <= g1) {  // bf16 rows where they lie, the whole column range at once
            pair_products<false>(
                x, kr0 / 2, (kr1 - kr0) / 32, i0, c_mt, ATiles{panel0 + 2 * kr0, row_bytes, 64},
                ATiles{panel1 + 2 * kr0, row_bytes, 64}, tot0, tot1, 1.0f, 1.0f, kr0 == 0, ctmp[0]);
            continue;
          }
          const int64_t nr1 = std::min<int64_t>(16, g1 - n0 - 16);
          const float* srow0 = kFp8 ? fp8_scale_row(w, n0) : nullptr;
          const float* srow1 = kFp8 ? fp8_scale_row(w, n0 + 16) : nullptr;
          for (int64_t k0 = kr0; k0 < kr1; k0 += 128) {
            const int64_t kc = std::min<int64_t>(128, K - k0), blk = k0 / 128 + 1;
            // the next block of both panels, or the first of the next pair's, requested between
            // this block's products (pair_products)
            LinePrefetch pf(128 * elem);
            if (blk < nb) {
              add_block(pf, wbase, row_bytes, elem, nb, n0, g1, blk);
              add_block(pf, wbase, row_bytes, elem, nb, n0 + 16, g1, blk);
            } else {
              add_block(pf, wbase, row_bytes, elem, nb, n0 + 32, g1, 0);
              add_block(pf, wbase, row_bytes, elem, nb, n0 + 48, g1, 0);
            }
            const ATiles a0 = stage_a<kFp8>(conv, panel0, row_bytes, 16, k0, kc, abuf);
            const ATiles a1 = stage_a<kFp8>(conv, panel1, row_bytes, nr1, k0, kc, abuf1);
            const float s0 = kFp8 ? srow0[k0 / 128] : 1.0f, s1 = kFp8 ? srow1[k0 / 128] : 1.0f;
            if (kc == 128) {
              pair_products<true, 4>(x, k0 / 2, 4, i0, c_mt, a0, a1, tot0, tot1, s0, s1, true, ctmp[0], &pf);
            } else {
              pair_products<true, 2>(x, k0 / 2, 2, i0, c_mt, a0, a1, tot0, tot1, s0, s1, true, ctmp[0], &pf);
            }
            pf.finish();
          }
        }
        for (; n0 < g1; n0 += 16) {
          const int64_t nr = std::min<int64_t>(16, g1 - n0);
          float* tot = totals + 256 * c_mt * ((n0 - g0) / 16);
          const float* srow = kFp8 ? fp8_scale_row(w, n0) : nullptr;
          const uint8_t* panel = wbase + n0 * row_bytes;
          for (int64_t k0 = kr0; k0 < kr1; k0 += 128) {
            const int64_t kc = std::min<int64_t>(128, K - k0);
            // the next block of this panel, or the first of the next one
            prefetch_block(wbase, row_bytes, elem, nb, n0, g1, k0 / 128 + 1);
            const float scale = kFp8 ? srow[k0 / 128] : 1.0f;
            load_a_kc(stage_a<kFp8>(conv, panel, row_bytes, nr, k0, kc, abuf), kc);
            if (kc == 128) {
              block_all_m<4>(x, k0 / 2, i0, c_mt, tot, scale, ctmp[0]);
            } else {
              block_all_m<2>(x, k0 / 2, i0, c_mt, tot, scale, ctmp[0]);
            }
          }
        }
      }
      const int64_t rows = std::min<int64_t>(16 * c_mt, m - i0);
      for (int64_t n0 = g0; n0 < g1; n0 += 16) {
        write_out(totals + 256 * c_mt * ((n0 - g0) / 16), rows, std::min<int64_t>(16, g1 - n0), y + i0 * ldy,
                  ldy, n0, accumulate);
      }
    }
  }
  _tile_release();
}

}  // namespace

void set_amx_blocking(const AmxBlocking& b) {
  CHECK(b.chunk_bytes > 0 && b.min_tiles >= 1 && b.group_panels >= 1);
  g_blocking = b;
}

bool amx_rows_ok(const WeightView& w, const ActView& x, int64_t r0) {
  // xt is also built for the lanes kernels on CPUs without (usable) AMX
  if (x.xt == nullptr || !amx_bf16_usable()) return false;
  // w must be what the view was prepared for (a mismatch is a caller bug, not a fallback)
  CHECK(w.cols == x.k && (w.dtype == DType::kBF16 || (w.dtype == DType::kF8E4M3 && x.bf16_perm64)));
  return x.m >= amx_min_m(w.dtype) && r0 % 16 == 0;
}

void rows_amx_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                         int64_t r0, int64_t r1) {
  CHECK(amx_rows_ok(w, x, r0));
  const bool fp8 = w.dtype == DType::kF8E4M3;
  if (fp8 && x.m <= 16) {
    amx_rows_one_tile(w, x, y, y_stride, accumulate, r0, r1);
  } else if (fp8) {
    amx_rows<true>(w, x, y, y_stride, accumulate, r0, r1);
  } else {
    amx_rows<false>(w, x, y, y_stride, accumulate, r0, r1);
  }
}

void act_transpose_pairs_avx512(const uint16_t* rows, int64_t m, int64_t stride, int64_t kp0, int64_t kp1,
                                uint32_t* xt, int64_t xt_stride) {
  const auto* src = reinterpret_cast<const uint32_t*>(rows);
  const int64_t ws = stride / 2;  // words per row
  for (int64_t kp = kp0; kp < kp1; kp += 16) {
    const int64_t nk = std::min<int64_t>(16, kp1 - kp);
    const __mmask16 kmask = static_cast<__mmask16>((1u << nk) - 1);
    int64_t i = 0;
    for (; i + 16 <= m; i += 16) {  // a 16 x 16 word transpose
      __m512i r[16];
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) r[j] = _mm512_maskz_loadu_epi32(kmask, src + (i + j) * ws + kp);
      transpose16x16_epi32(r);
      for (int64_t c = 0; c < nk; ++c) _mm512_storeu_si512(xt + (kp + c) * xt_stride + i, r[c]);
    }
    for (int64_t c = 0; c < nk; ++c) {
      uint32_t* out = xt + (kp + c) * xt_stride;
      for (int64_t ii = i; ii < m; ++ii) out[ii] = src[ii * ws + kp + c];
      for (int64_t ii = m; ii < xt_stride; ++ii) out[ii] = 0;
    }
  }
}

}  // namespace fathom::matmul_internal
