// ModelConfig: the shape and hyper-parameters of a DeepSeek-V3 / V2 / V2-Lite model, read from a
// Hugging Face config.json or from GGUF `deepseek2.*` metadata, written back to both, validated,
// and the numbers derived from it (parameter counts, KV-cache bytes per token, softmax scale).
//
// Conventions follow DeepSeek's reference inference/model.py and the HF config keys. V2-Lite has
// q_lora_rank null (stored here as 0: q_proj instead of q_a/q_b), softmax scoring and no groups.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace fathom {

class GgufFile;
struct GgufValue;

enum class ScoringFunc { kSoftmax, kSigmoid };
// greedy: plain top-k; group_limited_greedy (V2): groups ranked by their max score;
// noaux_tc (V3): groups ranked by the sum of their top-2 bias-corrected scores.
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct RopeScaling {
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct ParamCounts {
  int64_t total = 0;       // main model (embeddings, layers, norm, head); MTP excluded
  int64_t active = 0;      // per token: total minus the unused routed experts and the embedding
                           // (a lookup); V3: 36.6B, V2-Lite: 2.45B, as DeepSeek reports 37B/2.4B
  int64_t embedding = 0;   // embed_tokens
  int64_t mtp = 0;         // the MTP module(s), counted separately as DeepSeek does
};

struct ModelConfig {
  std::string architecture = "DeepseekV3ForCausalLM";
  std::string model_type = "deepseek_v3";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;       // dense MLP
  int64_t moe_intermediate_size = 0;   // each expert
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t q_lora_rank = 0;  // 0: no q LoRA (q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t max_position_embeddings = 4096;
  double routed_scaling_factor = 1.0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool norm_topk_prob = false;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  // How the checkpoint stores weights (config.json's quantization_config / torch_dtype).
  bool fp8_weights = false;
  int64_t fp8_block_rows = 128;
  int64_t fp8_block_cols = 128;
  std::string torch_dtype = "bfloat16";

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // YaRN's attention scaling: 0.1 * m * ln(factor) + 1 (1 without YaRN or factor <= 1).
  static double yarn_get_mscale(double factor, double m);
  // 1/sqrt(qk_head_dim) * mscale^2 with mscale from mscale_all_dim (DeepSeek's softmax_scale).
  double softmax_scale() const;
  ParamCounts param_counts() const;
  // Bytes of the MLA latent cache per token over all layers: (kv_lora_rank + qk_rope_head_dim)
  // values per layer in BF16, or FlashMLA's FP8 layout (e4m3 latent + f32 scale per 128 values +
  // BF16 rope part) when kv_dtype is F8_E4M3.
  int64_t kv_bytes_per_token(DType kv_dtype) const;
  int64_t kv_bytes_per_token_per_layer(DType kv_dtype) const;
  // What a standard multi-head K/V cache of the same model would need per token per layer (BF16).
  int64_t mha_kv_bytes_per_token_per_layer() const;

  // Every constraint the runtime relies on; errors name the field and the rule.
  Status validate() const;
};

std::string_view scoring_func_name(ScoringFunc f);
std::string_view topk_method_name(TopkMethod m);

// config.json (DeepSeek V2/V3 keys) -> ModelConfig, validated. `what` names the file in errors.
Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view what);
Result<ModelConfig> load_hf_config(const std::string& path);
// ModelConfig -> config.json as DeepSeek ships it (quantization_config when fp8_weights).
nlohmann::json hf_config_json(const ModelConfig& c);
// The parsed config as a flat JSON object with derived numbers (for `inspect --json`).
nlohmann::json model_config_summary_json(const ModelConfig& c);

// GGUF `deepseek2.*` metadata <-> ModelConfig. Both llama.cpp flavours are recognised: MLA
// (head_count_kv 1, key_length = kv_lora_rank + rope, key_length_mla/value_length_mla) and the
// legacy one (head_count_kv = heads, key_length = nope + rope). The GGUF has no topk_method:
// sigmoid gating means noaux_tc, softmax with groups group_limited_greedy, else greedy.
Result<ModelConfig> model_config_from_gguf(const GgufFile& gguf);
// `legacy_kvb`: describe the legacy flavour (attn_kv_b, head_count_kv = heads) instead of MLA's.
std::vector<std::pair<std::string, GgufValue>> gguf_model_metadata(const ModelConfig& c, std::string_view name,
                                                                  bool legacy_kvb = false);

}  // namespace fathom
