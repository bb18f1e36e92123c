// Exact scalar conversions between float formats, and block (de)quantisation as GGUF and
// DeepSeek define them. These are the references; kernels fuse faster versions of the same
// arithmetic and are tested against these.
//
// - BF16 <-> F32: round-to-nearest-even; NaN stays NaN (quiet), sign kept.
// - F16 <-> F32: IEEE binary16, RNE, subnormals exact, overflow to inf.
// - F8 E4M3 (OCP "e4m3fn", as torch.float8_e4m3fn): bias 7, subnormals, no inf, 0x7F/0xFF NaN,
//   max 448. Decode through an exact 256-entry table; encode with RNE and saturation to ±448.
// - Q8_0: blocks of 32 int8 with an f16 scale d = amax/127 (ggml's quantize_row_q8_0_ref).
// - Q4_0: blocks of 32 4-bit values with an f16 scale d = max/-8 where max is the value of
//   largest magnitude; nibble j holds x[j] (low) and x[j+16] (high) (ggml's quantize_row_q4_0_ref).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/status.h"
#include "tensor/dtype.h"

namespace fathom {

inline float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

extern const float kE4M3ToF32[256];
inline float e4m3_to_f32(uint8_t v) { return kE4M3ToF32[v]; }
uint8_t f32_to_e4m3(float f);
constexpr float kE4M3Max = 448.0f;

constexpr int kQ8_0Block = 32;
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

constexpr int kQ4_0Block = 32;
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[kQ4_0Block / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);  // n % 32 == 0
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n);
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n);

// Any computable dtype to f32 and back, n elements (a whole number of blocks for quantised types).
// Unsupported dtypes give kUnimplemented naming the dtype.
Status to_f32(DType src_type, const void* src, float* dst, int64_t n);
Status from_f32(DType dst_type, const float* src, void* dst, int64_t n);

// DeepSeek FP8 weights: e4m3 values with one f32 `weight_scale_inv` per 128x128 block (ceil-div
// grid), W = e4m3 * scale. Dequantises row `row` of a [rows, cols] weight into dst[cols].
constexpr int kFp8BlockSize = 128;
void dequantize_fp8_block_row(const uint8_t* w, const float* scale_inv, int64_t rows, int64_t cols,
                              int64_t row, float* dst);
// Quantises a [rows, cols] f32 matrix to e4m3 + scale_inv[ceil(rows/128), ceil(cols/128)] with
// scale = amax/448 per block (as DeepSeek's weight_quant does). A zero block gets scale 1.
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* out, float* scale_inv);

}  // namespace fathom
