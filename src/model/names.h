// The tensor-name table of the DeepSeek-V3 architecture: every weight's Hugging Face name and
// shape, and the GGUF tensors llama.cpp's converter writes for the same model (`deepseek2`,
// MLA flavour: merged expert stacks, kv_b split into attn_k_b / attn_v_b). The loader resolves
// weights through these functions and `fathom synth` writes checkpoints from them, so both sides
// always agree on names and shapes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model_config.h"

namespace fathom {

// Logical weights of one decoder layer (and the MTP module's extras).
enum class LayerWeight {
  kAttnNorm, kQA, kQANorm, kQB, kQ, kKvA, kKvANorm, kKvB, kO, kFfnNorm,
  kMlpGate, kMlpUp, kMlpDown,                  // dense MLP
  kRouter, kRouterBias,                        // MoE gate and e_score_correction_bias
  kShGate, kShUp, kShDown,                     // shared experts (merged into one MLP)
  kExpGate, kExpUp, kExpDown,                  // routed expert e
  kEnorm, kHnorm, kEhProj, kMtpEmbed, kMtpHeadNorm, kMtpHead,  // MTP layers only
};

enum class WeightRole {
  kEmbedding,   // [vocab, hidden]
  kNorm,        // 1-D RMSNorm weight
  kLinear,      // 2-D projection [out, in]; FP8 in DeepSeek's FP8 release
  kLinearBf16,  // 2-D projection DeepSeek keeps in BF16 (router, MTP eh_proj)
  kBias,        // 1-D f32 (e_score_correction_bias)
  kHead,        // [vocab, hidden] output projection
};

std::string hf_name(int64_t layer, LayerWeight w, int64_t expert = -1);
std::string gguf_name(int64_t layer, LayerWeight w);  // expert weights name the whole stack
inline const char* kHfEmbed = "model.embed_tokens.weight";
inline const char* kHfNorm = "model.norm.weight";
inline const char* kHfHead = "lm_head.weight";
inline const char* kGgufEmbed = "token_embd.weight";
inline const char* kGgufNorm = "output_norm.weight";
inline const char* kGgufHead = "output.weight";

struct HfWeight {
  std::string name;
  std::vector<int64_t> shape;
  WeightRole role;
  // Where it lives: layer (-1 for global tensors), logical weight, expert (-1 if none).
  int64_t layer = -1;
  LayerWeight weight = LayerWeight::kAttnNorm;
  int64_t expert = -1;
};

// Every weight of the model in Hugging Face naming, layer by layer (the order DeepSeek's shards
// follow), the MTP layers (indices num_hidden_layers..) when with_mtp.
std::vector<HfWeight> hf_weights(const ModelConfig& c, bool with_mtp);
// The shape of one logical weight from the config.
std::vector<int64_t> weight_shape(const ModelConfig& c, LayerWeight w);
bool layer_has_weight(const ModelConfig& c, int64_t layer, LayerWeight w);

// How a GGUF tensor's elements come from the Hugging Face weights.
enum class GgufSource {
  kSame,         // one HF tensor, same layout
  kExpertStack,  // [E, rows, cols] stacking experts 0..E-1 of one HF weight
  kKvbK,         // attn_k_b [heads, kv_lora, nope]: kv_b's nope rows of each head, transposed
  kKvbV,         // attn_v_b [heads, v, kv_lora]: kv_b's v rows of each head
};

struct GgufWeight {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  WeightRole role;
  GgufSource source = GgufSource::kSame;
  int64_t layer = -1;
  LayerWeight weight = LayerWeight::kAttnNorm;  // the HF logical weight it comes from
};

// `legacy_kvb`: attn_kv_b as one tensor (older converters) instead of attn_k_b / attn_v_b.
std::vector<GgufWeight> gguf_weights(const ModelConfig& c, bool with_mtp, bool legacy_kvb = false);

}  // namespace fathom
