// ModelConfig derived numbers and validation.
#include "formats/model_config.h"

#include <cmath>

namespace fathom {

std::string_view scoring_func_name(ScoringFunc f) { return f == ScoringFunc::kSigmoid ? "sigmoid" : "softmax"; }

std::string_view topk_method_name(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy: return "greedy";
    case TopkMethod::kGroupLimitedGreedy: return "group_limited_greedy";
    case TopkMethod::kNoauxTc: return "noaux_tc";
  }
  return "?";
}

double ModelConfig::yarn_get_mscale(double factor, double m) {
  if (factor <= 1.0) return 1.0;
  return 0.1 * m * std::log(factor) + 1.0;
}

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling.yarn && rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

ParamCounts ModelConfig::param_counts() const {
  const int64_t h = hidden_size;
  const int64_t heads = num_attention_heads;
  int64_t attn = 0;
  if (q_lora_rank > 0) {
    attn += q_lora_rank * h + q_lora_rank + heads * qk_head_dim() * q_lora_rank;
  } else {
    attn += heads * qk_head_dim() * h;
  }
  attn += (kv_lora_rank + qk_rope_head_dim) * h + kv_lora_rank;
  attn += heads * (qk_nope_head_dim + v_head_dim) * kv_lora_rank;
  attn += h * heads * v_head_dim;
  const int64_t norms = 2 * h;
  const int64_t dense_mlp = 3 * h * intermediate_size;
  const int64_t expert = 3 * h * moe_intermediate_size;
  const int64_t router = n_routed_experts * h + (topk_method == TopkMethod::kNoauxTc ? n_routed_experts : 0);
  const int64_t moe_all = router + (n_routed_experts + n_shared_experts) * expert;
  const int64_t moe_active = router + (num_experts_per_tok + n_shared_experts) * expert;

  ParamCounts p;
  p.embedding = vocab_size * h;
  p.total = p.embedding + h + (tie_word_embeddings ? 0 : vocab_size * h);
  p.active = p.total - p.embedding;  // an embedding lookup reads one row, not the matrix
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    const bool moe = is_moe_layer(l);
    p.total += attn + norms + (moe ? moe_all : dense_mlp);
    p.active += attn + norms + (moe ? moe_active : dense_mlp);
  }
  // MTP module: enorm, hnorm, eh_proj, one full (MoE) layer, its own norm; it shares the
  // embedding and the head with the main model.
  const int64_t mtp_layer = 2 * h + 2 * h * h + attn + norms + (n_routed_experts > 0 ? moe_all : dense_mlp) + h;
  p.mtp = num_nextn_predict_layers * mtp_layer;
  return p;
}

int64_t ModelConfig::kv_bytes_per_token_per_layer(DType kv_dtype) const {
  if (kv_dtype == DType::kF8E4M3) {
    // e4m3 latent, one f32 scale per 128 latent values, rope part in BF16
    return kv_lora_rank + 4 * ((kv_lora_rank + 127) / 128) + 2 * qk_rope_head_dim;
  }
  return static_cast<int64_t>(dtype_info(kv_dtype).block_bytes) * (kv_lora_rank + qk_rope_head_dim);
}

int64_t ModelConfig::kv_bytes_per_token(DType kv_dtype) const {
  return num_hidden_layers * kv_bytes_per_token_per_layer(kv_dtype);
}

int64_t ModelConfig::mha_kv_bytes_per_token_per_layer() const {
  return 2 * num_attention_heads * (qk_head_dim() + v_head_dim);
}

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v <= 0) return invalid_argument("{} must be positive, got {}", name, v);
    return {};
  };
  TRY(positive(vocab_size, "vocab_size"));
  TRY(positive(hidden_size, "hidden_size"));
  TRY(positive(num_hidden_layers, "num_hidden_layers"));
  TRY(positive(num_attention_heads, "num_attention_heads"));
  TRY(positive(kv_lora_rank, "kv_lora_rank"));
  TRY(positive(qk_nope_head_dim, "qk_nope_head_dim"));
  TRY(positive(qk_rope_head_dim, "qk_rope_head_dim"));
  TRY(positive(v_head_dim, "v_head_dim"));
  TRY(positive(max_position_embeddings, "max_position_embeddings"));
  if (q_lora_rank < 0) return invalid_argument("q_lora_rank must be positive or null, got {}", q_lora_rank);
  if (qk_rope_head_dim % 2 != 0) return invalid_argument("qk_rope_head_dim {} must be even (RoPE rotates pairs)", qk_rope_head_dim);
  if (first_k_dense_replace < 0 || first_k_dense_replace > num_hidden_layers) {
    return invalid_argument("first_k_dense_replace {} must be within 0..num_hidden_layers ({})", first_k_dense_replace,
                            num_hidden_layers);
  }
  if (num_nextn_predict_layers < 0 || num_nextn_predict_layers > 8) {
    return invalid_argument("num_nextn_predict_layers {} must be within 0..8", num_nextn_predict_layers);
  }
  if (first_k_dense_replace > 0 || n_routed_experts == 0) TRY(positive(intermediate_size, "intermediate_size"));
  if (n_routed_experts < 0) return invalid_argument("n_routed_experts must not be negative");
  if (n_routed_experts > 0) {
    TRY(positive(moe_intermediate_size, "moe_intermediate_size"));
    TRY(positive(num_experts_per_tok, "num_experts_per_tok"));
    TRY(positive(moe_layer_freq, "moe_layer_freq"));
    if (num_experts_per_tok > n_routed_experts) {
      return invalid_argument("num_experts_per_tok {} exceeds n_routed_experts {}", num_experts_per_tok, n_routed_experts);
    }
    TRY(positive(n_group, "n_group"));
    if (n_routed_experts % n_group != 0) {
      return invalid_argument("n_routed_experts {} is not divisible by n_group {}", n_routed_experts, n_group);
    }
    if (topk_group < 1 || topk_group > n_group) {
      return invalid_argument("topk_group {} must be within 1..n_group ({})", topk_group, n_group);
    }
    if (topk_group * (n_routed_experts / n_group) < num_experts_per_tok) {
      return invalid_argument("topk_group {} groups of {} experts cannot hold num_experts_per_tok {}", topk_group,
                              n_routed_experts / n_group, num_experts_per_tok);
    }
    if (topk_method == TopkMethod::kNoauxTc && n_routed_experts / n_group < 2) {
      return invalid_argument("noaux_tc ranks groups by their top-2 scores: groups need >= 2 experts");
    }
  }
  if (n_shared_experts < 0) return invalid_argument("n_shared_experts must not be negative");
  if (rms_norm_eps <= 0 || !std::isfinite(rms_norm_eps)) return invalid_argument("rms_norm_eps must be positive");
  if (rope_theta <= 0 || !std::isfinite(rope_theta)) return invalid_argument("rope_theta must be positive");
  if (!std::isfinite(routed_scaling_factor) || routed_scaling_factor <= 0) {
    return invalid_argument("routed_scaling_factor must be positive");
  }
  if (rope_scaling.yarn) {
    if (!(rope_scaling.factor >= 1.0) || !std::isfinite(rope_scaling.factor)) {
      return invalid_argument("rope_scaling.factor must be >= 1, got {}", rope_scaling.factor);
    }
    TRY(positive(rope_scaling.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings"));
    if (!(rope_scaling.beta_fast > rope_scaling.beta_slow) || rope_scaling.beta_slow <= 0) {
      return invalid_argument("rope_scaling needs beta_fast > beta_slow > 0, got {} and {}", rope_scaling.beta_fast,
                              rope_scaling.beta_slow);
    }
  }
  if (num_key_value_heads != 0 && num_key_value_heads != num_attention_heads) {
    return invalid_argument("num_key_value_heads {} must equal num_attention_heads {} (MLA decompresses per head)",
                            num_key_value_heads, num_attention_heads);
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size || eos_token_id < 0 || eos_token_id >= vocab_size) {
    return invalid_argument("bos_token_id {} / eos_token_id {} must be within the vocabulary of {}", bos_token_id,
                            eos_token_id, vocab_size);
  }
  if (fp8_weights && (fp8_block_rows != 128 || fp8_block_cols != 128)) {
    return unimplemented("FP8 weight_block_size [{}, {}] is not supported (DeepSeek's is [128, 128])", fp8_block_rows,
                         fp8_block_cols);
  }
  return {};
}

}  // namespace fathom
