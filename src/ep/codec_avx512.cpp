// AVX-512 row codecs: the same arithmetic as the scalar references in codec.cpp, 16 lanes at a
// time with masked tails. e4m3 encoding is done with integer operations on the f32 bits
// (round-to-nearest-even on the mantissa, subnormals through an exact x*512 and a rounding
// conversion, saturation to 448), since AVX-512 has no FP8 conversion instruction.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ep/codec.h"

namespace fathom::ep::internal {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

inline __m512 load16(const void* src, bool bf16, int64_t i, __mmask16 m) {
  if (bf16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + i);
}

inline __m256i f32_to_bf16_16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i q = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_blend_epi32(nan, r, q);
  return _mm512_cvtepi32_epi16(r);
}

inline __m128i e4m3_encode16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
  const __mmask16 sat = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x43e80000));  // >= 464
  const __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3c800000));  // < 2^-6
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7ffff)));
  // (biased f32 exponent - 120) << 3 | top three mantissa bits == (r >> 20) - 960
  __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(960));
  code = _mm512_min_epu32(code, _mm512_set1_epi32(0x7e));
  const __m512i subc = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)));
  code = _mm512_mask_blend_epi32(sub, code, subc);
  code = _mm512_mask_blend_epi32(sat, code, _mm512_set1_epi32(0x7e));
  code = _mm512_mask_blend_epi32(nan, code, _mm512_set1_epi32(0x7f));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

// Four vectors of codes (0..255 in 32-bit lanes) as 64 bytes in order: two saturating packs work
// within 128-bit lanes, so byte lane L holds dwords (c0, c1, c2, c3) of lane L; one permute puts
// each vector's 16 bytes back together.
inline void store_codes64(uint8_t* dst, __m512i c0, __m512i c1, __m512i c2, __m512i c3) {
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(idx, b));
}

// e4m3 codes of 16 finite values with |v| <= 448 (1 + 2^-22): no NaN or saturation cases, so the
// code is the rounded exponent-and-mantissa field, or the subnormal x * 512 rounded, plus the sign.
inline __m512i e4m3_finite16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7ffff)));
  __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(960));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3c800000));  // < 2^-6
  if (sub != 0)
    code = _mm512_mask_cvtps_epi32(code, sub, _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)));
  // code | ((bits >> 24) & 0x80)
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80), 0xf8);
}

// A whole group of 128 values stays in eight registers between the amax and the encoding. The
// amax is an integer max over the magnitudes' bits (the same order as floats for finite values);
// a group holding NaN or inf takes the general encoder.
__attribute__((always_inline)) inline void encode_fp8_group(const void* src, bool bf16, int64_t g0, uint8_t* dst,
                                                           float* scale) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512 v[8];
  __m512i vmax = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    v[j] = load16(src, bf16, g0 + 16 * j, __mmask16(0xffff));
    vmax = _mm512_max_epu32(vmax, _mm512_and_si512(_mm512_castps_si512(v[j]), abs_mask));
  }
  const uint32_t amax_bits = _mm512_reduce_max_epu32(vmax);
  const bool finite = amax_bits < 0x7f800000u;
  float amax;
  if (finite) {
    std::memcpy(&amax, &amax_bits, 4);
  } else {
    __m512 fmax = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) fmax = _mm512_max_ps(fmax, _mm512_and_ps(v[j], _mm512_castsi512_ps(abs_mask)));
    amax = _mm512_reduce_max_ps(fmax);
  }
  amax = std::max(amax, 1e-4f);
  const __m512 inv = _mm512_set1_ps(448.0f / amax);
  *scale = amax / 448.0f;
  if (!finite) {
    for (int j = 0; j < 8; ++j)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + g0 + 16 * j), e4m3_encode16(_mm512_mul_ps(v[j], inv)));
    return;
  }
  __m512i c[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) c[j] = e4m3_finite16(_mm512_mul_ps(v[j], inv));
  store_codes64(dst + g0, c[0], c[1], c[2], c[3]);
  store_codes64(dst + g0 + 64, c[4], c[5], c[6], c[7]);
}

// The last, partial group of a row ([g0, n), n - g0 < 128), with masked loads and stores.
void encode_fp8_tail(const void* src, bool bf16, int64_t g0, int64_t n, uint8_t* dst, float* scales) {
  if (g0 >= n) return;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t i = g0; i < n; i += 16)
    vmax = _mm512_max_ps(vmax, _mm512_and_ps(load16(src, bf16, i, tail_mask(n - i)), abs_mask));
  const float amax = std::max(_mm512_reduce_max_ps(vmax), 1e-4f);
  const __m512 inv = _mm512_set1_ps(448.0f / amax);
  scales[g0 / kFp8Group] = amax / 448.0f;
  for (int64_t i = g0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m128i q = e4m3_encode16(_mm512_mul_ps(load16(src, bf16, i, m), inv));
    _mm_mask_storeu_epi8(dst + i, m, q);
  }
}

void encode_fp8(const void* src, bool bf16, int64_t n, uint8_t* dst, float* scales) {
  const int64_t full = n / kFp8Group * kFp8Group;
  for (int64_t g0 = 0; g0 < full; g0 += kFp8Group)
    encode_fp8_group(src, bf16, g0, dst, scales + g0 / kFp8Group);
  encode_fp8_tail(src, bf16, full, n, dst, scales);
}

// Streams bytes [off, off + len) of the encoded row src to every destination (len a multiple of
// 64; the destinations 64-byte aligned).
inline void stream_chunk(uint8_t* const* dsts, int nd, const uint8_t* src, uint64_t off, uint64_t len) {
  for (uint64_t i = off; i < off + len; i += 64) {
    const __m512i v = _mm512_loadu_si512(src + i);
    for (int k = 0; k < nd; ++k) _mm512_stream_si512(reinterpret_cast<__m512i*>(dsts[k] + i), v);
  }
}

inline __m512 load_row16(const void* row, WireFormat f, int64_t i, __mmask16 m) {
  return load16(row, f == WireFormat::kBF16, i, m);
}

}  // namespace

void encode_row_avx512(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales) {
  if (f == WireFormat::kFP8) return encode_fp8(src, src_bf16, n, static_cast<uint8_t*>(dst), scales);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = load16(src, src_bf16, i, m);
    if (f == WireFormat::kF32) {
      _mm512_mask_storeu_ps(static_cast<float*>(dst) + i, m, v);
    } else {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(dst) + i, m, f32_to_bf16_16(v));
    }
  }
}

void encode_row_multi_avx512(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst,
                             float* scales, uint8_t* const* dsts, float* const* dst_scales, int nd) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  const int64_t full = n / kFp8Group * kFp8Group;
  const uint64_t scale_bytes = f == WireFormat::kFP8 ? static_cast<uint64_t>(fp8_scale_cols(n)) * 4 : 0;
  // A few scale rows share lines with other senders' rows: requested for writing now, so their
  // reads for ownership complete while the row is encoded (streaming them would need whole lines).
  for (int k = 0; k < nd && scale_bytes; ++k) {
    if (!dst_scales[k]) continue;
    const uintptr_t a = reinterpret_cast<uintptr_t>(dst_scales[k]);
    for (uintptr_t l = a & ~uintptr_t{63}; l < a + scale_bytes; l += 64)
      asm volatile("prefetchw (%0)" : : "r"(l));
  }
  if (f == WireFormat::kFP8) {
    for (int64_t g0 = 0; g0 < full; g0 += kFp8Group) {
      encode_fp8_group(src, src_bf16, g0, out, scales + g0 / kFp8Group);
      stream_chunk(dsts, nd, out, static_cast<uint64_t>(g0), kFp8Group);
    }
    encode_fp8_tail(src, src_bf16, full, n, out, scales);
  } else {
    const uint64_t in_elem = src_bf16 ? 2 : 4, chunk = wire_row_bytes(f, kFp8Group);
    for (int64_t g0 = 0; g0 < full; g0 += kFp8Group) {
      const uint64_t at = static_cast<uint64_t>(g0 / kFp8Group) * chunk;
      encode_row_avx512(static_cast<const uint8_t*>(src) + static_cast<uint64_t>(g0) * in_elem, src_bf16, f,
                        kFp8Group, out + at, nullptr);
      stream_chunk(dsts, nd, out, at, chunk);
    }
    if (full < n)
      encode_row_avx512(static_cast<const uint8_t*>(src) + static_cast<uint64_t>(full) * in_elem, src_bf16, f,
                        n - full, out + wire_row_bytes(f, full), nullptr);
  }
  const uint64_t done = wire_row_bytes(f, full), bytes = wire_row_bytes(f, n);
  for (int k = 0; k < nd && done < bytes; ++k) std::memcpy(dsts[k] + done, out + done, bytes - done);
  for (int k = 0; k < nd && scale_bytes; ++k)
    if (dst_scales[k]) std::memcpy(dst_scales[k], scales, scale_bytes);
}

void accumulate_row_avx512(float* acc, const void* row, WireFormat f, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 a = _mm512_maskz_loadu_ps(m, acc + i);
    _mm512_mask_storeu_ps(acc + i, m, _mm512_add_ps(a, load_row16(row, f, i, m)));
  }
}

void axpy_row_avx512(float* acc, float w, const void* row, WireFormat f, int64_t n) {
  const __m512 vw = _mm512_set1_ps(w);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 a = _mm512_maskz_loadu_ps(m, acc + i);
    const __m512 p = _mm512_mul_ps(vw, load_row16(row, f, i, m));
    _mm512_mask_storeu_ps(acc + i, m, _mm512_add_ps(a, p));
  }
}

void copy_row_stream_multi_avx512(uint8_t* const* dsts, int n, const void* src, uint64_t bytes) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint64_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    const __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64);
    const __m512i c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
    for (int k = 0; k < n; ++k) {
      uint8_t* d = dsts[k] + i;
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d), a);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64), b);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 128), c);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 192), e);
    }
  }
  for (; i + 64 <= bytes; i += 64) {
    const __m512i a = _mm512_loadu_si512(s + i);
    for (int k = 0; k < n; ++k) _mm512_stream_si512(reinterpret_cast<__m512i*>(dsts[k] + i), a);
  }
  for (int k = 0; k < n && i < bytes; ++k) std::memcpy(dsts[k] + i, s + i, bytes - i);
}

void sum_rows_avx512(float* out, const void* const* rows, int n, WireFormat f, int64_t count, bool stream) {
  stream = stream && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 m = tail_mask(count - i);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) acc = _mm512_add_ps(acc, load_row16(rows[j], f, i, m));
    if (stream && m == 0xffff) {
      _mm512_stream_ps(out + i, acc);
    } else {
      _mm512_mask_storeu_ps(out + i, m, acc);
    }
  }
}

void weighted_sum_rows_avx512(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                              int64_t count) {
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 m = tail_mask(count - i);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j)
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w[j]), load_row16(rows[j], f, i, m)));
    _mm512_mask_storeu_ps(out + i, m, acc);
  }
}

void decode_fp8_row_avx512(const uint8_t* q, const float* scales, int64_t n, float* out) {
  const __m512i k7 = _mm512_set1_epi32(7), k15 = _mm512_set1_epi32(15);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, q + i));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    const __m512i e = _mm512_and_si512(_mm512_srli_epi32(b, 3), k15);
    const __m512i mant = _mm512_and_si512(b, k7);
    __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(120)), 23),
                                   _mm512_slli_epi32(mant, 20));
    const __m512i sub =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mant), _mm512_set1_ps(0.001953125f)));
    bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), bits, sub);
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(e, k15) & _mm512_cmpeq_epi32_mask(mant, k7);
    bits = _mm512_mask_blend_epi32(nan, bits, _mm512_set1_epi32(0x7fc00000));
    const __m512 v = _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_set1_ps(scales[i / kFp8Group])));
  }
}

}  // namespace fathom::ep::internal
