// Prefill attention driver and the scalar inner loop.
#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/cpu.h"
#include "kernels/ops.h"

namespace fathom {

void attention_state_init(int64_t n_q, int heads, int d_v, float* m, float* l, float* acc) {
  std::fill(m, m + n_q * heads, -std::numeric_limits<float>::infinity());
  std::fill(l, l + n_q * heads, 0.0f);
  std::fill(acc, acc + n_q * heads * d_v, 0.0f);
}

void attention_state_finish(int64_t n_q, int heads, int d_v, const float* l, const float* acc, float* out) {
  for (int64_t i = 0; i < n_q * heads; ++i) {
    const float inv = l[i] > 0 ? 1.0f / l[i] : 0.0f;
    for (int d = 0; d < d_v; ++d) out[i * d_v + d] = acc[i * d_v + d] * inv;
  }
}

namespace internal {

void prefill_attention_rows_scalar(const PrefillAttentionParams& p, int h, int64_t q_begin, int64_t q_end) {
  const int dq = p.d_nope + p.d_rope;
  std::vector<float> s(static_cast<size_t>(p.n_k));
  for (int64_t i = q_begin; i < q_end; ++i) {
    const int64_t qpos = p.q_pos0 + i;
    const int64_t visible = std::min<int64_t>(p.n_k, qpos - p.k0 + 1);
    if (visible <= 0) continue;
    const float* q = p.q + (i * p.heads + h) * dq;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      const float* kn = p.k_nope + j * p.heads * p.d_nope + h * p.d_nope;
      const float* kp = p.k_pe + j * p.k_pe_stride;
      float dot = 0;
      for (int d = 0; d < p.d_nope; ++d) dot += q[d] * kn[d];
      for (int d = 0; d < p.d_rope; ++d) dot += q[p.d_nope + d] * kp[d];
      s[static_cast<size_t>(j)] = dot * p.scale;
      mx = std::max(mx, s[static_cast<size_t>(j)]);
    }
    float& m = p.m[i * p.heads + h];
    float& l = p.l[i * p.heads + h];
    float* acc = p.acc + (i * p.heads + h) * p.d_v;
    const float m_new = std::max(m, mx);
    const float corr = std::exp(m - m_new);
    for (int d = 0; d < p.d_v; ++d) acc[d] *= corr;
    l *= corr;
    for (int64_t j = 0; j < visible; ++j) {
      const float e = std::exp(s[static_cast<size_t>(j)] - m_new);
      l += e;
      const float* v = p.v + j * p.heads * p.d_v + h * p.d_v;
      for (int d = 0; d < p.d_v; ++d) acc[d] += e * v[d];
    }
    m = m_new;
  }
}

}  // namespace internal

void prefill_attention_block(const PrefillAttentionParams& p, ThreadPool& pool) {
  if (p.n_q == 0 || p.n_k == 0) return;
  if (p.bf16_operands && simd_level() >= SimdLevel::kAvx512Bf16 && amx_bf16_usable() &&
      internal::prefill_attention_amx_ok(p)) {
    internal::prefill_attention_amx(p, pool);
    return;
  }
  constexpr int64_t kRowsPerTask = 32;
  const int64_t q_tiles = (p.n_q + kRowsPerTask - 1) / kRowsPerTask;
  const bool avx512 = simd_level() >= SimdLevel::kAvx512 && p.d_v % 16 == 0;
  pool.run(p.heads * q_tiles, [&](int64_t task, int) {
    const int h = static_cast<int>(task / q_tiles);
    const int64_t b = (task % q_tiles) * kRowsPerTask;
    const int64_t e = std::min(p.n_q, b + kRowsPerTask);
    if (avx512) {
      internal::prefill_attention_rows_avx512(p, h, b, e);
    } else {
      internal::prefill_attention_rows_scalar(p, h, b, e);
    }
  });
}

}  // namespace fathom
