// The scalar reference of the MLA decode segment: the same paged online softmax as the SIMD paths
// (f32 running max, sum and output, one page at a time), written for clarity, with the query kept
// in f32 and each token decoded exactly (mla_kv_decode_token). It is the path MlaDecoder takes at
// simd_level() scalar, and what the fast paths are tested against besides the float64 oracle.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/mla_decode_impl.h"

namespace fathom::internal {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// One row's update for one page: scores, rescale, accumulate.
void ref_row_page(const float* q, const float* kf, int nt, int D, int dl, int64_t t0, int32_t lim, float c,
                  float* scores, float* m, float* l, float* o) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < nt; ++t) {
    float sc = -std::numeric_limits<float>::infinity();
    if (t0 + t <= lim) {
      float dot = 0;
      for (int d = 0; d < D; ++d) dot += q[d] * kf[t * D + d];
      sc = dot * c;
    }
    scores[t] = sc;
    mx = std::fmax(mx, sc);
  }
  const float m_new = std::fmax(*m, mx);
  const float m_safe = std::isinf(m_new) ? 0.0f : m_new;
  const float alpha = std::exp2(*m - m_safe);
  *l *= alpha;
  for (int c2 = 0; c2 < dl; ++c2) o[c2] *= alpha;
  for (int t = 0; t < nt; ++t) {
    const float pt = std::exp2(scores[t] - m_safe);
    if (pt == 0.0f) continue;
    *l += pt;
    for (int c2 = 0; c2 < dl; ++c2) o[c2] += pt * kf[t * D + c2];
  }
  *m = m_new;
}

}  // namespace

void mla_segment_ref(const MlaSegmentArgs& a, MlaScratch& s) {
  const MlaDecodeParams& p = *a.params;
  const MlaKvFormat& f = p.cache.format;
  const int R = p.s_q * p.heads, D = f.d_qk(), dl = f.d_latent, T = f.page_tokens;
  const int64_t L = p.cache_seqlens[a.seq];
  const float* q = p.q + a.seq * int64_t{R} * D;
  const float c = p.softmax_scale * kLog2e;
  float* kf = reinterpret_cast<float*>(s.k);
  for (int r = 0; r < R; ++r) {
    s.lim[r] = static_cast<int32_t>(p.causal ? L - p.s_q + r / p.heads : L - 1);
    s.m[r] = -std::numeric_limits<float>::infinity();
    s.l[r] = 0;
    for (int c2 = 0; c2 < dl; ++c2) s.o[int64_t{r} * dl + c2] = 0;
  }
  for (int64_t page = a.page_begin; page < a.page_end; ++page) {
    const int64_t t0 = page * T;
    const int nt = static_cast<int>(std::min<int64_t>(T, L - t0));
    if (nt <= 0) break;
    const int64_t id = p.block_table[a.seq * p.max_pages + page];
    const uint8_t* base = p.cache.data + id * p.cache.page_stride_bytes;
    for (int t = 0; t < nt; ++t) mla_kv_decode_token(f, base + t * f.token_bytes(), kf + int64_t{t} * D);
    for (int r = 0; r < R; ++r) {
      ref_row_page(q + int64_t{r} * D, kf, nt, D, dl, t0, s.lim[r], c, s.s, &s.m[r], &s.l[r],
                   s.o + int64_t{r} * dl);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float l = s.l[r];
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int c2 = 0; c2 < dl; ++c2) a.out[int64_t{r} * dl + c2] = s.o[int64_t{r} * dl + c2] * inv;
    a.lse[r] = l > 0 ? (s.m[r] + std::log2(l)) * kLn2 : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace fathom::internal
