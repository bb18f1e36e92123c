// vdpbf16ps peak loop: 12 independent accumulators, 64 FLOP per instruction.
#include <immintrin.h>

#include "kernels/roofline.h"

namespace fathom::internal {

double peak_bf16_avx512bf16(uint64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, y);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return static_cast<double>(iterations) * 12 * 64;
}

}  // namespace fathom::internal
