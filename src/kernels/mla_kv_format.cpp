// Token encode/decode for the MLA latent cache (scalar; the cache writes one token per layer per
// step, so this is not a hot loop). The decode kernel has its own vectorised page dequantisers.
#include "kernels/mla_kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/convert.h"

namespace fathom {

std::string_view mla_kv_dtype_name(MlaKvDType dtype) {
  return dtype == MlaKvDType::kFP8 ? "fp8" : "bf16";
}

Result<MlaKvDType> parse_mla_kv_dtype(std::string_view name) {
  if (name == "bf16" || name == "BF16") return MlaKvDType::kBF16;
  if (name == "fp8" || name == "FP8" || name == "f8_e4m3" || name == "e4m3") return MlaKvDType::kFP8;
  return invalid_argument("KV cache dtype '{}' is not one of bf16, fp8", name);
}

Status MlaKvFormat::validate() const {
  if (d_latent < 16 || d_latent > 4096 || d_latent % 16 != 0) {
    return invalid_argument(
        "MLA KV format: d_latent (kv_lora_rank) is {}, expected a multiple of 16 in [16, 4096]", d_latent);
  }
  if (d_rope < 0 || d_rope > 1024 || d_rope % 2 != 0) {
    return invalid_argument(
        "MLA KV format: d_rope (qk_rope_head_dim) is {}, expected an even number in [0, 1024]", d_rope);
  }
  if (page_tokens < 2 || page_tokens > 256 || page_tokens % 2 != 0) {
    return invalid_argument("MLA KV format: page_tokens is {}, expected an even number in [2, 256]",
                            page_tokens);
  }
  if (dtype != MlaKvDType::kBF16 && dtype != MlaKvDType::kFP8) {
    return invalid_argument("MLA KV format: unknown dtype code {}", static_cast<int>(dtype));
  }
  return {};
}

namespace {

// 2^ceil(log2(amax / 448)), clamped to normal floats; 1 for an all-zero group.
float fp8_group_scale(float amax) {
  if (!(amax > 0.0f)) return amax == 0.0f ? 1.0f : amax;  // NaN propagates
  if (std::isinf(amax)) return amax;
  int e = 0;
  const float f = std::frexp(amax / kE4M3Max, &e);  // amax/448 = f * 2^e, f in [0.5, 1)
  if (f == 0.5f) e -= 1;                            // already a power of two
  e = std::clamp(e, -126, 127);
  return std::ldexp(1.0f, e);
}

}  // namespace

void mla_kv_encode_token(const MlaKvFormat& format, const float* in, uint8_t* out) {
  const int dl = format.d_latent;
  uint16_t* rope = reinterpret_cast<uint16_t*>(out + format.rope_offset());
  for (int i = 0; i < format.d_rope; ++i) rope[i] = f32_to_bf16(in[dl + i]);
  if (format.dtype == MlaKvDType::kBF16) {
    uint16_t* lat = reinterpret_cast<uint16_t*>(out);
    for (int i = 0; i < dl; ++i) lat[i] = f32_to_bf16(in[i]);
    return;
  }
  for (int g = 0; g < format.n_scale_groups(); ++g) {
    const int begin = g * kMlaFp8GroupSize, end = std::min(dl, begin + kMlaFp8GroupSize);
    float amax = 0.0f;
    for (int i = begin; i < end; ++i) amax = std::isnan(in[i]) ? in[i] : std::max(amax, std::fabs(in[i]));
    const float scale = fp8_group_scale(amax);
    std::memcpy(out + format.scales_offset() + 4 * g, &scale, 4);
    const float inv = 1.0f / scale;  // exact: scale is a power of two
    for (int i = begin; i < end; ++i) out[i] = f32_to_e4m3(in[i] * inv);
  }
}

void mla_kv_decode_token(const MlaKvFormat& format, const uint8_t* in, float* out) {
  const int dl = format.d_latent;
  const uint16_t* rope = reinterpret_cast<const uint16_t*>(in + format.rope_offset());
  for (int i = 0; i < format.d_rope; ++i) out[dl + i] = bf16_to_f32(rope[i]);
  if (format.dtype == MlaKvDType::kBF16) {
    const uint16_t* lat = reinterpret_cast<const uint16_t*>(in);
    for (int i = 0; i < dl; ++i) out[i] = bf16_to_f32(lat[i]);
    return;
  }
  for (int g = 0; g < format.n_scale_groups(); ++g) {
    float scale;
    std::memcpy(&scale, in + format.scales_offset() + 4 * g, 4);
    const int begin = g * kMlaFp8GroupSize, end = std::min(dl, begin + kMlaFp8GroupSize);
    for (int i = begin; i < end; ++i) out[i] = e4m3_to_f32(in[i]) * scale;
  }
}

}  // namespace fathom
