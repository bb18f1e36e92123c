// DType: element types of tensors, with their block structure. Quantised types store blocks of
// `block_elems` values in `block_bytes` bytes (Q8_0: 32 values in 34 bytes). The K-quants and
// IQ types are known by size only, so GGUF files holding them can be inspected; Fathom computes
// with F32, F16, BF16, F8_E4M3 (with block scales), Q8_0 and Q4_0.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace fathom {

enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64, kF8E4M3,
  kI8, kI16, kI32, kI64, kU8, kBool, kU16, kU32, kU64, kF8E5M2,
  kQ8_0, kQ4_0,
  // Known by size only (inspection):
  kQ4_1, kQ5_0, kQ5_1, kQ8_1, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kQ8_K,
  kIQ2_XXS, kIQ2_XS, kIQ3_XXS, kIQ1_S, kIQ4_NL, kIQ3_S, kIQ2_S, kIQ4_XS, kIQ1_M, kTQ1_0, kTQ2_0, kMXFP4,
  kCount
};

struct DTypeInfo {
  std::string_view name;  // canonical: "f32", "bf16", "f8_e4m3", "q8_0", ...
  int block_elems;        // 1 for scalar types
  int block_bytes;        // bytes per block (element size for scalar types)
  bool is_float;          // a floating-point scalar type
  bool computable;        // Fathom kernels read it
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
inline bool dtype_is_quantized(DType t) { return dtype_info(t).block_elems > 1; }
// Parses canonical names case-insensitively ("BF16", "q8_0", "fp8" and "f8" mean f8_e4m3).
Result<DType> parse_dtype(std::string_view name);
// Bytes for n elements; n must be a multiple of the block size (CHECKed by callers that care).
uint64_t dtype_bytes(DType t, uint64_t n);
// Error when n is not a whole number of blocks.
Status check_block_multiple(DType t, uint64_t n, std::string_view what);

}  // namespace fathom
