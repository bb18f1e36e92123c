// The DeepSeekMoE gate (see moe.h): scores, bias-corrected group-limited top-k, normalisation and
// routed scaling; scalar (a few hundred experts per token). The reference is in moe_ref.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "kernels/moe.h"

namespace fathom {

Status validate_moe_gate(const MoeGateParams& p) {
  if (p.n_experts < 1 || p.n_experts > (int64_t{1} << 20))
    return invalid_argument("moe gate: n_routed_experts {} out of range", p.n_experts);
  if (p.top_k < 1 || p.top_k > p.n_experts) {
    return invalid_argument("moe gate: num_experts_per_tok {} must lie in [1, n_routed_experts = {}]",
                            p.top_k, p.n_experts);
  }
  if (p.n_groups < 1 || p.n_experts % p.n_groups != 0) {
    return invalid_argument("moe gate: n_group {} must divide n_routed_experts {}", p.n_groups, p.n_experts);
  }
  if (p.topk_groups < 1 || p.topk_groups > p.n_groups) {
    return invalid_argument("moe gate: topk_group {} must lie in [1, n_group = {}]", p.topk_groups,
                            p.n_groups);
  }
  const int64_t per_group = p.n_experts / p.n_groups;
  if (p.n_groups > 1 && p.group_score == MoeGroupScore::kTop2Sum && per_group < 2) {
    return invalid_argument("moe gate: the top-2-sum group score needs at least 2 experts per group (got {})",
                            per_group);
  }
  if (p.top_k > per_group * p.topk_groups) {
    return invalid_argument(
        "moe gate: num_experts_per_tok {} exceeds the {} experts in the topk_group = {} kept groups", p.top_k,
        per_group * p.topk_groups, p.topk_groups);
  }
  if (!std::isfinite(p.scale))
    return invalid_argument("moe gate: routed_scaling_factor {} is not finite", p.scale);
  return {};
}

namespace {

// Selection key: NaN sorts below everything (so a broken logit cannot break the ordering).
inline float key(float v) {
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

// Greater score first; ties: lower index first. A strict weak order on indices.
struct ByScore {
  const float* s;
  bool operator()(int32_t a, int32_t b) const {
    const float ka = key(s[a]), kb = key(s[b]);
    return ka > kb || (ka == kb && a < b);
  }
};

}  // namespace

void moe_gate_scores(const MoeGateParams& p, const float* logits, float* scores) {
  const int64_t n = p.n_experts;
  if (p.scoring == MoeScoring::kSigmoid) {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) mx = std::max(mx, logits[e]);
  float sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += scores[e] = std::exp(logits[e] - mx);
  for (int64_t e = 0; e < n; ++e) scores[e] /= sum;
}

namespace {

void gate_token(const MoeGateParams& p, const float* logits, int32_t* ids, float* weights,
                std::vector<float>& scores, std::vector<float>& sel, std::vector<int32_t>& idx,
                std::vector<float>& group) {
  const int64_t n = p.n_experts, per_group = n / p.n_groups;
  moe_gate_scores(p, logits, scores.data());
  for (int64_t e = 0; e < n; ++e)
    sel[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] + (p.bias ? p.bias[e] : 0.0f);
  if (p.n_groups > 1) {
    for (int g = 0; g < p.n_groups; ++g) {
      const float* s = sel.data() + g * per_group;
      float a = -std::numeric_limits<float>::infinity(), b = a;  // the two largest
      for (int64_t j = 0; j < per_group; ++j) {
        const float v = key(s[j]);
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      group[static_cast<size_t>(g)] = p.group_score == MoeGroupScore::kMax ? a : a + b;
    }
    std::iota(idx.begin(), idx.begin() + p.n_groups, 0);
    std::partial_sort(idx.begin(), idx.begin() + p.topk_groups, idx.begin() + p.n_groups,
                      ByScore{group.data()});
    for (int g = 0; g < p.n_groups; ++g) {
      const bool kept = std::find(idx.begin(), idx.begin() + p.topk_groups, g) != idx.begin() + p.topk_groups;
      if (!kept) {
        for (int64_t j = 0; j < per_group; ++j)
          sel[static_cast<size_t>(g * per_group + j)] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  std::iota(idx.begin(), idx.begin() + n, 0);
  std::partial_sort(idx.begin(), idx.begin() + p.top_k, idx.begin() + n, ByScore{sel.data()});
  float sum = 0;
  for (int j = 0; j < p.top_k; ++j) {
    ids[j] = idx[static_cast<size_t>(j)];
    weights[j] = scores[static_cast<size_t>(ids[j])];
    sum += weights[j];
  }
  const float norm = p.normalize ? 1.0f / (sum + 1e-20f) : 1.0f;
  for (int j = 0; j < p.top_k; ++j) weights[j] = weights[j] * norm * p.scale;
}

}  // namespace

void moe_gate(const MoeGateParams& p, const float* logits, int64_t n_tokens, int32_t* ids, float* weights) {
  const Status v = validate_moe_gate(p);
  CHECK_MSG(v.ok(), "{}", v.message());
  thread_local std::vector<float> scores, sel, group;
  thread_local std::vector<int32_t> idx;
  scores.resize(static_cast<size_t>(p.n_experts));
  sel.resize(static_cast<size_t>(p.n_experts));
  idx.resize(static_cast<size_t>(std::max<int64_t>(p.n_experts, p.n_groups)));
  group.resize(static_cast<size_t>(p.n_groups));
  for (int64_t t = 0; t < n_tokens; ++t) {
    gate_token(p, logits + t * p.n_experts, ids + t * p.top_k, weights + t * p.top_k, scores, sel, idx,
               group);
  }
}

}  // namespace fathom
