// AVX-512 peak loops (int8 VNNI, f32 FMA) and the read-only sweep.
#include <immintrin.h>

#include "kernels/roofline.h"

namespace fathom::internal {

double peak_int8_avx512(uint64_t iterations) {
  __m512i acc[12];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], x, y);
  }
  __m512i s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_epi32(s, acc[k]);
  // Lane 0 keeps the loop alive; the lanes wrap by design, and _mm512_reduce_add_epi32 would sum
  // them in signed int (undefined on overflow, which UBSan reports).
  volatile int sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(s));
  (void)sink;
  return static_cast<double>(iterations) * 12 * 128;
}

double peak_f32_avx512(uint64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], x, y);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return static_cast<double>(iterations) * 12 * 32;
}

uint64_t read_sweep_avx512(const uint8_t* p, uint64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  uint64_t i = 0;
  for (; i + 256 <= n; i += 256) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
  }
  a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(a));
}

}  // namespace fathom::internal
