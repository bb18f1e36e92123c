// Row-wise and element-wise ops: dispatch by SIMD level, the split over the pool, the portable
// scalar paths, and the norm weight's conversion to fp32.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/cpu.h"
#include "kernels/ops_impl.h"
#include "tensor/convert.h"

namespace fathom {

using namespace ops_internal;

namespace ops_internal {

void rms_norm_row_scalar(const float* x, const float* w, float* y, int64_t n, float eps) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j] * x[i + j];
  for (; i < n; ++i) s[0] += x[i] * x[i];
  const float ss = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (i = 0; i < n; ++i) y[i] = w != nullptr ? x[i] * inv * w[i] : x[i] * inv;
}

double softmax_row_scalar(const float* x, float* y, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  if (mx == -INFINITY) {  // every entry masked
    std::fill(y, y + n, 0.0f);
    return -INFINITY;
  }
  double sum = 0;  // the portable path has no lanes to spread the rounding over
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - mx);
    sum += y[i];
  }
  const float inv = static_cast<float>(scale / sum);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  return static_cast<double>(mx) + std::log(sum);
}

void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void exp_scalar(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

int64_t argmax_scalar(const float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;  // NaN compares false: skipped
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == mx) return i;
  }
  return 0;
}

}  // namespace ops_internal

namespace {

// Rows per task so each task has at least ~16K elements of work.
int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
}

const float* norm_weight_f32(DType dtype, const void* weight, int64_t dim) {
  if (weight == nullptr) return nullptr;
  if (dtype == DType::kF32) return static_cast<const float*>(weight);
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(dim));
  const auto* h = static_cast<const uint16_t*>(weight);
  CHECK_MSG(dtype == DType::kBF16 || dtype == DType::kF16, "rms_norm: weight dtype {} (f32, bf16 or f16)",
            dtype_name(dtype));
  for (int64_t i = 0; i < dim; ++i)
    w[static_cast<size_t>(i)] = dtype == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  return w.data();
}

}  // namespace

void rms_norm(const RmsNormParams& p, const float* x, const void* weight, float* y, ThreadPool& pool) {
  CHECK(p.dim > 0 && p.n_rows >= 0);
  const int64_t xs = p.x_stride ? p.x_stride : p.dim, ys = p.y_stride ? p.y_stride : p.dim;
  const float* w = norm_weight_f32(p.weight_dtype, weight, p.dim);
  const SimdLevel level = simd_level();
  auto row = level >= SimdLevel::kAvx512 ? rms_norm_row_avx512
             : level >= SimdLevel::kAvx2 ? rms_norm_row_avx2
                                         : rms_norm_row_scalar;
  pool.parallel_for(p.n_rows, row_grain(p.dim), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) row(x + r * xs, w, y + r * ys, p.dim, p.eps);
  });
}

namespace {

// The softmax row kernel of this CPU's SIMD level.
auto softmax_row_kernel() {
  const SimdLevel level = simd_level();
  return level >= SimdLevel::kAvx512 ? softmax_row_avx512
         : level >= SimdLevel::kAvx2 ? softmax_row_avx2
                                     : softmax_row_scalar;
}

}  // namespace

void softmax(float* x, int64_t n_rows, int64_t n, int64_t stride, ThreadPool& pool) {
  CHECK(n > 0 && n_rows >= 0);
  const int64_t s = stride ? stride : n;
  auto row = softmax_row_kernel();
  pool.parallel_for(n_rows, row_grain(n), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) row(x + r * s, x + r * s, n, 1.0f);
  });
}

double softmax_row_lse(const float* x, float* y, int64_t n, float scale) {
  CHECK(n > 0);
  return softmax_row_kernel()(x, y, n, scale);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::kAvx512) {
    silu_mul_avx512(gate, up, out, n);
  } else if (level >= SimdLevel::kAvx2) {
    silu_mul_avx2(gate, up, out, n);
  } else {
    silu_mul_scalar(gate, up, out, n);
  }
}

int64_t argmax(const float* x, int64_t n) {
  CHECK(n > 0);
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::kAvx512) return argmax_avx512(x, n);
  if (level >= SimdLevel::kAvx2) return argmax_avx2(x, n);
  return argmax_scalar(x, n);
}

void exp_f32(const float* x, float* out, int64_t n) {
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::kAvx512) {
    exp_avx512(x, out, n);
  } else if (level >= SimdLevel::kAvx2) {
    exp_avx2(x, out, n);
  } else {
    exp_scalar(x, out, n);
  }
}

}  // namespace fathom
