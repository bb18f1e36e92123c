// GGUF deepseek2.* metadata <-> ModelConfig (llama.cpp's key names).
#include <cmath>

#include "formats/gguf.h"
#include "formats/model_config.h"

namespace fathom {
namespace {

constexpr const char* kArch = "deepseek2";

std::string key(const char* suffix) { return fmt::format("{}.{}", kArch, suffix); }

Result<int64_t> opt_int(const GgufFile& g, const std::string& k, int64_t fallback) {
  if (g.get(k) == nullptr) return fallback;
  return g.get_int(k);
}

Result<double> opt_float(const GgufFile& g, const std::string& k, double fallback) {
  if (g.get(k) == nullptr) return fallback;
  return g.get_float(k);
}

}  // namespace

Result<ModelConfig> model_config_from_gguf(const GgufFile& g) {
  const std::string arch = TRY(g.get_string("general.architecture"));
  if (arch != kArch) return unimplemented("{}: architecture '{}' is not supported (deepseek2 is)", g.path(), arch);
  ModelConfig c;
  c.hidden_size = TRY(g.get_int(key("embedding_length")));
  c.num_hidden_layers = TRY(g.get_int(key("block_count")));
  c.intermediate_size = TRY(opt_int(g, key("feed_forward_length"), 0));
  c.moe_intermediate_size = TRY(opt_int(g, key("expert_feed_forward_length"), 0));
  c.num_attention_heads = TRY(g.get_int(key("attention.head_count")));
  c.num_key_value_heads = c.num_attention_heads;
  c.q_lora_rank = TRY(opt_int(g, key("attention.q_lora_rank"), 0));
  c.kv_lora_rank = TRY(g.get_int(key("attention.kv_lora_rank")));
  c.qk_rope_head_dim = TRY(g.get_int(key("rope.dimension_count")));
  if (g.get(key("attention.key_length_mla")) != nullptr) {
    c.qk_nope_head_dim = TRY(g.get_int(key("attention.key_length_mla"))) - c.qk_rope_head_dim;
    c.v_head_dim = TRY(g.get_int(key("attention.value_length_mla")));
  } else {
    c.qk_nope_head_dim = TRY(g.get_int(key("attention.key_length"))) - c.qk_rope_head_dim;
    c.v_head_dim = TRY(g.get_int(key("attention.value_length")));
  }
  c.n_routed_experts = TRY(opt_int(g, key("expert_count"), 0));
  c.num_experts_per_tok = TRY(opt_int(g, key("expert_used_count"), 0));
  c.n_shared_experts = TRY(opt_int(g, key("expert_shared_count"), 0));
  c.first_k_dense_replace = TRY(opt_int(g, key("leading_dense_block_count"), 0));
  c.n_group = TRY(opt_int(g, key("expert_group_count"), 1));
  c.topk_group = TRY(opt_int(g, key("expert_group_used_count"), 1));
  c.routed_scaling_factor = TRY(opt_float(g, key("expert_weights_scale"), 1.0));
  c.norm_topk_prob = g.get(key("expert_weights_norm")) != nullptr ? TRY(g.get_bool(key("expert_weights_norm"))) : false;
  const int64_t gating = TRY(opt_int(g, key("expert_gating_func"), 1));
  if (gating == 2) {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (gating == 1 || gating == 0) {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else {
    return unimplemented("{}: expert_gating_func {} is not supported (1 softmax, 2 sigmoid)", g.path(), gating);
  }
  if (c.scoring_func == ScoringFunc::kSigmoid) {
    c.topk_method = TopkMethod::kNoauxTc;
    c.model_type = "deepseek_v3";
    c.architecture = "DeepseekV3ForCausalLM";
  } else {
    c.topk_method = c.n_group > 1 ? TopkMethod::kGroupLimitedGreedy : TopkMethod::kGreedy;
    c.model_type = "deepseek_v2";
    c.architecture = "DeepseekV2ForCausalLM";
  }
  c.max_position_embeddings = TRY(opt_int(g, key("context_length"), 4096));
  c.rope_theta = TRY(opt_float(g, key("rope.freq_base"), 10000.0));
  c.rms_norm_eps = TRY(opt_float(g, key("attention.layer_norm_rms_epsilon"), 1e-6));
  c.num_nextn_predict_layers = TRY(opt_int(g, key("nextn_predict_layers"), 0));
  if (g.get(key("rope.scaling.type")) != nullptr) {
    const std::string type = TRY(g.get_string(key("rope.scaling.type")));
    if (type == "yarn") {
      c.rope_scaling.yarn = true;
      c.rope_scaling.factor = TRY(opt_float(g, key("rope.scaling.factor"), 1.0));
      c.rope_scaling.original_max_position_embeddings = TRY(opt_int(g, key("rope.scaling.original_context_length"), 4096));
      const double log_mul = TRY(opt_float(g, key("rope.scaling.yarn_log_multiplier"), 0.0));
      c.rope_scaling.mscale_all_dim = log_mul / 0.1;
      c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim;
      c.rope_scaling.beta_fast = TRY(opt_float(g, key("rope.scaling.yarn_beta_fast"), 32.0));
      c.rope_scaling.beta_slow = TRY(opt_float(g, key("rope.scaling.yarn_beta_slow"), 1.0));
    } else if (type != "none") {
      return unimplemented("{}: rope scaling '{}' is not supported (yarn or none)", g.path(), type);
    }
  }
  if (g.get(key("vocab_size")) != nullptr) {
    c.vocab_size = TRY(g.get_int(key("vocab_size")));
  } else if (const GgufValue* tokens = g.get("tokenizer.ggml.tokens"); tokens != nullptr) {
    c.vocab_size = static_cast<int64_t>(tokens->arr.size());
  } else {
    return not_found("{}: neither deepseek2.vocab_size nor tokenizer.ggml.tokens is present", g.path());
  }
  c.bos_token_id = TRY(opt_int(g, "tokenizer.ggml.bos_token_id", 0));
  c.eos_token_id = TRY(opt_int(g, "tokenizer.ggml.eos_token_id", 1));
  c.torch_dtype = "gguf";
  Status st = c.validate();
  if (!st.ok()) return st.with_context(g.path());
  return c;
}

std::vector<std::pair<std::string, GgufValue>> gguf_model_metadata(const ModelConfig& c, std::string_view name,
                                                                  bool legacy_kvb) {
  using V = GgufValue;
  auto u32 = [](int64_t v) { return V::u32(static_cast<uint32_t>(v)); };
  auto f32 = [](double v) { return V::f32(static_cast<float>(v)); };
  std::vector<std::pair<std::string, GgufValue>> m;
  m.emplace_back("general.architecture", V::string(kArch));
  m.emplace_back("general.name", V::string(std::string(name)));
  m.emplace_back("general.quantization_version", u32(2));
  m.emplace_back(key("block_count"), u32(c.num_hidden_layers));
  m.emplace_back(key("context_length"), u32(c.max_position_embeddings));
  m.emplace_back(key("embedding_length"), u32(c.hidden_size));
  m.emplace_back(key("feed_forward_length"), u32(c.intermediate_size));
  m.emplace_back(key("attention.head_count"), u32(c.num_attention_heads));
  m.emplace_back(key("attention.head_count_kv"), u32(legacy_kvb ? c.num_attention_heads : 1));
  m.emplace_back(key("rope.freq_base"), f32(c.rope_theta));
  m.emplace_back(key("attention.layer_norm_rms_epsilon"), f32(c.rms_norm_eps));
  m.emplace_back(key("expert_used_count"), u32(c.num_experts_per_tok));
  m.emplace_back(key("leading_dense_block_count"), u32(c.first_k_dense_replace));
  m.emplace_back(key("vocab_size"), u32(c.vocab_size));
  if (c.q_lora_rank > 0) m.emplace_back(key("attention.q_lora_rank"), u32(c.q_lora_rank));
  m.emplace_back(key("attention.kv_lora_rank"), u32(c.kv_lora_rank));
  if (legacy_kvb) {
    m.emplace_back(key("attention.key_length"), u32(c.qk_nope_head_dim + c.qk_rope_head_dim));
    m.emplace_back(key("attention.value_length"), u32(c.v_head_dim));
  } else {
    m.emplace_back(key("attention.key_length"), u32(c.kv_lora_rank + c.qk_rope_head_dim));
    m.emplace_back(key("attention.value_length"), u32(c.kv_lora_rank));
    m.emplace_back(key("attention.key_length_mla"), u32(c.qk_nope_head_dim + c.qk_rope_head_dim));
    m.emplace_back(key("attention.value_length_mla"), u32(c.v_head_dim));
  }
  m.emplace_back(key("expert_feed_forward_length"), u32(c.moe_intermediate_size));
  m.emplace_back(key("expert_count"), u32(c.n_routed_experts));
  m.emplace_back(key("expert_shared_count"), u32(c.n_shared_experts));
  m.emplace_back(key("expert_weights_scale"), f32(c.routed_scaling_factor));
  if (c.norm_topk_prob) m.emplace_back(key("expert_weights_norm"), V::boolean(true));
  m.emplace_back(key("expert_gating_func"), u32(c.scoring_func == ScoringFunc::kSigmoid ? 2 : 1));
  if (c.n_group > 1) {
    m.emplace_back(key("expert_group_count"), u32(c.n_group));
    m.emplace_back(key("expert_group_used_count"), u32(c.topk_group));
  }
  m.emplace_back(key("rope.dimension_count"), u32(c.qk_rope_head_dim));
  if (c.rope_scaling.yarn) {
    m.emplace_back(key("rope.scaling.type"), V::string("yarn"));
    m.emplace_back(key("rope.scaling.factor"), f32(c.rope_scaling.factor));
    m.emplace_back(key("rope.scaling.original_context_length"), u32(c.rope_scaling.original_max_position_embeddings));
    m.emplace_back(key("rope.scaling.yarn_log_multiplier"), f32(0.1 * c.rope_scaling.mscale_all_dim));
    m.emplace_back(key("rope.scaling.yarn_beta_fast"), f32(c.rope_scaling.beta_fast));
    m.emplace_back(key("rope.scaling.yarn_beta_slow"), f32(c.rope_scaling.beta_slow));
  }
  if (c.num_nextn_predict_layers > 0) m.emplace_back(key("nextn_predict_layers"), u32(c.num_nextn_predict_layers));
  return m;
}

}  // namespace fathom
