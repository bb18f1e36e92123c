// Scalar references of the row codecs, the run-time choice of kernel, and the public FP8 helpers
// and format names. The references are the definition: FP8 follows DeepEP's per_token_cast_to_fp8
// exactly (f32 arithmetic: inv = 448 / max(amax, 1e-4), q = e4m3_rne(x * inv), scale = amax / 448).
#include "ep/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/cpu.h"
#include "base/strings.h"
#include "tensor/convert.h"

namespace fathom::ep {

std::string_view wire_format_name(WireFormat f) {
  switch (f) {
    case WireFormat::kF32:
      return "f32";
    case WireFormat::kBF16:
      return "bf16";
    case WireFormat::kFP8:
      return "fp8";
  }
  return "?";
}

Result<WireFormat> parse_wire_format(std::string_view name) {
  for (WireFormat f : {WireFormat::kF32, WireFormat::kBF16, WireFormat::kFP8})
    if (name == wire_format_name(f)) return f;
  if (name == "fp32") return WireFormat::kF32;
  if (name == "e4m3" || name == "f8") return WireFormat::kFP8;
  return invalid_argument("unknown wire format '{}' (expected f32, bf16 or fp8)", name);
}

uint64_t wire_row_bytes(WireFormat f, int64_t hidden) {
  const uint64_t n = static_cast<uint64_t>(hidden);
  return f == WireFormat::kF32 ? 4 * n : f == WireFormat::kBF16 ? 2 * n : n;
}

namespace internal {
namespace {

inline float load_value(const void* src, bool src_bf16, int64_t i) {
  return src_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(src)[i]) : static_cast<const float*>(src)[i];
}
inline float row_value(const void* row, WireFormat f, int64_t i) {
  return f == WireFormat::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(row)[i])
                                : static_cast<const float*>(row)[i];
}

bool use_avx512() {
  return simd_level() >= SimdLevel::kAvx512;
}

}  // namespace

void encode_row_ref(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales) {
  if (f == WireFormat::kF32) {
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = load_value(src, src_bf16, i);
  } else if (f == WireFormat::kBF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i)
      d[i] = src_bf16 ? static_cast<const uint16_t*>(src)[i] : f32_to_bf16(load_value(src, false, i));
  } else {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t g0 = 0; g0 < n; g0 += kFp8Group) {
      const int64_t g1 = std::min(n, g0 + kFp8Group);
      float amax = 0.0f;
      for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(load_value(src, src_bf16, i)));
      amax = std::max(amax, 1e-4f);
      const float inv = 448.0f / amax;
      scales[g0 / kFp8Group] = amax / 448.0f;
      for (int64_t i = g0; i < g1; ++i) d[i] = f32_to_e4m3(load_value(src, src_bf16, i) * inv);
    }
  }
}

void accumulate_row_ref(float* acc, const void* row, WireFormat f, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += row_value(row, f, i);
}

void axpy_row_ref(float* acc, float w, const void* row, WireFormat f, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = w * row_value(row, f, i);
    acc[i] += p;
  }
}

void sum_rows_ref(float* out, const void* const* rows, int n, WireFormat f, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += row_value(rows[j], f, i);
    out[i] = acc;
  }
}

void weighted_sum_rows_ref(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                           int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float p = w[j] * row_value(rows[j], f, i);
      acc += p;
    }
    out[i] = acc;
  }
}

void decode_fp8_row_ref(const uint8_t* q, const float* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(q[i]) * scales[i / kFp8Group];
}

void encode_row(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales) {
  if ((f == WireFormat::kF32 && !src_bf16) || (f == WireFormat::kBF16 && src_bf16)) {
    std::memcpy(dst, src, wire_row_bytes(f, n));
    return;
  }
  use_avx512() ? encode_row_avx512(src, src_bf16, f, n, dst, scales)
               : encode_row_ref(src, src_bf16, f, n, dst, scales);
}

void accumulate_row(float* acc, const void* row, WireFormat f, int64_t n) {
  use_avx512() ? accumulate_row_avx512(acc, row, f, n) : accumulate_row_ref(acc, row, f, n);
}

void axpy_row(float* acc, float w, const void* row, WireFormat f, int64_t n) {
  use_avx512() ? axpy_row_avx512(acc, w, row, f, n) : axpy_row_ref(acc, w, row, f, n);
}

void copy_row_stream_multi(uint8_t* const* dsts, int n, const void* src, uint64_t bytes) {
  bool aligned = use_avx512() && bytes >= 1024;
  for (int i = 0; i < n && aligned; ++i) aligned = (reinterpret_cast<uintptr_t>(dsts[i]) & 63) == 0;
  if (aligned) {
    copy_row_stream_multi_avx512(dsts, n, src, bytes);
  } else {
    for (int i = 0; i < n; ++i) std::memcpy(dsts[i], src, bytes);
  }
}

void encode_row_multi(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales,
                      uint8_t* const* dsts, float* const* dst_scales, int nd) {
  const bool identity = (f == WireFormat::kF32 && !src_bf16) || (f == WireFormat::kBF16 && src_bf16);
  bool aligned = use_avx512() && !identity;
  for (int i = 0; i < nd && aligned; ++i) aligned = (reinterpret_cast<uintptr_t>(dsts[i]) & 63) == 0;
  if (aligned) return encode_row_multi_avx512(src, src_bf16, f, n, dst, scales, dsts, dst_scales, nd);
  encode_row(src, src_bf16, f, n, dst, scales);
  copy_row_stream_multi(dsts, nd, dst, wire_row_bytes(f, n));
  if (f != WireFormat::kFP8) return;
  for (int i = 0; i < nd; ++i)
    if (dst_scales[i]) std::memcpy(dst_scales[i], scales, static_cast<size_t>(fp8_scale_cols(n)) * 4);
}

void copy_row_stream(void* dst, const void* src, uint64_t bytes) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  copy_row_stream_multi(&d, 1, src, bytes);
}

void sum_rows(float* out, const void* const* rows, int n, WireFormat f, int64_t count, bool stream) {
  use_avx512() ? sum_rows_avx512(out, rows, n, f, count, stream) : sum_rows_ref(out, rows, n, f, count);
}

void weighted_sum_rows(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                       int64_t count) {
  use_avx512() ? weighted_sum_rows_avx512(out, rows, w, n, f, count)
               : weighted_sum_rows_ref(out, rows, w, n, f, count);
}

void stream_fence() {
  __builtin_ia32_sfence();
}

void decode_fp8_row(const uint8_t* q, const float* scales, int64_t n, float* out) {
  use_avx512() ? decode_fp8_row_avx512(q, scales, n, out) : decode_fp8_row_ref(q, scales, n, out);
}

}  // namespace internal

Status per_token_cast_to_fp8(const Tensor& x, uint8_t* q, float* scales) {
  if (x.ndim != 2 || (x.dtype != DType::kF32 && x.dtype != DType::kBF16) || !x.is_contiguous())
    return invalid_argument(
        "per_token_cast_to_fp8: x must be a contiguous [rows, hidden] f32 or bf16 tensor, got {} {}",
        dtype_name(x.dtype), x.shape_string());
  const int64_t rows = x.dim(0), hidden = x.dim(1), sc = fp8_scale_cols(hidden);
  for (int64_t r = 0; r < rows; ++r)
    internal::encode_row(x.row_ptr(r), x.dtype == DType::kBF16, WireFormat::kFP8, hidden, q + r * hidden,
                         scales + r * sc);
  return {};
}

void per_token_cast_back(const uint8_t* q, const float* scales, int64_t rows, int64_t hidden, float* out) {
  const int64_t sc = fp8_scale_cols(hidden);
  for (int64_t r = 0; r < rows; ++r)
    internal::decode_fp8_row(q + r * hidden, scales + r * sc, hidden, out + r * hidden);
}

}  // namespace fathom::ep
