// Scalar reference conversions. See convert.h for the exact semantics.
#include "tensor/convert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "base/check.h"

namespace fathom {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in f32
    float v = static_cast<float>(mant) * 0x1.0p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even.
    const float a = bits_to_f32(x) * 0x1.0p24f;  // exact scaling
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a)));
  }
  x += 0xfffu + ((x >> 13) & 1u);
  x -= 112u << 23;
  return static_cast<uint16_t>(sign | (x >> 13));
}

namespace {

constexpr float e4m3_decode_one(uint8_t v) {
  const int sign = v >> 7;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float mag = 0;
  if (exp == 0xf && mant == 0x7) {
    mag = __builtin_nanf("");
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * 0.001953125f;  // mant/8 * 2^-6 = mant * 2^-9
  } else {
    float m = 1.0f + static_cast<float>(mant) / 8.0f;
    int e = exp - 7;
    float p = 1.0f;
    if (e >= 0) {
      for (int i = 0; i < e; ++i) p *= 2.0f;
    } else {
      for (int i = 0; i < -e; ++i) p *= 0.5f;
    }
    mag = m * p;
  }
  return sign ? -mag : mag;
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = e4m3_decode_one(static_cast<uint8_t>(i));
  return t;
}

constexpr std::array<float, 256> kE4M3Table = make_e4m3_table();

}  // namespace

const float kE4M3ToF32[256] = {
#define R(i) kE4M3Table[i]
#define R8(i) R(i), R(i + 1), R(i + 2), R(i + 3), R(i + 4), R(i + 5), R(i + 6), R(i + 7)
#define R64(i) R8(i), R8(i + 8), R8(i + 16), R8(i + 24), R8(i + 32), R8(i + 40), R8(i + 48), R8(i + 56)
    R64(0), R64(64), R64(128), R64(192)
#undef R64
#undef R8
#undef R
};

uint8_t f32_to_e4m3(float f) {
  uint32_t x = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);  // NaN
  if (x >= 0x43e80000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 464 (incl. inf): saturate
  if (x < 0x3c800000u) {
    // below 2^-6, the smallest normal: a multiple of 2^-9, RNE; 8 becomes the smallest normal.
    const float a = bits_to_f32(x) * 512.0f;
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a)));
  }
  x += 0x7ffffu + ((x >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
  const uint32_t exp = (x >> 23) - 127 + 7;
  const uint32_t mant = (x >> 20) & 7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return static_cast<uint8_t>(sign | 0x7e);
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  CHECK(n % kQ8_0Block == 0);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const float* xb = x + b * kQ8_0Block;
    float amax = 0.0f;
    for (int j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < kQ8_0Block; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  CHECK(n % kQ8_0Block == 0);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQ8_0Block; ++j) y[b * kQ8_0Block + j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  CHECK(n % kQ4_0Block == 0);
  for (int64_t b = 0; b < n / kQ4_0Block; ++b) {
    const float* xb = x + b * kQ4_0Block;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQ4_0Block; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < kQ4_0Block / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[kQ4_0Block / 2 + j] * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min<int8_t>(15, static_cast<int8_t>(x0 + 8.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min<int8_t>(15, static_cast<int8_t>(x1 + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n) {
  CHECK(n % kQ4_0Block == 0);
  for (int64_t b = 0; b < n / kQ4_0Block; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQ4_0Block / 2; ++j) {
      y[b * kQ4_0Block + j] = static_cast<float>((x[b].qs[j] & 0x0f) - 8) * d;
      y[b * kQ4_0Block + kQ4_0Block / 2 + j] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

Status to_f32(DType src_type, const void* src, float* dst, int64_t n) {
  TRY(check_block_multiple(src_type, static_cast<uint64_t>(n), "to_f32"));
  switch (src_type) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return {};
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return {};
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return {};
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_to_f32(s[i]);
      return {};
    }
    case DType::kF64: {
      const auto* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return {};
    }
    case DType::kQ8_0: dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n); return {};
    case DType::kQ4_0: dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n); return {};
    default: return unimplemented("conversion from {} to f32 is not supported", dtype_name(src_type));
  }
}

Status from_f32(DType dst_type, const float* src, void* dst, int64_t n) {
  TRY(check_block_multiple(dst_type, static_cast<uint64_t>(n), "from_f32"));
  switch (dst_type) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return {};
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return {};
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return {};
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_e4m3(src[i]);
      return {};
    }
    case DType::kF64: {
      auto* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      return {};
    }
    case DType::kQ8_0: quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n); return {};
    case DType::kQ4_0: quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n); return {};
    default: return unimplemented("conversion from f32 to {} is not supported", dtype_name(dst_type));
  }
}

void dequantize_fp8_block_row(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                              int64_t row, float* dst) {
  CHECK(row >= 0 && row < rows);
  const int64_t scale_cols = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  const float* srow = scale_inv + (row / kFp8BlockSize) * scale_cols;
  const uint8_t* wrow = w + row * cols;
  for (int64_t c = 0; c < cols; ++c) dst[c] = e4m3_to_f32(wrow[c]) * srow[c / kFp8BlockSize];
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv) {
  const int64_t br = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t bc = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r0 = i * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      const int64_t c0 = j * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
      scale_inv[i * bc + j] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = f32_to_e4m3(w[r * cols + c] / scale);
    }
  }
}

}  // namespace fathom
