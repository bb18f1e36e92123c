// The elementary layer pairs: linear, embedding, RMSNorm, cross-entropy and SwiGLU (train.h,
// train_impl.h). The float linear forward is the runtime's fp32 matmul kernel (kernels/matmul.h)
// so training and serving compute the same products; the backward GEMMs are train/gemm.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "train/gemm.h"
#include "train/train_impl.h"

namespace fathom::train {

template <class T>
void linear_forward(const T* x, const T* w, int64_t m, int64_t in, int64_t out, T* y) {
  if (m == 0) return;
  gemm_nt(m, out, in, x, w, y, false);  // float: the runtime's matmul kernel (gemm.h)
}

template <class T>
void linear_backward_input(const T* dy, const T* w, int64_t m, int64_t in, int64_t out, T* dx,
                           bool accumulate) {
  gemm_nn(m, in, out, dy, w, dx, accumulate);
}

template <class T>
void linear_backward_weight(const T* dy, const T* x, int64_t m, int64_t in, int64_t out, T* dw) {
  gemm_tn(out, in, m, dy, x, dw);
}

template <class T>
void embedding_forward(const T* table, int64_t dim, std::span<const int32_t> tokens, T* x) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    std::memcpy(x + static_cast<int64_t>(t) * dim, table + static_cast<int64_t>(tokens[t]) * dim,
                static_cast<size_t>(dim) * sizeof(T));
  }
}

template <class T>
void embedding_backward_weight(const T* dx, int64_t dim, std::span<const int32_t> tokens, T* dtable) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    T* row = dtable + static_cast<int64_t>(tokens[t]) * dim;
    const T* d = dx + static_cast<int64_t>(t) * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += d[i];
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* g, int64_t n, int64_t dim, double eps, T* y,
                     RmsNormContext<T>& ctx) {
  ctx.n = n;
  ctx.dim = dim;
  ctx.xhat.resize(static_cast<size_t>(n * dim));
  ctx.rinv.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * dim;
    double ss = 0;  // fp64 accumulation of the mean square
    for (int64_t d = 0; d < dim; ++d) ss += static_cast<double>(xr[d]) * xr[d];
    const T inv = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    ctx.rinv[static_cast<size_t>(r)] = inv;
    T* xh = ctx.xhat.data() + r * dim;
    for (int64_t d = 0; d < dim; ++d) xh[d] = xr[d] * inv;
    T* yr = y + r * dim;
    for (int64_t d = 0; d < dim; ++d) yr[d] = xh[d] * g[d];
  }
}

template <class T>
void rmsnorm_backward_input(const RmsNormContext<T>& ctx, const T* g, const T* dy, T* dx, bool accumulate) {
  const int64_t dim = ctx.dim;
  for (int64_t r = 0; r < ctx.n; ++r) {
    const T* xh = ctx.xhat.data() + r * dim;
    const T* dyr = dy + r * dim;
    double dot = 0;
    for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(dyr[d]) * g[d] * xh[d];
    const T mean = static_cast<T>(dot / static_cast<double>(dim));
    const T inv = ctx.rinv[static_cast<size_t>(r)];
    T* dxr = dx + r * dim;
    for (int64_t d = 0; d < dim; ++d) {
      const T v = inv * (dyr[d] * g[d] - xh[d] * mean);
      dxr[d] = accumulate ? dxr[d] + v : v;
    }
  }
}

template <class T>
void rmsnorm_backward_weight(const RmsNormContext<T>& ctx, const T* dy, T* dg) {
  for (int64_t r = 0; r < ctx.n; ++r) {
    const T* xh = ctx.xhat.data() + r * ctx.dim;
    const T* dyr = dy + r * ctx.dim;
    for (int64_t d = 0; d < ctx.dim; ++d) dg[d] += dyr[d] * xh[d];
  }
}

template <class T>
double cross_entropy_forward_backward(const T* logits, int64_t n, int64_t vocab,
                                      std::span<const int32_t> targets, double loss_scale, T* dlogits) {
  CHECK(static_cast<int64_t>(targets.size()) == n);
  int64_t n_valid = 0;
  for (int32_t t : targets) {
    CHECK(t >= -1 && t < vocab);
    n_valid += t >= 0;
  }
  const double k = loss_scale / static_cast<double>(std::max<int64_t>(n_valid, 1));
  if constexpr (std::is_same_v<T, float>) {
    // Rows in parallel, each one pass of the runtime's vectorised softmax (kernels/ops.h: exp to
    // ~2e-7 relative, the sum in fp32 lanes) that also returns the row's log-sum-exp; per-row
    // losses summed in row order afterwards (independent of the thread count).
    std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
    default_pool().parallel_for(n, 8, [&](int64_t r0, int64_t r1, int) {
      thread_local std::vector<float> scratch;
      for (int64_t r = r0; r < r1; ++r) {
        const float* lr = logits + r * vocab;
        const int32_t tgt = targets[static_cast<size_t>(r)];
        float* dr = dlogits != nullptr ? dlogits + r * vocab : nullptr;
        if (tgt < 0) {
          if (dr != nullptr) std::fill(dr, dr + vocab, 0.0f);
          continue;
        }
        if (dr == nullptr) {
          scratch.resize(static_cast<size_t>(vocab));
          dr = scratch.data();
        }
        const double lse = softmax_row_lse(lr, dr, vocab, static_cast<float>(k));
        row_loss[static_cast<size_t>(r)] = lse - static_cast<double>(lr[tgt]);
        if (dlogits != nullptr) dr[tgt] -= static_cast<float>(k);
      }
    });
    double total = 0;
    for (double l : row_loss) total += l;
    return n_valid > 0 ? total / static_cast<double>(n_valid) : 0.0;
  }
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    const T* lr = logits + r * vocab;
    const int32_t tgt = targets[static_cast<size_t>(r)];
    T* dr = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    if (tgt < 0) {
      if (dr != nullptr) std::fill(dr, dr + vocab, T(0));
      continue;
    }
    const double mx = static_cast<double>(*std::max_element(lr, lr + vocab));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(lr[v]) - mx);
    const double lse = mx + std::log(sum);
    total += lse - static_cast<double>(lr[tgt]);
    if (dr == nullptr) continue;
    for (int64_t v = 0; v < vocab; ++v)
      dr[v] = static_cast<T>(std::exp(static_cast<double>(lr[v]) - lse) * k);
    dr[tgt] -= static_cast<T>(k);
  }
  return n_valid > 0 ? total / static_cast<double>(n_valid) : 0.0;
}

// out[i] = 1 / (1 + exp(-g[i])) over the pool (SwiGLU's backward); float uses the runtime's
// vectorised exp (kernels/ops.h, ~2e-7 relative), double std::exp. Elementwise, so independent of
// the thread count.
template <class T>
void sigmoid(const T* g, T* out, int64_t n) {
  default_pool().parallel_for(n, 8192, [&](int64_t i0, int64_t i1, int) {
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = i0; i < i1; ++i) out[i] = -g[i];
      exp_f32(out + i0, out + i0, i1 - i0);
      for (int64_t i = i0; i < i1; ++i) out[i] = 1.0f / (1.0f + out[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) out[i] = T(1) / (T(1) + std::exp(-g[i]));
    }
  });
}

template <class T>
void swiglu_forward(const T* x, const T* wg, const T* wu, const T* wd, int64_t m, int64_t hidden,
                    int64_t inter, T* y, SwigluContext<T>& ctx) {
  ctx.m = m;
  ctx.hidden = hidden;
  ctx.inter = inter;
  ctx.x.assign(x, x + m * hidden);
  ctx.g.resize(static_cast<size_t>(m * inter));
  ctx.u.resize(ctx.g.size());
  ctx.h.resize(ctx.g.size());
  linear_forward(x, wg, m, hidden, inter, ctx.g.data());
  linear_forward(x, wu, m, hidden, inter, ctx.u.data());
  if constexpr (std::is_same_v<T, float>) {  // the runtime's vectorised silu(g) * u, rows over the pool
    default_pool().parallel_for(m * inter, 8192, [&](int64_t i0, int64_t i1, int) {
      silu_mul(ctx.g.data() + i0, ctx.u.data() + i0, ctx.h.data() + i0, i1 - i0);
    });
  } else {
    for (size_t i = 0; i < ctx.g.size(); ++i) ctx.h[i] = ctx.g[i] / (T(1) + std::exp(-ctx.g[i])) * ctx.u[i];
  }
  linear_forward(ctx.h.data(), wd, m, inter, hidden, y);
}

template <class T>
void swiglu_backward_input(SwigluContext<T>& ctx, const T* wg, const T* wu, const T* wd, const T* dy, T* dx,
                           bool accumulate) {
  const int64_t m = ctx.m, hidden = ctx.hidden, inter = ctx.inter;
  ctx.dy.assign(dy, dy + m * hidden);
  ctx.dg.resize(static_cast<size_t>(m * inter));
  ctx.du.resize(ctx.dg.size());
  // dh = dy . Wd, then through h = silu(g) * u.
  linear_backward_input(dy, wd, m, inter, hidden, ctx.dg.data(), false);
  sigmoid(ctx.g.data(), ctx.du.data(), m * inter);  // du holds sigmoid(g) until overwritten below
  for (size_t i = 0; i < ctx.dg.size(); ++i) {
    const T gi = ctx.g[i], dh = ctx.dg[i];
    const T sig = ctx.du[i];
    ctx.du[i] = dh * gi * sig;
    ctx.dg[i] = dh * ctx.u[i] * sig * (T(1) + gi * (T(1) - sig));
  }
  linear_backward_input(ctx.dg.data(), wg, m, hidden, inter, dx, accumulate);
  linear_backward_input(ctx.du.data(), wu, m, hidden, inter, dx, true);
}

template <class T>
void swiglu_backward_weight(const SwigluContext<T>& ctx, T* dwg, T* dwu, T* dwd) {
  linear_backward_weight(ctx.dy.data(), ctx.h.data(), ctx.m, ctx.inter, ctx.hidden, dwd);
  linear_backward_weight(ctx.dg.data(), ctx.x.data(), ctx.m, ctx.hidden, ctx.inter, dwg);
  linear_backward_weight(ctx.du.data(), ctx.x.data(), ctx.m, ctx.hidden, ctx.inter, dwu);
}

#define FATHOM_LAYERS_INSTANTIATE(T)                                                                      \
  template void linear_forward<T>(const T*, const T*, int64_t, int64_t, int64_t, T*);                     \
  template void linear_backward_input<T>(const T*, const T*, int64_t, int64_t, int64_t, T*, bool);        \
  template void linear_backward_weight<T>(const T*, const T*, int64_t, int64_t, int64_t, T*);             \
  template void embedding_forward<T>(const T*, int64_t, std::span<const int32_t>, T*);                    \
  template void embedding_backward_weight<T>(const T*, int64_t, std::span<const int32_t>, T*);            \
  template void rmsnorm_forward<T>(const T*, const T*, int64_t, int64_t, double, T*, RmsNormContext<T>&); \
  template void rmsnorm_backward_input<T>(const RmsNormContext<T>&, const T*, const T*, T*, bool);        \
  template void rmsnorm_backward_weight<T>(const RmsNormContext<T>&, const T*, T*);                       \
  template double cross_entropy_forward_backward<T>(const T*, int64_t, int64_t, std::span<const int32_t>, \
                                                    double, T*);                                          \
  template void swiglu_forward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, T*,  \
                                  SwigluContext<T>&);                                                     \
  template void swiglu_backward_input<T>(SwigluContext<T>&, const T*, const T*, const T*, const T*, T*,   \
                                         bool);                                                           \
  template void swiglu_backward_weight<T>(const SwigluContext<T>&, T*, T*, T*);
FATHOM_LAYERS_INSTANTIATE(float)
FATHOM_LAYERS_INSTANTIATE(double)
#undef FATHOM_LAYERS_INSTANTIATE

}  // namespace fathom::train
