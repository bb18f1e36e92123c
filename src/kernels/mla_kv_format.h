// The byte layout of one token of the MLA latent KV cache, shared by the cache (src/kvcache/, which
// writes tokens) and the decode kernel (mla_decode.h, which reads pages of them). A token holds
// `d_latent` normalised latent values (also the value vector V) followed by `d_rope` RoPE'd key
// values; nothing else is cached. DeepSeek-V3: 512 + 64.
//
//   bf16: [d_latent bf16 | d_rope bf16]                          2*(d_latent+d_rope) B (1152 for V3)
//   fp8:  [d_latent e4m3 | ceil(d_latent/128) f32 scales | d_rope bf16]   (656 B for V3, FlashMLA's)
//
// FP8 scales cover 128 consecutive latent values each (the last group may be shorter) and are
// powers of two (ue8m0-style: scale = 2^ceil(log2(amax/448))), so e4m3 * scale is exactly
// representable in bf16 and the kernel can dequantise without rounding. The RoPE part stays bf16.
// A page is `page_tokens` consecutive tokens; pages are the unit of allocation and hashing.
// Layout version kMlaKvLayoutVersion is part of every page hash (docs/kvcache.md).
//
// Not here: paging, block tables, hashing (src/kvcache/) and attention (mla_decode.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace fathom {

enum class MlaKvDType : uint8_t { kBF16 = 0, kFP8 = 1 };

constexpr uint32_t kMlaKvLayoutVersion = 1;
constexpr int kMlaFp8GroupSize = 128;  // latent values per fp32 scale

std::string_view mla_kv_dtype_name(MlaKvDType dtype);          // "bf16" | "fp8"
Result<MlaKvDType> parse_mla_kv_dtype(std::string_view name);  // "bf16" | "fp8" (also "f8_e4m3")

struct MlaKvFormat {
  int d_latent = 512;  // kv_lora_rank; a multiple of 16
  int d_rope = 64;     // qk_rope_head_dim; even
  MlaKvDType dtype = MlaKvDType::kBF16;
  int page_tokens = 64;  // even, 2..256

  int d_qk() const { return d_latent + d_rope; }
  int n_scale_groups() const { return (d_latent + kMlaFp8GroupSize - 1) / kMlaFp8GroupSize; }
  // Byte offsets inside a token.
  int64_t scales_offset() const { return d_latent; }  // fp8 only
  int64_t rope_offset() const {
    return dtype == MlaKvDType::kBF16 ? int64_t{2} * d_latent : d_latent + int64_t{4} * n_scale_groups();
  }
  int64_t token_bytes() const { return rope_offset() + int64_t{2} * d_rope; }
  int64_t page_bytes() const { return token_bytes() * page_tokens; }
  // An error naming the bad field when the widths or page size are unsupported.
  Status validate() const;
  bool operator==(const MlaKvFormat&) const = default;
};

// Quantises one token (`in`: [d_latent + d_rope] f32) into `out` (token_bytes()). BF16 rounds to
// nearest even; FP8 saturates to +-448 after scaling. Non-finite inputs propagate (NaN stays NaN).
void mla_kv_encode_token(const MlaKvFormat& format, const float* in, uint8_t* out);
// Decodes one token back to f32 (`out`: [d_latent + d_rope]); exact.
void mla_kv_decode_token(const MlaKvFormat& format, const uint8_t* in, float* out);

}  // namespace fathom
