// The e4m3 -> bf16 converter of CPUs with AVX-512 VBMI, shared by the row-wise FP8 kernels
// (matmul_fp8vbmi_avx512bf16.cpp) and the AMX tiles (matmul_amx_avx512bf16.cpp): two vpermi2b
// byte-table lookups (low and high byte of the 128 magnitudes), the sign OR-ed in, and an unpack,
// 5 instructions per 64 weights. The unpack interleaves within 128-bit lanes, so the converted
// values come out in the order of fp8_perm64_index and the activations are prepared in the same
// order (ActView::bf16_perm64). Include only from files compiled with -mavx512vbmi.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/simd_avx512_impl.h"

namespace fathom::matmul_internal {
namespace {

struct ByteTables {
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t hi[128];
  constexpr ByteTables() : lo(), hi() {
    for (int i = 0; i < 128; ++i) {
      lo[i] = static_cast<uint8_t>(e4m3_mag_to_bf16(i) & 0xff);
      hi[i] = static_cast<uint8_t>(e4m3_mag_to_bf16(i) >> 8);
    }
  }
};
inline constexpr ByteTables kByteTables{};

struct Fp8VbmiConvert {
  __m512i lo0, lo1, hi0, hi1;
  Fp8VbmiConvert()
      : lo0(_mm512_load_si512(kByteTables.lo)),
        lo1(_mm512_load_si512(kByteTables.lo + 64)),
        hi0(_mm512_load_si512(kByteTables.hi)),
        hi1(_mm512_load_si512(kByteTables.hi + 64)) {}
  // a: bf16 of bytes 0-7, 16-23, 32-39, 48-55; b: bytes 8-15, 24-31, 40-47, 56-63.
  inline void convert64(const uint8_t* p, __mmask64 mask, __m512i& a, __m512i& b) const {
    const __m512i v = _mm512_maskz_loadu_epi8(mask, p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, v, lo1);  // index bits 0-6; the sign bit is ignored
    const __m512i hi =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, v, hi1), v,
                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);  // hi | (v & 0x80)
    a = _mm512_unpacklo_epi8(lo, hi);
    b = _mm512_unpackhi_epi8(lo, hi);
  }
};

}  // namespace
}  // namespace fathom::matmul_internal
