// Test helpers for train/: tiny configs and a finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "base/rng.h"
#include "train/train_impl.h"

namespace fathom::train::testing {

// A fresh seed per run, printed so a failure can be replayed (FATHOM_TRAIN_SEED=... to force one).
inline uint64_t fresh_seed(const char* what) {
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* env = std::getenv("FATHOM_TRAIN_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("[%s] seed %llu (FATHOM_TRAIN_SEED to replay)\n", what, static_cast<unsigned long long>(seed));
  return seed;
}

// A DeepSeek-V3-shaped config small enough for float64 finite differences: q LoRA (or q_proj),
// YaRN with blended frequencies, one dense layer then MoE (sigmoid, noaux_tc groups, shared
// expert, routed scaling), one MTP module.
inline ModelConfig tiny_config(bool q_lora = true) {
  ModelConfig c;
  c.vocab_size = 23;
  c.hidden_size = 12;
  c.intermediate_size = 10;
  c.moe_intermediate_size = 6;
  c.num_hidden_layers = 2;
  c.num_nextn_predict_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.n_shared_experts = 1;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 1;
  c.q_lora_rank = q_lora ? 10 : 0;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 4;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 6;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.max_position_embeddings = 64;
  c.rope_scaling = {true, 4.0, 8, 32.0, 1.0, 1.0, 1.0};
  return c;
}

// The default model's attention shape (docs/MODEL.md: 8 heads, q LoRA 128 or q_proj, latent 64,
// 32-wide nope / rope / v dims, YaRN x4 over 4096 positions) on top of tiny_config's other fields.
inline void default_attention_shape(ModelConfig& c, bool q_lora) {
  c.hidden_size = 256;
  c.num_attention_heads = c.num_key_value_heads = 8;
  c.q_lora_rank = q_lora ? 128 : 0;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = c.qk_rope_head_dim = c.v_head_dim = 32;
  c.max_position_embeddings = 4096;
  c.rope_scaling = {true, 4.0, 4096, 32.0, 1.0, 1.0, 1.0};
}

inline void fill_uniform(std::vector<double>& v, Rng& rng, double a = 1.0) {
  for (double& x : v) x = a * (2.0 * rng.uniform() - 1.0);
}

// Compares analytic d loss / d x[i] (grad[i]) with central differences on `samples` random
// coordinates of x[0..n) (all of them when n <= samples). Tolerance: |fd - g| <= atol + rtol |g|.
inline void expect_grad(const std::string& what, const std::function<double()>& loss, double* x,
                        const double* grad, int64_t n, int samples, Rng& rng, double atol = 1e-7,
                        double rtol = 1e-5) {
  constexpr double kH = 1e-5;
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    const int64_t i = n <= samples ? s : static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    const double x0 = x[i];
    x[i] = x0 + kH;
    const double lp = loss();
    x[i] = x0 - kH;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * kH);
    EXPECT_NEAR(grad[i], fd, atol + rtol * std::abs(fd)) << what << "[" << i << "]";
  }
}

}  // namespace fathom::train::testing
