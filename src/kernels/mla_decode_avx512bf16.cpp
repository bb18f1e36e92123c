// MLA decode segment, AVX-512 BF16 path: both GEMMs on vdpbf16ps (16 lanes x 2 products), f32
// accumulation, the online softmax from mla_decode_simd.h.
//
//   QK:  S[t][r] += (k[t][2i], k[t][2i+1]) . (q[r][2i], q[r][2i+1])   key pairs broadcast straight
//        from the bf16 cache (fp8 pages dequantised to bf16 rows, exactly, by the QK tiles as they
//        read them, or in a pass before QK where a scale is not a power of two); q packed once per
//        segment as qp[rb][i][16 rows], or for <= 16 rows as qq[group][quad][4 rows x 4 pairs]
//        so one 16-byte broadcast of 4 key pairs serves all rows.
//   PV:  O[r][c] += (p[2j][r], p[2j+1][r]) . (v[2j][c], v[2j+1][c])   p packed per page as
//        pp[j][r]; v interleaved in registers from token rows 2j and 2j+1 (PvRowsTile; the AMX
//        path packs it once per page as vp[block][j][16 columns x 2], bf16_pack_v).
// The query and P are rounded to bf16 (P before it is summed, so the normaliser matches). Not
// here: the softmax and the segment loop (mla_decode_simd.h), scheduling (mla_decode.cpp).
#include "kernels/amx_tiles.h"
#include "kernels/mla_decode_simd.h"

namespace fathom::internal {
namespace {

// bf16 round-to-nearest-even of a finite float (NaN is not expected in a query).
uint16_t bf16_rne(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// qp[rb][i][lane] = (bf16 q[r][2i], bf16 q[r][2i+1]) for r = 16*rb + lane; padding rows are zero.
void bf16_pack_q(const float* q, int R, int D, MlaScratch& s) {
  const int n_dp = D / 2, rb_count = (R + 15) / 16;
  uint32_t* qp = reinterpret_cast<uint32_t*>(s.q);
  if (R % 16 != 0) std::fill(qp + int64_t{rb_count - 1} * n_dp * 16, qp + int64_t{rb_count} * n_dp * 16, 0u);
  alignas(64) uint32_t pairs[16];
  for (int r = 0; r < R; ++r) {
    const float* src = q + int64_t{r} * D;
    uint32_t* dst = qp + int64_t{r / 16} * n_dp * 16 + r % 16;
    int i = 0;
    for (; 2 * i + 32 <= D; i += 16) {
      const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 2 * i + 16), _mm512_loadu_ps(src + 2 * i));
      _mm512_store_si512(pairs, (__m512i)b);
      for (int k = 0; k < 16; ++k) dst[int64_t{i + k} * 16] = pairs[k];
    }
    for (; i < n_dp; ++i) {
      dst[int64_t{i} * 16] = bf16_rne(src[2 * i]) | static_cast<uint32_t>(bf16_rne(src[2 * i + 1])) << 16;
    }
  }
}

// e4m3 times 2^k as bf16, exactly, 32 values in 16-bit lanes. The byte sign-extended to 16 bits
// holds the sign in bits 8-15 and the magnitude (eeee mmm) in bits 0-6: shifted left by 4 and
// masked with 0x87f0 it is the bf16 (s, 0000 eeee, mmm 0000), and adding (120 + k) << 7 rebases a
// normal e4m3's exponent (the sum stays below 0x8000, so no carry reaches the sign): four
// operations per 32 values and one broadcast per scale group. Zero and subnormals (eeee = 0)
// come from an 8-entry table of m * 2^(k-9) instead, off the common path (rare in a scaled cache:
// values below 2^-6 of their group's scale). Requires |k| <= 100 (no bf16 overflow or subnormal).
__attribute__((noinline)) __m512i fp8_pow2_tiny(__m512i v, __m512i x, __mmask32 tiny, int k) {
  // m * 2^(k-9) for m = 1..7 is 2^(k-9), 2^(k-8), 1.5*2^(k-8), 2^(k-7), 1.25, 1.5, 1.75 * 2^(k-7)
  const __m512i sub = _mm512_maskz_add_epi16(
      0xfe,
      _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                       120 << 7 | 0x60, 120 << 7 | 0x40, 120 << 7 | 0x20, 120 << 7, 119 << 7 | 0x40,
                       119 << 7, 118 << 7, 0),
      _mm512_set1_epi16(static_cast<int16_t>(k << 7)));
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7f));
  const __m512i sign = _mm512_and_si512(x, _mm512_set1_epi16(static_cast<int16_t>(0x8000)));
  return _mm512_mask_mov_epi16(v, tiny, _mm512_or_si512(_mm512_permutexvar_epi16(mag, sub), sign));
}

inline __m512i fp8_pow2_convert32(const uint8_t* src, __m512i bias, int k) {
  const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i v = _mm512_add_epi16(
      _mm512_and_si512(_mm512_slli_epi16(x, 4), _mm512_set1_epi16(static_cast<int16_t>(0x87f0))), bias);
  const __mmask32 tiny = _mm512_testn_epi16_mask(x, _mm512_set1_epi16(0x78));
  if (tiny != 0) [[unlikely]] return fp8_pow2_tiny(v, x, tiny, k);
  return v;
}

// Latent values [d, end) times any other scale (pages imported from elsewhere), or a tail shorter
// than 32: through f32, rounded to bf16.
__attribute__((noinline)) void dequant_group_f32(const uint8_t* src, float scale, int d, int end,
                                                 uint16_t* dst) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (; d < end; d += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d),
                        (__m256i)_mm512_cvtneps_pbh(V512::e4m3x(src + d, sc)));
  }
}

// The exponent k when `scale` is exactly 2^k with |k| <= 100 (what the cache writes), else -1000.
int pow2_exponent(float scale) {
  uint32_t b;
  std::memcpy(&b, &scale, 4);
  const int e = static_cast<int>(b >> 23);  // sign bit included: negative scales fail the range check
  return (b & 0x7fffffu) == 0 && e >= 27 && e <= 227 ? e - 127 : -1000;
}

// One fp8 scale group of latent values [begin, end) into bf16.
inline void dequant_group(const uint8_t* src, float scale, int begin, int end, uint16_t* dst) {
  const int k = pow2_exponent(scale);
  int d = begin;
  if (k != -1000) [[likely]] {
    const __m512i bias = _mm512_set1_epi16(static_cast<int16_t>((120 + k) << 7));
    for (; d + 32 <= end; d += 32) _mm512_storeu_si512(dst + d, fp8_pow2_convert32(src + d, bias, k));
    if (d == end) return;
  }
  dequant_group_f32(src, scale, d, end, dst);
}

// The 16-bit exponent rebase (120 + k) << 7 of a power-of-two scale 2^k in both halves of 32
// bits: one `vpaddd` with a broadcast operand adds it to 16-bit lanes (the sums never carry past
// 16 bits, see fp8_pow2_convert32).
constexpr int fp8_bias_exponent(uint32_t pair) {
  return static_cast<int>(pair & 0xffffu) / 128 - 120;
}

// An fp8 page's pass before a QK that converts its latent: each token's scale groups as bias
// pairs, bias[t * groups + g]. False when a scale is not a power of two in range (a page imported
// from elsewhere; the cache writes powers of two). Four groups per 128-bit step.
bool fp8_page_biases(const MlaKvFormat& f, const uint8_t* page, int nt, uint32_t* bias) {
  const int groups = f.n_scale_groups();
  __m128i bad = _mm_setzero_si128();
  for (int t = 0; t < nt; ++t) {
    const uint8_t* sc = page + t * f.token_bytes() + f.scales_offset();
    for (int g = 0; g < groups; g += 4) {
      const __mmask8 m = static_cast<__mmask8>(groups - g >= 4 ? 0xf : (1u << (groups - g)) - 1);
      const __m128i b = _mm_maskz_loadu_epi32(m, sc + 4 * g);
      // 2^k with |k| <= 100: mantissa zero, sign clear, biased exponent 27..227 (pow2_exponent)
      // (lanes past the last group are not checked)
      const __m128i e = _mm_srli_epi32(b, 23);
      __m128i lane = _mm_and_si128(b, _mm_set1_epi32(0x7fffff));
      lane = _mm_or_si128(lane, _mm_andnot_si128(_mm_cmpgt_epi32(e, _mm_set1_epi32(26)), _mm_set1_epi32(1)));
      lane = _mm_or_si128(lane, _mm_and_si128(_mm_cmpgt_epi32(e, _mm_set1_epi32(227)), _mm_set1_epi32(1)));
      bad = _mm_or_si128(bad, _mm_maskz_mov_epi32(m, lane));
      // (120 + e - 127) << 7 in each 16-bit half
      const __m128i h = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(7)), 7);
      _mm_mask_storeu_epi32(bias + t * groups + g, m, _mm_or_si128(h, _mm_slli_epi32(h, 16)));
    }
  }
  return _mm_test_all_zeros(bad, bad) != 0;
}

// fp8 tokens -> bf16 [nt][D] in s.k (slot `slot` of page_tokens rows, for a group of pages). With
// `defer` (one page per scratch), power-of-two scales leave the conversion to QK (MlaRows::fp8),
// the group biases in the scratch's second page of bf16 rows.
MlaRows bf16_load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s, const uint8_t* next,
                       int slot = 0, bool defer = false) {
  if (f.dtype == MlaKvDType::kBF16) return {page, f.token_bytes(), next, f.token_bytes()};
  const int D = f.d_qk(), dl = f.d_latent;
  uint16_t* kb = reinterpret_cast<uint16_t*>(s.k) + int64_t{slot} * f.page_tokens * D;
  if (defer && dl % 32 == 0) {
    auto* bias = reinterpret_cast<uint32_t*>(kb + int64_t{f.page_tokens} * D);
    if (fp8_page_biases(f, page, nt, bias)) {
      MlaRows rows{reinterpret_cast<const uint8_t*>(kb), int64_t{D} * 2, next, f.token_bytes()};
      rows.fp8 = page;
      rows.fp8_bias = bias;
      rows.fp8_format = &f;
      return rows;
    }
  }
  for (int t = 0; t < nt; ++t) {
    const uint8_t* src = page + t * f.token_bytes();
    uint16_t* dst = kb + int64_t{t} * D;
    for (int g = 0; g < f.n_scale_groups(); ++g) {
      dequant_group(src, mla_load_f32(src + f.scales_offset() + 4 * g), g * kMlaFp8GroupSize,
                    std::min(dl, (g + 1) * kMlaFp8GroupSize), dst);
    }
    std::memcpy(dst + dl, src + f.rope_offset(), size_t{2} * f.d_rope);
  }
  // QK reads the bf16 copy for longer than this conversion took: it prefetches the next page,
  // a line at a time between its FMAs rather than in one burst here.
  return {reinterpret_cast<const uint8_t*>(kb), int64_t{D} * 2, next, f.token_bytes()};
}

// Chunk ch (latent values [32 ch, 32 ch + 32)) of M fp8 token rows (f8_stride bytes apart) into
// bf16 rows kw (kstride values apart), zero and subnormals through fp8_pow2_convert32's table.
__attribute__((noinline)) void fp8_convert_chunk_exact(const uint8_t* f8, int64_t f8_stride,
                                                       const uint32_t* bias, int groups, int m, int ch,
                                                       uint16_t* kw, int64_t kstride) {
  for (int i = 0; i < m; ++i) {
    const uint32_t b = bias[i * groups + ch / 4];
    _mm512_storeu_si512(kw + i * kstride + 32 * ch,
                        fp8_pow2_convert32(f8 + i * f8_stride + 32 * ch,
                                           _mm512_set1_epi32(static_cast<int>(b)), fp8_bias_exponent(b)));
  }
}

// The same, the common case inline: fp8_pow2_convert32's four operations with the bias pair
// added by one `vpaddd` (a broadcast operand), and the tiny check of all M rows joined into one
// branch to the exact form. (Storing each row as two 256-bit halves, which a microbenchmark puts
// at less cost beside vdpbf16ps than one 512-bit store, measured 0.99x here.)
template <int M>
inline void fp8_convert_chunk(const uint8_t* f8, int64_t f8_stride, const uint32_t* bias, int groups, int ch,
                              uint16_t* kw, int64_t kstride) {
  __mmask32 tiny = 0;
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    const __m512i x = _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f8 + i * f8_stride + 32 * ch)));
    const __m512i v =
        _mm512_add_epi32(_mm512_and_si512(_mm512_slli_epi16(x, 4), _mm512_set1_epi32(0x87f087f0)),
                         _mm512_set1_epi32(static_cast<int>(bias[i * groups + ch / 4])));
    tiny |= _mm512_testn_epi16_mask(x, _mm512_set1_epi16(0x78));
    _mm512_storeu_si512(kw + i * kstride + 32 * ch, v);
  }
  if (tiny != 0) [[unlikely]]
    fp8_convert_chunk_exact(f8, f8_stride, bias, groups, M, ch, kw, kstride);
}

// An fp8 page whose latent the QK tiles convert as they read it (MlaRows::fp8): its rows, each
// token's group biases, the latent's 32-value chunks (16 d-pairs, 4 quads each), the offset of the
// RoPE part in a row (read from the page as stored) and the bf16 rows the latent goes to
// (MlaRows::ptr, writable: the scratch's), where PV reads it afterwards.
struct Fp8Source {
  const uint8_t* page = nullptr;
  int64_t stride = 0;
  const uint32_t* bias = nullptr;  // [token][group]
  int groups = 0, chunks = 0;
  int64_t rope = 0;
  uint16_t* kw = nullptr;
};

Fp8Source fp8_source(const MlaRows& k) {
  const MlaKvFormat& fmt = *k.fp8_format;
  Fp8Source f;
  f.page = k.fp8;
  f.stride = fmt.token_bytes();
  f.bias = k.fp8_bias;
  f.groups = fmt.n_scale_groups();
  f.chunks = fmt.d_latent / 32;
  f.rope = fmt.rope_offset();
  f.kw = const_cast<uint16_t*>(reinterpret_cast<const uint16_t*>(k.ptr));
  return f;
}

// A tile's M rows of an fp8 page from token t0: chunk by chunk into their bf16 rows.
template <int M>
struct Fp8TileRows {
  const uint8_t* f8;
  const uint32_t* bias;
  uint16_t* kw;
  int64_t stride, kstride;
  int groups;
  Fp8TileRows(const Fp8Source& f, int t0, int64_t k_stride)
      : f8(f.page + t0 * f.stride),
        bias(f.bias + t0 * f.groups),
        kw(f.kw + t0 * (k_stride / 2)),
        stride(f.stride),
        kstride(k_stride / 2),
        groups(f.groups) {}
  void convert(int ch) const { fp8_convert_chunk<M>(f8, stride, bias, groups, ch, kw, kstride); }
};

// The QK tiles' request for the next page: for step IDX of UNIT bytes per row, the line it starts
// (where that is a line's start below the row length STRIDE) of the tile's M rows of that page
// (PF: its row of token t0, or null), into L1. A macro so that the requests stay written out in
// each loop: moved into a lambda or an inline function, GCC 12 dropped them.
// clang-format off
#define MLA_PREFETCH_NEXT_LINE(PF, STRIDE, IDX, UNIT)                                                  \
  if ((PF) != nullptr && (IDX) % (64 / (UNIT)) == 0 && (IDX) * (UNIT) < (STRIDE)) {                   \
    _Pragma("GCC unroll 32") for (int i = 0; i < M; ++i)                                               \
      _mm_prefetch(reinterpret_cast<const char*>((PF) + i * (STRIDE) + (IDX) * (UNIT)), _MM_HINT_T0);  \
  }
// clang-format on

struct QkCtx {
  const uint8_t* k;     // token rows (bf16 pairs)
  int64_t k_stride;     // bytes
  const uint8_t* next;  // the next page to prefetch, or null
  int64_t next_stride;  // its row bytes
  const uint32_t* q;    // qp
  int64_t q_rb;         // n_dp * 16
  int n_dp;
  float* s;
  int64_t sstride;
  Fp8Source f8;  // QkF8Tile
};

// kF8: the latent comes from an fp8 page. The first column of tiles (rb0 == 0, which reads every
// token) converts it a 32-value chunk ahead of its products, as QkQuadTile does; later columns read
// the converted rows. The RoPE d-pairs are read from the page in every column.
template <int M, int N, bool kF8>
struct QkTile {
  static void run(int t0, int rb0, const QkCtx& c) {
    if constexpr (M * N > 28) {
      __builtin_trap();
    } else {
      __m512 acc[M][N];
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
      const uint8_t* k = c.k + t0 * c.k_stride;
      const uint32_t* q = c.q + rb0 * c.q_rb;
      // d-pair dp of the tile's rows, row 0's at `pair` and the others `stride` bytes apart
      auto step = [&](int dp, const uint8_t* pair, int64_t stride) {
        __m512bh b[N];
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) b[j] = (__m512bh)_mm512_loadu_si512(q + j * c.q_rb + dp * 16);
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(mla_load_u32(pair + i * stride)));
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
      };
      // The first column of tiles reads every token row once: it prefetches the same rows of
      // the next page, a cache line per 16 d-pairs until the row is covered.
      const uint8_t* pf = rb0 == 0 && c.next != nullptr ? c.next + t0 * c.next_stride : nullptr;
      int dp = 0, dp0 = 0;
      const uint8_t* rest = k;  // the rows of d-pairs dp0 .. n_dp
      int64_t rest_stride = c.k_stride;
      if constexpr (kF8) {
        const Fp8Source& f = c.f8;
        const Fp8TileRows<M> rows(f, t0, c.k_stride);
        if (rb0 == 0) {
          rows.convert(0);
          for (int ch = 0; ch < f.chunks; ++ch) {
            if (ch + 1 < f.chunks) rows.convert(ch + 1);
            for (const int end = dp + 16; dp < end; ++dp) {
              MLA_PREFETCH_NEXT_LINE(pf, c.next_stride, dp, 4)
              step(dp, k + dp * 4, c.k_stride);
            }
          }
        } else {
          for (; dp < 16 * f.chunks; ++dp) step(dp, k + dp * 4, c.k_stride);
        }
        rest = rows.f8 + f.rope;
        rest_stride = f.stride;
        dp0 = dp;
      }
      for (; dp < c.n_dp; ++dp) {
        MLA_PREFETCH_NEXT_LINE(pf, c.next_stride, dp, 4)
        step(dp, rest + (dp - dp0) * 4, rest_stride);
      }
      float* s = c.s + t0 * c.sstride + rb0 * 16;
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) _mm512_storeu_ps(s + i * c.sstride + j * 16, acc[i][j]);
    }
  }
};

// Two-parameter names for MlaTiler (its template template parameter takes two; clang does not
// match a template with a third parameter to it).
template <int M, int N>
using QkBf16Tile = QkTile<M, N, false>;
template <int M, int N>
using QkF8Tile = QkTile<M, N, true>;

// Few rows (s_q * heads <= 16): 16 lanes as 4 rows x 4 consecutive d-pairs, so one broadcast
// of 16 key bytes (4 d-pairs) feeds all 4 row groups and loads stop limiting the FMAs. Lanes of
// a group are summed when the tile is stored. qq[j][g][4 rr + k] = q pair (row 4j + rr, d-pair 4g + k).
struct QkQuadCtx {
  const uint8_t* k;
  int64_t k_stride;
  const uint8_t* next;  // as in QkCtx
  int64_t next_stride;
  const uint32_t* q;    // qq
  int64_t q_group;      // n_quads * 16
  int n_quads;          // full quads of d-pairs
  int tail;             // d-pairs left over (0..3), read with a masked load
  float* s;
  int64_t sstride;
  Fp8Source f8;  // QkQuadF8Tile
};

// Sums each group of 4 lanes of acc[j] into s[4j .. 4j+3].
template <int N>
void store_quad_sums(const __m512 (&acc)[N], float* s) {
  if constexpr (N == 4) {  // all 16 rows: a transposing reduction, 10 operations instead of 20
    // per 128-bit lane L: a = (x0[0]+x0[2], x1[0]+x1[2], x0[1]+x0[3], x1[1]+x1[3]), b likewise
    const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(acc[0], acc[1]), _mm512_unpackhi_ps(acc[0], acc[1]));
    const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(acc[2], acc[3]), _mm512_unpackhi_ps(acc[2], acc[3]));
    // lane 4L + j: the sum of group j's lane group L, i.e. row 4j + L
    const __m512 z =
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),
                      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(s, _mm512_permutexvar_ps(idx, z));
    return;
  }
  __m512 out = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int j = 0; j < N; ++j) {
    __m512 x = _mm512_add_ps(acc[j], _mm512_permute_ps(acc[j], 0xb1));  // (k0+k1, k1+k0, k2+k3, k3+k2)
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4e));                   // every lane: the group's sum
    // lane 4j + rr of out takes lane 4rr of x
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    out = _mm512_mask_permutexvar_ps(out, static_cast<__mmask16>(0xfu << (4 * j)), idx, x);
  }
  _mm512_storeu_ps(s, out);
}

// kF8: the tile converts its tokens' latent from the fp8 page a 32-value chunk (four quads) ahead
// of its products, so the conversion issues beside them rather than as a pass of its own, and
// reads the RoPE quads from the page. Each token is converted once: with one row block the tile's
// N covers every row group. PV then reads the converted rows.
template <int M, int N, bool kF8>
struct QkQuadTile {
  static void run(int t0, int j0, const QkQuadCtx& c) {
    if constexpr (M * N > 28 || N > 4) {
      __builtin_trap();
    } else {
      __m512 acc[M][N];
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
      const uint8_t* k = c.k + t0 * c.k_stride;
      const uint32_t* q = c.q + j0 * c.q_group;
      // Quad g of the tile's rows, row 0's at `quad` and the others `stride` bytes apart.
      auto step = [&](int g, const uint8_t* quad, int64_t stride, auto&& load_k) {
        __m512bh b[N];
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) b[j] = (__m512bh)_mm512_loadu_si512(q + j * c.q_group + g * 16);
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i) {
          const __m512bh a = (__m512bh)_mm512_broadcast_i32x4(load_k(quad + i * stride));
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
      };
      auto load16 = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
      // The same rows of the next page, a cache line per 4 quads until the row is covered.
      const uint8_t* pf = c.next != nullptr ? c.next + t0 * c.next_stride : nullptr;
      int g = 0;
      const uint8_t* rest = k;  // the rows of quads g0 .. n_quads (all of them in bf16 rows)
      int64_t rest_stride = c.k_stride;
      int g0 = 0;
      if constexpr (kF8) {
        const Fp8Source& f = c.f8;
        const Fp8TileRows<M> rows(f, t0, c.k_stride);
        rows.convert(0);
        for (int ch = 0; ch < f.chunks; ++ch) {
          if (ch + 1 < f.chunks) rows.convert(ch + 1);
          for (const int end = g + 4; g < end; ++g) {
            MLA_PREFETCH_NEXT_LINE(pf, c.next_stride, g, 16)
            step(g, k + g * 16, c.k_stride, load16);
          }
        }
        rest = rows.f8 + f.rope;
        rest_stride = f.stride;
        g0 = g;
      }
      for (; g < c.n_quads; ++g) {
        MLA_PREFETCH_NEXT_LINE(pf, c.next_stride, g, 16)
        step(g, rest + (g - g0) * 16, rest_stride, load16);
      }
      if (c.tail > 0) {  // the last d-pairs of the row: never read past it
        const __mmask8 m = static_cast<__mmask8>((1u << c.tail) - 1);
        step(c.n_quads, rest + (c.n_quads - g0) * 16, rest_stride,
             [m](const uint8_t* p) { return _mm_maskz_loadu_epi32(m, p); });
      }
      // With fewer than 4 groups the upper lanes are padding rows: stored as 0.
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i) store_quad_sums<N>(acc[i], c.s + (t0 + i) * c.sstride);
    }
  }
};
// Two-parameter names for MlaTiler, as for QkTile.
template <int M, int N>
using QkQuadBf16Tile = QkQuadTile<M, N, false>;
template <int M, int N>
using QkQuadF8Tile = QkQuadTile<M, N, true>;

// qq for R <= 16 rows: padding rows and d-pairs are zero.
void bf16_pack_q_quads(const float* q, int R, int D, MlaScratch& s) {
  const int n_dp = D / 2, n_quads = (n_dp + 3) / 4, n_groups = (R + 3) / 4;
  uint32_t* qq = reinterpret_cast<uint32_t*>(s.q);
  std::fill(qq, qq + int64_t{n_groups} * n_quads * 16, 0u);
  for (int r = 0; r < R; ++r) {
    const float* src = q + int64_t{r} * D;
    uint32_t* dst = qq + int64_t{r / 4} * n_quads * 16 + 4 * (r % 4);
    int i = 0;
    for (; 2 * i + 32 <= D; i += 16) {  // 16 d-pairs = 4 quads: four 16-byte stores
      const __m512i b =
          (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 2 * i + 16), _mm512_loadu_ps(src + 2 * i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i / 4) * 16), _mm512_extracti32x4_epi32(b, 0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i / 4 + 1) * 16), _mm512_extracti32x4_epi32(b, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i / 4 + 2) * 16), _mm512_extracti32x4_epi32(b, 2));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i / 4 + 3) * 16), _mm512_extracti32x4_epi32(b, 3));
    }
    for (; i < n_dp; ++i) {
      dst[(i / 4) * 16 + i % 4] = bf16_rne(src[2 * i]) | static_cast<uint32_t>(bf16_rne(src[2 * i + 1]))
                                                             << 16;
    }
  }
}

// 16 columns of token rows a and b (b null: zero) as (a[c], b[c]) pairs in column order: a last
// 16-column block of V, which the 32-column unpacks do not cover.
inline __m512i interleave16_in_order(const uint16_t* a, const uint16_t* b) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                      6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i va = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  const __m512i vb = b != nullptr
                         ? _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)))
                         : _mm512_setzero_si512();
  return _mm512_permutex2var_epi16(va, lo, vb);
}

// PV reading V from the token rows themselves (the bf16 page, or the fp8 page's bf16 copy): each
// step interleaves rows 2tp and 2tp+1 in registers, 32 columns per vpunpck{l,h}wd pair, in
// bf16_pack_v's column order. Stores, not shuffles, are what the products share their cycles with
// here (a 512-bit store costs about one cycle of vdpbf16ps issue on Zen 5, an unpack next to
// nothing), so a packed copy of V costs more than redoing the interleave in each row tile.
struct PvRowsCtx {
  const uint32_t* p;  // pp[tp][sstride]
  int64_t sstride;
  const uint8_t* k;  // token rows (bf16), V the first dl values
  int64_t k_stride;  // bytes
  int nt;
  const float* alpha;
  float* o;
  int64_t dl;
};

template <int M, int N>
struct PvRowsTile {
  static void run(int r0, int cb0, const PvRowsCtx& c) {
    if constexpr (M * N > 28) {
      __builtin_trap();
    } else {
      __m512 acc[M][N];
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i)
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
      const uint32_t* p = c.p + r0;
      const uint8_t* rows = c.k + cb0 * 32;
      // One token pair: rows ra and rb (rb null past the last token: zero).
      auto step = [&](const uint16_t* ra, const uint16_t* rb, int tp) {
        __m512bh b[N];
#pragma GCC unroll 4
        for (int j = 0; j + 2 <= N; j += 2) {
          const __m512i va = _mm512_loadu_si512(ra + j * 16);
          const __m512i vb = rb != nullptr ? _mm512_loadu_si512(rb + j * 16) : _mm512_setzero_si512();
          b[j] = (__m512bh)_mm512_unpacklo_epi16(va, vb);
          b[j + 1] = (__m512bh)_mm512_unpackhi_epi16(va, vb);
        }
        if constexpr (N % 2 == 1)  // a last 16-column block (d_latent % 32 == 16): in order
          b[N - 1] =
              (__m512bh)interleave16_in_order(ra + (N - 1) * 16, rb == nullptr ? nullptr : rb + (N - 1) * 16);
#pragma GCC unroll 32
        for (int i = 0; i < M; ++i) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[tp * c.sstride + i]));
#pragma GCC unroll 32
          for (int j = 0; j < N; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
      };
      const int full = c.nt / 2;
      for (int tp = 0; tp < full; ++tp) {
        const uint8_t* ra = rows + 2 * tp * c.k_stride;
        step(reinterpret_cast<const uint16_t*>(ra), reinterpret_cast<const uint16_t*>(ra + c.k_stride), tp);
      }
      if (c.nt % 2 != 0)
        step(reinterpret_cast<const uint16_t*>(rows + (c.nt - 1) * c.k_stride), nullptr, full);
#pragma GCC unroll 32
      for (int i = 0; i < M; ++i) {
        const __m512 al = _mm512_set1_ps(c.alpha[r0 + i]);
        float* o = c.o + (r0 + i) * c.dl + cb0 * 16;
#pragma GCC unroll 32
        for (int j = 0; j < N; ++j)
          _mm512_storeu_ps(o + j * 16, _mm512_fmadd_ps(_mm512_loadu_ps(o + j * 16), al, acc[i][j]));
      }
    }
  }
};

// Interleaves token rows 2tp and 2tp+1 for column blocks [cb0, cb0 + n_cb) (16 columns each) into
// vp[j][tp][32]: (v[2tp][c], v[2tp+1][c]) pairs. Whole 32-column chunks use vpunpck{l,h}wd, which
// interleave within 128-bit lanes, so their columns come out permuted (see bf16_finish_row) and
// finish_row restores it; a last 16-column block is interleaved in order. A missing odd row is
// zero, and so are pairs past nt (n_tp may be padded). A few blocks at a time (8 KiB) stay in L1
// while the PV tiles of every row read them. v_cb: elements between column blocks in vp (pairs of
// a whole group of pages, when vp points at one page's first pair within it).
void bf16_pack_v(MlaRows k, int nt, int cb0, int n_cb, int n_tp, uint16_t* vp, int64_t v_cb) {
  for (int tp = 0; tp < n_tp; ++tp) {
    if (2 * tp >= nt) {  // padding pairs (the AMX path's K of 32 tokens): zero, never read
      for (int j = 0; j < n_cb; ++j) _mm512_storeu_si512(vp + j * v_cb + tp * 32, _mm512_setzero_si512());
      continue;
    }
    const uint16_t* a = reinterpret_cast<const uint16_t*>(k.ptr + 2 * tp * k.stride) + cb0 * 16;
    const bool has_b = 2 * tp + 1 < nt;
    const uint16_t* b = reinterpret_cast<const uint16_t*>(k.ptr + (2 * tp + 1) * k.stride) + cb0 * 16;
    int j = 0;
    for (; j + 2 <= n_cb; j += 2) {
      const __m512i va = _mm512_loadu_si512(a + j * 16);
      const __m512i vb = has_b ? _mm512_loadu_si512(b + j * 16) : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + j * v_cb + tp * 32, _mm512_unpacklo_epi16(va, vb));
      _mm512_storeu_si512(vp + (j + 1) * v_cb + tp * 32, _mm512_unpackhi_epi16(va, vb));
    }
    if (j < n_cb)  // one 16-column block left
      _mm512_storeu_si512(vp + j * v_cb + tp * 32,
                          interleave16_in_order(a + j * 16, has_b ? b + j * 16 : nullptr));
  }
}

// One output row: O (32-column chunks in unpack order) times 1/l, columns back in order. Chunk
// position p < 16 holds column 8(p/4) + p%4, position 16 + p holds column 8(p/4) + 4 + p%4.
void bf16_finish_row(const float* o, float inv, int dl, float* out) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 vinv = _mm512_set1_ps(inv);
  int c = 0;
  for (; c + 32 <= dl; c += 32) {
    const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(o + c), vinv),
                 b = _mm512_mul_ps(_mm512_loadu_ps(o + c + 16), vinv);
    _mm512_storeu_ps(out + c, _mm512_permutex2var_ps(a, first, b));
    _mm512_storeu_ps(out + c + 16, _mm512_permutex2var_ps(a, second, b));
  }
  if (c < dl) _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), vinv));
}

// P (already rounded to bf16 values) as pp[tp][r] = (p[2tp][r], p[2tp+1][r]); an odd tail gets 0.
void bf16_pack_p(const float* s, int nt, int64_t sstride, int n_tp, uint32_t* pp) {
  const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                         22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int tp = 0; tp < n_tp; ++tp) {
    const float* p0 = s + 2 * tp * sstride;
    const bool has_1 = 2 * tp + 1 < nt;
    for (int64_t r = 0; r < sstride; r += 16) {
      const __m512 a = _mm512_loadu_ps(p0 + r);
      const __m512 b = has_1 ? _mm512_loadu_ps(p0 + sstride + r) : _mm512_setzero_ps();
      const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      _mm512_storeu_si512(pp + tp * sstride + r, _mm512_permutexvar_epi16(inter, packed));
    }
  }
}

constexpr std::array<int, 4> kQkStep = {12, 12, 8, 6};
constexpr int kPvBlock = 4;  // 16-column blocks of V packed at a time (8 KiB at 64-token pages)

struct Bf16Isa {
  using V = V512;
  static constexpr bool kRoundP = true;
  static void pack_q(const float* q, int R, int D, MlaScratch& s) {
    if (R <= 16) {
      bf16_pack_q_quads(q, R, D, s);
    } else {
      bf16_pack_q(q, R, D, s);
    }
  }
  static MlaRows load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s,
                           const uint8_t* next) {
    return bf16_load_page(f, page, nt, s, next, 0, /*defer=*/true);
  }
  static void finish_row(const float* o, float inv, int dl, float* out) { bf16_finish_row(o, inv, dl, out); }
  static void qk(MlaRows k, int nt, int rb_count, int D, int64_t sstride, MlaScratch& s) {
    const int n_dp = D / 2;
    const auto* q = reinterpret_cast<const uint32_t*>(s.q);
    if (rb_count == 1) {
      QkQuadCtx ctx{k.ptr,    k.stride, k.next, k.next_stride, q, int64_t{(n_dp + 3) / 4} * 16,
                    n_dp / 4, n_dp % 4, s.s,    sstride};
      if (k.fp8 == nullptr) {
        MlaTiler<QkQuadBf16Tile, 12, 4, QkQuadCtx>::run(nt, static_cast<int>(sstride) / 4, kQkStep, ctx);
        return;
      }
      ctx.f8 = fp8_source(k);
      MlaTiler<QkQuadF8Tile, 12, 4, QkQuadCtx>::run(nt, static_cast<int>(sstride) / 4, kQkStep, ctx);
    } else {
      QkCtx ctx{k.ptr, k.stride, k.next, k.next_stride, q, int64_t{n_dp} * 16, n_dp, s.s, sstride};
      if (k.fp8 == nullptr) {
        MlaTiler<QkBf16Tile, 12, 4, QkCtx>::run(nt, rb_count, kQkStep, ctx);
      } else {
        ctx.f8 = fp8_source(k);
        MlaTiler<QkF8Tile, 12, 4, QkCtx>::run(nt, rb_count, kQkStep, ctx);
      }
    }
  }
  static void pv(MlaRows k, int nt, int R, int dl, int64_t sstride, MlaScratch& s) {
    bf16_pack_p(s.s, nt, sstride, (nt + 1) / 2, s.p);
    const PvRowsCtx ctx{s.p, sstride, k.ptr, k.stride, nt, s.alpha, s.o, dl};
    MlaTiler<PvRowsTile, 12, 4, PvRowsCtx>::run(R, dl / 16, kQkStep, ctx);
  }
};

// ---- AMX tiles (mla_segment_amx_avx512bf16): both GEMMs on TDPBF16PS, 16 x 16 f32 tiles. ----
//
//   QK:  S[t][r] = K[t][:] . Q[r][:]   A = 16 token rows x 32 dims of the page (bf16, read in place
//        from a bf16 page or from the fp8 page's bf16 copy), B = qp (bf16_pack_q's [rb][pair][16
//        rows] layout is the tile's pair-interleaved B), C stored into S[t][r] as the vector path's.
//   PV:  O[r][c] = alpha_r O[r][c] + P[r][:] . V[:][c]   A = P transposed to [rows][tokens] bf16,
//        B = bf16_pack_v's [block][token pair][16 columns x 2] (zero pairs up to 32 tokens), C the
//        16-column blocks of O itself (rows rescaled by alpha first where their max moved).
// The tiles are configured once per segment (all eight 16 x 64 bytes, amx_tiles.h). Needs d_qk and
// d_latent multiples of 32 and pages of a multiple of 32 tokens (mla_amx_shape_ok).

// P [nt][sstride] f32 (bf16-exact values) of row block rb -> pt[16][tpad] bf16, tokens past nt zero.
void amx_transpose_p(const float* s, int nt, int64_t sstride, int rb, int tpad, uint16_t* pt) {
  for (int t0 = 0; t0 < tpad; t0 += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = t0 + i < nt ? _mm512_loadu_ps(s + (t0 + i) * sstride + rb * 16) : _mm512_setzero_ps();
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; ++i) {
      r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    // r[j]: row j of the block over tokens t0 .. t0 + 15 (a 16 x 16 transpose). P holds bf16
    // values already, so the conversion is exact.
    for (int j = 0; j < 16; ++j) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pt + int64_t{j} * tpad + t0),
                          (__m256i)_mm512_cvtneps_pbh(r[j]));
    }
  }
}

// The next page, fetched a few lines at a time between the tile operations of this one (QK, then
// PV, which flushes the rest): a page is contiguous, 64 tokens of 1152 (bf16) or 656 (fp8) bytes,
// and one core keeps only ~16 lines in flight, so a burst of prefetches stalls the tiles behind it.
// Into L2 (prefetcht1): the page is larger than L1, and the tiles read L2 at about L1's rate here
// (1.05-1.07x faster than prefetcht0 for bf16 pages, 1.02x for fp8, A/B in one process; also
// fetching each key tile's rows into L1 one step ahead measured 0.94-0.96x, and shifting the
// lines toward QK (16 per product, 4 in PV) 0.89-0.94x). The lines are spread evenly over the
// page's QK and PV products (about 8 per product at 16 heads, 1-2 at 128): a fixed 8 per product
// issued the whole next page within the first row block's QK at 128 heads, and spreading it over
// all eight row blocks made 128-head bf16 pages 1.07x faster (A/B in one process, 2026-12-06).
struct AmxPrefetch {
  const char* p = nullptr;
  const char* end = nullptr;
  int per_product = 1;
  // products: the tile products that will run before the next page is read.
  void start(const MlaRows& k, int rows, int products) {
    finish();  // what is left of the previous stream
    p = reinterpret_cast<const char*>(k.next);
    end = p == nullptr ? nullptr : p + rows * k.next_stride;
    const int64_t lines = p == nullptr ? 0 : (end - p + 63) / 64;
    per_product = static_cast<int>(std::max<int64_t>(1, (lines + products - 1) / products));
  }
  void issue(int64_t lines) {
    for (; lines > 0 && p < end; --lines, p += 64) _mm_prefetch(p, _MM_HINT_T1);
  }
  void step() { issue(per_product); }
  void finish() { issue(INT64_MAX); }
};
thread_local AmxPrefetch g_amx_prefetch;

// One step of up to four products into C tiles 0..NB-1 against the shared operand in tile 4: the
// other operand loaded into tiles 5, 6, 7, 5 from P, P + STEP, ... (rows of STRIDE bytes), as A
// (QK: key rows, MLA_AMX_A) or as B (PV: V pairs, MLA_AMX_B), a few next-page lines after each.
// Macros: GCC pastes the tile numbers into the instructions, so they must be literals.
#define MLA_AMX_A(C, T, P, STRIDE) \
  do {                             \
    _tile_loadd(T, P, STRIDE);     \
    _tile_dpbf16ps(C, T, 4);       \
    g_amx_prefetch.step();         \
  } while (0)
#define MLA_AMX_B(C, T, P, STRIDE) \
  do {                             \
    _tile_loadd(T, P, STRIDE);     \
    _tile_dpbf16ps(C, 4, T);       \
    g_amx_prefetch.step();         \
  } while (0)
#define MLA_AMX_FOUR(MUL, NB, P, STEP, STRIDE)              \
  do {                                                      \
    MUL(0, 5, (P), STRIDE);                                 \
    if ((NB) > 1) MUL(1, 6, (P) + (STEP), STRIDE);          \
    if ((NB) > 2) MUL(2, 7, (P) + 2 * (STEP), STRIDE);      \
    if ((NB) > 3) MUL(3, 5, (P) + 3 * (STEP), STRIDE);      \
  } while (0)
// C tiles 0..NB-1 loaded from or stored to (OP: _tile_loadd / _tile_stored) 16 x 16 f32 blocks at
// P, P + STEP, ... (rows of STRIDE bytes).
#define MLA_AMX_C_TILES(OP, NB, P, STEP, STRIDE)       \
  do {                                                 \
    OP(0, (P), STRIDE);                                \
    if ((NB) > 1) OP(1, (P) + (STEP), STRIDE);         \
    if ((NB) > 2) OP(2, (P) + 2 * (STEP), STRIDE);     \
    if ((NB) > 3) OP(3, (P) + 3 * (STEP), STRIDE);     \
  } while (0)

// S = K Q^T for two or more row blocks: C tiles 0-3 hold (tokens tb, tb + 1) x (row blocks rb,
// rb + 1), tiles 4-5 the key slices of the two token blocks, 6-7 the query slices of the two row
// blocks, so each loaded slice serves two products (one load per product, against 1.25 for four
// token blocks against one row block). 1.02-1.06x over the 1 x 4 form from 32 heads up (`bench mla
// --ab`, 2026-12-06); the same 2 x 2 blocking of PV gained nothing (0.99-1.01x) and was dropped.
void amx_qk_2x2(const MlaRows& k, int n_tb, int rb_count, int n_dp, int n_k, int64_t sstride, MlaScratch& s,
                int t_off) {
  const auto* q = reinterpret_cast<const uint32_t*>(s.q);
  const int64_t ks = k.stride;
  for (int rb = 0; rb < rb_count; rb += 2) {
    const bool r2 = rb + 1 < rb_count;
    const uint32_t* q0 = q + int64_t{rb} * n_dp * 16;
    const uint32_t* q1 = q0 + int64_t{n_dp} * 16;
    for (int tb = 0; tb < n_tb; tb += 2) {
      const bool t2 = tb + 1 < n_tb;
      const uint8_t* k0 = k.ptr + tb * 16 * ks;
      const uint8_t* k1 = k0 + 16 * ks;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int kk = 0; kk < n_k; ++kk) {
        _tile_loadd(4, k0 + kk * 64, ks);
        _tile_loadd(6, q0 + kk * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        g_amx_prefetch.step();
        if (t2) {
          _tile_loadd(5, k1 + kk * 64, ks);
          _tile_dpbf16ps(1, 5, 6);
          g_amx_prefetch.step();
        }
        if (r2) {
          _tile_loadd(7, q1 + kk * 256, 64);
          _tile_dpbf16ps(2, 4, 7);
          g_amx_prefetch.step();
          if (t2) {
            _tile_dpbf16ps(3, 5, 7);
            g_amx_prefetch.step();
          }
        }
      }
      float* s0 = s.s + (t_off + tb * 16) * sstride + rb * 16;
      _tile_stored(0, s0, sstride * 4);
      if (t2) _tile_stored(1, s0 + 16 * sstride, sstride * 4);
      if (r2) _tile_stored(2, s0 + 16, sstride * 4);
      if (r2 && t2) _tile_stored(3, s0 + 16 * sstride + 16, sstride * 4);
    }
  }
}

// S = K Q^T for the page on tiles, into S's rows from t_off. One row block: C tiles 0-3 hold tokens
// [16 tb, 16 tb + 16) x 16 rows; tile 4 the B slice of qp, tiles 5-7 the A slices. Two or more:
// amx_qk_2x2.
void amx_qk(const MlaRows& k, int nt, int rb_count, int D, int64_t sstride, MlaScratch& s, int t_off,
            int pv_pages) {
  const int n_dp = D / 2, n_k = D / 32, n_tb = (nt + 15) / 16;
  // The next page is spread over this QK and the PV of the pages that follow it (about one QK's
  // products each); a page whose group goes on gets it within its QK, as it is read next.
  g_amx_prefetch.start(k, nt, (1 + pv_pages) * rb_count * n_k * n_tb);
  const auto* q = reinterpret_cast<const uint32_t*>(s.q);
  const int64_t ks = k.stride;
  if (rb_count >= 2) {
    amx_qk_2x2(k, n_tb, rb_count, n_dp, n_k, sstride, s, t_off);
    return;
  }
  for (int rb = 0; rb < rb_count; ++rb) {
    const uint32_t* qb = q + int64_t{rb} * n_dp * 16;
    for (int tb0 = 0; tb0 < n_tb; tb0 += 4) {
      const int nb = std::min(4, n_tb - tb0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int kk = 0; kk < n_k; ++kk) {
        _tile_loadd(4, qb + kk * 256, 64);
        MLA_AMX_FOUR(MLA_AMX_A, nb, k.ptr + tb0 * 16 * ks + kk * 64, 16 * ks, ks);
      }
      MLA_AMX_C_TILES(_tile_stored, nb, s.s + (t_off + tb0 * 16) * sstride + rb * 16, 16 * sstride,
                      sstride * 4);
    }
  }
}

// O[r][:] *= alpha_r for the rows of row block rb whose running max moved on this page (alpha
// is exactly 1 for the others, which is most rows after a sequence's first pages).
void amx_rescale(int rb, int dl, const float* alpha, float* o) {
  const __mmask16 moved =
      _mm512_cmp_ps_mask(_mm512_loadu_ps(alpha + rb * 16), _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
  for (uint32_t m = moved; m != 0; m &= m - 1) {
    const int r = rb * 16 + __builtin_ctz(m);
    const __m512 al = _mm512_set1_ps(alpha[r]);
    float* row = o + int64_t{r} * dl;
    for (int c = 0; c < dl; c += 16) _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), al));
  }
}

// O update for a group of g pages on tiles (their nts[j] tokens are consecutive, scores in S's
// rows in that order): P transposed per row block into s.p ([rb][16][tpad] bf16), V packed
// kPvBlock column blocks at a time, page by page into one run of token pairs (zero pairs up to
// tpad tokens); O's rows rescaled where alpha moved, then accumulated in place: C tiles 0-3 load
// four 16-column blocks of O (rows of d_latent floats) once for the whole group, tile 4 holds the
// A slice of P, tiles 5-7 the B slices of V. A page alone gives each O tile only two products
// (64 tokens) per load and store; at 128 heads those round trips were a third of the kernel.
void amx_pv(const MlaRows* ks, const int* nts, int g, int R, int dl, int64_t sstride, MlaScratch& s) {
  int nt = 0;
  for (int j = 0; j < g; ++j) nt += nts[j];
  const int rb_count = (R + 15) / 16, tpad = (nt + 31) / 32 * 32, n_tp = tpad / 2, n_k = tpad / 32;
  const int n_cb = dl / 16;
  auto* pt = reinterpret_cast<uint16_t*>(s.p);
  for (int rb = 0; rb < rb_count; ++rb) {
    amx_transpose_p(s.s, nt, sstride, rb, tpad, pt + int64_t{rb} * 16 * tpad);
    amx_rescale(rb, dl, s.alpha, s.o);
  }
  auto* vp = reinterpret_cast<uint16_t*>(s.v);
  const int64_t v_cb = int64_t{n_tp} * 32, os = int64_t{dl} * 4;
  for (int cb0 = 0; cb0 < n_cb; cb0 += kPvBlock) {
    const int nb = std::min(kPvBlock, n_cb - cb0);
    for (int j = 0, tp0 = 0; j < g; tp0 += nts[j++] / 2) {  // all but the last page are whole (even)
      bf16_pack_v(ks[j], nts[j], cb0, nb, j + 1 == g ? n_tp - tp0 : nts[j] / 2, vp + tp0 * 32, v_cb);
    }
    for (int rb = 0; rb < rb_count; ++rb) {
      const uint16_t* a = pt + int64_t{rb} * 16 * tpad;
      float* o = s.o + int64_t{rb} * 16 * dl + cb0 * 16;
      MLA_AMX_C_TILES(_tile_loadd, nb, o, 16, os);
      for (int kk = 0; kk < n_k; ++kk) {
        _tile_loadd(4, a + kk * 32, tpad * 2);
        MLA_AMX_FOUR(MLA_AMX_B, nb, vp + kk * 512, v_cb, 64);  // 16 token pairs x 32 values per block
      }
      MLA_AMX_C_TILES(_tile_stored, nb, o, 16, os);
    }
  }
  g_amx_prefetch.finish();
}

struct AmxIsa {
  using V = V512;
  static constexpr bool kRoundP = true;
  static constexpr bool kGroupsPages = true;  // mla_segment_simd's grouped loop
  static constexpr int kMaxGroupPages = kMlaGroupTokens / 32;  // pages of a multiple of 32 tokens
  // Grouping pays from 32 rows (`bench mla --batch 32 --seqlen 4096`, groups of two 64-token pages
  // against one, alternated, 2026-12-06: 32 heads 1.06-1.08x bf16, 1.0x fp8; 128 heads 1.05-1.06x
  // bf16, 1.04x fp8) but costs at 16 rows (0.91-0.95x both dtypes), so one row block runs page by page.
  static constexpr int kGroupMinRowBlocks = 2;
  static void pack_q(const float* q, int R, int D, MlaScratch& s) { bf16_pack_q(q, R, D, s); }
  static MlaRows load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s,
                           const uint8_t* next, int slot) {
    return bf16_load_page(f, page, nt, s, next, slot);
  }
  static void finish_row(const float* o, float inv, int dl, float* out) { bf16_finish_row(o, inv, dl, out); }
  static void qk(MlaRows k, int nt, int rb_count, int D, int64_t sstride, MlaScratch& s, int t_off,
                 int pv_pages) {
    amx_qk(k, nt, rb_count, D, sstride, s, t_off, pv_pages);
  }
  static void pv(const MlaRows* ks, const int* nts, int g, int R, int dl, int64_t sstride, MlaScratch& s) {
    amx_pv(ks, nts, g, R, dl, sstride, s);
  }
};
}  // namespace

void mla_segment_avx512bf16(const MlaSegmentArgs& args, MlaScratch& scratch) {
  mla_segment_simd<Bf16Isa>(args, scratch);
}

bool mla_amx_shape_ok(const MlaKvFormat& f) {
  return f.d_qk() % 32 == 0 && f.d_latent % 32 == 0 && f.page_tokens % 32 == 0;
}

void mla_segment_amx_avx512bf16(const MlaSegmentArgs& args, MlaScratch& scratch) {
  amx::configure_full_tiles();
  mla_segment_simd<AmxIsa>(args, scratch);
  _tile_release();
}

#undef MLA_AMX_C_TILES
#undef MLA_AMX_FOUR
#undef MLA_AMX_B
#undef MLA_AMX_A

}  // namespace fathom::internal
