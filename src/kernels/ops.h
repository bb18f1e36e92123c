// Element-wise and row-wise kernels of the DeepSeek forward pass, all in fp32: RMSNorm (fp32
// accumulation, weight in f32/bf16/f16), softmax (max-subtracted), SiLU-mul (SwiGLU's
// silu(gate) * up), the vectorised exp they share, and the argmax of greedy decoding. AVX-512 / AVX2 / scalar
// paths chosen by simd_level(); scalar references in ops_ref.cpp.
//
// exp: |relative error| <= 2e-7 (a few ulp) over the float range; underflows to 0 below -87.3,
// overflows to inf above 88.7; NaN stays NaN.
// Thread safety: pure functions; the row-wise ones split rows over the pool when large.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace fathom {

struct RmsNormParams {
  int64_t n_rows = 1;
  int64_t dim = 0;                   // elements normalised per row
  float eps = 1e-6f;                 // rms_norm_eps from the config
  int64_t x_stride = 0;              // elements between rows of x; 0 means dim
  int64_t y_stride = 0;              // elements between rows of y; 0 means dim
  DType weight_dtype = DType::kF32;  // f32, bf16 or f16
};

// y[r, :dim] = x[r, :dim] / sqrt(mean(x[r, :dim]^2) + eps) * weight[:dim]. y may equal x (in place).
// `weight` may be nullptr (no scale).
void rms_norm(const RmsNormParams& p, const float* x, const void* weight, float* y,
              ThreadPool& pool = default_pool());

// Row-wise softmax in place over x[r, :n] for r < n_rows (stride elements between rows, 0 = n).
// A row whose entries are all -inf becomes all zeros (instead of NaN).
void softmax(float* x, int64_t n_rows, int64_t n, int64_t stride = 0, ThreadPool& pool = default_pool());

// One row, on the calling thread: y[:n] = scale * softmax(x[:n]); returns the row's log-sum-exp,
// max + log(sum of exp(x - max)), in double (a cross-entropy loss is lse - x[target] and its
// gradient scale * (softmax - onehot)). y may equal x. A row of all -inf gives zeros and -inf.
double softmax_row_lse(const float* x, float* y, int64_t n, float scale = 1.0f);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]. out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// out[i] = exp(x[i]) with the accuracy above. out may alias x.
void exp_f32(const float* x, float* out, int64_t n);

// The index of the largest of x[:n] (n >= 1), the first one where several are equal, as
// std::max_element gives for values without NaN; NaN entries are never chosen (0 when every entry is
// NaN). Greedy sampling over a vocabulary row: 102400 entries (from L2) in 8 us at AVX-512, against
// 0.31 ms for std::max_element, whose compare-and-move chain waits on a load per entry (Zen 5 VM).
int64_t argmax(const float* x, int64_t n);

// Scalar float64 references.
void rms_norm_ref(const RmsNormParams& p, const float* x, const void* weight, double* y);
void softmax_ref(const float* x, int64_t n_rows, int64_t n, int64_t stride, double* y);
void silu_mul_ref(const float* gate, const float* up, double* out, int64_t n);
int64_t argmax_ref(const float* x, int64_t n);  // one pass, strict greater-than

}  // namespace fathom
