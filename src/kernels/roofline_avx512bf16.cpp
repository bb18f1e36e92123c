// vdpbf16ps peak loop: 16 independent accumulators, 64 FLOP per instruction. 12 do not hide the
// latency on Zen 5 (measured ~8% below 16 and 24, which agree), and a kernel with 24 accumulators
// then beat the "peak".
#include <immintrin.h>

#include "kernels/roofline.h"

namespace fathom::internal {

double peak_bf16_avx512bf16(uint64_t iterations) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, y);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 16; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return static_cast<double>(iterations) * 16 * 64;
}

}  // namespace fathom::internal
