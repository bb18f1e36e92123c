// Prefill attention on AMX tiles (Sapphire Rapids and later Xeons), for callers whose activations
// are rounded to bf16 anyway (PrefillAttentionParams::bf16_operands). Two passes per key block:
//   1. per head, K (nope | rope, zero-padded to a multiple of 32 dims and 16 keys) to bf16 rows
//      kb[key][dqp], and V to bf16 key pairs vp[pair][d_v][2] (zero past n_k, up to 32 keys);
//   2. per head and 32 query rows, for every 64 keys the rows may see:
//      QK  S^T[key][row] = K . Q^T: A = 16 keys x 32 dims of kb, B = the rows' queries as pairs
//          (qt[dim pair][32 rows][2]), C tiles stored into S^T in the AVX-512 loop's layout;
//      the same online softmax (attention_softmax_impl.h), P rounded to bf16 before its sum so
//          that l matches what PV multiplies;
//      PV  acc[row][d] = alpha acc + P . V: A = P transposed to [row][key] bf16, B = vp, C tiles the
//          rows' accumulators (a per-task copy of the state).
// Both products take a 2 x 2 block of C tiles (A in tiles 4-5, B in 6-7), so each tile load serves
// two products. Each row's result depends only on its own query and the keys (the tiles compute
// every C element from its own row and column), as the vector path's does.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/amx_tiles.h"
#include "kernels/simd_avx512_impl.h"
#include "model/attention.h"
#include "model/attention_softmax_impl.h"
#include "tensor/tensor.h"

namespace fathom::internal {
namespace {

constexpr int kRows = kAttnRows;
constexpr int kKeys = kAttnKeys;

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// n f32 values -> bf16 (round to nearest even).
void to_bf16(const float* src, int n, uint16_t* dst) {
  int d = 0;
  for (; d + 16 <= n; d += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + d)));
  if (d < n) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (n - d)) - 1);
    _mm256_mask_storeu_epi16(dst + d, mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, src + d)));
  }
}

struct Layout {
  int dq = 0, dqp = 0;             // query/key width, padded to 32
  int64_t nk16 = 0, nk32 = 0;      // keys padded to 16 (kb rows) and 32 (vp pairs * 2)
  int64_t k_head = 0, v_head = 0;  // elements per head in kb and vp
};

Layout layout_of(const PrefillAttentionParams& p) {
  Layout l;
  l.dq = p.d_nope + p.d_rope;
  l.dqp = static_cast<int>(round_up(l.dq, 32));
  l.nk16 = round_up(p.n_k, 16);
  l.nk32 = round_up(p.n_k, 32);
  l.k_head = l.nk16 * l.dqp;
  l.v_head = l.nk32 * p.d_v;
  return l;
}

// Pass 1 for head h.
void convert_head(const PrefillAttentionParams& p, const Layout& lo, int h, uint16_t* kb, uint16_t* vp) {
  for (int64_t j = 0; j < lo.nk16; ++j) {
    uint16_t* row = kb + j * lo.dqp;
    if (j >= p.n_k) {
      std::memset(row, 0, static_cast<size_t>(lo.dqp) * 2);
      continue;
    }
    to_bf16(p.k_nope + j * p.heads * p.d_nope + int64_t{h} * p.d_nope, p.d_nope, row);
    to_bf16(p.k_pe + j * p.k_pe_stride, p.d_rope, row + p.d_nope);
    if (lo.dqp > lo.dq) std::memset(row + lo.dq, 0, static_cast<size_t>(lo.dqp - lo.dq) * 2);
  }
  // vp[kp][c] = (v[2kp][c], v[2kp + 1][c]) as bf16 pairs
  const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                         22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int64_t v_stride = int64_t{p.heads} * p.d_v;
  for (int64_t kp = 0; kp < lo.nk32 / 2; ++kp) {
    const bool has0 = 2 * kp < p.n_k, has1 = 2 * kp + 1 < p.n_k;
    const float* v0 = p.v + 2 * kp * v_stride + int64_t{h} * p.d_v;
    const float* v1 = v0 + v_stride;
    uint16_t* dst = vp + kp * p.d_v * 2;
    for (int c = 0; c < p.d_v; c += 16) {
      const __m512 a = has0 ? _mm512_loadu_ps(v0 + c) : _mm512_setzero_ps();
      const __m512 b = has1 ? _mm512_loadu_ps(v1 + c) : _mm512_setzero_ps();
      const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      _mm512_storeu_si512(dst + 2 * c, _mm512_permutexvar_epi16(inter, packed));
    }
  }
}

// st [kKeys][kRows] f32 (bf16-exact values) of row tile rt -> pt[16 rows][kKeys] bf16, keys past
// nk zero (a 16 x 16 transpose per 16 keys).
void transpose_p(const float* st, int nk, int rt, uint16_t* pt) {
  for (int t0 = 0; t0 < kKeys; t0 += 16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = t0 + i < nk ? _mm512_load_si512(st + (t0 + i) * kRows + rt * 16) : _mm512_setzero_si512();
    matmul_internal::transpose16x16_epi32(r);
    for (int j = 0; j < 16; ++j)
      _mm256_store_si256(reinterpret_cast<__m256i*>(pt + j * kKeys + t0),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(r[j])));
  }
}

// Per-task scratch: queries as pairs, S^T, P rows, the rows' accumulators.
struct alignas(64) Scratch {
  float st[kKeys * kRows];
  uint16_t pt[2][16 * kKeys];
};

// Pass 2 for head h, rows [i0, i0 + rows).
void attend_rows(const PrefillAttentionParams& p, const Layout& lo, int h, int64_t i0, int rows,
                 const uint16_t* kb, const uint16_t* vp, uint32_t* qt, float* acc, Scratch& sc) {
  const int64_t keys = std::min<int64_t>(p.n_k, p.q_pos0 + i0 + rows - 1 - p.k0 + 1);
  if (keys <= 0) return;
  const int rv = (rows + 15) / 16, n_dp = lo.dqp / 2, n_qk = lo.dqp / 32, n_dt = p.d_v / 16;
  // qt[dp][r] = (q[r][2dp], q[r][2dp + 1]); rows past `rows` and dims past dq are zero
  alignas(64) uint16_t qrow[1024];
  CHECK(lo.dqp <= 1024);
  for (int r = 0; r < kRows; ++r) {
    if (r < rows) {
      to_bf16(p.q + ((i0 + r) * p.heads + h) * lo.dq, lo.dq, qrow);
      std::fill(qrow + lo.dq, qrow + lo.dqp, uint16_t{0});
    } else {
      std::fill(qrow, qrow + lo.dqp, uint16_t{0});
    }
    uint32_t w;
    for (int dp = 0; dp < n_dp; ++dp) {
      std::memcpy(&w, qrow + 2 * dp, 4);
      qt[dp * kRows + r] = w;
    }
  }
  alignas(64) float m[kRows], l[kRows], alpha[kRows] = {};
  alignas(64) int32_t pos[kRows];
  for (int r = 0; r < kRows; ++r) {
    const bool real = r < rows;
    m[r] = real ? p.m[(i0 + r) * p.heads + h] : 0.0f;
    l[r] = real ? p.l[(i0 + r) * p.heads + h] : 0.0f;
    pos[r] = static_cast<int32_t>(p.q_pos0 + i0 + r);
    float* a = acc + int64_t{r} * p.d_v;
    if (real) {
      std::memcpy(a, p.acc + ((i0 + r) * p.heads + h) * p.d_v, static_cast<size_t>(p.d_v) * 4);
    } else {
      std::fill(a, a + p.d_v, 0.0f);
    }
  }
  const int64_t ks = int64_t{lo.dqp} * 2, vs = int64_t{p.d_v} * 4, as = int64_t{p.d_v} * 4;
  for (int64_t j0 = 0; j0 < keys; j0 += kKeys) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, keys - j0));
    const int n_kt = (nk + 15) / 16;
    // QK: C 0-3 = (key tiles kt, kt + 1) x (row tiles 0, 1)
    for (int kt = 0; kt < n_kt; kt += 2) {
      const bool k2 = kt + 1 < n_kt, r2 = rv == 2;
      const uint16_t* k0p = kb + (j0 + kt * 16) * lo.dqp;
      const uint16_t* k1p = k0p + 16 * lo.dqp;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int s = 0; s < n_qk; ++s) {
        const uint32_t* qs = qt + s * 16 * kRows;
        _tile_loadd(4, k0p + s * 32, ks);
        _tile_loadd(6, qs, kRows * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (k2) {
          _tile_loadd(5, k1p + s * 32, ks);
          _tile_dpbf16ps(1, 5, 6);
        }
        if (r2) {
          _tile_loadd(7, qs + 16, kRows * 4);
          _tile_dpbf16ps(2, 4, 7);
          if (k2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      float* s0 = sc.st + kt * 16 * kRows;
      _tile_stored(0, s0, kRows * 4);
      if (k2) _tile_stored(1, s0 + 16 * kRows, kRows * 4);
      if (r2) _tile_stored(2, s0 + 16, kRows * 4);
      if (k2 && r2) _tile_stored(3, s0 + 16 * kRows + 16, kRows * 4);
    }
    attention_softmax_exp(sc.st, nk, rv, pos, m, alpha, p.k0 + j0, p.scale);
    for (int j = 0; j < nk; ++j) {  // P as the bf16 values PV multiplies
      for (int v = 0; v < 2; ++v) {
        float* s = sc.st + j * kRows + 16 * v;
        _mm512_store_ps(s, _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_load_ps(s))));
      }
    }
    attention_softmax_sum(sc.st, nk, rv, alpha, l);
    // rows whose max moved: acc *= alpha
    for (int v = 0; v < rv; ++v) {
      const __mmask16 moved =
          _mm512_cmp_ps_mask(_mm512_load_ps(alpha + 16 * v), _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
      for (uint32_t mk = moved; mk != 0; mk &= mk - 1) {
        const int r = 16 * v + __builtin_ctz(mk);
        float* a = acc + int64_t{r} * p.d_v;
        const __m512 al = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < p.d_v; c += 16)
          _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), al));
      }
    }
    for (int rt = 0; rt < rv; ++rt) transpose_p(sc.st, nk, rt, sc.pt[rt]);
    // PV: C 0-3 = (row tiles 0, 1) x (column tiles dt, dt + 1)
    const int n_pk = (nk + 31) / 32;
    const uint16_t* vj = vp + (j0 / 2) * p.d_v * 2;
    for (int dt = 0; dt < n_dt; dt += 2) {
      const bool d2 = dt + 1 < n_dt, r2 = rv == 2;
      float* a0 = acc + dt * 16;
      float* a1 = acc + 16 * p.d_v + dt * 16;
      _tile_loadd(0, a0, as);
      if (d2) _tile_loadd(1, a0 + 16, as);
      if (r2) _tile_loadd(2, a1, as);
      if (r2 && d2) _tile_loadd(3, a1 + 16, as);
      for (int s = 0; s < n_pk; ++s) {
        const uint16_t* vb = vj + (s * 16 * p.d_v + dt * 16) * 2;
        _tile_loadd(6, vb, vs);
        _tile_loadd(4, sc.pt[0] + s * 32, kKeys * 2);
        _tile_dpbf16ps(0, 4, 6);
        if (d2) {
          _tile_loadd(7, vb + 32, vs);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (r2) {
          _tile_loadd(5, sc.pt[1] + s * 32, kKeys * 2);
          _tile_dpbf16ps(2, 5, 6);
          if (d2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, a0, as);
      if (d2) _tile_stored(1, a0 + 16, as);
      if (r2) _tile_stored(2, a1, as);
      if (r2 && d2) _tile_stored(3, a1 + 16, as);
    }
  }
  for (int r = 0; r < rows; ++r) {
    p.m[(i0 + r) * p.heads + h] = m[r];
    p.l[(i0 + r) * p.heads + h] = l[r];
    std::memcpy(p.acc + ((i0 + r) * p.heads + h) * p.d_v, acc + int64_t{r} * p.d_v,
                static_cast<size_t>(p.d_v) * 4);
  }
}

}  // namespace

bool prefill_attention_amx_ok(const PrefillAttentionParams& p) {
  return p.d_v % 16 == 0 && p.d_nope + p.d_rope <= 1024;
}

void prefill_attention_amx(const PrefillAttentionParams& p, ThreadPool& pool) {
  const Layout lo = layout_of(p);
  // K and V of every head for this key block: grow-only, on the calling thread (the pool's tasks
  // only read them while this call waits).
  thread_local Buffer kv_buf;
  const size_t bytes = static_cast<size_t>((lo.k_head + lo.v_head) * p.heads) * 2;
  if (kv_buf.size() < bytes) kv_buf = Buffer::allocate(bytes);
  uint16_t* kb = reinterpret_cast<uint16_t*>(kv_buf.data());
  uint16_t* vp = kb + lo.k_head * p.heads;
  pool.run(p.heads, [&](int64_t h, int) {
    convert_head(p, lo, static_cast<int>(h), kb + h * lo.k_head, vp + h * lo.v_head);
  });
  const int64_t q_tiles = (p.n_q + kRows - 1) / kRows;
  pool.run(p.heads * q_tiles, [&](int64_t task, int) {
    const int h = static_cast<int>(task / q_tiles);
    const int64_t i0 = (task % q_tiles) * kRows;
    const int rows = static_cast<int>(std::min<int64_t>(kRows, p.n_q - i0));
    thread_local Buffer scratch;
    const size_t qt_bytes = static_cast<size_t>(lo.dqp / 2) * kRows * 4;
    const size_t acc_bytes = static_cast<size_t>(kRows) * static_cast<size_t>(p.d_v) * 4;
    const size_t need = sizeof(Scratch) + qt_bytes + acc_bytes;
    if (scratch.size() < need) scratch = Buffer::allocate(need);
    Scratch& sc = *reinterpret_cast<Scratch*>(scratch.data());
    auto* qt = reinterpret_cast<uint32_t*>(scratch.data() + sizeof(Scratch));
    auto* acc = reinterpret_cast<float*>(scratch.data() + sizeof(Scratch) + qt_bytes);
    amx::configure_full_tiles();
    attend_rows(p, lo, h, i0, rows, kb + h * lo.k_head, vp + h * lo.v_head, qt, acc, sc);
    _tile_release();
  });
}

}  // namespace fathom::internal
