// config.json parsing on DeepSeek's published configs, derived numbers, and bad configs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "formats/model_config.h"

namespace fathom {
namespace {

// DeepSeek-V3's published config.json (the fields that matter).
const char* kV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
  "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
  "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
  "first_k_dense_replace": 3, "norm_topk_prob": true, "scoring_func": "sigmoid", "hidden_act": "silu",
  "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}
})";

// DeepSeek-V2-Lite's published config.json.
const char* kV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
  "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
  "n_routed_experts": 64, "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": null,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1,
  "topk_group": 1, "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
  "norm_topk_prob": false, "scoring_func": "softmax", "aux_loss_alpha": 0.001, "seq_aux": true,
  "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16"
})";

TEST(ModelConfig, ParsesDeepSeekV3AndDerivesItsPublishedNumbers) {
  auto c = parse_hf_config(kV3, "v3/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->fp8_weights);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  const ParamCounts p = c->param_counts();
  EXPECT_NEAR(static_cast<double>(p.total) / 1e9, 671.0, 0.5);   // "671B total parameters"
  EXPECT_NEAR(static_cast<double>(p.active) / 1e9, 37.0, 0.7);   // "37B activated for each token"
  EXPECT_NEAR(static_cast<double>(p.mtp) / 1e9, 11.5, 0.5);      // MTP layer without its shared embedding/head
  EXPECT_NEAR(c->softmax_scale(), 0.1352338, 1e-6);
  EXPECT_EQ(c->kv_bytes_per_token_per_layer(DType::kBF16), 1152);
  EXPECT_EQ(c->kv_bytes_per_token_per_layer(DType::kF8E4M3), 656);
  EXPECT_EQ(c->mha_kv_bytes_per_token_per_layer(), 81920);
  EXPECT_TRUE(c->is_moe_layer(3));
  EXPECT_FALSE(c->is_moe_layer(2));
}

TEST(ModelConfig, ParsesV2LiteWithNullQLoraAndSoftmaxGating) {
  auto c = parse_hf_config(kV2Lite, "v2-lite/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c->topk_method, TopkMethod::kGreedy);
  EXPECT_FALSE(c->fp8_weights);
  const ParamCounts p = c->param_counts();
  EXPECT_NEAR(static_cast<double>(p.total) / 1e9, 15.7, 0.1);  // "15.7B total"
  EXPECT_NEAR(static_cast<double>(p.active) / 1e9, 2.4, 0.1);   // "2.4B activated"
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->softmax_scale(), m * m / std::sqrt(192.0), 1e-9);
}

TEST(ModelConfig, RoundTripsThroughConfigJson) {
  auto c = parse_hf_config(kV3, "v3");
  ASSERT_TRUE(c.ok());
  auto back = parse_hf_config(hf_config_json(*c).dump(), "written");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(hf_config_json(*back).dump(), hf_config_json(*c).dump());
}

TEST(ModelConfig, RejectsImpossibleConfigsNamingTheField) {
  struct Case {
    const char* patch;  // JSON merge-patch applied to V3
    const char* needle;
  };
  const Case cases[] = {
      {R"({"hidden_size": 0})", "hidden_size must be positive"},
      {R"({"hidden_size": "big"})", "'hidden_size' must be an integer"},
      {R"({"num_experts_per_tok": 300})", "num_experts_per_tok 300 exceeds n_routed_experts 256"},
      {R"({"n_group": 7})", "not divisible by n_group 7"},
      {R"({"topk_group": 9})", "topk_group 9 must be within 1..n_group"},
      {R"({"qk_rope_head_dim": 63})", "must be even"},
      {R"({"first_k_dense_replace": 99})", "first_k_dense_replace 99"},
      {R"({"model_type": "llama"})", "model_type 'llama' is not supported"},
      {R"({"hidden_act": "gelu"})", "hidden_act 'gelu'"},
      {R"({"scoring_func": "relu"})", "scoring_func 'relu'"},
      {R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})", "weight_block_size [64, 64]"},
      {R"({"quantization_config": {"quant_method": "awq"}})", "quant_method 'awq'"},
      {R"({"rope_scaling": {"type": "linear", "factor": 2}})", "rope_scaling type 'linear'"},
      {R"({"rope_scaling": {"type": "yarn", "factor": 0.5}})", "rope_scaling.factor must be >= 1"},
      {R"({"kv_lora_rank": null})", "'kv_lora_rank' is missing"},
      {R"({"eos_token_id": 200000})", "within the vocabulary"},
      {R"({"num_key_value_heads": 8})", "num_key_value_heads 8"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = nlohmann::json::parse(kV3);
    j.merge_patch(nlohmann::json::parse(c.patch));
    auto r = parse_hf_config(j.dump(), "bad/config.json");
    ASSERT_FALSE(r.ok()) << c.patch;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message() << " wanted " << c.needle;
    EXPECT_NE(r.status().message().find("bad/config.json"), std::string::npos);
  }
  EXPECT_FALSE(parse_hf_config("{", "x").ok());
  EXPECT_FALSE(parse_hf_config("[]", "x").ok());
}

}  // namespace
}  // namespace fathom
