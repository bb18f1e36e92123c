// Q8_0 and Q4_0 weights on AVX-512 VNNI: int8 activations (quantised per 32-block), vpdpbusd
// int32 block dot products, fp32 scale d_w * d_x per block.
//
// vpdpbusd multiplies unsigned by signed bytes, so weights enter as w + 128 (u8) and the
// activations stay signed; the excess 128 * sum(x) is removed exactly by starting each int32
// accumulator at the precomputed correction (-128 * sum of the activation bytes it covers).
//  - m <= matvec_max_m (9): row-wise; two 32-blocks per 512-bit step, lanes 0-7 block b and 8-15
//    block b+1.
//  - above: blocked GEMM, panel [kc/4][64 columns][4 bytes], calls of up to 6 rows run as 3x64
//    micro-kernels; per 32-block the int32 tile is converted and scaled into an fp32 tile held in
//    registers.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/matmul_gemm_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

template <DType D>
constexpr int64_t block_bytes() {
  return D == DType::kQ8_0 ? 34 : 18;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Blocks b and b+1 (when `two`) of a row as 64 bytes of w + 128.
template <DType D>
inline __m512i load_q64(const uint8_t* row, int64_t b, bool two) {
  constexpr int64_t bb = block_bytes<D>();
  const uint8_t* p0 = row + b * bb + 2;
  if constexpr (D == DType::kQ8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0));
    const __m256i hi =
        two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + bb)) : _mm256_setzero_si256();
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i n0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0));
    const __m128i n1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + bb)) : _mm_setzero_si128();
    const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(n0), n1, 1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(y, m4), hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), m4);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // lo b, lo b+1, hi b, hi b+1
    const __m512i ordered = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm512_add_epi8(ordered, _mm512_set1_epi8(120));  // (q - 8) + 128
  }
}

// fp32 scales of blocks b and b+1: lanes 0-7 d_b, lanes 8-15 d_{b+1} (0 when !two).
template <DType D>
inline __m512 load_d2(const uint8_t* row, int64_t b, bool two) {
  constexpr int64_t bb = block_bytes<D>();
  const __m256i lo = _mm256_set1_epi16(static_cast<short>(load_u16(row + b * bb)));
  const __m256i h = two ? _mm256_mask_set1_epi16(lo, 0xff00, static_cast<short>(load_u16(row + (b + 1) * bb)))
                        : _mm256_maskz_mov_epi16(0x00ff, lo);
  return _mm512_cvtph_ps(h);
}

inline void store_y(float* y, bool accumulate, float v) {
  *y = accumulate ? *y + v : v;
}

// `next`/`next_rows`: the following group of rows, prefetched at the columns this group reads (see
// fp8_mv_chunk in matmul_fp8_impl.h: short rows defeat the hardware prefetcher).
template <DType D, int R, int M>
void matvec_group(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                  const uint8_t* next = nullptr, int next_rows = 0) {
  constexpr int64_t bb = block_bytes<D>();
  const int64_t nb = w.cols / 32, row_bytes = nb * bb;
  const uint8_t* row0 = static_cast<const uint8_t*>(w.data) + r * row_bytes;
  __m512 acc[R][M];
  FATHOM_UNROLL
  for (int i = 0; i < R; ++i) {
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) acc[i][m] = _mm512_setzero_ps();
  }
  const int64_t xs = x.stride, ls = x.stride / 4;
  auto step = [&](int64_t b, bool two) {
    for (int i = 0; i < next_rows; ++i) {
      const char* p = reinterpret_cast<const char*>(next + i * row_bytes + b * bb);
      _mm_prefetch(p, _MM_HINT_T0);
      _mm_prefetch(p + 64, _MM_HINT_T0);
    }
    FATHOM_UNROLL
    for (int i = 0; i < R; ++i) {
      const __m512i wq = load_q64<D>(row0 + i * row_bytes, b, two);
      const __m512 dw = load_d2<D>(row0 + i * row_bytes, b, two);
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512i t = _mm512_dpbusd_epi32(_mm512_loadu_si512(x.qcorr_lane + m * ls + b * 8), wq,
                                              _mm512_loadu_si512(x.q + m * xs + b * 32));
        const __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(x.qd_lane + m * ls + b * 8));
        acc[i][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), s, acc[i][m]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) step(b, true);
  if (b < nb) step(b, false);  // a last single block: the second half is zero on both sides
  FATHOM_UNROLL
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 4) {
      alignas(16) float s[4];
      _mm_store_ps(s, hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
      FATHOM_UNROLL
      for (int i = 0; i < 4; ++i) store_y(y + m * ldy + r + i, accumulate, s[i]);
    } else {
      FATHOM_UNROLL
      for (int i = 0; i < R; ++i) store_y(y + m * ldy + r + i, accumulate, _mm512_reduce_add_ps(acc[i][m]));
    }
  }
}

// R weight rows against every activation row, in groups of 4, while the rows stay in L1.
// The first pass over the rows prefetches the next group (`next_rows` rows from row r + R).
template <DType D, int R>
void matvec_all(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r,
                int next_rows = 0) {
  const int64_t row_bytes = w.cols / 32 * block_bytes<D>();
  const uint8_t* next = static_cast<const uint8_t*>(w.data) + (r + R) * row_bytes;
  int64_t i = 0;
  for (; i + 4 <= x.m; i += 4) {
    matvec_group<D, R, 4>(w, act_rows(x, i, 4), y + i * ldy, ldy, accumulate, r, next,
                          i == 0 ? next_rows : 0);
  }
  const int nr = i == 0 ? next_rows : 0;
  switch (x.m - i) {
    case 1:
      matvec_group<D, R, 1>(w, act_rows(x, i, 1), y + i * ldy, ldy, accumulate, r, next, nr);
      break;
    case 2:
      matvec_group<D, R, 2>(w, act_rows(x, i, 2), y + i * ldy, ldy, accumulate, r, next, nr);
      break;
    case 3:
      matvec_group<D, R, 3>(w, act_rows(x, i, 3), y + i * ldy, ldy, accumulate, r, next, nr);
      break;
    default:
      break;
  }
}

// The f16 scales of nc <= 16 consecutive blocks of a row (block j's at byte j * bb of p, an even
// offset: word j * bb / 2) as 16 floats (0 past nc), without a gather: the chunk's bytes as four
// pairs of vectors, each pair's scales picked into place by one vpermt2w. Reads only the chunk's
// nc * bb bytes. (vpgatherdd took most of the one-row kernel's time on the Zen 5 VM.)
template <DType D>
struct ChunkScales {
  alignas(64) uint16_t idx[4][32] = {};  // per pair q: the word (of its 64) holding block j's scale
  __mmask32 mask[4] = {};                // per pair q: the blocks whose scale lies in it
  ChunkScales() {
    constexpr int kWordStride = static_cast<int>(block_bytes<D>() / 2);
    for (int q = 0; q < 4; ++q) {
      for (int j = 0; j < 16; ++j) {
        const int word = kWordStride * j - 64 * q;
        if (word >= 0 && word < 64) {
          idx[q][j] = static_cast<uint16_t>(word);
          mask[q] |= __mmask32{1} << j;
        }
      }
    }
  }
  static __mmask64 first_bytes(int64_t n) {
    return n >= 64 ? ~__mmask64{0} : n <= 0 ? __mmask64{0} : (__mmask64{1} << n) - 1;
  }
  __m512 get(const uint8_t* p, int nc) const {
    const int64_t bytes = nc * block_bytes<D>();
    __m512i out = _mm512_setzero_si512();
    FATHOM_UNROLL
    for (int q = 0; q < 4; ++q) {
      if (mask[q] == 0) continue;  // Q4_0's 16 scales lie in the first three pairs
      const __m512i lo = _mm512_maskz_loadu_epi8(first_bytes(bytes - 128 * q), p + 128 * q);
      const __m512i hi = _mm512_maskz_loadu_epi8(first_bytes(bytes - 128 * q - 64), p + 128 * q + 64);
      out = _mm512_or_si512(out, _mm512_maskz_permutex2var_epi16(mask[q], lo, _mm512_load_si512(idx[q]), hi));
    }
    return _mm512_cvtph_ps(_mm512_castsi512_si256(out));
  }
};

// One to three activation rows on CPUs that read a call's weights in address order
// (address_order_wanted: AMD): one weight row at a time, so the call's rows are one run of
// addresses (matvec_all walks four side by side), each line requested kStreamL2Bytes ahead into L2,
// on into the thread's next weights past the call's last row. Per chunk of 16 blocks the 16 scale
// products d_w * d_x of each activation row are formed at once (ChunkScales) and each step's two
// take their lanes with one vpermps; at one row two accumulators alternate. Against matvec_all
// (`bench gemm --dtype q8_0 --threads 2 --ab`, Zen 5, 40-70 GB/s phases): m = 1 [11264 x 2048]
// 1.05-1.32x, [2048 x 1408] 1.04-1.20x, [102400 x 2048] 1.19-1.24x; m = 2 / 3 1.08-1.17x /
// 1.34-1.37x, and from L3 on one thread 1.45 / 1.54x (m = 4 0.65x: it stays on matvec_all). The
// V2-Lite Q8_0 decode step (`bench serve --ab`): 1.255x at one client, 1.063x at 16 (m = 1);
// 1.093 / 1.074x at 16 / 32 clients (m = 2-3). L1 requests as well (kStreamL1Bytes ahead) read
// 0.94-1.00x these; with a gather for the scales the m = 1 kernel was slower than matvec_all from
// L3 (0.57-0.72x).
template <DType D, int M>
void stream_matvec(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                   int64_t r1) {
  static_assert(M >= 1 && M <= 3);
  constexpr int kAcc = M == 1 ? 2 : 1;  // product chains per activation row
  constexpr int64_t bb = block_bytes<D>();
  static const ChunkScales<D> scales;
  const int64_t nb = w.cols / 32, row_bytes = nb * bb;
  const int64_t xs = x.stride, ls = x.stride / 4, ds = x.stride / kQBlock;
  const uint8_t* begin = static_cast<const uint8_t*>(w.data) + r0 * row_bytes;
  const uint8_t* end = begin + (r1 - r0) * row_bytes;
  const NextWeights nw = t_next_weights;
  prefetch_range_l1(begin, std::min<int64_t>(kStreamL1Bytes, end - begin));
  // lanes 0-7 of step j's products are block 2j of its chunk, lanes 8-15 block 2j + 1
  const __m512i first_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = begin + (r - r0) * row_bytes;
    const bool inside =
        end - row >= row_bytes + kStreamL2Bytes;  // every request of this row lands within the call
    __m512 acc[M][kAcc];
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) {
      FATHOM_UNROLL
      for (int a = 0; a < kAcc; ++a) acc[m][a] = _mm512_setzero_ps();
    }
    for (int64_t c0 = 0; c0 < nb; c0 += 16) {
      const int nc = static_cast<int>(std::min<int64_t>(16, nb - c0));
      const uint8_t* pc = row + c0 * bb;
      const __m512 dw = scales.get(pc, nc);
      __m512 s16[M];
      FATHOM_UNROLL
      for (int m = 0; m < M; ++m) {
        s16[m] = _mm512_mul_ps(
            dw, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nc) - 1), x.qd + m * ds + c0));
      }
      // the lines from the chunk's start (which may sit mid-line) past its end: one per step, the
      // rest after the last
      const int n_req = static_cast<int>((nc * bb + 63) / 64) + 1;
      __m512i idx = first_idx;
      int j = 0;
      const auto product = [&](bool two) {
        const int64_t b = c0 + j;
        const __m512i wq = load_q64<D>(row, b, two);
        FATHOM_UNROLL
        for (int m = 0; m < M; ++m) {
          const __m512i t = _mm512_dpbusd_epi32(_mm512_loadu_si512(x.qcorr_lane + m * ls + b * 8), wq,
                                                _mm512_loadu_si512(x.q + m * xs + b * 32));
          acc[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_permutexvar_ps(idx, s16[m]), acc[m][0]);
        }
      };
      for (; j + 2 <= nc; j += 2) {
        if (j / 2 < n_req) STREAM_REQUEST(pc + 32 * j, kStreamL2Bytes, _MM_HINT_T1, inside, end, nw);
        product(true);
        if constexpr (kAcc == 2) std::swap(acc[0][0], acc[0][1]);
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2));
      }
      for (int i = j / 2; i < n_req; ++i)
        STREAM_REQUEST(pc + 64 * i, kStreamL2Bytes, _MM_HINT_T1, inside, end, nw);
      if (j < nc) product(false);  // a last single block: the second half is zero on both sides
    }
    FATHOM_UNROLL
    for (int m = 0; m < M; ++m) {
      const __m512 sum = kAcc == 2 ? _mm512_add_ps(acc[m][0], acc[m][kAcc - 1]) : acc[m][0];
      store_y(y + m * ldy + r, accumulate, _mm512_reduce_add_ps(sum));
    }
  }
}

template <DType D>
void matvec_rows(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4)
    matvec_all<D, 4>(w, x, y, ldy, accumulate, r, static_cast<int>(std::min<int64_t>(4, r1 - r - 4)));
  for (; r < r1; ++r) matvec_all<D, 1>(w, x, y, ldy, accumulate, r);
}

template <DType D>
struct Int8Gemm {
  static constexpr int kNR = 64;
  static constexpr int kMR = 6;
  static constexpr int64_t kKC = 256;
  struct Panel {
    alignas(64) uint32_t b[kKC / 4 * kNR];         // [kc/4][64] groups of 4 bytes (w + 128)
    alignas(64) float scale[kKC / kQBlock * kNR];  // [kc/32][64] d_w
  };

  static int64_t kc_step(const WeightView&) { return kKC; }

  // A panel: 16 rows at a time, each block pair's 64 bytes of w + 128 transposed into groups of 4,
  // and the 16 rows' f16 scales of each block by plain loads into a small array and one vcvtph2ps.
  // kFull (the panel's 64 rows present, kc whole block pairs: every checkpoint shape but a last
  // ragged panel or k-block) drops the per-row and per-block checks. Against 16 scalar f16_to_f32
  // calls per block, two threads from memory on the Zen 5 VM (`bench gemm --ab`, `bench moe --ab`):
  // with a vpgatherdd of the 16 scales, 1.10x / 1.08x at 48 / 512 rows of [1408 x 2048]; the plain
  // loads 1.05-1.10x more at 24-96 rows of [2048 x 1408], 0.99x at 512, and 1.06-1.08x on the Q8_0
  // experts at 128-512 tokens.
  template <bool kFull>
  static void pack_panel(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    constexpr int64_t bb = block_bytes<D>();
    const int64_t row_bytes = w.cols / 32 * bb;
    const int64_t b0 = k0 / 32, nb = kc / 32;
    for (int v = 0; v < kNR / 16; ++v) {
      const uint8_t* r0 = static_cast<const uint8_t*>(w.data) + (n0 + 16 * v) * row_bytes;
      const int64_t live = kFull ? 16 : std::clamp<int64_t>(nr - 16 * v, 0, 16);  // rows present
      for (int64_t b = 0; b < nb; b += 2) {
        const bool two = kFull || b + 1 < nb;
        __m512i t[16];
        alignas(32) uint16_t d16[2][16];  // the two blocks' f16 scales of the 16 rows
        FATHOM_UNROLL
        for (int i = 0; i < 16; ++i) {
          const bool here = kFull || i < live;
          const uint8_t* row = here ? r0 + i * row_bytes : r0;  // no pointer past the tensor
          t[i] = here ? load_q64<D>(row, b0 + b, two) : _mm512_setzero_si512();
          d16[0][i] = here ? load_u16(row + (b0 + b) * bb) : 0;
          d16[1][i] = here && two ? load_u16(row + (b0 + b + 1) * bb) : 0;
        }
        transpose16x16_epi32(t);
        uint32_t* dst = p.b + (b * 8) * kNR + 16 * v;
        FATHOM_UNROLL
        for (int j = 0; j < 16; ++j) {
          if (j < 8 || two) _mm512_store_si512(dst + j * kNR, t[j]);
        }
        FATHOM_UNROLL
        for (int h = 0; h < 2; ++h) {
          if (h == 0 || two) {
            _mm512_store_ps(p.scale + (b + h) * kNR + 16 * v,
                            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16[h]))));
          }
        }
      }
    }
  }

  static void pack(const WeightView& w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, Panel& p) {
    if (nr == kNR && kc % 64 == 0) {
      pack_panel<true>(w, n0, nr, k0, kc, p);
    } else {
      pack_panel<false>(w, n0, nr, k0, kc, p);
    }
  }

  // Per 32-block: the int32 sums of MR x 64 (MR <= 3: 12 accumulators), then converted and scaled
  // into the fp32 tile, which stays in registers beside them (12 more) and is stored once per
  // k-block. Six rows at a time would need 48 registers, and an fp32 tile kept in L1 instead cost
  // a store per eight vpdpbusd: two threads from memory, [1408 x 2048], 1.04x at 48 rows and
  // 1.09x at 512 against the six-row kernel with its tile in L1 (`bench gemm --ab`, Zen 5).
  template <int MR>
  static void micro_reg(const ActView& x, int64_t m0, int64_t k0, int64_t kc, const Panel& p, float* c,
                        int64_t ldc, int64_t nr, bool overwrite) {
    static_assert(MR >= 1 && MR <= 3);
    __m512 tile[MR][4];
    const int64_t xnb = x.stride / kQBlock;
    const int64_t nb = kc / 32;
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int64_t xb = k0 / 32 + blk;
      __m512i acci[MR][4];
      FATHOM_UNROLL
      for (int m = 0; m < MR; ++m) {
        acci[m][0] = _mm512_set1_epi32(x.qcorr_block[(m0 + m) * xnb + xb]);
        acci[m][1] = acci[m][2] = acci[m][3] = acci[m][0];
      }
      const uint32_t* b = p.b + blk * 8 * kNR;
      const int8_t* a = x.q + m0 * x.stride + xb * 32;
      FATHOM_UNROLL
      for (int q = 0; q < 8; ++q, b += kNR) {
        const __m512i b0 = _mm512_load_si512(b), b1 = _mm512_load_si512(b + 16);
        const __m512i b2 = _mm512_load_si512(b + 32), b3 = _mm512_load_si512(b + 48);
        FATHOM_UNROLL
        for (int m = 0; m < MR; ++m) {
          const __m512i av = _mm512_set1_epi32(load_i32(a + m * x.stride + 4 * q));
          acci[m][0] = _mm512_dpbusd_epi32(acci[m][0], b0, av);
          acci[m][1] = _mm512_dpbusd_epi32(acci[m][1], b1, av);
          acci[m][2] = _mm512_dpbusd_epi32(acci[m][2], b2, av);
          acci[m][3] = _mm512_dpbusd_epi32(acci[m][3], b3, av);
        }
      }
      const float* dw = p.scale + blk * kNR;
      FATHOM_UNROLL
      for (int m = 0; m < MR; ++m) {
        const __m512 dx = _mm512_set1_ps(x.qd[(m0 + m) * xnb + xb]);
        FATHOM_UNROLL
        for (int v = 0; v < 4; ++v) {
          const __m512 sc = _mm512_mul_ps(_mm512_load_ps(dw + 16 * v), dx);
          const __m512 f = _mm512_cvtepi32_ps(acci[m][v]);
          tile[m][v] = blk == 0 ? _mm512_mul_ps(f, sc) : _mm512_fmadd_ps(f, sc, tile[m][v]);
        }
      }
    }
    FATHOM_UNROLL
    for (int m = 0; m < MR; ++m) {
      FATHOM_UNROLL
      for (int v = 0; v < 4; ++v) store_tile16(c + m * ldc + 16 * v, tile[m][v], nr - 16 * v, overwrite);
    }
  }

  // Calls of up to kMR rows run as calls of at most three (four as two and two: a single row's
  // four sums are too few chains to fill the pipes).
  template <int MR>
  static void micro(const ActView& x, int64_t m0, int64_t k0, int64_t kc, const Panel& p, float* c,
                    int64_t ldc, int64_t nr, bool overwrite) {
    if constexpr (MR <= 3) {
      micro_reg<MR>(x, m0, k0, kc, p, c, ldc, nr, overwrite);
    } else {
      constexpr int kFirst = MR == 4 ? 2 : 3;
      micro_reg<kFirst>(x, m0, k0, kc, p, c, ldc, nr, overwrite);
      micro<MR - kFirst>(x, m0 + kFirst, k0, kc, p, c + kFirst * ldc, ldc, nr, overwrite);
    }
  }
};

template <DType D>
void rows_typed(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                int64_t r1) {
  if (x.m >= 1 && x.m <= 3 && address_order_wanted()) {
    switch (x.m) {
      case 1:
        stream_matvec<D, 1>(w, x, y, ldy, accumulate, r0, r1);
        return;
      case 2:
        stream_matvec<D, 2>(w, x, y, ldy, accumulate, r0, r1);
        return;
      default:
        stream_matvec<D, 3>(w, x, y, ldy, accumulate, r0, r1);
        return;
    }
  } else if (x.m <= matvec_max_m(D, SimdLevel::kAvx512)) {
    matvec_rows<D>(w, x, y, ldy, accumulate, r0, r1);
  } else {
    gemm_rows<Int8Gemm<D>>(w, x, y, ldy, accumulate, r0, r1);
  }
}

}  // namespace

void rows_int8_avx512(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                      int64_t r0, int64_t r1) {
  CHECK(x.kind == ActKind::kQ8);
  if (w.dtype == DType::kQ8_0) {
    rows_typed<DType::kQ8_0>(w, x, y, y_stride, accumulate, r0, r1);
  } else {
    CHECK(w.dtype == DType::kQ4_0);
    rows_typed<DType::kQ4_0>(w, x, y, y_stride, accumulate, r0, r1);
  }
}

}  // namespace fathom::matmul_internal
