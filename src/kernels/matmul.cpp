// matmul: validation, activation preparation, path selection and the split over the pool. The
// arithmetic lives in matmul_<isa>.cpp (fast paths) and matmul_scalar.cpp (portable path).
#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "base/check.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace fathom {

using namespace matmul_internal;

bool matmul_supports(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kQ8_0:
    case DType::kQ4_0:
      return true;
    default:
      return false;
  }
}

Status validate_weight(const WeightView& w, std::string_view name) {
  if (!matmul_supports(w.dtype)) {
    return unimplemented(
        "{}: weight dtype {} is not supported by matmul (f32, f16, bf16, f8_e4m3, q8_0, q4_0)", name,
        dtype_name(w.dtype));
  }
  if (w.rows <= 0 || w.cols <= 0) {
    return invalid_argument("{}: weight shape [{}, {}] must be positive", name, w.rows, w.cols);
  }
  if (w.rows >= (int64_t{1} << 31) || w.cols >= (int64_t{1} << 31)) {
    return out_of_range("{}: weight shape [{}, {}] exceeds 2^31 in a dimension", name, w.rows, w.cols);
  }
  TRY(check_block_multiple(w.dtype, static_cast<uint64_t>(w.cols), name));
  if (w.data == nullptr) return invalid_argument("{}: weight data is missing", name);
  const bool fp8 = w.dtype == DType::kF8E4M3;
  if (fp8 && w.scale_inv == nullptr) {
    return invalid_argument("{}: f8_e4m3 weight [{}, {}] needs weight_scale_inv [{}, {}]", name, w.rows,
                            w.cols, (w.rows + 127) / 128, (w.cols + 127) / 128);
  }
  if (!fp8 && w.scale_inv != nullptr) {
    return invalid_argument("{}: weight_scale_inv given for a {} weight (only f8_e4m3 has block scales)",
                            name, dtype_name(w.dtype));
  }
  return {};
}

Result<WeightView> slice_rows(const WeightView& w, int64_t begin, int64_t end) {
  if (begin < 0 || end > w.rows || begin >= end) {
    return out_of_range("slice_rows: [{}, {}) is not a non-empty range of the weight's {} rows", begin, end,
                        w.rows);
  }
  if (w.dtype == DType::kF8E4M3 && begin % 128 != 0) {
    return invalid_argument(
        "slice_rows: an f8_e4m3 slice must start at a multiple of 128 rows (got {}) so the "
        "128x128 scale blocks stay aligned",
        begin);
  }
  WeightView s = w;
  s.rows = end - begin;
  s.data = static_cast<const uint8_t*>(w.data) +
           dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols)) * static_cast<uint64_t>(begin);
  if (w.dtype == DType::kF8E4M3) s.scale_inv = w.scale_inv + (begin / 128) * ((w.cols + 127) / 128);
  return s;
}

int64_t matmul_matvec_max_m(DType dtype) {
  return matvec_max_m(dtype, simd_level());
}

bool matmul_fp8_f16_active() {
  return fp8_use_f16(simd_level());
}

void dequantize_weight_row(const WeightView& w, int64_t r, float* dst) {
  CHECK(r >= 0 && r < w.rows);
  const int64_t cols = w.cols;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) +
                       dtype_bytes(w.dtype, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(r);
  switch (w.dtype) {
    case DType::kF8E4M3: {
      const float* s = fp8_scale_row(w, r);
      for (int64_t c = 0; c < cols; ++c) dst[c] = e4m3_to_f32(row[c]) * s[c / 128];
      return;
    }
    case DType::kQ8_0:
      dequantize_row_q8_0(reinterpret_cast<const BlockQ8_0*>(row), dst, cols);
      return;
    case DType::kQ4_0:
      dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(row), dst, cols);
      return;
    default: {
      const Status s = to_f32(w.dtype, row, dst, cols);
      CHECK_MSG(s.ok(), "{}", s.message());
    }
  }
}

namespace matmul_internal {

ActKind act_kind_for(DType dtype, SimdLevel level) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ4_0:
      return ActKind::kQ8;
    case DType::kBF16:
    case DType::kF8E4M3:
      return level >= SimdLevel::kAvx512Bf16 ? ActKind::kBF16 : ActKind::kF32;
    default:
      return ActKind::kF32;
  }
}

namespace {

std::atomic<int> g_vbmi_override{-1};

}  // namespace

bool fp8_use_vbmi(SimdLevel level) {
  static const bool supported = __builtin_cpu_supports("avx512vbmi");
  if (level < SimdLevel::kAvx512Bf16 || !supported) return false;
  const int o = g_vbmi_override.load(std::memory_order_relaxed);
  return o != 0;
}

void set_fp8_vbmi_override(int override) {
  g_vbmi_override.store(override);
}

namespace {

std::atomic<int> g_address_order_override{-1};

}  // namespace

bool address_order_wanted() {
  static const bool amd = cpu_features().vendor == "AuthenticAMD";
  const int o = g_address_order_override.load(std::memory_order_relaxed);
  return o < 0 ? amd : o != 0;
}

void set_address_order_override(int override) {
  g_address_order_override.store(override);
}

namespace {

std::atomic<int> g_f16_override{-1};

}  // namespace

bool fp8_f16_available() {
  static const bool available = [] {
    const char* env = std::getenv("FATHOM_FP8_F16");
    return cpu_features().avx512_fp16 && __builtin_cpu_supports("avx512vbmi") &&
           !(env != nullptr && std::string_view(env) == "0");
  }();
  return available;
}

bool fp8_use_f16(SimdLevel level) {
  if (!fp8_f16_available() || !fp8_use_vbmi(level)) return false;
  return g_f16_override.load(std::memory_order_relaxed) != 0;
}

void set_fp8_f16_override(int override) {
  g_f16_override.store(override);
}

bool fp8_f16_applies(DType dtype, SimdLevel level, int64_t k) {
  return dtype == DType::kF8E4M3 && k % 128 == 0 && fp8_use_f16(level);
}

bool fp8_f16_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k) {
  return m >= 2 && m <= kFp8F16MaxM && fp8_f16_applies(dtype, level, k);
}

bool fp8_lanes_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k) {
  return dtype == DType::kF8E4M3 && fp8_lanes_m(m) && k % 128 == 0 && fp8_use_vbmi(level) &&
         !amx_bf16_usable();
}

bool bf16_lanes_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k) {
  return dtype == DType::kBF16 && bf16_lanes_m(m) && k % 32 == 0 && level >= SimdLevel::kAvx512Bf16 &&
         !amx_bf16_usable();
}

namespace {

int64_t padded(int64_t k) {
  return (k + kActPad - 1) / kActPad * kActPad;
}
bool needs_rounding(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF8E4M3;
}
uint64_t align64(uint64_t n) {
  return (n + 63) / 64 * 64;
}

void quantize_rows(const ActView& a, SimdLevel level, const float* x, int64_t x_stride, int64_t i0,
                   int64_t i1) {
  const int64_t s = a.stride, k = a.k, nb = s / kQBlock, nl = s / 4;
  auto* q = const_cast<int8_t*>(a.q);
  auto* d = const_cast<float*>(a.qd);
  auto* cb = const_cast<int32_t*>(a.qcorr_block);
  auto* cl = const_cast<int32_t*>(a.qcorr_lane);
  auto* dl = const_cast<float*>(a.qd_lane);
  if (level >= SimdLevel::kAvx512) {
    act_quant_q8_rows_avx512(x, x_stride, k, s, q, d, cb, cl, dl, i0, i1);
    return;
  }
  if (level >= SimdLevel::kAvx2) {
    act_quant_q8_rows_avx2(x, x_stride, k, s, q, d, cb, cl, i0, i1);
  } else {
    for (int64_t i = i0; i < i1; ++i) {
      std::memset(q + i * s, 0, static_cast<size_t>(s));
      std::memset(d + i * nb, 0, static_cast<size_t>(nb) * 4);
      std::memset(cb + i * nb, 0, static_cast<size_t>(nb) * 4);
      std::memset(cl + i * nl, 0, static_cast<size_t>(nl) * 4);
      quantize_act_row_ref(x + i * x_stride, k, q + i * s, d + i * nb, cb + i * nb, cl + i * nl);
    }
  }
  for (int64_t i = i0; i < i1; ++i)  // lane scales (only the AVX-512 kernels read them)
    for (int64_t l = 0; l < nl; ++l) dl[i * nl + l] = d[i * nb + l / 8];
}

}  // namespace

namespace {

// Columns of ActView::xt for m activation rows: at least 16 zero columns past the last row (a
// 16-column tile or vector from any row stays inside), rounded up to whole 64-byte lines so that
// every k-pair's row starts on a line (the lanes kernels' loads; unaligned they split lines, and at
// 30 or 62 rows the kernels ran 0.8-1.0x the row-wise kernel or the GEMM against 1.07-1.2x at 32
// or 64).
uint64_t xt_stride_for(uint64_t m) {
  return (m + 16 + 15) / 16 * 16;
}

// Whether kBF16 views have room for the transposed pairs (ActView::xt): CPUs with AMX or AVX-512
// BF16 (the lanes kernels, fp8_lanes_wanted and bf16_lanes_wanted).
bool xt_space_wanted() {
  static const bool wanted = amx_bf16_available() || cpu_features().avx512_bf16;
  return wanted;
}

}  // namespace

uint64_t act_scratch_bytes(ActKind kind, DType dtype, int64_t m, int64_t k) {
  const uint64_t rows = static_cast<uint64_t>(m), s = static_cast<uint64_t>(padded(k));
  switch (kind) {
    case ActKind::kF32:
      return needs_rounding(dtype) ? align64(rows * static_cast<uint64_t>(k) * 4) : 0;
    case ActKind::kBF16:  // the rows, then room for their transposed pairs (ActView::xt, AMX or
                          // AVX-512 BF16 CPUs) and their fp16 form (ActView::f16, AVX-512 FP16 CPUs)
      return align64(rows * s * 2) + (xt_space_wanted() ? align64((s / 2) * xt_stride_for(rows) * 4) : 0) +
             (fp8_f16_available() ? align64(rows * s * 2) + align64(rows * 4) : 0);
    case ActKind::kQ8:
      return align64(rows * s) + 2 * align64(rows * (s / kQBlock) * 4) + 2 * align64(rows * (s / 4) * 4);
  }
  return 0;
}

ActView layout_activations(ActKind kind, bool perm64, int64_t m, int64_t k, void* scratch) {
  ActView a;
  a.kind = kind;
  a.m = m;
  a.k = k;
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const uint64_t rows = static_cast<uint64_t>(m);
  switch (kind) {
    case ActKind::kF32:
      a.stride = k;
      a.f32 = reinterpret_cast<float*>(base);
      return a;
    case ActKind::kBF16:
      a.stride = padded(k);
      a.bf16 = reinterpret_cast<uint16_t*>(base);
      a.bf16_perm64 = perm64;
      base += align64(rows * static_cast<uint64_t>(a.stride) * 2);
      if (xt_space_wanted()) {
        a.xt_space = reinterpret_cast<uint32_t*>(base);
        base += align64(static_cast<uint64_t>(a.stride / 2) * xt_stride_for(rows) * 4);
      }
      if (fp8_f16_available()) {
        a.f16_space = reinterpret_cast<uint16_t*>(base);
        a.f16_unscale_space =
            reinterpret_cast<float*>(base + align64(rows * static_cast<uint64_t>(a.stride) * 2));
      }
      return a;
    case ActKind::kQ8: {
      const int64_t s = padded(k);
      a.stride = s;
      a.q = reinterpret_cast<int8_t*>(base);
      base += align64(rows * static_cast<uint64_t>(s));
      a.qd = reinterpret_cast<float*>(base);
      base += align64(rows * static_cast<uint64_t>(s / kQBlock) * 4);
      a.qcorr_block = reinterpret_cast<int32_t*>(base);
      base += align64(rows * static_cast<uint64_t>(s / kQBlock) * 4);
      a.qcorr_lane = reinterpret_cast<int32_t*>(base);
      base += align64(rows * static_cast<uint64_t>(s / 4) * 4);
      a.qd_lane = reinterpret_cast<float*>(base);
      return a;
    }
  }
  return a;
}

uint64_t act_scratch_bytes_any(int64_t m, int64_t k) {
  return std::max({act_scratch_bytes(ActKind::kF32, DType::kBF16, m, k),
                   act_scratch_bytes(ActKind::kBF16, DType::kBF16, m, k),
                   act_scratch_bytes(ActKind::kQ8, DType::kQ8_0, m, k)});
}

ActView act_rows(const ActView& a, int64_t begin, int64_t count) {
  ActView r = a;
  r.m = count;
  if (a.f32 != nullptr) r.f32 = a.f32 + begin * a.stride;
  if (a.bf16 != nullptr) r.bf16 = a.bf16 + begin * a.stride;
  if (a.xt != nullptr) r.xt = a.xt + begin;
  r.xt_space = nullptr;
  if (a.f16 != nullptr) {
    r.f16 = a.f16 + begin * a.stride;
    r.f16_unscale = a.f16_unscale + begin;
  }
  r.f16_space = nullptr;
  r.f16_unscale_space = nullptr;
  if (a.q != nullptr) {
    r.q = a.q + begin * a.stride;
    r.qd = a.qd + begin * (a.stride / kQBlock);
    r.qcorr_block = a.qcorr_block + begin * (a.stride / kQBlock);
    r.qcorr_lane = a.qcorr_lane + begin * (a.stride / 4);
    r.qd_lane = a.qd_lane + begin * (a.stride / 4);
  }
  return r;
}

void copy_act_row(const ActView& src, int64_t src_row, const ActView& dst, int64_t dst_row) {
  CHECK(src.kind == dst.kind && src.k == dst.k);
  auto copy = [](const void* from, void* to, int64_t bytes) {
    std::memcpy(to, from, static_cast<size_t>(bytes));
  };
  switch (src.kind) {
    case ActKind::kF32:
      copy(src.f32 + src_row * src.stride, const_cast<float*>(dst.f32) + dst_row * dst.stride, src.k * 4);
      return;
    case ActKind::kBF16:
      CHECK(src.stride == dst.stride && src.bf16_perm64 == dst.bf16_perm64);
      copy(src.bf16 + src_row * src.stride, const_cast<uint16_t*>(dst.bf16) + dst_row * dst.stride,
           src.stride * 2);
      if (src.f16 != nullptr && dst.f16 != nullptr) {
        copy(src.f16 + src_row * src.stride, const_cast<uint16_t*>(dst.f16) + dst_row * dst.stride,
             src.stride * 2);
        const_cast<float*>(dst.f16_unscale)[dst_row] = src.f16_unscale[src_row];
      }
      return;
    case ActKind::kQ8: {
      CHECK(src.stride == dst.stride);
      const int64_t s = src.stride, nb = s / kQBlock, nl = s / 4;
      copy(src.q + src_row * s, const_cast<int8_t*>(dst.q) + dst_row * s, s);
      copy(src.qd + src_row * nb, const_cast<float*>(dst.qd) + dst_row * nb, nb * 4);
      copy(src.qcorr_block + src_row * nb, const_cast<int32_t*>(dst.qcorr_block) + dst_row * nb, nb * 4);
      copy(src.qcorr_lane + src_row * nl, const_cast<int32_t*>(dst.qcorr_lane) + dst_row * nl, nl * 4);
      copy(src.qd_lane + src_row * nl, const_cast<float*>(dst.qd_lane) + dst_row * nl, nl * 4);
      return;
    }
  }
}

bool act_enable_f16(ActView& a) {
  if (a.f16_space == nullptr) return false;
  a.f16 = a.f16_space;
  a.f16_unscale = a.f16_unscale_space;
  return true;
}

bool amx_wanted(DType dtype, SimdLevel level, int64_t m, int64_t k) {
  if (level < SimdLevel::kAvx512Bf16 || m < amx_min_m(dtype) || k % 64 != 0 || !amx_bf16_usable())
    return false;
  if (fp8_f16_wanted(dtype, level, m, k)) return false;  // the fp16 kernel takes these rows
  return dtype == DType::kBF16 || (dtype == DType::kF8E4M3 && fp8_use_vbmi(level));
}

void act_build_xt(ActView& a, DType dtype, SimdLevel level, ThreadPool& pool, bool lanes) {
  if (a.kind != ActKind::kBF16 || a.xt_space == nullptr ||
      !(amx_wanted(dtype, level, a.m, a.k) ||
        (lanes && (fp8_lanes_wanted(dtype, level, a.m, a.k) || bf16_lanes_wanted(dtype, level, a.m, a.k)))))
    return;
  const int64_t n_kp = a.stride / 2, stride = static_cast<int64_t>(xt_stride_for(static_cast<uint64_t>(a.m)));
  uint32_t* xt = a.xt_space;
  pool.parallel_for((n_kp + 15) / 16, 8, [&](int64_t b0, int64_t b1, int) {
    act_transpose_pairs_avx512(a.bf16, a.m, a.stride, b0 * 16, std::min(n_kp, b1 * 16), xt, stride);
  });
  a.xt = xt;
  a.xt_stride = stride;
}

ActView prepare_activations(DType dtype, SimdLevel level, const float* x, int64_t m, int64_t k,
                            int64_t x_stride, void* scratch, ThreadPool& pool, bool build_xt, int build_f16) {
  const ActKind kind = act_kind_for(dtype, level);
  if (kind == ActKind::kF32 && !needs_rounding(dtype)) {
    ActView a;
    a.kind = kind;
    a.m = m;
    a.k = k;
    a.f32 = x;
    a.stride = x_stride;
    return a;
  }
  const bool perm = kind == ActKind::kBF16 && dtype == DType::kF8E4M3 && fp8_use_vbmi(level);
  ActView a = layout_activations(kind, perm, m, k, scratch);
  const bool f16 = kind == ActKind::kBF16 &&
                   (build_f16 < 0 ? fp8_f16_wanted(dtype, level, m, k)
                                  : build_f16 != 0 && fp8_f16_applies(dtype, level, k)) &&
                   act_enable_f16(a);
  // rows are independent: split them over the pool when there is enough work
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  pool.parallel_for(m, grain, [&](int64_t i0, int64_t i1, int) {
    switch (kind) {
      case ActKind::kF32:
        act_round_bf16_rows_scalar(x, x_stride, k, const_cast<float*>(a.f32), i0, i1);
        return;
      case ActKind::kBF16:
        if (level >= SimdLevel::kAvx512) {
          act_to_bf16_rows_avx512(x, x_stride, k, a.stride, const_cast<uint16_t*>(a.bf16), i0, i1, perm);
        } else {
          act_to_bf16_rows_scalar(x, x_stride, k, a.stride, const_cast<uint16_t*>(a.bf16), i0, i1, perm);
        }
        if (f16) {
          act_to_f16_rows_avx512fp16(x, x_stride, k, a.stride, a.f16_space, a.f16_unscale_space, i0, i1);
        }
        return;
      case ActKind::kQ8:
        quantize_rows(a, level, x, x_stride, i0, i1);
        return;
    }
  });
  if (build_xt) act_build_xt(a, dtype, level, pool);
  return a;
}

void act_round_bf16_rows_scalar(const float* x, int64_t x_stride, int64_t k, float* out, int64_t i0,
                                int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t c = 0; c < k; ++c) out[i * k + c] = bf16_to_f32(f32_to_bf16(x[i * x_stride + c]));
  }
}

void act_to_f16_rows_scalar(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                            float* unscale, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * x_stride;
    float amax = 0;
    bool finite = true;
    for (int64_t c = 0; c < k; ++c) {
      const float v = std::fabs(bf16_to_f32(f32_to_bf16(xi[c])));
      if (!std::isfinite(v)) finite = false;
      amax = std::max(amax, v);
    }
    int e = 0;
    if (finite && amax > 0) {
      int q = 0;
      std::frexp(amax, &q);
      e = std::clamp(10 - q, -100, 100);
    }
    for (int64_t c = 0; c < stride; ++c) {
      const float v = c < k ? bf16_to_f32(f32_to_bf16(xi[c])) : 0.0f;
      out[i * stride + c] = f32_to_f16(std::ldexp(v, e));
    }
    unscale[i] = std::ldexp(1.0f, 8 - e);
  }
}

void act_to_bf16_rows_scalar(const float* x, int64_t x_stride, int64_t k, int64_t stride, uint16_t* out,
                             int64_t i0, int64_t i1, bool perm64) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t c = 0; c < stride; ++c) {
      const uint16_t v = c < k ? f32_to_bf16(x[i * x_stride + c]) : 0;
      out[i * stride + (perm64 ? fp8_perm64_index(c) : c)] = v;
    }
  }
}

int64_t matvec_max_m(DType dtype, SimdLevel level) {
  if (level < SimdLevel::kAvx512) return 4;  // AVX2 and scalar have no separate GEMM form
  switch (dtype) {
    case DType::kBF16:
      return level >= SimdLevel::kAvx512Bf16 ? 16 : 8;
    case DType::kQ8_0:
    case DType::kQ4_0:
      // the GEMM from 10 rows: with its 3-row register tiles it beat the four-row matrix-vector
      // kernel at 10-12 rows, 1.05-1.38x ([1408 x 2048] and [2048 x 1408], two threads from memory,
      // `bench gemm --ab`, Zen 5; 0.85-1.08x at 9), and the Q8_0 experts at 96 / 128 tokens 1.06 /
      // 1.03x (`bench moe --ab`)
      return 9;
    case DType::kF8E4M3:
      return level >= SimdLevel::kAvx512Bf16 ? kFp8MatvecMaxM : 8;
    default:
      return 8;
  }
}

RowsKernel rows_kernel_for(DType dtype, SimdLevel level) {
  const bool quant = dtype == DType::kQ8_0 || dtype == DType::kQ4_0;
  const bool bf16ish = dtype == DType::kBF16 || dtype == DType::kF8E4M3;
  if (level >= SimdLevel::kAvx512Bf16 && bf16ish) return rows_bf16_avx512bf16;
  if (level >= SimdLevel::kAvx512) return quant ? rows_int8_avx512 : rows_f32family_avx512;
  if (level >= SimdLevel::kAvx2) return quant ? rows_int8_avx2 : rows_f32family_avx2;
  return rows_scalar;
}

int64_t rows_granularity(DType dtype, SimdLevel level, int64_t m) {
  // AMX tiles take 16-row panels (amx_rows_ok needs r0 % 16 == 0; 64 is a multiple); bf16 weights
  // run them two at a time (amx_rows), so their ranges hold whole pairs
  if (amx_wanted(dtype, level, m, 64) && m <= matvec_max_m(dtype, level))
    return dtype == DType::kBF16 ? 32 : 16;
  if (m <= matvec_max_m(dtype, level) || level < SimdLevel::kAvx512) return 8;
  const bool quant = dtype == DType::kQ8_0 || dtype == DType::kQ4_0;
  const bool bf16ish = dtype == DType::kBF16 || dtype == DType::kF8E4M3;
  if (quant) return 32;
  if (bf16ish && level >= SimdLevel::kAvx512Bf16) return 64;
  return 48;
}

namespace {

// Grow-only per-thread scratch for prepared activations: allocated once per thread at the
// largest size seen, never per call after that.
void* act_scratch(uint64_t bytes) {
  thread_local Buffer buffer;
  if (buffer.size() < bytes) buffer = Buffer::allocate(static_cast<size_t>(bytes + bytes / 4));
  return buffer.data();
}

}  // namespace
}  // namespace matmul_internal

void matmul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
            const MatmulOptions& options) {
  CHECK_OK(validate_weight(w, "matmul"));
  CHECK(m >= 0);
  if (m == 0) return;
  const int64_t x_stride = options.x_stride ? options.x_stride : w.cols;
  const int64_t y_stride = options.y_stride ? options.y_stride : w.rows;
  CHECK(x_stride >= w.cols && y_stride >= w.rows);
  const SimdLevel level = simd_level();
  const ActKind kind = act_kind_for(w.dtype, level);
  void* scratch = act_scratch(act_scratch_bytes(kind, w.dtype, m, w.cols));
  const ActView a = prepare_activations(w.dtype, level, x, m, w.cols, x_stride, scratch, pool);
  const RowsKernel kernel = rows_kernel_for(w.dtype, level);
  const int64_t gran = rows_granularity(w.dtype, level, m);
  // Enough work per task to amortise the dispatch: at least ~256 KiB of weights or a panel.
  const uint64_t row_bytes = dtype_bytes(w.dtype, static_cast<uint64_t>(w.cols));
  const int64_t min_rows = std::max<int64_t>(
      gran, static_cast<int64_t>(
                (uint64_t{1} << 18) /
                std::max<uint64_t>(row_bytes * static_cast<uint64_t>(std::min<int64_t>(m, 8)), 1)));
  const int64_t units = (w.rows + gran - 1) / gran;
  const int64_t grain_units = std::max<int64_t>(1, min_rows / gran);
  pool.parallel_for(units, grain_units, [&](int64_t u0, int64_t u1, int) {
    kernel(w, a, y, y_stride, options.accumulate, u0 * gran, std::min(w.rows, u1 * gran));
  });
}

}  // namespace fathom
