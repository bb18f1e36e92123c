// AVX2 peak loops and read sweep (for machines without AVX-512).
#include <immintrin.h>

#include "kernels/roofline.h"

namespace fathom::internal {

double peak_f32_avx2(uint64_t iterations) {
  __m256 acc[10];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 10
    for (int k = 0; k < 10; ++k) acc[k] = _mm256_fmadd_ps(acc[k], x, y);
  }
  __m256 s = acc[0];
  for (int k = 1; k < 10; ++k) s = _mm256_add_ps(s, acc[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return static_cast<double>(iterations) * 10 * 16;
}

// AVX-VNNI is not assumed by the AVX2 path; this measures the maddubs+madd sequence it uses.
double peak_int8_avx2(uint64_t iterations) {
  __m256i acc[8];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const __m256i x = _mm256_set1_epi8(1), y = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones));
    }
  }
  __m256i s = acc[0];
  for (int k = 1; k < 8; ++k) s = _mm256_add_epi32(s, acc[k]);
  alignas(32) int out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  volatile int sink = out[0];
  (void)sink;
  return static_cast<double>(iterations) * 8 * 64;
}

uint64_t read_sweep_avx2(const uint8_t* p, uint64_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), a);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}

}  // namespace fathom::internal
