// The online-softmax step of prefill attention shared by the AVX-512 loop (attention_avx512.cpp)
// and the AMX tiles (attention_amx_avx512bf16.cpp): S^T is [kKeys][kRows] f32 with the rows in the
// lanes, so each row's max and sum are vertical. Include only from AVX-512 translation units; the
// functions have internal linkage, so each keeps the code its own flags compile.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/ops.h"

namespace fathom::internal {
namespace {  // NOLINT(build/namespaces): one copy per ISA translation unit

constexpr int kAttnRows = 32;  // query rows per block: two 16-lane vectors
constexpr int kAttnKeys = 64;  // keys per softmax step

// Keys [0, nk) of a step whose first key is at absolute position key_pos0: scale, hide keys after
// each row's position (pos), update the running max m, leave alpha = exp(m_old - m_new) and st =
// exp(scaled score - m_new) (0 for hidden keys). rv: 16-row vectors in use (1 or 2); with one, the
// upper half of st's rows is zeroed so the exp reads defined values.
inline void attention_softmax_exp(float* st, int nk, int rv, const int32_t* pos, float* m, float* alpha,
                                  int64_t key_pos0, float scale) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int v = 0; v < rv; ++v) {
    const __m512i vpos = _mm512_load_si512(pos + 16 * v);
    __m512 mx = _mm512_set1_ps(neg_inf);
    for (int j = 0; j < nk; ++j) {
      float* s = st + j * kAttnRows + 16 * v;
      const __mmask16 seen =
          _mm512_cmpge_epi32_mask(vpos, _mm512_set1_epi32(static_cast<int32_t>(key_pos0 + j)));
      const __m512 x = _mm512_mask_mul_ps(_mm512_set1_ps(neg_inf), seen, _mm512_load_ps(s), vscale);
      _mm512_store_ps(s, x);
      mx = _mm512_max_ps(mx, x);
    }
    const __m512 m_old = _mm512_load_ps(m + 16 * v);
    const __m512 m_new = _mm512_max_ps(m_old, mx);
    // A row that has seen no key yet keeps m = -inf: exponents are then taken against 0.
    const __m512 m_safe = _mm512_mask_mov_ps(
        m_new, _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(neg_inf), _CMP_EQ_OQ), _mm512_setzero_ps());
    _mm512_store_ps(alpha + 16 * v, _mm512_sub_ps(m_old, m_safe));
    _mm512_store_ps(m + 16 * v, m_new);
    for (int j = 0; j < nk; ++j) {
      float* s = st + j * kAttnRows + 16 * v;
      _mm512_store_ps(s, _mm512_sub_ps(_mm512_load_ps(s), m_safe));
    }
  }
  if (rv == 1) {  // the unused upper half of each row of S^T: exp of garbage is never read
    for (int j = 0; j < nk; ++j) _mm512_store_ps(st + j * kAttnRows + 16, _mm512_setzero_ps());
  }
  exp_f32(st, st, int64_t{nk} * kAttnRows);
  exp_f32(alpha, alpha, kAttnRows);
}

// l = l * alpha + the sum of the step's st over its nk keys.
inline void attention_softmax_sum(const float* st, int nk, int rv, const float* alpha, float* l) {
  for (int v = 0; v < rv; ++v) {
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; ++j) sum = _mm512_add_ps(sum, _mm512_load_ps(st + j * kAttnRows + 16 * v));
    _mm512_store_ps(l + 16 * v,
                    _mm512_fmadd_ps(_mm512_load_ps(l + 16 * v), _mm512_load_ps(alpha + 16 * v), sum));
  }
}

}  // namespace
}  // namespace fathom::internal
