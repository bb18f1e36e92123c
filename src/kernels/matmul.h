// Linear layers with weights in their stored precision: y[m, rows] = x[m, cols] . W^T, with the
// dequantisation fused into the dot products and fp32 accumulation. Weights are read where they
// lie (memory-mapped checkpoints included): nothing is repacked at load and no upcast copy is kept.
//
// Activation precision by weight type (the same for every m and every SIMD path, so a prefill and
// a token-by-token decode compute the same products; only the fp32 summation order differs):
//   f32, f16         x in fp32 (F16 weights widened exactly); results comparable to ~1e-4 with
//                    other engines' fp32 paths.
//   bf16, f8_e4m3    x rounded once to bf16 (round-to-nearest-even), products exact in fp32
//                    (vdpbf16ps on AVX-512 BF16), fp32 sums; fp8 block scales applied per 128-column
//                    block in fp32 (W = e4m3 * scale_inv, the e4m3 values decoded exactly).
//   q8_0, q4_0       x quantised per 32-block as llama.cpp does for Q8_0 (d = amax/127, q = round(x/d),
//                    d kept in fp32), int32 block dot products (VNNI), fp32 d_w * d_x per block.
// The scalar references (matmul_ref.cpp) define these numerics in float64.
//
// Paths: AVX-512 BF16, AVX-512 (F/BW/VL/DQ + VNNI), AVX2 (+FMA/F16C) and portable scalar, chosen at
// run time by simd_level(). Small m (decode) runs row-wise matrix-vector kernels that stream each
// weight row once; larger m runs a blocked GEMM that converts a weight panel once into a
// thread-local tile and reuses it for every row of x. On CPUs with AMX BF16 (amx_bf16_usable),
// bf16 and fp8 weights with cols a multiple of 64 run on AMX tiles from m = 4 instead (same
// numerics; docs/kernels.md). Work is split over output rows on the pool; the weights are read
// exactly once per call.
//
// Thread safety: concurrent calls are safe (per-thread scratch); each call uses the given pool.
// Not here: attention (mla_*), bias terms (DeepSeek's linears have none), transposed weights.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace fathom {

// A linear layer's weight as stored: [rows = out_features, cols = in_features], row-major, rows
// contiguous (quantised types: each row is cols/32 blocks).
struct WeightView {
  DType dtype = DType::kF32;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features
  const void* data = nullptr;
  // f8_e4m3 only: float32 [ceil(rows/128), ceil(cols/128)], W = e4m3 * scale_inv (DeepSeek's
  // `weight_scale_inv`). The block grid is anchored at row 0 of `data`.
  const float* scale_inv = nullptr;
};

// The weight types matmul computes with: f32, f16, bf16, f8_e4m3, q8_0, q4_0.
bool matmul_supports(DType dtype);

// Checks a weight before use (at load): computable dtype, positive shape, cols a whole number of
// blocks, data present, scale_inv present exactly for fp8. `name` goes into the message.
Status validate_weight(const WeightView& w, std::string_view name);

// Rows [begin, end) of a weight (a head's slice of kv_b_proj, say). For f8_e4m3 `begin` must be a
// multiple of 128 so the scale grid stays aligned; the error says so otherwise.
Result<WeightView> slice_rows(const WeightView& w, int64_t begin, int64_t end);

struct MatmulOptions {
  int64_t x_stride = 0;     // elements between rows of x; 0 means cols
  int64_t y_stride = 0;     // elements between rows of y; 0 means rows
  bool accumulate = false;  // y += x . W^T instead of y = x . W^T
};

// y[m, w.rows] = x[m, w.cols] . W^T (x, y fp32, row-major). Runs on `pool`; m >= 0. The weight must
// pass validate_weight (CHECKed); x and y must not overlap.
void matmul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
            const MatmulOptions& options = {});
inline void matmul(const WeightView& w, const float* x, int64_t m, float* y) {
  matmul(w, x, m, y, default_pool());
}

// The float64 reference of exactly the numerics above (activation rounding included), single
// threaded: y[i, r] = sum_c q(x[i, c]) * W[r, c]. For tests and tools.
void matmul_ref(const WeightView& w, const float* x, int64_t m, double* y);
// The same without activation rounding (x used as given): the ideal result, to bound the error
// the activation precision adds.
void matmul_exact_ref(const WeightView& w, const float* x, int64_t m, double* y);

// Row r of W decoded to fp32 (dst[cols]), allocation-free (an embedding lookup, say); fp8 values
// are e4m3 * scale rounded to fp32.
void dequantize_weight_row(const WeightView& w, int64_t r, float* dst);

// The largest m that takes the matrix-vector path; above it the GEMM path runs (for benchmarks).
int64_t matmul_matvec_max_m(DType dtype);
// Whether fp8 weights at 2-7 activation rows use the fp16 kernels here (CPUs with AVX-512 FP16, at
// the current SIMD level; FATHOM_FP8_F16=0 turns it off).
bool matmul_fp8_f16_active();

}  // namespace fathom
