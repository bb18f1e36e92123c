// AVX-512 rows for rms_norm, softmax, silu_mul, exp (see ops_impl.h for the exp algorithm) and
// argmax.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops_impl.h"

namespace fathom::ops_internal {
namespace {

inline __mmask16 tail16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

inline __m512 exp16(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLo), _CMP_LT_OQ);
  const __mmask16 over = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpHi), _CMP_GT_OQ);
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(kExpHi), x);  // NaN passes through (second operand)
  xc = _mm512_max_ps(_mm512_set1_ps(kExpLo), xc);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP[5]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[0]));
  __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23)));
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23)));
  y = _mm512_mask_mov_ps(y, under, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, over, _mm512_set1_ps(INFINITY));
}

}  // namespace

void exp_avx512(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    _mm512_mask_storeu_ps(out + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

void rms_norm_row_avx512(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    const __m512 c = _mm512_loadu_ps(x + i + 32), d = _mm512_loadu_ps(x + i + 48);
    s0 = _mm512_fmadd_ps(a, a, s0);
    s1 = _mm512_fmadd_ps(b, b, s1);
    s2 = _mm512_fmadd_ps(c, c, s2);
    s3 = _mm512_fmadd_ps(d, d, s3);
  }
  for (; i < n; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(tail16(n - i), x + i);
    s0 = _mm512_fmadd_ps(a, a, s0);
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv);
    if (w != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i));
    _mm512_mask_storeu_ps(y + i, k, v);
  }
}

double softmax_row_avx512(const float* x, float* y, int64_t n, float scale) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail16(n - i), x + i));
  }
  const float m = _mm512_reduce_max_ps(mx);
  if (m == -INFINITY) {
    for (int64_t i = 0; i < n; i += 16) _mm512_mask_storeu_ps(y + i, tail16(n - i), _mm512_setzero_ps());
    return -INFINITY;
  }
  const __m512 mv = _mm512_set1_ps(m);
  double s = 0;  // fp32 lanes over blocks of kSumBlock values, the blocks' sums in double
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = std::min(n, b + kSumBlock);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = b; i < end; i += 16) {
      const __mmask16 k = tail16(end - i);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
      _mm512_mask_storeu_ps(y + i, k, e);
    }
    s += static_cast<double>(_mm512_reduce_add_ps(sum));
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(scale / s));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, y + i), inv));
  }
  return static_cast<double>(m) + std::log(s);
}

void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(k, up + i);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(s, u));
  }
}

int64_t argmax_avx512(const float* x, int64_t n) {
  // the largest value, four chains; max_ps(v, m) keeps m where v is NaN (the second operand wins)
  __m512 m[4];
  for (__m512& v : m) v = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 4; ++j) m[j] = _mm512_max_ps(_mm512_loadu_ps(x + i + 16 * j), m[j]);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    m[0] = _mm512_max_ps(_mm512_mask_loadu_ps(m[0], k, x + i), m[0]);
  }
  const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3])));
  // the first index holding it (NaN compares unequal)
  const __m512 target = _mm512_set1_ps(mx);
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = tail16(n - i);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), target, _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  return 0;
}

}  // namespace fathom::ops_internal
