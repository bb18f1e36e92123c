// DType table.
#include "tensor/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "base/check.h"

namespace fathom {
namespace {

constexpr std::array<DTypeInfo, static_cast<size_t>(DType::kCount)> kInfo = {{
    {"f32", 1, 4, true, true},
    {"f16", 1, 2, true, true},
    {"bf16", 1, 2, true, true},
    {"f64", 1, 8, true, false},
    {"f8_e4m3", 1, 1, true, true},
    {"i8", 1, 1, false, false},
    {"i16", 1, 2, false, false},
    {"i32", 1, 4, false, false},
    {"i64", 1, 8, false, false},
    {"u8", 1, 1, false, false},
    {"bool", 1, 1, false, false},
    {"u16", 1, 2, false, false},
    {"u32", 1, 4, false, false},
    {"u64", 1, 8, false, false},
    {"f8_e5m2", 1, 1, true, false},
    {"q8_0", 32, 34, false, true},
    {"q4_0", 32, 18, false, true},
    {"q4_1", 32, 20, false, false},
    {"q5_0", 32, 22, false, false},
    {"q5_1", 32, 24, false, false},
    {"q8_1", 32, 36, false, false},
    {"q2_k", 256, 84, false, false},
    {"q3_k", 256, 110, false, false},
    {"q4_k", 256, 144, false, false},
    {"q5_k", 256, 176, false, false},
    {"q6_k", 256, 210, false, false},
    {"q8_k", 256, 292, false, false},
    {"iq2_xxs", 256, 66, false, false},
    {"iq2_xs", 256, 74, false, false},
    {"iq3_xxs", 256, 98, false, false},
    {"iq1_s", 256, 50, false, false},
    {"iq4_nl", 32, 18, false, false},
    {"iq3_s", 256, 110, false, false},
    {"iq2_s", 256, 82, false, false},
    {"iq4_xs", 256, 136, false, false},
    {"iq1_m", 256, 56, false, false},
    {"tq1_0", 256, 54, false, false},
    {"tq2_0", 256, 66, false, false},
    {"mxfp4", 32, 17, false, false},
}};

}  // namespace

const DTypeInfo& dtype_info(DType t) {
  const auto i = static_cast<size_t>(t);
  CHECK_MSG(i < kInfo.size(), "bad dtype {}", i);
  return kInfo[i];
}

Result<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "fp8" || lower == "f8" || lower == "e4m3" || lower == "float8_e4m3fn") {
    return DType::kF8E4M3;
  }
  if (lower == "fp32" || lower == "float32") return DType::kF32;
  if (lower == "fp16" || lower == "float16") return DType::kF16;
  if (lower == "bfloat16") return DType::kBF16;
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == lower) return static_cast<DType>(i);
  }
  return invalid_argument("unknown dtype '{}'", name);
}

uint64_t dtype_bytes(DType t, uint64_t n) {
  const DTypeInfo& info = dtype_info(t);
  return n / static_cast<uint64_t>(info.block_elems) * static_cast<uint64_t>(info.block_bytes);
}

Status check_block_multiple(DType t, uint64_t n, std::string_view what) {
  const DTypeInfo& info = dtype_info(t);
  if (n % static_cast<uint64_t>(info.block_elems) != 0) {
    return invalid_argument("{}: {} elements is not a multiple of the {} block size {}", what, n,
                            info.name, info.block_elems);
  }
  return {};
}

}  // namespace fathom
