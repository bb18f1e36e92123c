// DeepSeekMoE kernels: the gate (scores, bias-corrected group-limited top-k, normalisation,
// routed scaling) and the grouped expert SwiGLU that runs every selected expert over the tokens
// routed to it, reading each expert's weights once per call.
//
// Gate, per token, as DeepSeek's inference/model.py Gate.forward defines it:
//   s = softmax(logits) or sigmoid(logits)                        (fp32)
//   b = s + bias   (bias = e_score_correction_bias; used only to choose, never as weight)
//   groups (n_groups > 1): group score = max of b in the group (kMax, V2 group_limited_greedy, no
//     bias) or sum of the two largest b in the group (kTop2Sum, V3 noaux_tc); the topk_groups best
//     groups stay, every expert of the other groups gets -inf (not 0: biased scores can be < 0);
//   ids = the top_k largest b (ties: lower expert id first), ordered by descending b;
//   weights = s[ids], divided by their sum (+1e-20) when normalize, times scale.
// Mapping configs (the lead's loader does this):
//   V3:  sigmoid, kTop2Sum, bias, normalize = norm_topk_prob, scale = routed_scaling_factor.
//   V2:  softmax, kMax when topk_method == group_limited_greedy else groups = 1, no bias; HF's V2
//        applies routed_scaling_factor only when it does not normalise: scale = norm ? 1 : factor.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "tensor/tensor.h"

namespace fathom {

enum class MoeScoring : uint8_t { kSoftmax, kSigmoid };
enum class MoeGroupScore : uint8_t { kMax, kTop2Sum };

struct MoeGateParams {
  int64_t n_experts = 0;  // n_routed_experts
  int top_k = 1;          // num_experts_per_tok
  MoeScoring scoring = MoeScoring::kSoftmax;
  int n_groups = 1;     // n_group; 1 disables group limiting
  int topk_groups = 1;  // topk_group
  MoeGroupScore group_score = MoeGroupScore::kMax;
  const float* bias = nullptr;  // [n_experts] e_score_correction_bias, or nullptr
  bool normalize = false;
  float scale = 1.0f;
};

// Errors name the field: top_k out of [1, n_experts], n_groups not dividing n_experts,
// topk_groups out of [1, n_groups], kTop2Sum with fewer than 2 experts per group, top_k larger than
// the experts in the kept groups.
Status validate_moe_gate(const MoeGateParams& p);

// The fp32 scores of one token (softmax or sigmoid of its n_experts logits).
void moe_gate_scores(const MoeGateParams& p, const float* logits, float* scores);

// logits: [n_tokens, n_experts] (the gate linear's output); ids, weights: [n_tokens, top_k].
void moe_gate(const MoeGateParams& p, const float* logits, int64_t n_tokens, int32_t* ids, float* weights);
// Float64 reference of the same (same tie rule).
void moe_gate_ref(const MoeGateParams& p, const float* logits, int64_t n_tokens, int32_t* ids,
                  double* weights);

// One expert's SwiGLU weights: gate, up: [inter, hidden]; down: [hidden, inter].
struct ExpertWeights {
  WeightView gate, up, down;
};

struct MoeExpertsParams {
  int64_t n_experts = 0;  // entries of the experts span (routed ids index it)
  int64_t hidden = 0;
  int64_t inter = 0;  // moe_intermediate_size (or n_shared * it for the shared experts as one)
  int top_k = 1;      // slots per token, at most 64
};

// Scratch for moe_experts, sized once for at most `max_tokens` tokens (allocated here, never per
// call): about max_tokens * top_k * (4 hidden + 12 inter) bytes plus max_tokens * 4 hidden (e.g.
// 80 MiB for V2-Lite at 512 tokens). Not thread-safe: one call at a time per workspace.
class MoeWorkspace {
 public:
  static Result<std::unique_ptr<MoeWorkspace>> create(const MoeExpertsParams& p, int64_t max_tokens);
  int64_t max_tokens() const { return max_tokens_; }
  const MoeExpertsParams& params() const { return params_; }
  ~MoeWorkspace();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  MoeWorkspace() = default;
  MoeExpertsParams params_;
  int64_t max_tokens_ = 0;
  std::unique_ptr<Impl> impl_;
};

// Checks every expert (shapes [inter, hidden] / [hidden, inter], matmul_supports, same gate/up dtype
// across experts, same down dtype); experts[e].gate.data == nullptr marks an expert not held here
// (expert parallelism) which must not be routed to.
Status validate_experts(const MoeExpertsParams& p, std::span<const ExpertWeights> experts);

// y[t, :] (=|+=) sum_j weights[t, j] * down_e( silu(gate_e x_t) * up_e x_t ),  e = ids[t, j].
// Shared experts can run through the same call as one expert (inter = n_shared * moe_inter, ids all
// 0, weights all 1, top_k 1); the model runs them as a matmul SwiGLU after it. Activations for each
// matrix follow matmul's precision for its dtype; h = silu(gate) * up is formed in fp32.
// x, y: [n_tokens, hidden] fp32; ids, weights: [n_tokens, top_k]; ids < 0 skip the slot.
// n_tokens <= ws.max_tokens(). Each expert's matrices are read once per call; each token's
// expert outputs are added in ascending expert id, so results do not depend on the thread count.
void moe_experts(const MoeExpertsParams& p, std::span<const ExpertWeights> experts, const float* x,
                 int64_t n_tokens, const int32_t* ids, const float* weights, float* y, bool accumulate,
                 MoeWorkspace& ws, ThreadPool& pool = default_pool());

// Float64 reference: per token and slot, the matmul_ref numerics (activation rounding included).
void moe_experts_ref(const MoeExpertsParams& p, std::span<const ExpertWeights> experts, const float* x,
                     int64_t n_tokens, const int32_t* ids, const float* weights, double* y);

}  // namespace fathom
