// Float64 reference of rope_apply, computed from the formula for every element (no table).
#include <cmath>
#include <vector>

#include "kernels/rope.h"

namespace fathom {

void rope_apply_ref(const RopeParams& rp, const RopeApplyParams& p, const int64_t* positions, const float* x,
                    double* out) {
  const std::vector<double> f = rope_inv_freq(rp);
  const double scale = rope_cos_sin_scale(rp);
  const int64_t half = rp.dim / 2;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const float* xi = x + t * p.token_stride + h * p.head_stride;
      double* oi = out + (t * p.n_heads + h) * rp.dim;
      for (int64_t i = 0; i < half; ++i) {
        const double a =
            static_cast<double>(positions[t]) * f[static_cast<size_t>(i)] * (p.inverse ? -1.0 : 1.0);
        const double c = std::cos(a) * scale, s = std::sin(a) * scale;
        oi[2 * i] = xi[2 * i] * c - xi[2 * i + 1] * s;
        oi[2 * i + 1] = xi[2 * i] * s + xi[2 * i + 1] * c;
      }
    }
  }
}

}  // namespace fathom
