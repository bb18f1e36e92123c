// FP8 weights against a few activation rows in fp16 arithmetic, for CPUs with AVX-512 FP16
// (compiled with -mavx512fp16, chosen at run time by fp8_use_f16).
//
// Why: on the Xeons with AMX, vfmadd231ph does 32 products in a quarter of the time vdpbf16ps
// takes for its 32 (0.16 against 0.56 ns per instruction, one thread, model-167 VM), and e4m3
// converts to fp16 by shifts instead of table lookups: sign-extend the byte to 16 bits, shift left
// by 7 and clear bit 14. The result's bits are s 0 eeee mmm 0000000, an fp16 equal to the e4m3
// value times 2^-8 for normal and subnormal codes alike, so the conversion is exact. A decode
// step's experts see 1-8 tokens each, where the bf16 dot products, not the memory, bounded the
// row-wise kernel (docs/PERFORMANCE.md, "FP16 products for fp8 weights at 2-4 rows"), and at 5-7
// the tiles lost more to converting each weight tile for a handful of rows ("... at 5-7 rows"
// in the same file).
//
// Precision: the activations are the bf16-rounded rows every other path uses, scaled per row by a
// power of two (ActView::f16), so they are exact in fp16. For each 128-row weight group they are
// multiplied in fp32 by the scale of their column block and rounded once to fp16 (at most 2^-12),
// so two blocks can be summed per lane in fp16 before a conversion to fp32 (8 fused products, then
// the two 256-bit halves added). Each rounding is at most u = 2^-11 of a partial sum bounded by the
// lane's sum |x w|; matmul_test sees errors up to 0.4u of that sum (its bound is 2u), about what the
// bf16 rounding of the activations already costs. A group whose scales spread beyond 2^14 (the
// small-scale blocks' products would fall to fp16 subnormals) or are not finite runs on the bf16
// path.
//
// e4m3 NaN codes (0x7f, 0xff) would read as +-1.875 here; the kernel tracks the byte maxima of the
// rows it reads and the caller recomputes a 128-row group holding one on the bf16 path, which keeps
// NaN results.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/matmul_impl.h"
#include "kernels/simd_avx512_impl.h"
#include "tensor/tensor.h"

namespace fathom::matmul_internal {
namespace {

// Register plan of the pair kernel: zmm0-7 the fp16 sums of the current two blocks, zmm(4i + m)
// for weight row i and activation row m; zmm8-15 the fp32 totals in the same order; zmm16-19 the
// converted weights (row 0 columns 0-31 and 32-63 of a half block, then row 1); zmm20/21 one
// activation row's two vectors; zmm25 the 0xbfff word mask; zmm26 flush scratch; zmm28/29 the
// unsigned and signed byte maxima of the weights read (NaN codes); zmm30 their bytes.
// %[k] runs from -K to 0 over the weight bytes; every pointer is the end of its row.
// clang-format off
#define H8_CONV(W, D)                         \
  "vpmovsxbw " W ", %%zmm" D "\n\t"           \
  "vpsllw $7, %%zmm" D ", %%zmm" D "\n\t"     \
  "vpandd %%zmm25, %%zmm" D ", %%zmm" D "\n\t"
#define H8_NAN(W)                             \
  "vmovdqu8 " W ", %%zmm30\n\t"               \
  "vpmaxub %%zmm30, %%zmm28, %%zmm28\n\t"     \
  "vpmaxsb %%zmm30, %%zmm29, %%zmm29\n\t"
#define H8_DOT(OP, H, XP, ACC0, ACC1)                       \
  "vmovdqu16 2*" H "(%[" XP "],%[k],2), %%zmm20\n\t"        \
  "vmovdqu16 2*" H "+64(%[" XP "],%[k],2), %%zmm21\n\t"     \
  OP " %%zmm20, %%zmm16, %%" ACC0 "\n\t"                    \
  OP " %%zmm20, %%zmm18, %%" ACC1 "\n\t"                    \
  "vfmadd231ph %%zmm21, %%zmm17, %%" ACC0 "\n\t"            \
  "vfmadd231ph %%zmm21, %%zmm19, %%" ACC1 "\n\t"
#define H8_DOTS1(OP, H) H8_DOT(OP, H, "x0", "zmm0", "zmm4")
#define H8_DOTS2(OP, H) H8_DOTS1(OP, H) H8_DOT(OP, H, "x1", "zmm1", "zmm5")
#define H8_DOTS3(OP, H) H8_DOTS2(OP, H) H8_DOT(OP, H, "x2", "zmm2", "zmm6")
#define H8_DOTS4(OP, H) H8_DOTS3(OP, H) H8_DOT(OP, H, "x3", "zmm3", "zmm7")
// 64 columns at byte offset H from %[k] (the activations at 2H): request the same columns of the
// next two rows into L1 and of the two far rows into L2, track the NaN codes, convert rows 0 and
// 1, then each activation row's products (OP: vmulph where the sums start, vfmadd231ph after).
// The far rows at the same columns, as the m = 1 kernel requests its own, read 1.05-1.15x faster
// from memory than walking them one after the other (docs/PERFORMANCE.md, "FP16 products for fp8
// weights at 2-4 rows").
#define H8_HALF(OP, H, M)                                               \
  "prefetcht0 " H "(%[p0],%[k])\n\t"                                    \
  "prefetcht0 " H "(%[p1],%[k])\n\t"                                    \
  "prefetcht1 " H "(%[f0],%[k])\n\t"                                    \
  "prefetcht1 " H "(%[f1],%[k])\n\t"                                    \
  H8_NAN(H "(%[w0],%[k])") H8_NAN(H "(%[w1],%[k])")                     \
  H8_CONV(H "(%[w0],%[k])", "16") H8_CONV(H "+32(%[w0],%[k])", "17")    \
  H8_CONV(H "(%[w1],%[k])", "18") H8_CONV(H "+32(%[w1],%[k])", "19")    \
  H8_DOTS##M(OP, H)
// The fp16 sums (32 lanes) into the fp32 totals: upper half added to the lower, converted, added.
#define H8_FLUSH(A, T)                                  \
  "vextractf64x4 $1, %%zmm" A ", %%ymm26\n\t"            \
  "vaddph %%ymm" A ", %%ymm26, %%ymm26\n\t"              \
  "vcvtph2psx %%ymm26, %%zmm26\n\t"                      \
  "vaddps %%zmm26, %%zmm" T ", %%zmm" T "\n\t"
#define H8_FLUSH1 H8_FLUSH("0", "8") H8_FLUSH("4", "12")
#define H8_FLUSH2 H8_FLUSH1 H8_FLUSH("1", "9") H8_FLUSH("5", "13")
#define H8_FLUSH3 H8_FLUSH2 H8_FLUSH("2", "10") H8_FLUSH("6", "14")
#define H8_FLUSH4 H8_FLUSH3 H8_FLUSH("3", "11") H8_FLUSH("7", "15")
#define H8_ZERO(R) "vpxord %%zmm" R ", %%zmm" R ", %%zmm" R "\n\t"
#define H8_STORE(R, OFF) "vmovaps %%zmm" R ", " OFF "(%[tot])\n\t"
// Two 128-column blocks per iteration, summed per lane in fp16 and flushed once; an odd block count
// runs the first block alone. The NaN-code maxima come from and go back to the output buffer.
#define H8_LOOP(M)                                                                         \
  "vpbroadcastw %[mask], %%zmm25\n\t"                                                      \
  "vmovdqu8 512(%[tot]), %%zmm28\n\t"                                                      \
  "vmovdqu8 576(%[tot]), %%zmm29\n\t"                                                      \
  H8_ZERO("8") H8_ZERO("9") H8_ZERO("10") H8_ZERO("11")                                    \
  H8_ZERO("12") H8_ZERO("13") H8_ZERO("14") H8_ZERO("15")                                  \
  "test %[odd], %[odd]\n\t"                                                                \
  "jz 2f\n\t"                                                                              \
  H8_HALF("vmulph", "0", M) H8_HALF("vfmadd231ph", "64", M) H8_FLUSH##M                    \
  "add $128, %[k]\n\t"                                                                     \
  "jz 3f\n\t"                                                                              \
  "2:\n\t"                                                                                 \
  H8_HALF("vmulph", "0", M) H8_HALF("vfmadd231ph", "64", M)                                \
  H8_HALF("vfmadd231ph", "128", M) H8_HALF("vfmadd231ph", "192", M) H8_FLUSH##M            \
  "add $256, %[k]\n\t"                                                                     \
  "jnz 2b\n\t"                                                                             \
  "3:\n\t"                                                                                 \
  H8_STORE("8", "0") H8_STORE("9", "64") H8_STORE("10", "128") H8_STORE("11", "192")       \
  H8_STORE("12", "256") H8_STORE("13", "320") H8_STORE("14", "384") H8_STORE("15", "448")  \
  "vmovdqu8 %%zmm28, 512(%[tot])\n\t"                                                      \
  "vmovdqu8 %%zmm29, 576(%[tot])\n\t"

#define H8_CLOBBERS                                                                                  \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",   \
      "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21",       \
      "xmm25", "xmm26", "xmm28", "xmm29", "xmm30", "cc", "memory"
// clang-format on

// The pair kernel's activation rows at most (its register plan); single_kernel takes more.
constexpr int64_t kPairMaxM = 4;

// Output of the pair kernel: per-lane fp32 totals [weight row][activation row][16] (zero for rows
// beyond m), then the byte maxima of the weights read (unsigned, signed), which the kernel updates
// (the caller clears them once per weight group).
struct alignas(64) PairOut {
  float tot[2][4][16];
  uint8_t max_u[64];
  int8_t max_s[64];
};

// Weight rows w0 and w0 + K against m (1..4) fp16 activation rows x + i * xs that already carry
// the block scales; K % 128 == 0. pf, pf + K: rows to request into L1 and far, far + K: rows to
// request into L2, both at the columns being read.
void pair_kernel(int m, const uint8_t* w0, int64_t K, const uint16_t* x, int64_t xs, const uint8_t* pf,
                 const uint8_t* far, PairOut& out) {
  int64_t k = -K;
  const int64_t odd = (K / 128) % 2;
  const Fp8PairEnds e(m, w0, K, x, xs, pf, far);
  float* tot = &out.tot[0][0][0];
  const uint32_t mask = 0xbfff;
#define H8_ASM(M)                                                                                  \
  asm volatile(H8_LOOP(M)                                                                          \
               : [k] "+r"(k)                                                                       \
               : [w0] "r"(e.w0), [w1] "r"(e.w1), [p0] "r"(e.p0), [p1] "r"(e.p1), [x0] "r"(e.x0),   \
                 [x1] "r"(e.x1), [x2] "r"(e.x2), [x3] "r"(e.x3), [tot] "r"(tot), [mask] "r"(mask), \
                 [f0] "r"(e.f0), [f1] "r"(e.f1), [odd] "r"(odd)                                    \
               : H8_CLOBBERS)
  switch (m) {
    case 1:
      H8_ASM(1);
      return;
    case 2:
      H8_ASM(2);
      return;
    case 3:
      H8_ASM(3);
      return;
    default:
      H8_ASM(4);
      return;
  }
#undef H8_ASM
}

// Whether the bytes the kernel read since the maxima were cleared held an e4m3 NaN code (0x7f or
// 0xff).
inline bool saw_nan(__m512i max_u, __m512i max_s) {
  return (_mm512_cmpeq_epi8_mask(max_u, _mm512_set1_epi8(static_cast<char>(0xff))) |
          _mm512_cmpeq_epi8_mask(max_s, _mm512_set1_epi8(0x7f))) != 0;
}
inline bool saw_nan(const PairOut& o) {
  return saw_nan(_mm512_load_si512(o.max_u), _mm512_load_si512(o.max_s));
}

// Weight rows one at a time against M (5..7) fp16 activation rows, in intrinsics (the register plan
// fits: M fp16 sums, M fp32 totals, the row's two converted vectors, the NaN maxima). Reading more
// than four activation rows in the pair kernel would need more registers than there are, and two
// four-row sweeps convert every weight twice (at 6 rows they read 0.48 of the bandwidth from
// memory, this kernel 0.60-0.61). x holds the scaled rows interleaved per 32 columns
// ([K / 32][M][32], so the M vectors of a column chunk are adjacent); pf and far as the pair
// kernel's, one row each. tot gets row i's per-lane totals at tot[i].
template <int M>
void single_kernel(const uint8_t* w, int64_t K, const uint16_t* x, const uint8_t* pf, const uint8_t* far,
                   __m512 (&tot)[8], __m512i& max_u, __m512i& max_s) {
  const __m512i mask = _mm512_set1_epi16(static_cast<short>(0xbfff));
  __m512i mu = max_u, ms = max_s;
  __m512h acc[M];
  __m512 t[M];  // in registers, copied to tot at the end
  FATHOM_UNROLL
  for (int i = 0; i < M; ++i) t[i] = _mm512_setzero_ps();
  // 64 columns at c: the same columns of the next row into L1 and of the far row into L2, the NaN
  // maxima, the conversion, then each activation row's two products
  const auto half = [&](int64_t c) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + c), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(far + c), _MM_HINT_T1);
    const __m512i b = _mm512_loadu_si512(w + c);
    mu = _mm512_max_epu8(mu, b);
    ms = _mm512_max_epi8(ms, b);
    const __m512h w0 = _mm512_castsi512_ph(_mm512_and_si512(
        _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c))),
                          7),
        mask));
    const __m512h w1 = _mm512_castsi512_ph(_mm512_and_si512(
        _mm512_slli_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c + 32))), 7),
        mask));
    const uint16_t* xc = x + (c / 32) * M * 32;
    FATHOM_UNROLL
    for (int i = 0; i < M; ++i) {
      const __m512h a0 = _mm512_castsi512_ph(_mm512_load_si512(xc + i * 32));
      const __m512h a1 = _mm512_castsi512_ph(_mm512_load_si512(xc + (M + i) * 32));
      acc[i] = _mm512_fmadd_ph(a1, w1, _mm512_fmadd_ph(a0, w0, acc[i]));
    }
  };
  const auto flush = [&] {
    FATHOM_UNROLL
    for (int i = 0; i < M; ++i) {
      const __m256h lo = _mm512_castph512_ph256(acc[i]);
      const __m256h hi = _mm256_castsi256_ph(_mm512_extracti64x4_epi64(_mm512_castph_si512(acc[i]), 1));
      t[i] = _mm512_add_ps(t[i], _mm512_cvtxph_ps(_mm256_add_ph(lo, hi)));
    }
  };
  const int64_t nb = K / 128;
  int64_t c = 0;
  for (int64_t b = 0; b < nb;) {
    const int64_t n = b == 0 && nb % 2 != 0 ? 1 : 2;
    FATHOM_UNROLL
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ph();
    for (int64_t j = 0; j < n; ++j, c += 128) {
      half(c);
      half(c + 64);
    }
    flush();
    b += n;
  }
  FATHOM_UNROLL
  for (int i = 0; i < M; ++i) tot[i] = t[i];
  max_u = mu;
  max_s = ms;
}

// The activation rows of one 128-row weight group: row i's fp16 values (|x| < 2^10) times the
// scale of their column block and a power of two 2^t that puts the group's largest scale in
// [1/2, 1), in fp32, rounded to fp16. factor[i] turns row i's sums back: f16_unscale[i] * 2^-t.
// False (nothing written) when a scale is not finite or a nonzero one is below 2^-14 after the
// power of two.
// Rows are [m][K] for the pair kernel (m <= kPairMaxM) and interleaved per 32 columns,
// [K / 32][m][32], for single_kernel (more rows).
struct ScaledRows {
  Buffer x;  // 64-byte aligned
  float factor[8] = {};
  void reserve(int64_t m, int64_t K) {
    const size_t bytes = static_cast<size_t>(m * K) * 2;
    if (x.size() < bytes) x = Buffer::allocate(bytes);
  }
};

bool scale_rows(const ActView& a, int64_t m, int64_t K, const float* scale, ScaledRows& out) {
  const int64_t nkb = K / 128;
  float smax = 0, smin = __builtin_inff();
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const float v = std::fabs(scale[kb]);
    if (!std::isfinite(v)) return false;
    smax = std::max(smax, v);
    if (v > 0) smin = std::min(smin, v);
  }
  int t = 0;
  if (smax > 0) {
    std::frexp(smax, &t);  // smax in [2^(t-1), 2^t)
    t = -t;
    if (t > 126 || t < -126 || std::ldexp(smin, t) < 0x1p-14f) return false;
  }
  for (int64_t i = 0; i < m; ++i) out.factor[i] = a.f16_unscale[i] * std::ldexp(1.0f, -t);
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const __m512 s = _mm512_set1_ps(std::ldexp(scale[kb], t));
    for (int64_t col = kb * 128; col < kb * 128 + 128; col += 32) {  // 32 columns: one 64-byte store
      for (int64_t i = 0; i < m; ++i) {
        const uint16_t* xi = a.f16 + i * a.stride + col;
        const __m256i lo = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtxph_ps(_mm256_loadu_ph(xi)), s),
                                           _MM_FROUND_TO_NEAREST_INT);
        const __m256i hi = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtxph_ps(_mm256_loadu_ph(xi + 16)), s),
                                           _MM_FROUND_TO_NEAREST_INT);
        uint16_t* o = out.x.as<uint16_t>() + (m <= kPairMaxM ? i * K + col : (col / 32 * m + i) * 32);
        _mm512_store_si512(o, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
      }
    }
  }
  return true;
}

// Runs rows [r0, r1) by 128-row scale groups: scale_rows, then group(g0, g1, sums), which fills
// sums ([weight row - g0][activation row]) and returns whether the weights held a NaN code, then
// the sums times each row's factor into y. A group whose activations cannot be scaled, or whose
// weights held a NaN code, runs on the bf16 path instead (which keeps NaN results; nothing of the
// group was written yet).
template <int S, typename Group>
void over_groups(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                 int64_t r1, ScaledRows& sr, Group&& group) {
  alignas(64) float sums[128][S];
  for (int64_t g0 = r0; g0 < r1; g0 = (g0 / 128 + 1) * 128) {
    const int64_t g1 = std::min(r1, (g0 / 128 + 1) * 128);
    if (!scale_rows(x, x.m, w.cols, fp8_scale_row(w, g0), sr) || group(g0, g1, sums)) {
      rows_fp8_vbmi_avx512bf16(w, x, y, ldy, accumulate, g0, g1);
      continue;
    }
    for (int64_t i = 0; i < x.m; ++i) {
      float* yi = y + i * ldy;
      for (int64_t r = g0; r < g1; ++r) {
        const float v = sums[r - g0][i] * sr.factor[i];
        yi[r] = accumulate ? yi[r] + v : v;
      }
    }
  }
}

// Rows [r0, r1) at 5..7 activation rows, one weight row at a time (single_kernel).
int64_t rows_single(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate, int64_t r0,
                    int64_t r1, ScaledRows& sr) {
  const int64_t K = w.cols, m = x.m;
  const int mi = static_cast<int>(m);
  // the next row into L1 and the row kFar ahead into L2, both at the columns being read
  constexpr int64_t kAhead = 1, kFar = 8;
  prefetch_range_l1(fp8_row(w, r0), std::min<int64_t>(kAhead, r1 - r0) * K);
  const uint16_t* xs = sr.x.as<uint16_t>();
  over_groups<8>(w, x, y, ldy, accumulate, r0, r1, sr, [&](int64_t g0, int64_t g1, float(*sums)[8]) {
    __m512i max_u = _mm512_setzero_si512(), max_s = _mm512_setzero_si512();
    __m512 tot[8];
    for (int64_t r = g0; r < g1; ++r) {
      const uint8_t* self = fp8_row(w, r);
      const uint8_t* pf = r + kAhead < r1 ? fp8_row(w, r + kAhead) : self;
      const uint8_t* far = r + kFar < r1 ? fp8_row(w, r + kFar) : self;
      switch (mi) {
        case 5:
          single_kernel<5>(self, K, xs, pf, far, tot, max_u, max_s);
          break;
        case 6:
          single_kernel<6>(self, K, xs, pf, far, tot, max_u, max_s);
          break;
        default:
          single_kernel<7>(self, K, xs, pf, far, tot, max_u, max_s);
          break;
      }
      for (int i = mi; i < 8; ++i) tot[i] = _mm512_setzero_ps();
      _mm_store_ps(sums[r - g0], hsum4(tot[0], tot[1], tot[2], tot[3]));
      _mm_store_ps(sums[r - g0] + 4, hsum4(tot[4], tot[5], tot[6], tot[7]));
    }
    return saw_nan(max_u, max_s);
  });
  return r1;
}

}  // namespace

int64_t rows_fp8_f16_avx512fp16(const WeightView& w, const ActView& x, float* y, int64_t ldy, bool accumulate,
                                int64_t r0, int64_t r1) {
  CHECK(x.f16 != nullptr && w.dtype == DType::kF8E4M3 && w.cols % 128 == 0 && r0 % 2 == 0 &&
        x.m <= kFp8F16MaxM);
  const int64_t K = w.cols, m = x.m;
  const int mi = static_cast<int>(m);
  thread_local ScaledRows sr;
  sr.reserve(m, K);
  if (m > kPairMaxM) return rows_single(w, x, y, ldy, accumulate, r0, r1, sr);
  const int64_t re = r0 + (r1 - r0) / 2 * 2;  // whole pairs; the caller takes a last odd row
  // the next pair into L1 and the rows kFar ahead into L2, both while this pair is read
  // (from memory, m = 2-4: 2 and 8 rows ahead read like 4 / 8, 4 / 12, 4 / 16 and 2 / 16, except m =
  // 4 on [1408 x 2048], 0.71 against 0.64; 6 / 12 was slower)
  constexpr int64_t kAhead = 2, kFar = 8;
  prefetch_range_l1(fp8_row(w, r0), std::min<int64_t>(kAhead, re - r0) * K);
  PairOut out;
  over_groups<4>(w, x, y, ldy, accumulate, r0, re, sr, [&](int64_t g0, int64_t g1, float(*sums)[4]) {
    std::memset(out.max_u, 0, sizeof(out.max_u));
    std::memset(out.max_s, 0, sizeof(out.max_s));
    for (int64_t r = g0; r < g1; r += 2) {
      const uint8_t* self = fp8_row(w, r);
      const uint8_t* pf = r + kAhead + 2 <= re ? fp8_row(w, r + kAhead) : self;
      const uint8_t* far = r + kFar + 2 <= re ? fp8_row(w, r + kFar) : self;
      pair_kernel(mi, self, K, sr.x.as<uint16_t>(), K, pf, far, out);
      const auto t = [&](int row, int i) { return _mm512_load_ps(out.tot[row][i]); };
      _mm_store_ps(sums[r - g0], hsum4(t(0, 0), t(0, 1), t(0, 2), t(0, 3)));
      _mm_store_ps(sums[r - g0 + 1], hsum4(t(1, 0), t(1, 1), t(1, 2), t(1, 3)));
    }
    return saw_nan(out);
  });
  return re;
}

// The bf16 rounding of every path, then the row's power of two: e with max |x| * 2^e in
// [2^9, 2^10) (0 for an all-zero or non-finite row; clamped to +-100 for extreme rows), so a
// 128-column block's fp16 lane sums stay below 8 * 2^10 * 1.75.
void act_to_f16_rows_avx512fp16(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                                float* unscale, int64_t i0, int64_t i1) {
  auto load_bf16 = [&](const float* xi, int64_t c) {  // 16 values rounded as every path does, 0 past k
    const __mmask16 lanes = static_cast<__mmask16>(k - c >= 16 ? 0xffff : (1u << (k - c)) - 1);
    const __m512 v = c < k ? _mm512_maskz_loadu_ps(lanes, xi + c) : _mm512_setzero_ps();
    return bf16_to_f32x16(f32_to_bf16_rne(v));
  };
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * x_stride;
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nonfinite = 0;
    for (int64_t c = 0; c < k; c += 16) {
      const __m512 v = _mm512_abs_ps(load_bf16(xi, c));
      nonfinite |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ);  // inf or NaN
      mx = _mm512_max_ps(mx, v);
    }
    const float amax = _mm512_reduce_max_ps(mx);
    int e = 0;
    if (nonfinite == 0 && amax > 0) {
      int q = 0;
      std::frexp(amax, &q);  // amax in [2^(q-1), 2^q)
      e = std::clamp(10 - q, -100, 100);
    }
    const __m512 scale = _mm512_set1_ps(std::ldexp(1.0f, e));
    uint16_t* oi = out + i * stride;
    for (int64_t c = 0; c < stride; c += 16) {
      const __m512 v = _mm512_mul_ps(load_bf16(xi, c), scale);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(oi + c), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    unscale[i] = std::ldexp(1.0f, 8 - e);
  }
}

}  // namespace fathom::matmul_internal
