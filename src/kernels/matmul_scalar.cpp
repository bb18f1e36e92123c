// Portable matmul path (no SIMD intrinsics; the compiler may auto-vectorise): each weight row is
// decoded once into a per-thread buffer and dotted with every row of x. Same numerics as the SIMD
// paths: fp32 (or bf16-rounded) activations with fp32 sums, fp8 scales applied per 128-block, and
// int32 block dot products for q8_0/q4_0.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"

namespace fathom::matmul_internal {
namespace {

// Dot product with 8 independent fp32 partial sums (the order the SIMD paths roughly use).
float dot_f32(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Weight row r decoded to fp32; fp8 without its scale (applied per block by the caller).
void decode_row_f32(const WeightView& w, int64_t r, float* out) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) +
                       dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols)) * static_cast<uint64_t>(r);
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, row, static_cast<size_t>(w.cols) * 4);
      return;
    case DType::kF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < w.cols; ++c) out[c] = f16_to_f32(p[c]);
      return;
    }
    case DType::kBF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < w.cols; ++c) out[c] = bf16_to_f32(p[c]);
      return;
    }
    case DType::kF8E4M3:
      for (int64_t c = 0; c < w.cols; ++c) out[c] = e4m3_to_f32(row[c]);
      return;
    default:
      CHECK_MSG(false, "decode_row_f32: {}", dtype_name(w.dtype));
  }
}

// Weight row r as int8 values and one fp32 scale per 32-block.
void decode_row_q(const WeightView& w, int64_t r, int8_t* q, float* d) {
  const int64_t nb = w.cols / 32;
  if (w.dtype == DType::kQ8_0) {
    const auto* b = static_cast<const BlockQ8_0*>(w.data) + r * nb;
    for (int64_t i = 0; i < nb; ++i) {
      d[i] = f16_to_f32(b[i].d);
      std::memcpy(q + i * 32, b[i].qs, 32);
    }
    return;
  }
  CHECK(w.dtype == DType::kQ4_0);
  const auto* b = static_cast<const BlockQ4_0*>(w.data) + r * nb;
  for (int64_t i = 0; i < nb; ++i) {
    d[i] = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      q[i * 32 + j] = static_cast<int8_t>((b[i].qs[j] & 0x0f) - 8);
      q[i * 32 + 16 + j] = static_cast<int8_t>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void store(float* y, bool accumulate, float v) {
  *y = accumulate ? *y + v : v;
}

void rows_float(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  const bool fp8 = w.dtype == DType::kF8E4M3;
  for (int64_t r = r0; r < r1; ++r) {
    decode_row_f32(w, r, row.data());
    for (int64_t i = 0; i < x.m; ++i) {
      const float* xi = x.f32 + i * x.stride;
      float v = 0;
      if (fp8) {
        const float* s = fp8_scale_row(w, r);
        for (int64_t c0 = 0; c0 < w.cols; c0 += 128) {
          const int64_t n = std::min<int64_t>(128, w.cols - c0);
          v += dot_f32(row.data() + c0, xi + c0, n) * s[c0 / 128];
        }
      } else {
        v = dot_f32(row.data(), xi, w.cols);
      }
      store(y + i * y_stride + r, accumulate, v);
    }
  }
}

void rows_quant(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                int64_t r0, int64_t r1) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  const int64_t nb = w.cols / 32;
  q.resize(static_cast<size_t>(w.cols));
  d.resize(static_cast<size_t>(nb));
  for (int64_t r = r0; r < r1; ++r) {
    decode_row_q(w, r, q.data(), d.data());
    for (int64_t i = 0; i < x.m; ++i) {
      const int8_t* xq = x.q + i * x.stride;
      const float* xd = x.qd + i * (x.stride / kQBlock);
      float v = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j)
          s += static_cast<int32_t>(q[static_cast<size_t>(b * 32 + j)]) * xq[b * 32 + j];
        v += static_cast<float>(s) * (d[static_cast<size_t>(b)] * xd[b]);
      }
      store(y + i * y_stride + r, accumulate, v);
    }
  }
}

}  // namespace

void rows_scalar(const WeightView& w, const ActView& x, float* y, int64_t y_stride, bool accumulate,
                 int64_t r0, int64_t r1) {
  if (x.kind == ActKind::kQ8) {
    rows_quant(w, x, y, y_stride, accumulate, r0, r1);
  } else {
    CHECK(x.kind == ActKind::kF32);
    rows_float(w, x, y, y_stride, accumulate, r0, r1);
  }
}

}  // namespace fathom::matmul_internal
