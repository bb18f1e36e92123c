// A float64 reference of the whole DeepSeek forward pass, written independently of the fast path
// (plain loops; YaRN RoPE, RMSNorm, MLA in the naive form, the MoE gate all re-derived here), for
// tests on small configs. What it shares with the fast path is only what defines the numerics:
// the stored weights (through the loader), the kernels' float64 matmul reference (which models
// the activation precision each weight type uses) and the KV cache's storage rounding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "kernels/mla_kv_format.h"
#include "model/model.h"
#include "model/weights.h"

namespace fathom {

struct ReferenceOptions {
  MlaKvDType kv_dtype = MlaKvDType::kBF16;  // how the cache rounds latents
  bool with_mtp = false;                    // also return the MTP logits (position i predicts i + 2)
  // Use these experts (a fast run's recorded routing) instead of the reference's own top-k; the
  // gate weights are still the reference's. Disagreements are counted.
  const RoutingTrace* routing = nullptr;
  // Model the prefill attention of BF16/FP8 models on AMX tiles (PrefillAttentionParams::
  // bf16_operands): q, K, V and the unnormalised probabilities rounded to bf16, sums in double.
  bool bf16_attention = false;
};

struct ReferenceResult {
  std::vector<double> logits;      // [n, vocab]
  std::vector<double> hidden;      // [n, hidden] final normed hidden states
  std::vector<double> mtp_logits;  // [n - 1, vocab]: MTP over (hidden_i, token_{i+1})
  int64_t routing_decisions = 0;   // tokens x MoE layers
  int64_t routing_disagreements = 0;  // of them, where the reference's own top-k set differed
};

Result<ReferenceResult> reference_forward(const ModelWeights& w, std::span<const int32_t> tokens,
                                          const ReferenceOptions& options = {});

}  // namespace fathom
