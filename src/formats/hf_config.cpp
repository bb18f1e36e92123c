// config.json <-> ModelConfig.
#include <nlohmann/json.hpp>

#include <cmath>

#include "base/fs.h"
#include "formats/json_util.h"
#include "formats/model_config.h"

namespace fathom {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string_view what;

  Result<int64_t> integer(const char* key, int64_t fallback, bool required = false) const {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) return invalid_argument("{}: '{}' is missing", what, key);
      return fallback;
    }
    const json& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 1e15) {
      return static_cast<int64_t>(v.get<double>());
    }
    return invalid_argument("{}: '{}' must be an integer, got {}", what, key, v.dump());
  }
  Result<double> number(const char* key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) return invalid_argument("{}: '{}' must be a number, got {}", what, key, j[key].dump());
    return j[key].get<double>();
  }
  Result<bool> boolean(const char* key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) return invalid_argument("{}: '{}' must be true or false, got {}", what, key, j[key].dump());
    return j[key].get<bool>();
  }
  Result<std::string> string(const char* key, std::string fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_string()) return invalid_argument("{}: '{}' must be a string, got {}", what, key, j[key].dump());
    return j[key].get<std::string>();
  }
};

Status read_rope_scaling(const json& j, std::string_view what, ModelConfig& c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return {};
  const json& r = j["rope_scaling"];
  if (!r.is_object()) return invalid_argument("{}: 'rope_scaling' must be an object or null", what);
  Reader rr{r, what};
  std::string type = TRY(rr.string("type", ""));
  if (type.empty()) type = TRY(rr.string("rope_type", ""));
  if (type == "default" || type.empty()) return {};
  if (type != "yarn") return unimplemented("{}: rope_scaling type '{}' is not supported (DeepSeek uses yarn)", what, type);
  c.rope_scaling.yarn = true;
  c.rope_scaling.factor = TRY(rr.number("factor", 1.0));
  c.rope_scaling.original_max_position_embeddings = TRY(rr.integer("original_max_position_embeddings", 4096));
  c.rope_scaling.beta_fast = TRY(rr.number("beta_fast", 32.0));
  c.rope_scaling.beta_slow = TRY(rr.number("beta_slow", 1.0));
  c.rope_scaling.mscale = TRY(rr.number("mscale", 1.0));
  c.rope_scaling.mscale_all_dim = TRY(rr.number("mscale_all_dim", 0.0));
  return {};
}

Status read_quantization(const json& j, std::string_view what, ModelConfig& c) {
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return {};
  const json& q = j["quantization_config"];
  if (!q.is_object()) return invalid_argument("{}: 'quantization_config' must be an object", what);
  Reader qr{q, what};
  const std::string method = TRY(qr.string("quant_method", ""));
  if (method != "fp8") return unimplemented("{}: quantization_config.quant_method '{}' is not supported (fp8 is)", what, method);
  const std::string fmt_name = TRY(qr.string("fmt", "e4m3"));
  if (fmt_name != "e4m3") return unimplemented("{}: FP8 format '{}' is not supported (e4m3 is)", what, fmt_name);
  c.fp8_weights = true;
  if (q.contains("weight_block_size")) {
    const json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer()) {
      return invalid_argument("{}: weight_block_size must be two integers, got {}", what, b.dump());
    }
    c.fp8_block_rows = b[0].get<int64_t>();
    c.fp8_block_cols = b[1].get<int64_t>();
  }
  return {};
}

}  // namespace

Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view what) {
  const json j = TRY(internal::parse_json_strict(json_text, what));
  if (!j.is_object()) return invalid_argument("{}: config is not a JSON object", what);
  Reader r{j, what};
  ModelConfig c;
  c.model_type = TRY(r.string("model_type", ""));
  if (c.model_type != "deepseek_v3" && c.model_type != "deepseek_v2") {
    return unimplemented("{}: model_type '{}' is not supported (deepseek_v3 or deepseek_v2)", what, c.model_type);
  }
  const bool v3 = c.model_type == "deepseek_v3";
  c.architecture = v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM";
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    c.architecture = j["architectures"][0].get<std::string>();
  }
  const std::string act = TRY(r.string("hidden_act", "silu"));
  if (act != "silu") return unimplemented("{}: hidden_act '{}' is not supported (DeepSeek uses silu)", what, act);
  c.vocab_size = TRY(r.integer("vocab_size", 0, true));
  c.hidden_size = TRY(r.integer("hidden_size", 0, true));
  c.intermediate_size = TRY(r.integer("intermediate_size", 0));
  c.moe_intermediate_size = TRY(r.integer("moe_intermediate_size", 0));
  c.num_hidden_layers = TRY(r.integer("num_hidden_layers", 0, true));
  c.num_nextn_predict_layers = TRY(r.integer("num_nextn_predict_layers", 0));
  c.num_attention_heads = TRY(r.integer("num_attention_heads", 0, true));
  c.num_key_value_heads = TRY(r.integer("num_key_value_heads", c.num_attention_heads));
  c.n_shared_experts = TRY(r.integer("n_shared_experts", 0));
  c.n_routed_experts = TRY(r.integer("n_routed_experts", 0));
  c.num_experts_per_tok = TRY(r.integer("num_experts_per_tok", 0));
  c.n_group = TRY(r.integer("n_group", 1));
  c.topk_group = TRY(r.integer("topk_group", 1));
  c.first_k_dense_replace = TRY(r.integer("first_k_dense_replace", 0));
  c.moe_layer_freq = TRY(r.integer("moe_layer_freq", 1));
  c.q_lora_rank = TRY(r.integer("q_lora_rank", 0));
  c.kv_lora_rank = TRY(r.integer("kv_lora_rank", 0, true));
  c.qk_nope_head_dim = TRY(r.integer("qk_nope_head_dim", 0, true));
  c.qk_rope_head_dim = TRY(r.integer("qk_rope_head_dim", 0, true));
  c.v_head_dim = TRY(r.integer("v_head_dim", 0, true));
  c.max_position_embeddings = TRY(r.integer("max_position_embeddings", 4096));
  c.routed_scaling_factor = TRY(r.number("routed_scaling_factor", 1.0));
  c.rms_norm_eps = TRY(r.number("rms_norm_eps", 1e-6));
  c.rope_theta = TRY(r.number("rope_theta", 10000.0));
  c.norm_topk_prob = TRY(r.boolean("norm_topk_prob", false));
  c.tie_word_embeddings = TRY(r.boolean("tie_word_embeddings", false));
  c.bos_token_id = TRY(r.integer("bos_token_id", 0));
  c.eos_token_id = TRY(r.integer("eos_token_id", 1));
  c.torch_dtype = TRY(r.string("torch_dtype", "bfloat16"));
  const std::string scoring = TRY(r.string("scoring_func", v3 ? "sigmoid" : "softmax"));
  if (scoring == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (scoring == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else {
    return unimplemented("{}: scoring_func '{}' is not supported (sigmoid or softmax)", what, scoring);
  }
  const std::string topk = TRY(r.string("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (topk == "greedy" || topk == "gready") {  // "gready": the HF DeepseekV2Config default's spelling
    c.topk_method = TopkMethod::kGreedy;
  } else if (topk == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (topk == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else {
    return unimplemented("{}: topk_method '{}' is not supported", what, topk);
  }
  TRY(read_rope_scaling(j, what, c));
  TRY(read_quantization(j, what, c));
  Status st = c.validate();
  if (!st.ok()) return st.with_context(what);
  return c;
}

Result<ModelConfig> load_hf_config(const std::string& path) {
  const std::string text = TRY(read_file(path));
  return parse_hf_config(text, path);
}

nlohmann::json hf_config_json(const ModelConfig& c) {
  nlohmann::json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads ? c.num_key_value_heads : c.num_attention_heads;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_routed_experts;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::json(c.q_lora_rank) : nlohmann::json(nullptr);
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["topk_method"] = topk_method_name(c.topk_method);
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = scoring_func_name(c.scoring_func);
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.yarn) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.rope_scaling.factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
                         {"beta_fast", c.rope_scaling.beta_fast},
                         {"beta_slow", c.rope_scaling.beta_slow},
                         {"mscale", c.rope_scaling.mscale},
                         {"mscale_all_dim", c.rope_scaling.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  if (c.fp8_weights) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {c.fp8_block_rows, c.fp8_block_cols}}};
  }
  return j;
}

nlohmann::json model_config_summary_json(const ModelConfig& c) {
  const ParamCounts p = c.param_counts();
  nlohmann::json j = hf_config_json(c);
  j["q_lora_rank"] = c.q_lora_rank;
  j["params_total"] = p.total;
  j["params_active"] = p.active;
  j["params_embedding"] = p.embedding;
  j["params_mtp"] = p.mtp;
  j["kv_bytes_per_token_bf16"] = c.kv_bytes_per_token(DType::kBF16);
  j["kv_bytes_per_token_fp8"] = c.kv_bytes_per_token(DType::kF8E4M3);
  j["kv_bytes_per_token_per_layer_bf16"] = c.kv_bytes_per_token_per_layer(DType::kBF16);
  j["mha_kv_bytes_per_token_per_layer"] = c.mha_kv_bytes_per_token_per_layer();
  j["softmax_scale"] = c.softmax_scale();
  return j;
}

}  // namespace fathom
