// Scalar float64 references for matmul: the definition of the numerics every fast path is tested
// against (activation rounding per weight dtype, exact weight decoding, exact products and sums).
// Also the scalar activation quantiser every SIMD quantiser must match bit for bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"

namespace fathom {
namespace matmul_internal {

void quantize_act_row_ref(const float* x, int64_t k, int8_t* q, float* d, int32_t* corr_block,
                          int32_t* corr_lane) {
  CHECK(k % kQBlock == 0);
  for (int64_t b = 0; b < k / kQBlock; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < kQBlock; ++j) {
      finite &= std::fabs(xb[j]) < INFINITY;  // false for inf and NaN
      amax = std::fmax(amax, std::fabs(xb[j]));
    }
    if (!finite) {  // the block's scale becomes NaN so every product it enters is NaN
      d[b] = NAN;
      std::fill(q + b * kQBlock, q + (b + 1) * kQBlock, int8_t{0});
      if (corr_block != nullptr) corr_block[b] = 0;
      continue;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int32_t sum = 0;
    for (int j = 0; j < kQBlock; ++j) {
      // round half to even, as the SIMD quantisers do (llama.cpp's AVX path does the same)
      const int32_t v = static_cast<int32_t>(std::nearbyint(xb[j] * id));
      q[b * kQBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    if (corr_block != nullptr) corr_block[b] = -128 * sum;
  }
  if (corr_lane != nullptr) {
    for (int64_t l = 0; l < k / 4; ++l) {
      corr_lane[l] = -128 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
  }
}

}  // namespace matmul_internal

namespace {

// Row r of W decoded exactly (fp8: e4m3 * scale in float64).
void decode_row_f64(const WeightView& w, int64_t r, double* out) {
  const int64_t cols = w.cols;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) +
                       dtype_bytes(w.dtype, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(r);
  switch (w.dtype) {
    case DType::kF32: {
      const auto* p = reinterpret_cast<const float*>(row);
      for (int64_t c = 0; c < cols; ++c) out[c] = p[c];
      return;
    }
    case DType::kF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) out[c] = f16_to_f32(p[c]);
      return;
    }
    case DType::kBF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(p[c]);
      return;
    }
    case DType::kF8E4M3: {
      const float* s = matmul_internal::fp8_scale_row(w, r);
      for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<double>(e4m3_to_f32(row[c])) * s[c / 128];
      return;
    }
    case DType::kQ8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t c = 0; c < cols; ++c)
        out[c] = static_cast<double>(b[c / 32].qs[c % 32]) * f16_to_f32(b[c / 32].d);
      return;
    }
    case DType::kQ4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
      for (int64_t c = 0; c < cols; ++c) {
        const int j = static_cast<int>(c % 32);
        const uint8_t byte = b[c / 32].qs[j % 16];
        const int v = (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
        out[c] = static_cast<double>(v) * f16_to_f32(b[c / 32].d);
      }
      return;
    }
    default:
      CHECK_MSG(false, "matmul_ref: unsupported dtype {}", dtype_name(w.dtype));
  }
}

// x row as the kernels see it after activation rounding.
void round_act_row(DType dtype, const float* x, int64_t k, double* out) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
      for (int64_t c = 0; c < k; ++c) out[c] = x[c];
      return;
    case DType::kBF16:
    case DType::kF8E4M3:
      for (int64_t c = 0; c < k; ++c) out[c] = bf16_to_f32(f32_to_bf16(x[c]));
      return;
    case DType::kQ8_0:
    case DType::kQ4_0: {
      std::vector<int8_t> q(static_cast<size_t>(k));
      std::vector<float> d(static_cast<size_t>(k / 32));
      matmul_internal::quantize_act_row_ref(x, k, q.data(), d.data(), nullptr, nullptr);
      for (int64_t c = 0; c < k; ++c)
        out[c] = static_cast<double>(q[static_cast<size_t>(c)]) * d[static_cast<size_t>(c / 32)];
      return;
    }
    default:
      CHECK_MSG(false, "matmul_ref: unsupported dtype {}", dtype_name(dtype));
  }
}

void ref_impl(const WeightView& w, const float* x, int64_t m, double* y, bool round) {
  CHECK_OK(validate_weight(w, "matmul_ref"));
  std::vector<double> xr(static_cast<size_t>(m * w.cols)), wr(static_cast<size_t>(w.cols));
  for (int64_t i = 0; i < m; ++i) {
    if (round) {
      round_act_row(w.dtype, x + i * w.cols, w.cols, xr.data() + i * w.cols);
    } else {
      for (int64_t c = 0; c < w.cols; ++c) xr[static_cast<size_t>(i * w.cols + c)] = x[i * w.cols + c];
    }
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    decode_row_f64(w, r, wr.data());
    for (int64_t i = 0; i < m; ++i) {
      const double* xi = xr.data() + i * w.cols;
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += xi[c] * wr[static_cast<size_t>(c)];
      y[i * w.rows + r] = s;
    }
  }
}

}  // namespace

void matmul_ref(const WeightView& w, const float* x, int64_t m, double* y) {
  ref_impl(w, x, m, y, true);
}
void matmul_exact_ref(const WeightView& w, const float* x, int64_t m, double* y) {
  ref_impl(w, x, m, y, false);
}

}  // namespace fathom
