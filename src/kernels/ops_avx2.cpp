// AVX2 rows for rms_norm, softmax, silu_mul, exp (see ops_impl.h for the exp algorithm) and argmax.
// Tails (n % 8) run the scalar formulas on a zero-padded copy so no load reads past the end.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops_impl.h"

namespace fathom::ops_internal {
namespace {

inline __m256 exp8(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(kExpHi), _CMP_GT_OQ);
  __m256 xc = _mm256_min_ps(_mm256_set1_ps(kExpHi), x);
  xc = _mm256_max_ps(_mm256_set1_ps(kExpLo), xc);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP[5]);
  for (int j = 4; j >= 0; --j) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[j]));
  __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
  y = _mm256_andnot_ps(under, y);
  return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
}

// Applies fn to [i, n) (fewer than 8 values) through a padded copy.
template <typename F>
inline void tail8(int64_t i, int64_t n, float pad, const float* a, float* out, F fn) {
  if (i >= n) return;
  alignas(32) float buf[8];
  for (int j = 0; j < 8; ++j) buf[j] = i + j < n ? a[i + j] : pad;
  _mm256_store_ps(buf, fn(_mm256_load_ps(buf)));
  std::memcpy(out + i, buf, static_cast<size_t>(n - i) * 4);
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

}  // namespace

void exp_avx2(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(x + i)));
  tail8(i, n, 0.0f, x, out, exp8);
}

void rms_norm_row_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
  }
  float ss = hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv_s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 inv = _mm256_set1_ps(inv_s);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), inv);
    if (w != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) y[i] = w != nullptr ? x[i] * inv_s * w[i] : x[i] * inv_s;
}

double softmax_row_avx2(const float* x, float* y, int64_t n, float scale) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float m = -INFINITY;
  for (float v : lanes) m = std::fmax(m, v);
  for (; i < n; ++i) m = std::fmax(m, x[i]);
  if (m == -INFINITY) {
    std::memset(y, 0, static_cast<size_t>(n) * 4);
    return -INFINITY;
  }
  const __m256 mv = _mm256_set1_ps(m);
  auto shifted_exp = [&](__m256 v) { return exp8(_mm256_sub_ps(v, mv)); };
  double s = 0;  // fp32 lanes over blocks of kSumBlock values, the blocks' sums in double
  for (i = 0; i + 8 <= n;) {
    const int64_t end = std::min(n - n % 8, i + kSumBlock);
    __m256 sum = _mm256_setzero_ps();
    for (; i < end; i += 8) {
      const __m256 e = shifted_exp(_mm256_loadu_ps(x + i));
      sum = _mm256_add_ps(sum, e);
      _mm256_storeu_ps(y + i, e);
    }
    s += static_cast<double>(hsum8(sum));
  }
  tail8(i, n, -INFINITY, x, y, shifted_exp);
  for (; i < n; ++i) s += static_cast<double>(y[i]);
  const float inv = static_cast<float>(scale / s);
  for (i = 0; i < n; ++i) y[i] *= inv;
  return static_cast<double>(m) + std::log(s);
}

void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

int64_t argmax_avx2(const float* x, int64_t n) {
  // the largest value, four chains; max_ps(v, m) keeps m where v is NaN (the second operand wins)
  __m256 m[4];
  for (__m256& v : m) v = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) m[j] = _mm256_max_ps(_mm256_loadu_ps(x + i + 8 * j), m[j]);
  }
  for (; i + 8 <= n; i += 8) m[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), m[0]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
  float mx = -INFINITY;
  for (float v : lanes) mx = v > mx ? v : mx;
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  // the first index holding it (NaN compares unequal)
  const __m256 target = _mm256_set1_ps(mx);
  for (i = 0; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (eq != 0) return i + __builtin_ctz(static_cast<unsigned>(eq));
  }
  for (; i < n; ++i) {
    if (x[i] == mx) return i;
  }
  return 0;
}

}  // namespace fathom::ops_internal
