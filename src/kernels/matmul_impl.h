// Internals shared by matmul.cpp, the per-ISA kernel files and the grouped-expert code: the
// prepared-activation view, the row-range kernel signature and the per-ISA entry points.
// Not a public header: other components include kernels/matmul.h only.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "base/cpu.h"
#include "kernels/matmul.h"

// Full unrolling of the small fixed loops (rows x activation rows) of the hot kernels, so their
// accumulator arrays live in registers.
#define FATHOM_UNROLL _Pragma("GCC unroll 16")

namespace fathom::matmul_internal {

// How the activations of one call are represented, decided by the weight dtype and the SIMD level.
enum class ActKind : uint8_t {
  kF32,   // fp32 rows (x itself for f32/f16 weights; a bf16-rounded copy for bf16/fp8 without vdpbf16ps)
  kBF16,  // bf16 rows for vdpbf16ps, zero-padded to `stride` (a multiple of kActPad)
  kQ8,    // int8 rows + fp32 scale per 32-block + correction terms, zero-padded to `stride`
};

constexpr int64_t kActPad = 64;  // padded row length granularity for kBF16 / kQ8 rows
constexpr int kQBlock = 32;      // activation quantisation block (Q8_0)

// Activations prepared once per call: x[m, k] in the arithmetic of the weight's dtype.
struct ActView {
  ActKind kind = ActKind::kF32;
  int64_t m = 0;
  int64_t k = 0;       // logical columns
  int64_t stride = 0;  // elements between rows (floats, bf16 values or int8 values)
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  // kBF16 for fp8 weights on VBMI CPUs: within each 64-column group the values are stored in the
  // order the vpermi2b e4m3 converter produces: x[16L + j] at 8L + j and x[16L + 8 + j] at
  // 32 + 8L + j (L < 4, j < 8).
  bool bf16_perm64 = false;
  const int8_t* q = nullptr;             // [m, stride]
  const float* qd = nullptr;             // [m, stride / 32] scale d = amax / 127
  const int32_t* qcorr_block = nullptr;  // [m, stride / 32] -128 * sum(q over the block)
  const int32_t* qcorr_lane = nullptr;   // [m, stride / 4]  -128 * sum(q over each group of 4)
  const float* qd_lane = nullptr;        // [m, stride / 4]  d of each group's block (AVX-512 only)
  // AMX (matmul_amx_avx512bf16.cpp), and the lanes kernels on CPUs without AMX (fp8_lanes_wanted,
  // bf16_lanes_wanted): the kBF16 rows as 32-bit column pairs, transposed:
  // xt[kp * xt_stride + i] = columns (2kp, 2kp+1), in the row's stored order, of row i. The
  // xt_stride - m columns past the last row are zero, so a 16-column tile that starts at any row
  // stays inside, and xt_stride is a multiple of 16 (each k-pair's row starts on a cache line). Null until
  // act_build_xt fills it (only where those kernels will run).
  const uint32_t* xt = nullptr;
  int64_t xt_stride = 0;
  uint32_t* xt_space = nullptr;  // where act_build_xt writes (whole views from layout_activations)
  // fp8 weights in fp16 arithmetic (fp8_use_f16, matmul_fp8f16_avx512fp16.cpp): the kBF16 rows in
  // natural order as fp16, each times a power of two 2^e that puts its largest magnitude in
  // [2^9, 2^10) (exact: bf16 values fit fp16's mantissa), zero-padded to `stride`; f16_unscale[i] =
  // 2^(8 - e) turns row i's sums back (the 8: the kernel reads e4m3 codes as fp16 times 2^-8). Null
  // unless filled (prepare_activations with build_f16, or copies from a filled view).
  const uint16_t* f16 = nullptr;       // [m, stride]
  const float* f16_unscale = nullptr;  // [m]
  uint16_t* f16_space = nullptr;       // where they go (whole views from layout_activations)
  float* f16_unscale_space = nullptr;
};

// Whether fp8 weights use the AVX-512 VBMI converter (CPU support, unless overridden for tests:
// override < 0 restores detection, 0 disables, 1 enables where supported).
bool fp8_use_vbmi(SimdLevel level);
void set_fp8_vbmi_override(int override);
// Whether the row-wise kernels read a call's weights in address order (kStreamL1Bytes below): one
// weight row at a time for bf16 and fp8 at one activation row (bf16_stream_matvec,
// fp8_stream_matvec) and Q8_0 / Q4_0 at one to three (stream_matvec in matmul_int8_avx512.cpp), and
// the requests for the rows ahead as one run in the fp8 pair kernels (fp8_mv_rows' pair_kernel) and
// the fp8 lanes kernel at up to 16 rows (fp8_lanes_rows). On AMD CPUs, where it was measured (Zen
// 5), unless overridden for tests and benchmarks like fp8_use_vbmi; elsewhere the orders tuned on
// the Xeons (four rows side by side, requests at the columns being read, which the model-167 Xeon
// ran 1.04x faster than address order).
bool address_order_wanted();
void set_address_order_override(int override);
// Whether fp8 weights at 2..kFp8F16MaxM activation rows use fp16 arithmetic (CPU support: AVX-512
// FP16 and the VBMI converter, unless overridden for tests and benchmarks like fp8_use_vbmi;
// FATHOM_FP8_F16=0 turns it off for the process). Buffers are sized by fp8_f16_available, which
// ignores the override.
bool fp8_use_f16(SimdLevel level);
bool fp8_f16_available();
void set_fp8_f16_override(int override);
// The fp16 kernels' range of activation rows, from 2 to this many: the pair kernel at 2-4, the
// single-row kernel at 5-7. Two threads, [1408 x 2048] and [2048 x 1408] from memory (`bench gemm`,
// model-167 Xeon VM): at one row the pair kernel read 0.77-0.81 of the bandwidth against the m = 1
// kernel's 0.82-0.91; at 5 / 6 / 7 rows the single-row kernel 0.62-0.67 / 0.60-0.61 / 0.55-0.62
// against the tiles' 0.55-0.59 / 0.54-0.60 / 0.54-0.59, at 8 rows 0.53-0.58 against 0.53-0.62, so
// from 8 rows on the tiles take over.
inline constexpr int64_t kFp8F16MaxM = 7;

// Which activation form a weight dtype uses at a SIMD level.
ActKind act_kind_for(DType dtype, SimdLevel level);

// Bytes of scratch prepare_activations needs for [m, k] in `kind` (0 for kF32 from f32/f16).
uint64_t act_scratch_bytes(ActKind kind, DType dtype, int64_t m, int64_t k);

// Fills `scratch` (act_scratch_bytes, 64-byte aligned) and returns the view. Rows are split over
// the pool. x_stride in elements.
// build_xt false skips the AMX transposed pairs (a view that is only copied from, say).
// build_f16: also the fp16 rows (ActView::f16) where fp8_use_f16 holds for fp8 weights; by default
// when m itself is in the fp16 kernel's range (the experts pass it for rows they gather).
ActView prepare_activations(DType dtype, SimdLevel level, const float* x, int64_t m, int64_t k,
                            int64_t x_stride, void* scratch, ThreadPool& pool, bool build_xt = true,
                            int build_f16 = -1);

// The buffers of a prepared-activation view for m rows of k columns placed in `scratch`
// (act_scratch_bytes for kind and a dtype that needs a copy; kF32 rows are plain fp32 with stride k).
ActView layout_activations(ActKind kind, bool perm64, int64_t m, int64_t k, void* scratch);
// Bytes layout_activations may need for any kind.
uint64_t act_scratch_bytes_any(int64_t m, int64_t k);
// Whether matmuls of a dtype at a level run on AMX tiles for m activation rows of k columns
// (amx_bf16_usable, bf16 weights or fp8 with the VBMI converter, k a multiple of 64, m >=
// amx_min_m). bf16 rows are tile-loaded where they lie and run the tiles from m = 2: two threads
// from memory, [2048 x 1408] at m = 2-3 0.95-0.98 of the bandwidth against 0.80-0.83 row-wise, the
// other V2-Lite shapes 0.99-1.11x. fp8 rows must be converted for the tiles, which at m = 2-3 costs
// more than the row-wise kernels' dot products (PERFORMANCE.md, "Far L2 requests in the fp8 loops").
inline constexpr int64_t amx_min_m(DType dtype) {
  return dtype == DType::kBF16 ? 2 : 4;
}
bool amx_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k);
// Fills a's transposed pairs (ActView::xt) over the pool when amx_wanted, or (with `lanes`)
// fp8_lanes_wanted or bf16_lanes_wanted, for its rows; a no-op for views without xt_space (not
// kBF16) or when no such kernel will run. The experts' gathered views pass lanes = false: their
// row subsets would take the lanes kernels or not by the whole batch's count, so an expert's
// results would depend on which other tokens share the step (or the expert-parallel rank).
void act_build_xt(ActView& a, DType dtype, SimdLevel level, ThreadPool& pool, bool lanes = true);
// Rows [begin, begin + count) of a view (pointers advanced; same stride).
ActView act_rows(const ActView& a, int64_t begin, int64_t count);
// Copies row `src_row` of src into row `dst_row` of dst (same kind and k; dst from layout_activations),
// with its fp16 form when both views have one (see act_enable_f16).
void copy_act_row(const ActView& src, int64_t src_row, const ActView& dst, int64_t dst_row);
// Marks a laid-out view's fp16 rows as present (its f16_space filled by copies); false when it has
// no room for them.
bool act_enable_f16(ActView& a);
// Whether weights of a dtype with k columns can take the fp16 kernel at a level (fp8, whole
// 128-column blocks, fp8_use_f16), and whether they do for m activation rows (m in its range).
bool fp8_f16_applies(DType dtype, SimdLevel level, int64_t k);
bool fp8_f16_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k);
// fp8 weights at 12-32 or 62-64 activation rows (fp8_lanes_m) on CPUs with the VBMI converter and no
// usable AMX, whole 128-column blocks: the kernel with the activation rows across the lanes
// (fp8_lanes_rows in matmul_fp8vbmi_avx512bf16.cpp), over the transposed pairs (ActView::xt,
// which act_build_xt then fills). Against the pair kernels (up to 16 rows) or the GEMM, two threads,
// [3072 x 2048] from memory (`bench gemm --ab`, Zen 5): 1.03-1.16x at 12-15 rows, 1.11-1.31x at
// 16-32, 0.74-1.03x at 40-60 (lanes left empty, or a second pass), 1.04-1.11x at 62-64.
inline bool fp8_lanes_m(int64_t m) {
  return (m >= 12 && m <= 32) || (m >= 62 && m <= 64);
}
bool fp8_lanes_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k);
// bf16 weights at 12-32 activation rows (bf16_lanes_m) on AVX-512 BF16 CPUs without usable AMX, k a
// multiple of 32: the same orientation with the weight pairs broadcast straight from the rows
// (bf16_lanes_rows in matmul_avx512bf16.cpp): [102400 x 2048] 1.27-1.45x at 12-16 rows, 1.20-1.31x
// at 24-32; at 64 rows level with the GEMM (0.97-1.07x).
inline bool bf16_lanes_m(int64_t m) {
  return m >= 12 && m <= 32;
}
bool bf16_lanes_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k);
// Whether a call over the prepared x takes the fp16 kernel (x has fp16 rows, m in its range,
// whole 128-column blocks).
inline bool fp8_f16_rows_ok(const WeightView& w, const ActView& x) {
  return x.f16 != nullptr && x.m >= 2 && x.m <= kFp8F16MaxM && w.cols % 128 == 0;
}

// Quantises one row (k a multiple of 32) the way every path does: per 32-block d = amax/127,
// q = round-half-even(x * (127/amax)), plus the two correction sums. Scalar; the reference.
void quantize_act_row_ref(const float* x, int64_t k, int8_t* q, float* d, int32_t* corr_block,
                          int32_t* corr_lane);

// Computes output columns (weight rows) [r0, r1) for every row of x:
//   y[i * y_stride + r] (=|+=) sum_c x[i, c] * W[r, c]   for i < x.m, r in [r0, r1).
// `accumulate` false overwrites. Chooses matrix-vector or GEMM form by x.m internally.
using RowsKernel = void (*)(const WeightView& w, const ActView& x, float* y, int64_t y_stride,
                            bool accumulate, int64_t r0, int64_t r1);

// The kernel for a dtype at a level (nullptr when unsupported). Levels fall back: a level without
// a kernel for the dtype uses the next lower one.
RowsKernel rows_kernel_for(DType dtype, SimdLevel level);

// Granularity (in weight rows) a caller should split [0, rows) at for this kernel and m.
int64_t rows_granularity(DType dtype, SimdLevel level, int64_t m);

// The largest m that takes the matrix-vector form at a level: weight rows are streamed once and
// dotted with the activation rows in groups of up to 4 (up to 16 rows on AVX-512 for bf16 and fp8
// and 9 for int8, where that beats converting a GEMM panel for a few rows).
int64_t matvec_max_m(DType dtype, SimdLevel level);
// fp8 weights on AVX-512 BF16: the row-wise kernels run up to this m (matmul_fp8_impl.h).
inline constexpr int64_t kFp8MatvecMaxM = 16;

// Requests [p, p + bytes) into L1 at once. The row-wise kernels prefetch a group of rows ahead of
// the rows they compute, so a range's first group would otherwise be read at DRAM latency, one
// cache line per row per step; every task starts such a range (same-process alternating decode
// steps, V2-Lite FP8: 3.8% for the FP8 kernels' first 4 rows, 2.2% for BF16's).
inline void prefetch_range_l1(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// Per-ISA entry points (nullptr-free: each exists for the dtypes its level handles).
void rows_scalar(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                 int64_t r0, int64_t r1);
void rows_f32family_avx2(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                         int64_t r0, int64_t r1);
void rows_int8_avx2(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                    int64_t r0, int64_t r1);
void rows_f32family_avx512(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                           int64_t r0, int64_t r1);
void rows_int8_avx512(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                      int64_t r0, int64_t r1);
void rows_bf16_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                          int64_t r0, int64_t r1);
void rows_fp8_vbmi_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride,
                              bool accumulate, int64_t r0, int64_t r1);
// fp8 weights in fp16 arithmetic (fp8_f16_rows_ok, r0 even): at 2-4 activation rows computes the
// whole pairs of [r0, r1) and returns where they end (r1, or r1 - 1 for an odd count, which the
// caller computes); at 5-7 rows computes every row and returns r1.
int64_t rows_fp8_f16_avx512fp16(const WeightView& w, const ActView& x, float* y, int64_t y_stride,
                                bool accumulate, int64_t r0, int64_t r1);
// AMX BF16 tiles for bf16 and fp8 (VBMI order) weights. A view has xt only where amx_wanted held
// for its dtype, converter and k; amx_rows_ok adds what each call decides: the row subview's m
// (an expert's tokens) and a 16-row aligned r0.
bool amx_rows_ok(const WeightView& w, const ActView& x, int64_t r0);
void rows_amx_avx512bf16(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                         int64_t r0, int64_t r1);
// Cache blocking of the tiles' m > 16 path: a pass keeps up to chunk_bytes of transposed
// activations (at least min_tiles 16-row tiles, over as many columns as fit) in L2 while up to
// group_panels 16-row weight panels run against them. Defaults 512 KiB, 8, 16; tests shrink them so
// small shapes take several passes and column ranges.
struct AmxBlocking {
  int64_t chunk_bytes = 512 << 10;
  int64_t min_tiles = 8;
  int64_t group_panels = 16;
};
void set_amx_blocking(const AmxBlocking& b);
// xt[kp * xt_stride + i] = pair kp of row i for kp in [kp0, kp1), rows [0, m); AVX-512.
void act_transpose_pairs_avx512(const uint16_t* rows, int64_t m, int64_t stride, int64_t kp0, int64_t kp1,
                                uint32_t* xt, int64_t xt_stride);

// Activation preparation leaves (rows [i0, i1) of x into the prepared buffers).
void act_to_bf16_rows_scalar(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                             int64_t i0, int64_t i1, bool perm64);
// Position of column c (within its 64-group) in the perm64 layout.
inline int64_t fp8_perm64_index(int64_t c) {
  const int64_t g = c & ~int64_t{63}, j = c & 63, lane = j >> 4, half = (j >> 3) & 1;
  return g + half * 32 + lane * 8 + (j & 7);
}
void act_to_bf16_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                             int64_t i0, int64_t i1, bool perm64);
// The fp16 rows of ActView::f16 (and their f16_unscale) for rows [i0, i1) of x; the scalar one is
// the reference the AVX-512 FP16 one matches bit for bit.
void act_to_f16_rows_scalar(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                            float* unscale, int64_t i0, int64_t i1);
void act_to_f16_rows_avx512fp16(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                                float* unscale, int64_t i0, int64_t i1);
void act_round_bf16_rows_scalar(const float* x, int64_t x_stride, int64_t k, float* out, int64_t i0,
                                int64_t i1);
void act_quant_q8_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t stride, int8_t* q,
                              float* d, int32_t* corr_block, int32_t* corr_lane, float* d_lane, int64_t i0,
                              int64_t i1);
void act_quant_q8_rows_avx2(const float* x, int64_t x_stride, int64_t k, int64_t stride, int8_t* q, float* d,
                            int32_t* corr_block, int32_t* corr_lane, int64_t i0, int64_t i1);

// FP8 helpers shared by the paths: row r's bytes, and the scale row of weight row r.
inline const uint8_t* fp8_row(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * w.cols;
}
inline const float* fp8_scale_row(const WeightView& w, int64_t r) {
  const int64_t scale_cols = (w.cols + 127) / 128;
  return w.scale_inv + (r / 128) * scale_cols;
}

// The weights the calling thread reads after the current kernel call (the grouped experts' next
// task: moe_experts.cpp), which the row-wise fp8 kernels request into L2 in place of their own rows
// once their far requests pass the call's last row, so the next call does not start with an empty
// stream. A byte range; its first bytes are requested as if they were the rows after r1. Set with
// NextWeightsScope around a kernel call on the thread that runs it; empty otherwise.
struct NextWeights {
  const uint8_t* p = nullptr;
  int64_t bytes = 0;
  int64_t row_bytes = 0;  // their row length where known (the GEMM requests a panel's first block), else 0
  // The byte `off` of these weights when [off, off + len) lies within them, else null.
  const uint8_t* at(int64_t off, int64_t len) const {
    return off >= 0 && off + len <= bytes ? p + off : nullptr;
  }
};
inline thread_local NextWeights t_next_weights;
class NextWeightsScope {
 public:
  NextWeightsScope(const void* p, int64_t bytes, int64_t row_bytes = 0)
      : NextWeightsScope(NextWeights{static_cast<const uint8_t*>(p), bytes, row_bytes}) {}
  explicit NextWeightsScope(const NextWeights& nw) { t_next_weights = nw.p != nullptr ? nw : NextWeights{}; }
  ~NextWeightsScope() { t_next_weights = {}; }
  NextWeightsScope(const NextWeightsScope&) = delete;
  NextWeightsScope& operator=(const NextWeightsScope&) = delete;
};

// The one-row-at-a-time matrix-vector kernels (address_order_wanted): a call's rows lie one after
// another, so reading them row by row is one run of addresses, which the hardware prefetcher
// follows. The kernels that walk four or two rows side by side read several runs at once, which on
// the Zen 5 VM cost 15-25% of the rate whenever its memory was slow (most of its phases; `bench
// moe`, a loads-only stand-in: one run 1.13-1.23x the kernels, two or four interleaved runs
// 0.85-0.94x; docs/PERFORMANCE.md, "One run of addresses for one activation row"). Each line is
// also requested kStreamL2Bytes ahead into L2, on into the bytes the thread reads next
// (t_next_weights) past the call's last row, and a call's first kStreamL1Bytes into L1 at its
// start; without requests the out-of-order window alone kept about 2 KiB in flight (0.19-0.32x).
// Requests into L1 as well (kStreamL1Bytes ahead, until 2026-12-07) cost one core 8-10% of its
// rate, what bounds a single-stream decode when the VM's memory is fast (docs/PERFORMANCE.md, "L2
// requests alone in the one-row kernels").
inline constexpr int64_t kStreamL1Bytes = 2048;
inline constexpr int64_t kStreamL2Bytes = 8192;

// The byte `d` past q in the run that ends at `end`, or past `end` in the thread's next weights;
// null where neither holds it.
inline const uint8_t* stream_ahead(const uint8_t* q, int64_t d, const uint8_t* end, const NextWeights& nw) {
  return d < end - q ? q + d : nw.at(d - (end - q), 1);
}
// A one-row kernel's request for the byte D past P (a line of the run that ends at END) with
// prefetch hint HINT, on into NW past END; INSIDE (the request within the run, the common case)
// skips the checks. A macro, not a helper: GCC 12 drops _mm_prefetch from lambdas and inline
// helpers here.
// clang-format off
#define STREAM_REQUEST(P, D, HINT, INSIDE, END, NW)                                                  \
  do {                                                                                               \
    if (INSIDE) {                                                                                    \
      _mm_prefetch(reinterpret_cast<const char*>((P) + (D)), HINT);                                  \
    } else if (const uint8_t* at_ = stream_ahead((P), (D), (END), (NW)); at_ != nullptr) {           \
      _mm_prefetch(reinterpret_cast<const char*>(at_), HINT);                                        \
    }                                                                                                \
  } while (0)
// clang-format on

// The row ends the fp8 pair kernels' assembly indexes with %[k] running from -K to 0: weight rows
// w and w + K, the rows pf, pf + K requested into L1 and far, far + K into L2, and m (1..4)
// activation rows x + i * xs (2-byte elements; rows beyond m point at row 0 and are never read).
struct Fp8PairEnds {
  const uint8_t *w0, *w1, *p0, *p1, *f0, *f1;
  const uint16_t *x0, *x1, *x2, *x3;
  Fp8PairEnds(int m, const uint8_t* w, int64_t K, const uint16_t* x, int64_t xs, const uint8_t* pf,
              const uint8_t* far)
      : w0(w + K),
        w1(w + 2 * K),
        p0(pf + K),
        p1(pf + 2 * K),
        f0(far + K),
        f1(far + 2 * K),
        x0(x + K),
        x1(m > 1 ? x0 + xs : x0),
        x2(m > 2 ? x0 + 2 * xs : x0),
        x3(m > 3 ? x0 + 3 * xs : x0) {}
};

}  // namespace fathom::matmul_internal
