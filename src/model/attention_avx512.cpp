// AVX-512 inner loop of prefill attention, register-blocked like a GEMM. For up to 32 query rows
// of one head and 64 keys at a time:
//   QK:  S^T[j][r] with lanes = rows: the queries are transposed once per call (qt[d][32]), each
//        key value is broadcast, and one tile of 8 keys x 2 row vectors keeps 16 accumulators
//        (2 loads + 8 broadcasts per 16 FMAs).
//   softmax: lanes = rows again, so row maxima and sums are vertical; one rescale of the
//        accumulators per 64 keys.
//   PV:  lanes = output columns: 4 rows x 64 columns of accumulators, one V row load per 4
//        columns and one broadcast of P per row (8 loads per 16 FMAs).
// The scalar reference is prefill_attention_rows_scalar (attention.cpp).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <limits>

#include "kernels/ops.h"
#include "model/attention.h"
#include "model/attention_softmax_impl.h"
#include "tensor/tensor.h"

namespace fathom::internal {
namespace {

constexpr int kRows = kAttnRows;
constexpr int kKeys = kAttnKeys;
constexpr int kQkKeys = 8;

struct Block {
  const PrefillAttentionParams* p;
  int h;
  int64_t i0;  // first row
  int rows;    // <= kRows
  const float* qt;  // [dq][kRows]
  float* st;        // [kKeys][kRows]
};

const float* key_nope(const PrefillAttentionParams& p, int h, int64_t j) {
  return p.k_nope + j * p.heads * p.d_nope + int64_t{h} * p.d_nope;
}

// S^T for keys [j0, j0 + nk) of the block (nk <= kQkKeys; missing keys repeat the first).
template <int RV>
void qk_tile(const Block& b, int64_t j0, int nk, float* st) {
  const PrefillAttentionParams& p = *b.p;
  const float* kn[kQkKeys];
  const float* kp[kQkKeys];
  for (int j = 0; j < kQkKeys; ++j) {
    const int64_t jj = j0 + (j < nk ? j : 0);
    kn[j] = key_nope(p, b.h, jj);
    kp[j] = p.k_pe + jj * p.k_pe_stride;
  }
  __m512 acc[kQkKeys][RV];
#pragma GCC unroll 8
  for (int j = 0; j < kQkKeys; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < RV; ++v) acc[j][v] = _mm512_setzero_ps();
  auto run = [&](const float* const* keys, int d_begin, int d_end) {
    for (int d = d_begin; d < d_end; ++d) {
      __m512 q[RV];
#pragma GCC unroll 2
      for (int v = 0; v < RV; ++v) q[v] = _mm512_load_ps(b.qt + int64_t{d} * kRows + 16 * v);
      const int kd = d - d_begin;
#pragma GCC unroll 8
      for (int j = 0; j < kQkKeys; ++j) {
        const __m512 k = _mm512_set1_ps(keys[j][kd]);
#pragma GCC unroll 2
        for (int v = 0; v < RV; ++v) acc[j][v] = _mm512_fmadd_ps(q[v], k, acc[j][v]);
      }
    }
  };
  run(kn, 0, p.d_nope);
  run(kp, p.d_nope, p.d_nope + p.d_rope);
#pragma GCC unroll 8
  for (int j = 0; j < kQkKeys; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < RV; ++v) _mm512_store_ps(st + j * kRows + 16 * v, acc[j][v]);
}

// acc rows [r0, r0 + NR), columns [c0, c0 + 16 NC): acc = acc * alpha + P V over nk keys.
template <int NR, int NC>
void pv_tile(const Block& b, int64_t j0, int nk, int r0, int c0, const float* alpha) {
  const PrefillAttentionParams& p = *b.p;
  __m512 acc[NR][NC];
  float* out[NR];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    out[r] = p.acc + ((b.i0 + r0 + r) * p.heads + b.h) * p.d_v + c0;
    const __m512 a = _mm512_set1_ps(alpha[r0 + r]);
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(out[r] + 16 * c), a);
  }
  const int64_t v_stride = int64_t{p.heads} * p.d_v;
  const float* v = p.v + j0 * v_stride + int64_t{b.h} * p.d_v + c0;
  for (int j = 0; j < nk; ++j, v += v_stride) {
    __m512 vv[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_ps(v + 16 * c);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(b.st[j * kRows + r0 + r]);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}

using PvFn = void (*)(const Block&, int64_t, int, int, int, const float*);
template <int NR>
constexpr std::array<PvFn, 4> pv_row() {
  return {&pv_tile<NR, 1>, &pv_tile<NR, 2>, &pv_tile<NR, 3>, &pv_tile<NR, 4>};
}
constexpr std::array<std::array<PvFn, 4>, 4> kPv = {pv_row<1>(), pv_row<2>(), pv_row<3>(), pv_row<4>()};

void attend_block(const Block& b, int64_t keys) {
  const PrefillAttentionParams& p = *b.p;
  const int rv = (b.rows + 15) / 16;
  // Row state in lanes; padding lanes start at m = 0, l = 0 and are never stored.
  alignas(64) float m[kRows], l[kRows], alpha[kRows] = {};
  alignas(64) int32_t pos[kRows];
  for (int r = 0; r < kRows; ++r) {
    const bool real = r < b.rows;
    m[r] = real ? p.m[(b.i0 + r) * p.heads + b.h] : 0.0f;
    l[r] = real ? p.l[(b.i0 + r) * p.heads + b.h] : 0.0f;
    pos[r] = static_cast<int32_t>(p.q_pos0 + b.i0 + r);
  }
  for (int64_t j0 = 0; j0 < keys; j0 += kKeys) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, keys - j0));
    for (int j = 0; j < nk; j += kQkKeys) {
      const int n = std::min(kQkKeys, nk - j);
      if (rv == 1) {
        qk_tile<1>(b, j0 + j, n, b.st + j * kRows);
      } else {
        qk_tile<2>(b, j0 + j, n, b.st + j * kRows);
      }
    }
    attention_softmax_exp(b.st, nk, rv, pos, m, alpha, p.k0 + j0, p.scale);
    attention_softmax_sum(b.st, nk, rv, alpha, l);
    const int n_cb = p.d_v / 16;
    for (int r0 = 0; r0 < b.rows; r0 += 4) {
      const int nr = std::min(4, b.rows - r0);
      for (int cb = 0; cb < n_cb; cb += 4) {
        const int nc = std::min(4, n_cb - cb);
        kPv[static_cast<size_t>(nr - 1)][static_cast<size_t>(nc - 1)](b, j0, nk, r0, cb * 16, alpha);
      }
    }
  }
  for (int r = 0; r < b.rows; ++r) {
    p.m[(b.i0 + r) * p.heads + b.h] = m[r];
    p.l[(b.i0 + r) * p.heads + b.h] = l[r];
  }
}

}  // namespace

void prefill_attention_rows_avx512(const PrefillAttentionParams& p, int h, int64_t q_begin, int64_t q_end) {
  const int dq = p.d_nope + p.d_rope;
  // The transposed queries (64-byte aligned, as the loads above need): grow-only per thread.
  thread_local Buffer qt_buf;
  const size_t qt_bytes = static_cast<size_t>(dq) * kRows * sizeof(float);
  if (qt_buf.size() < qt_bytes) qt_buf = Buffer::allocate(qt_bytes);
  float* qt = qt_buf.as<float>();
  alignas(64) float st[kKeys * kRows];
  for (int64_t i0 = q_begin; i0 < q_end; i0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, q_end - i0));
    // Keys up to the block's last row; none for a block entirely before this key block.
    const int64_t keys = std::min<int64_t>(p.n_k, p.q_pos0 + i0 + rows - 1 - p.k0 + 1);
    if (keys <= 0) continue;
    for (int d = 0; d < dq; ++d)
      for (int r = 0; r < kRows; ++r)
        qt[int64_t{d} * kRows + r] = r < rows ? p.q[((i0 + r) * p.heads + h) * dq + d] : 0.0f;
    attend_block(Block{&p, h, i0, rows, qt, st}, keys);
  }
}

}  // namespace fathom::internal
