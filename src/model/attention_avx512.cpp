// AVX-512 inner loop of prefill attention: per 16-key tile the keys of one head are transposed
// once ([d][16]), every query row then gets 16 scores with broadcast FMAs, and P.V accumulates
// over d_v with one FMA per key per 16 values.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "model/attention.h"

namespace fathom::internal {

void prefill_attention_rows_avx512(const PrefillAttentionParams& p, int h, int64_t q_begin, int64_t q_end) {
  const int dq = p.d_nope + p.d_rope;
  const int64_t last_q_pos = p.q_pos0 + q_end - 1;
  const int64_t keys = std::min<int64_t>(p.n_k, last_q_pos - p.k0 + 1);
  if (keys <= 0) return;
  alignas(64) float kt[(512 + 128) * 16];  // d_nope + d_rope <= 640
  alignas(64) float sc[16];
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < keys; j0 += 16) {
    const int nk = static_cast<int>(std::min<int64_t>(16, keys - j0));
    for (int d = 0; d < dq; ++d) {
      for (int j = 0; j < 16; ++j) {
        float v = 0;
        if (j < nk) {
          v = d < p.d_nope ? p.k_nope[(j0 + j) * p.heads * p.d_nope + h * p.d_nope + d]
                           : p.k_pe[(j0 + j) * p.k_pe_stride + (d - p.d_nope)];
        }
        kt[d * 16 + j] = v;
      }
    }
    for (int64_t i = q_begin; i < q_end; ++i) {
      const int64_t qpos = p.q_pos0 + i;
      const int64_t visible = std::min<int64_t>(nk, qpos - p.k0 - j0 + 1);
      if (visible <= 0) continue;
      const float* q = p.q + (i * p.heads + h) * dq;
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      int d = 0;
      for (; d + 1 < dq; d += 2) {
        s0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_load_ps(kt + d * 16), s0);
        s1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), _mm512_load_ps(kt + (d + 1) * 16), s1);
      }
      if (d < dq) s0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_load_ps(kt + d * 16), s0);
      __m512 s = _mm512_mul_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(p.scale));
      const __mmask16 valid = static_cast<__mmask16>((1u << visible) - 1u);
      s = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), valid, s);
      float& m = p.m[i * p.heads + h];
      float& l = p.l[i * p.heads + h];
      float* acc = p.acc + (i * p.heads + h) * p.d_v;
      const float m_new = std::max(m, _mm512_reduce_max_ps(s));
      const float corr = std::exp(m - m_new);
      _mm512_store_ps(sc, _mm512_sub_ps(s, _mm512_set1_ps(m_new)));
      exp_f32(sc, sc, 16);  // masked lanes: exp(-inf) = 0
      l = l * corr + _mm512_reduce_add_ps(_mm512_load_ps(sc));
      const __m512 vc = _mm512_set1_ps(corr);
      for (int dv = 0; dv < p.d_v; dv += 16) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(acc + dv), vc);
        for (int j = 0; j < visible; ++j) {
          const float* vr = p.v + (j0 + j) * p.heads * p.d_v + h * p.d_v + dv;
          a = _mm512_fmadd_ps(_mm512_set1_ps(sc[j]), _mm512_loadu_ps(vr), a);
        }
        _mm512_storeu_ps(acc + dv, a);
      }
      m = m_new;
    }
  }
}

}  // namespace fathom::internal
