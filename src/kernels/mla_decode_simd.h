// Shared SIMD machinery of the MLA decode segment kernels: vector traits (AVX-512F, AVX2), the
// register-tile dispatcher, the online-softmax page step and the segment driver, all templates.
// Included only by mla_decode_avx2.cpp, mla_decode_avx512.cpp and mla_decode_avx512bf16.cpp,
// which are compiled with different -m flags: everything here sits in an anonymous namespace so
// each of them gets its own copy (no ODR sharing of code built for a wider ISA).
//
// The data flow of one page (T tokens, R = s_q*heads rows, W lanes, lanes hold rows):
//   S[t][r] = q_r . k_t          (Isa::qk: register tiles of tokens x row-vectors)
//   online softmax over S in place (f32, log2 domain; masked keys skipped, never multiplied)
//   O[r][:] = alpha_r O[r][:] + sum_t P[t][r] v_t   (Isa::pv: register tiles of rows x columns)
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "base/check.h"
#include "kernels/mla_decode_impl.h"

namespace fathom::internal {
namespace {  // NOLINT(build/namespaces): one private copy per ISA translation unit

constexpr float kMlaLog2e = 1.4426950408889634f;
constexpr float kMlaLn2 = 0.6931471805599453f;
constexpr float kMlaNegInf = -std::numeric_limits<float>::infinity();

inline uint32_t mla_load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float mla_load_f32(const void* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float mla_bf16_scalar(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// Cephes exp2f polynomial: 2^f = 1 + f*P(f) on [-0.5, 0.5], relative error ~2e-7.
template <class V>
typename V::F mla_exp2_poly(typename V::F f) {
  auto p = V::set1(1.535336188319500e-4f);
  p = V::fmadd(p, f, V::set1(1.339887440266574e-3f));
  p = V::fmadd(p, f, V::set1(9.618437357674640e-3f));
  p = V::fmadd(p, f, V::set1(5.550332471162809e-2f));
  p = V::fmadd(p, f, V::set1(2.402264791363012e-1f));
  p = V::fmadd(p, f, V::set1(6.931472028550421e-1f));
  return V::fmadd(p, f, V::set1(1.0f));
}

#if defined(__AVX512F__)
struct V512 {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  // x where key index t is visible to the lane's row (t <= lim), else -inf.
  static F mask_after(F x, int64_t t, const int32_t* lim) {
    const __mmask16 hidden =
        _mm512_cmplt_epi32_mask(_mm512_loadu_si512(lim), _mm512_set1_epi32(static_cast<int>(t)));
    return _mm512_mask_mov_ps(x, hidden, set1(kMlaNegInf));
  }
  static F zero_if_neg_inf(F x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(kMlaNegInf), _CMP_NEQ_UQ), x);
  }
  // 2^x for x <= 0; exactly 0 below 2^-126 (and for -inf), never a subnormal.
  static F exp2(F x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, set1(-126.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(set1(-127.0f), x);
    const F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F r = _mm512_scalef_ps(mla_exp2_poly<V512>(sub(x, n)), n);
    return _mm512_maskz_mov_ps(keep, r);
  }
  // Rounds non-negative finite values to the nearest bf16 (ties to even), kept in f32.
  static F round_bf16(F x) {
    __m512i b = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // 16 e4m3 bytes -> f32 exactly (via the f16 bit pattern, then x256), times `scale`.
  static F e4m3x(const uint8_t* src, F scale) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
    return mul(mul(_mm512_cvtph_ps(h), set1(256.0f)), scale);
  }
  static F bf16x(const uint16_t* src) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
};
#endif

#if defined(__AVX2__)
struct V256 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F mask_after(F x, int64_t t, const int32_t* lim) {
    const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lim));
    const __m256i hidden = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(t)), l);
    return _mm256_blendv_ps(x, set1(kMlaNegInf), _mm256_castsi256_ps(hidden));
  }
  static F zero_if_neg_inf(F x) { return _mm256_and_ps(x, _mm256_cmp_ps(x, set1(kMlaNegInf), _CMP_NEQ_UQ)); }
  static F exp2(F x) {
    const F keep = _mm256_cmp_ps(x, set1(-126.0f), _CMP_NLT_UQ);
    x = _mm256_max_ps(set1(-126.0f), x);
    const F n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(mul(mla_exp2_poly<V256>(sub(x, n)), _mm256_castsi256_ps(e)), keep);
  }
  static F round_bf16(F x) {
    __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static F e4m3x(const uint8_t* src, F scale) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
    return mul(mul(_mm256_cvtph_ps(h), set1(256.0f)), scale);
  }
  static F bf16x(const uint16_t* src) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};
#endif

// Runs Tile<M, N>::run(m0, n0, ctx) over an m_total x n_total grid of register tiles: columns of
// NMAX tiles outer (so the operand they share stays in L1), tiles of m_step[n-1] rows inner.
template <template <int, int> class Tile, int MMAX, int NMAX, class Ctx>
struct MlaTiler {
  using Fn = void (*)(int, int, const Ctx&);
  template <int N, int... Ms>
  static constexpr std::array<Fn, MMAX> row(std::integer_sequence<int, Ms...>) {
    return {{&Tile<Ms + 1, N>::run...}};
  }
  template <int... Ns>
  static constexpr std::array<std::array<Fn, MMAX>, NMAX> make(std::integer_sequence<int, Ns...>) {
    return {{row<Ns + 1>(std::make_integer_sequence<int, MMAX>{})...}};
  }
  static void run(int m_total, int n_total, const std::array<int, NMAX>& m_step, const Ctx& ctx) {
    static constexpr auto kTable = make(std::make_integer_sequence<int, NMAX>{});
    for (int n0 = 0; n0 < n_total; n0 += NMAX) {
      const int nn = std::min(NMAX, n_total - n0);
      const int step = m_step[static_cast<size_t>(nn - 1)];
      for (int m0 = 0; m0 < m_total; m0 += step) {
        const int mm = std::min(step, m_total - m0);
        kTable[static_cast<size_t>(nn - 1)][static_cast<size_t>(mm - 1)](m0, n0, ctx);
      }
    }
  }
};

// Tokens of the current page as the GEMMs read them. `next` is the segment's next page as stored
// (rows of next_stride bytes), for QK to prefetch a slice of it with each slice it reads: a page
// read only once streams from DRAM, and rows of ~1 KiB, 64 at a time in a random page order, are
// too short for the hardware prefetcher to run ahead of the FMAs. An fp8 page is converted in one
// short pass and then read by QK from the copy, so QK prefetches for the conversion too.
struct MlaRows {
  const uint8_t* ptr = nullptr;
  int64_t stride = 0;  // bytes between tokens
  const uint8_t* next = nullptr;
  int64_t next_stride = 0;  // bytes between the next page's tokens (its row length: all are fetched)
  // An fp8 page on the bf16 path whose latent is not converted yet (null otherwise): QK converts
  // it into the rows at ptr as it reads it and reads the RoPE part from the page as stored
  // (mla_decode_avx512bf16.cpp). fp8_bias: per token and scale group, the exponent rebase.
  const uint8_t* fp8 = nullptr;
  const uint32_t* fp8_bias = nullptr;
  const MlaKvFormat* fp8_format = nullptr;  // the page's layout
};

// Prefetches the bytes of token t of `next_page` (rows of `row_bytes`) while token t of the
// current page is converted; no-op for a null page.
inline void mla_prefetch_row(const uint8_t* next_page, int t, int64_t row_bytes) {
  if (next_page == nullptr) return;
  const uint8_t* row = next_page + t * row_bytes;
  for (int64_t b = 0; b < row_bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
}

// One page of online softmax over S (scores [nt][sstride], lanes = rows) in place: S becomes
// P = 2^(c*s - m_new) (0 for hidden keys), and m, l, alpha are updated per row. With kRoundP, P is
// rounded to bf16 before it is summed, so the sum matches the bf16 P the PV GEMM multiplies.
template <class V, bool kRoundP>
void mla_softmax_page(MlaScratch& s, int nt, int rb_count, int64_t sstride, int64_t t0, bool need_mask,
                      float c) {
  constexpr int W = V::kLanes;
  const auto vc = V::set1(c);
  for (int rb = 0; rb < rb_count; ++rb) {
    float* col = s.s + rb * W;
    const int32_t* lim = s.lim + rb * W;
    auto vmax = V::set1(kMlaNegInf);
    for (int t = 0; t < nt; ++t) {
      auto x = V::mul(V::load(col + t * sstride), vc);
      if (need_mask) x = V::mask_after(x, t0 + t, lim);
      V::store(col + t * sstride, x);
      vmax = V::max(vmax, x);
    }
    const auto m_old = V::load(s.m + rb * W);
    const auto m_new = V::max(m_old, vmax);
    const auto m_safe = V::zero_if_neg_inf(m_new);
    const auto alpha = V::exp2(V::sub(m_old, m_safe));
    auto sum = V::zero();
    for (int t = 0; t < nt; ++t) {
      auto pt = V::exp2(V::sub(V::load(col + t * sstride), m_safe));
      if constexpr (kRoundP) pt = V::round_bf16(pt);
      V::store(col + t * sstride, pt);
      sum = V::add(sum, pt);
    }
    V::store(s.l + rb * W, V::fmadd(V::load(s.l + rb * W), alpha, sum));
    V::store(s.m + rb * W, m_new);
    V::store(s.alpha + rb * W, alpha);
  }
}

// What a segment's page loops need: its shapes, the last key any row may see, and its pages.
struct MlaSegmentPages {
  const MlaDecodeParams& p;
  const MlaSegmentArgs& a;
  int R, D, dl, T, rb_count;
  int64_t sstride, L, lim_min, lim_max;
  float c;  // softmax scale in log2 units

  const uint8_t* data(int64_t page) const {
    return p.cache.data + p.block_table[a.seq * p.max_pages + page] * p.cache.page_stride_bytes;
  }
  // The page after `page` when it holds a key some row may see, else null (`page` is the last).
  const uint8_t* next(int64_t page) const {
    const bool more = page + 1 < a.page_end && (page + 1) * T < std::min(L, lim_max + 1);
    return more ? data(page + 1) : nullptr;
  }
  // Keys of `page` some row may see (<= 0: none, the segment is done).
  int tokens(int64_t page) const {
    const int64_t t0 = page * T;
    return static_cast<int>(std::min({int64_t{T}, L - t0, lim_max - t0 + 1}));
  }
  bool need_mask(int64_t t0, int nt) const { return lim_min < t0 + nt - 1; }
};

// Page by page: load, QK, softmax, PV.
template <class Isa>
void mla_pages_each(const MlaSegmentPages& g, MlaScratch& s) {
  const MlaKvFormat& f = g.p.cache.format;
  for (int64_t page = g.a.page_begin; page < g.a.page_end; ++page) {
    const int64_t t0 = page * g.T;
    const int nt = g.tokens(page);
    if (nt <= 0) break;
    const MlaRows k = Isa::load_page(f, g.data(page), nt, s, g.next(page));
    Isa::qk(k, nt, g.rb_count, g.D, g.sstride, s);
    mla_softmax_page<typename Isa::V, Isa::kRoundP>(s, nt, g.rb_count, g.sstride, t0, g.need_mask(t0, nt),
                                                    g.c);
    Isa::pv(k, nt, g.R, g.dl, g.sstride, s);
  }
}

// Groups of consecutive pages (mla_group_pages where the rows fill Isa::kGroupMinRowBlocks row
// blocks, else groups of one): QK of each page into its rows of S, one softmax over the group's
// tokens (consecutive: only a segment's last page is short), one PV. QK's last argument is how
// many pages' PV follow it before the next page's QK (for the next page's prefetch).
template <class Isa>
void mla_pages_grouped(const MlaSegmentPages& g, MlaScratch& s) {
  const MlaKvFormat& f = g.p.cache.format;
  const int G = g.rb_count >= Isa::kGroupMinRowBlocks ? mla_group_pages(g.T) : 1;
  CHECK(G <= Isa::kMaxGroupPages);
  MlaRows ks[Isa::kMaxGroupPages];
  int nts[Isa::kMaxGroupPages];
  for (int64_t page = g.a.page_begin; page < g.a.page_end;) {
    const int64_t t0 = page * g.T;
    int n = 0, nt_all = 0;
    const uint8_t* next = nullptr;
    while (n < G) {
      const int nt = g.tokens(page);
      if (nt <= 0) break;
      next = g.next(page);
      const bool last = n + 1 == G || next == nullptr;
      ks[n] = Isa::load_page(f, g.data(page), nt, s, next, n);
      Isa::qk(ks[n], nt, g.rb_count, g.D, g.sstride, s, nt_all, last ? n + 1 : 0);
      nts[n++] = nt;
      nt_all += nt;
      ++page;
      if (last) break;
    }
    if (n == 0) break;
    mla_softmax_page<typename Isa::V, Isa::kRoundP>(s, nt_all, g.rb_count, g.sstride, t0,
                                                    g.need_mask(t0, nt_all), g.c);
    Isa::pv(ks, nts, n, g.R, g.dl, g.sstride, s);
    if (next == nullptr) break;
  }
}

// One segment: rows of sequence a.seq over pages [page_begin, page_end). Isa provides V, kRoundP,
// pack_q (once per segment), load_page (the page as token rows), qk (S for the page), pv (O
// update) and finish_row (O / l into the output row), or with kGroupsPages the grouped forms of
// load_page, qk and pv (mla_pages_grouped); see mla_decode_avx512bf16.cpp and MlaF32Isa below.
template <class Isa>
void mla_segment_simd(const MlaSegmentArgs& a, MlaScratch& s) {
  constexpr int W = Isa::V::kLanes;
  const MlaDecodeParams& p = *a.params;
  const MlaKvFormat& f = p.cache.format;
  const int R = p.s_q * p.heads, D = f.d_qk(), dl = f.d_latent;
  const int rb_count = (R + W - 1) / W;
  const int64_t sstride = int64_t{rb_count} * W;
  const int64_t L = p.cache_seqlens[a.seq];
  int64_t lim_min = std::numeric_limits<int32_t>::max(), lim_max = -1;
  for (int r = 0; r < sstride; ++r) {
    int64_t lim = std::numeric_limits<int32_t>::max();  // padding lanes see everything (never output)
    if (r < R) {
      lim = p.causal ? L - p.s_q + r / p.heads : L - 1;
      lim_min = std::min(lim_min, lim);
      lim_max = std::max(lim_max, lim);
    }
    s.lim[r] = static_cast<int32_t>(std::max<int64_t>(lim, -1));
    s.m[r] = kMlaNegInf;
    s.l[r] = 0;
  }
  std::fill(s.o, s.o + int64_t{R} * dl, 0.0f);
  Isa::pack_q(p.q + a.seq * int64_t{R} * D, R, D, s);
  const MlaSegmentPages pages{p, a, R, D, dl, f.page_tokens, rb_count, sstride, L, lim_min, lim_max,
                              p.softmax_scale * kMlaLog2e};
  if constexpr (requires { Isa::kGroupsPages; }) {
    mla_pages_grouped<Isa>(pages, s);
  } else {
    mla_pages_each<Isa>(pages, s);
  }
  for (int r = 0; r < R; ++r) {
    const float l = s.l[r], inv = l > 0 ? 1.0f / l : 0.0f;
    const float* o = s.o + int64_t{r} * dl;
    Isa::finish_row(o, inv, dl, a.out + int64_t{r} * dl);
    a.lse[r] = l > 0 ? (s.m[r] + std::log2(l)) * kMlaLn2 : kMlaNegInf;
  }
}

// ---- The f32 path (AVX-512F, AVX2): widen each page to f32, FMAs with broadcast operands. ----

// Query packed as q[rb][d][W]: lanes are rows, so a broadcast key value meets W rows at once.
template <class V>
void mla_f32_pack_q(const float* q, int R, int D, MlaScratch& s) {
  constexpr int W = V::kLanes;
  const int rb_count = (R + W - 1) / W;
  if (R % W != 0) std::fill(s.q + int64_t{rb_count - 1} * D * W, s.q + int64_t{rb_count} * D * W, 0.0f);
  for (int r = 0; r < R; ++r) {
    float* dst = s.q + int64_t{r / W} * D * W + r % W;
    const float* src = q + int64_t{r} * D;
    for (int d = 0; d < D; ++d) dst[int64_t{d} * W] = src[d];
  }
}

// The page as f32 [nt][D] in s.k: bf16 widened, fp8 dequantised (exact in both cases).
template <class V>
MlaRows mla_f32_load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s,
                          const uint8_t* next) {
  constexpr int W = V::kLanes;
  const int D = f.d_qk(), dl = f.d_latent;
  float* kf = reinterpret_cast<float*>(s.k);
  for (int t = 0; t < nt; ++t) {
    const uint8_t* src = page + t * f.token_bytes();
    float* dst = kf + int64_t{t} * D;
    mla_prefetch_row(next, t, f.token_bytes());
    if (f.dtype == MlaKvDType::kBF16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
      int d = 0;
      for (; d + W <= D; d += W) V::store(dst + d, V::bf16x(h + d));
      for (; d < D; ++d) dst[d] = mla_bf16_scalar(h[d]);
      continue;
    }
    for (int g = 0; g < f.n_scale_groups(); ++g) {
      const auto scale = V::set1(mla_load_f32(src + f.scales_offset() + 4 * g));
      const int end = std::min(dl, (g + 1) * kMlaFp8GroupSize);
      for (int d = g * kMlaFp8GroupSize; d < end; d += W) V::store(dst + d, V::e4m3x(src + d, scale));
    }
    const uint16_t* rope = reinterpret_cast<const uint16_t*>(src + f.rope_offset());
    for (int d = 0; d < f.d_rope; ++d) dst[dl + d] = mla_bf16_scalar(rope[d]);
  }
  return {s.k, int64_t{D} * 4};
}

// Register tiles of the f32 path. QK: M tokens x N row-vectors, over d. PV: M rows x N column
// vectors, over the page's tokens, then O = alpha * O + tile. Tiles too large for the register
// file are never dispatched (m_step keeps M*N within it).
template <class V>
struct MlaF32Kernels {
  using F = typename V::F;
  static constexpr int W = V::kLanes;
  struct QkCtx {
    const float* k;  // [nt][D]
    const float* q;  // [rb][D][W]
    float* s;        // [nt][sstride]
    int64_t D, sstride;
  };
  struct PvCtx {
    const float* k;      // [nt][D]; V is the first dl columns
    const float* s;      // P [nt][sstride]
    const float* alpha;  // [rows]
    float* o;            // [rows][dl]
    int64_t D, sstride, dl;
    int nt;
  };
  template <int M, int N>
  struct Qk {
    static void run(int t0, int rb0, const QkCtx& c) {
      if constexpr (M * N > 28) {
        __builtin_trap();
      } else {
        F acc[M][N];
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) acc[i][j] = V::zero();
        const float* k = c.k + t0 * c.D;
        const float* q = c.q + rb0 * c.D * W;
        for (int64_t d = 0; d < c.D; ++d) {
          F b[N];
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) b[j] = V::load(q + (j * c.D + d) * W);
#pragma GCC unroll 32
          for (int i = 0; i < M; ++i) {
            const F a = V::set1(k[i * c.D + d]);
#pragma GCC unroll 32
            for (int j = 0; j < N; ++j) acc[i][j] = V::fmadd(a, b[j], acc[i][j]);
          }
        }
        float* s = c.s + t0 * c.sstride + rb0 * W;
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) V::store(s + i * c.sstride + j * W, acc[i][j]);
      }
    }
  };
  template <int M, int N>
  struct Pv {
    static void run(int r0, int cb0, const PvCtx& c) {
      if constexpr (M * N > 28) {
        __builtin_trap();
      } else {
        F acc[M][N];
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) acc[i][j] = V::zero();
        const float* v = c.k + cb0 * W;
        const float* pcol = c.s + r0;
        for (int t = 0; t < c.nt; ++t) {
          F b[N];
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) b[j] = V::load(v + t * c.D + j * W);
#pragma GCC unroll 32
          for (int i = 0; i < M; ++i) {
            const F a = V::set1(pcol[t * c.sstride + i]);
#pragma GCC unroll 32
            for (int j = 0; j < N; ++j) acc[i][j] = V::fmadd(a, b[j], acc[i][j]);
          }
        }
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i) {
          const F al = V::set1(c.alpha[r0 + i]);
          float* o = c.o + (r0 + i) * c.dl + cb0 * W;
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) V::store(o + j * W, V::fmadd(V::load(o + j * W), al, acc[i][j]));
        }
      }
    }
  };
};

// The f32 path as an Isa for mla_segment_simd: tiles up to MMAX x NMAX holding at most kAcc
// accumulators (the register file less the operands).
template <class Vec, int MMAX, int NMAX, int kAcc>
struct MlaF32Isa {
  using V = Vec;
  using K = MlaF32Kernels<V>;
  static constexpr bool kRoundP = false;
  static constexpr std::array<int, NMAX> kStep = [] {
    std::array<int, NMAX> a{};
    for (int n = 1; n <= NMAX; ++n) a[static_cast<size_t>(n - 1)] = std::min(MMAX, kAcc / n);
    return a;
  }();
  static void pack_q(const float* q, int R, int D, MlaScratch& s) { mla_f32_pack_q<V>(q, R, D, s); }
  static void finish_row(const float* o, float inv, int dl, float* out) {
    for (int j = 0; j < dl; j += V::kLanes) V::store(out + j, V::mul(V::load(o + j), V::set1(inv)));
  }
  static MlaRows load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s,
                           const uint8_t* next) {
    return mla_f32_load_page<V>(f, page, nt, s, next);
  }
  static void qk(MlaRows k, int nt, int rb_count, int D, int64_t sstride, MlaScratch& s) {
    const typename K::QkCtx ctx{reinterpret_cast<const float*>(k.ptr), s.q, s.s, D, sstride};
    MlaTiler<K::template Qk, MMAX, NMAX, typename K::QkCtx>::run(nt, rb_count, kStep, ctx);
  }
  static void pv(MlaRows k, int nt, int R, int dl, int64_t sstride, MlaScratch& s) {
    const typename K::PvCtx ctx{
        reinterpret_cast<const float*>(k.ptr), s.s, s.alpha, s.o, k.stride / 4, sstride, dl, nt};
    MlaTiler<K::template Pv, MMAX, NMAX, typename K::PvCtx>::run(R, dl / V::kLanes, kStep, ctx);
  }
};

}  // namespace
}  // namespace fathom::internal
