// Float64 references for rms_norm, softmax and silu_mul, and argmax's (tests compare the fast paths
// with these).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "tensor/convert.h"

namespace fathom {

void rms_norm_ref(const RmsNormParams& p, const float* x, const void* weight, double* y) {
  const int64_t xs = p.x_stride ? p.x_stride : p.dim;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const float* xr = x + r * xs;
    double ss = 0;
    for (int64_t i = 0; i < p.dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      double w = 1.0;
      if (weight != nullptr) {
        const auto* h = static_cast<const uint16_t*>(weight);
        w = p.weight_dtype == DType::kF32    ? static_cast<const float*>(weight)[i]
            : p.weight_dtype == DType::kBF16 ? bf16_to_f32(h[i])
                                             : f16_to_f32(h[i]);
      }
      y[r * p.dim + i] = xr[i] * inv * w;
    }
  }
}

void softmax_ref(const float* x, int64_t n_rows, int64_t n, int64_t stride, double* y) {
  const int64_t s = stride ? stride : n;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * s;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(xr[i]));
    if (std::isinf(mx) && mx < 0) {
      for (int64_t i = 0; i < n; ++i) y[r * n + i] = 0;
      continue;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(xr[i]) - mx);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = std::exp(static_cast<double>(xr[i]) - mx) / sum;
  }
}

void silu_mul_ref(const float* gate, const float* up, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = g / (1.0 + std::exp(-g)) * up[i];
  }
}

int64_t argmax_ref(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

}  // namespace fathom
