// MLA decode segment, AVX-512 BF16 path: both GEMMs on vdpbf16ps (16 lanes x 2 products), f32
// accumulation, the online softmax from mla_decode_simd.h.
//
//   QK:  S[t][r] += (k[t][2i], k[t][2i+1]) . (q[r][2i], q[r][2i+1])   k pairs broadcast straight
//        from the bf16 cache (fp8 pages are first dequantised to bf16, exactly); q packed once per
//        segment as qp[rb][i][16 rows] (bf16 pairs).
//   PV:  O[r][c] += (p[2j][r], p[2j+1][r]) . (v[2j][c], v[2j+1][c])   p packed per page as
//        pp[j][r], v interleaved per page as vp[c/16][j][16 columns x 2].
// The query and P are rounded to bf16 (P before it is summed, so the normaliser matches).
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

// fp8 tokens -> bf16 [nt][D] in s.k (exact: e4m3 times a power-of-two scale fits in bf16).
MlaRows bf16_load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s) {
  if (f.dtype == MlaKvDType::kBF16) return {page, f.token_bytes()};
  const int D = f.d_qk(), dl = f.d_latent;
  uint16_t* kb = reinterpret_cast<uint16_t*>(s.k);
  for (int t = 0; t < nt; ++t) {
    const uint8_t* src = page + t * f.token_bytes();
    uint16_t* dst = kb + int64_t{t} * D;
    for (int g = 0; g < f.n_scale_groups(); ++g) {
      const __m512 scale = _mm512_set1_ps(mla_load_f32(src + f.scales_offset() + 4 * g));
      const int end = std::min(dl, (g + 1) * kMlaFp8GroupSize);
      for (int d = g * kMlaFp8GroupSize; d < end; d += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d),
                            (__m256i)_mm512_cvtneps_pbh(V512::e4m3x(src + d, scale)));
      }
    }
    std::memcpy(dst + dl, src + f.rope_offset(), size_t{2} * f.d_rope);
  }
  return {s.k, int64_t{D} * 2};
}

struct QkCtx {
  const uint8_t* k;   // token rows (bf16 pairs)
  int64_t k_stride;   // bytes
  const uint32_t* q;  // qp
  int64_t q_rb;       // n_dp * 16
  int n_dp;
  float* s;
  int64_t sstride;
};

template <int M, int N>
struct QkTile {
  static void run(int t0, int rb0, const QkCtx& c) {
    if constexpr (M * N > 28) {
      __builtin_trap();
    } else {
      __m512 acc[M][N];
      MLA_UNROLL for (int i = 0; i < M; ++i) MLA_UNROLL for (int j = 0; j < N; ++j) acc[i][j] =
          _mm512_setzero_ps();
      const uint8_t* k = c.k + t0 * c.k_stride;
      const uint32_t* q = c.q + rb0 * c.q_rb;
      for (int dp = 0; dp < c.n_dp; ++dp) {
        __m512bh b[N];
        MLA_UNROLL for (int j = 0; j < N; ++j) b[j] = (__m512bh)_mm512_loadu_si512(q + j * c.q_rb + dp * 16);
        MLA_UNROLL for (int i = 0; i < M; ++i) {
          const __m512bh a =
              (__m512bh)_mm512_set1_epi32(static_cast<int>(mla_load_u32(k + i * c.k_stride + dp * 4)));
          MLA_UNROLL for (int j = 0; j < N; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
      }
      float* s = c.s + t0 * c.sstride + rb0 * 16;
      MLA_UNROLL for (int i = 0; i < M; ++i) MLA_UNROLL for (int j = 0; j < N; ++j)
          _mm512_storeu_ps(s + i * c.sstride + j * 16, acc[i][j]);
    }
  }
};

struct PvCtx {
  const uint32_t* p;  // pp[j][sstride]
  int64_t sstride;
  const uint16_t* v;  // vp[cb][j][32]
  int64_t v_cb;       // n_tp * 32
  int n_tp;
  const float* alpha;
  float* o;
  int64_t dl;
};

template <int M, int N>
struct PvTile {
  static void run(int r0, int cb0, const PvCtx& c) {
    if constexpr (M * N > 28) {
      __builtin_trap();
    } else {
      __m512 acc[M][N];
      MLA_UNROLL for (int i = 0; i < M; ++i) MLA_UNROLL for (int j = 0; j < N; ++j) acc[i][j] =
          _mm512_setzero_ps();
      const uint16_t* v = c.v + cb0 * c.v_cb;
      const uint32_t* p = c.p + r0;
      for (int tp = 0; tp < c.n_tp; ++tp) {
        __m512bh b[N];
        MLA_UNROLL for (int j = 0; j < N; ++j) b[j] = (__m512bh)_mm512_loadu_si512(v + j * c.v_cb + tp * 32);
        MLA_UNROLL for (int i = 0; i < M; ++i) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[tp * c.sstride + i]));
          MLA_UNROLL for (int j = 0; j < N; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
      }
      MLA_UNROLL for (int i = 0; i < M; ++i) {
        const __m512 al = _mm512_set1_ps(c.alpha[r0 + i]);
        float* o = c.o + (r0 + i) * c.dl + cb0 * 16;
        MLA_UNROLL for (int j = 0; j < N; ++j)
            _mm512_storeu_ps(o + j * 16, _mm512_fmadd_ps(_mm512_loadu_ps(o + j * 16), al, acc[i][j]));
      }
    }
  }
};

// Interleaves rows t and t+1 of the page's first dl columns: vp[cb][tp][2c + {0,1}].
void bf16_pack_v(MlaRows k, int nt, int dl, int n_tp, uint16_t* vp) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                      6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  const int64_t v_cb = int64_t{n_tp} * 32;
  for (int tp = 0; tp < n_tp; ++tp) {
    const uint16_t* a = reinterpret_cast<const uint16_t*>(k.ptr + 2 * tp * k.stride);
    const bool has_b = 2 * tp + 1 < nt;
    const uint16_t* b = reinterpret_cast<const uint16_t*>(k.ptr + (2 * tp + 1) * k.stride);
    int c = 0;
    for (; c + 32 <= dl; c += 32) {
      const __m512i va = _mm512_loadu_si512(a + c);
      const __m512i vb = has_b ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + (c / 16) * v_cb + tp * 32, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_storeu_si512(vp + (c / 16 + 1) * v_cb + tp * 32, _mm512_permutex2var_epi16(va, hi, vb));
    }
    if (c < dl) {  // 16 columns left
      const __m512i va = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c)));
      const __m512i vb =
          has_b ? _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + c)))
                : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + (c / 16) * v_cb + tp * 32, _mm512_permutex2var_epi16(va, lo, vb));
    }
  }
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

struct Bf16Isa {
  using V = V512;
  static constexpr bool kRoundP = true;
  static void pack_q(const float* q, int R, int D, MlaScratch& s) { bf16_pack_q(q, R, D, s); }
  static MlaRows load_page(const MlaKvFormat& f, const uint8_t* page, int nt, MlaScratch& s) {
    return bf16_load_page(f, page, nt, s);
  }
  static void qk(MlaRows k, int nt, int rb_count, int D, int64_t sstride, MlaScratch& s) {
    const QkCtx ctx{k.ptr, k.stride, reinterpret_cast<const uint32_t*>(s.q), int64_t{D / 2} * 16, D / 2,
                    s.s,   sstride};
    MlaTiler<QkTile, 12, 4, QkCtx>::run(nt, rb_count, kQkStep, ctx);
  }
  static void pv(MlaRows k, int nt, int R, int dl, int64_t sstride, MlaScratch& s) {
    const int n_tp = (nt + 1) / 2;
    uint16_t* vp = reinterpret_cast<uint16_t*>(s.v);
    bf16_pack_p(s.s, nt, sstride, n_tp, s.p);
    bf16_pack_v(k, nt, dl, n_tp, vp);
    const PvCtx ctx{s.p, sstride, vp, int64_t{n_tp} * 32, n_tp, s.alpha, s.o, dl};
    MlaTiler<PvTile, 12, 4, PvCtx>::run(R, dl / 16, kQkStep, ctx);
  }
};

}  // namespace

void mla_segment_avx512bf16(const MlaSegmentArgs& args, MlaScratch& scratch) {
  mla_segment_simd<Bf16Isa>(args, scratch);
}

}  // namespace fathom::internal
