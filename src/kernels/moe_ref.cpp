// Float64 references for the MoE gate (selection by repeated argmax, sharing no selection code
// with moe_gate) and the grouped experts (token by token through matmul_ref).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/moe.h"

namespace fathom {

void moe_gate_ref(const MoeGateParams& p, const float* logits, int64_t n_tokens, int32_t* ids,
                  double* weights) {
  const Status v = validate_moe_gate(p);
  CHECK_MSG(v.ok(), "{}", v.message());
  const int64_t n = p.n_experts, per_group = n / p.n_groups;
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<float> scores(static_cast<size_t>(n));
  std::vector<double> sel(static_cast<size_t>(n));
  for (int64_t t = 0; t < n_tokens; ++t) {
    // scores in fp32 exactly as the model computes them; everything after in float64
    moe_gate_scores(p, logits + t * n, scores.data());
    for (int64_t e = 0; e < n; ++e) {
      const double b = static_cast<double>(scores[static_cast<size_t>(e)]) + (p.bias ? p.bias[e] : 0.0f);
      sel[static_cast<size_t>(e)] = static_cast<double>(static_cast<float>(b));  // the fp32 sum the gate uses
      if (std::isnan(sel[static_cast<size_t>(e)])) sel[static_cast<size_t>(e)] = ninf;
    }
    if (p.n_groups > 1) {
      std::vector<double> gs(static_cast<size_t>(p.n_groups));
      for (int g = 0; g < p.n_groups; ++g) {
        std::vector<double> v(sel.begin() + g * per_group, sel.begin() + (g + 1) * per_group);
        std::sort(v.begin(), v.end(), std::greater<>());
        gs[static_cast<size_t>(g)] = p.group_score == MoeGroupScore::kMax
                                         ? v[0]
                                         : static_cast<double>(static_cast<float>(v[0] + v[1]));
      }
      std::vector<bool> kept(static_cast<size_t>(p.n_groups), false);
      for (int r = 0; r < p.topk_groups; ++r) {  // repeated argmax, lowest index on ties
        int best = -1;
        for (int g = 0; g < p.n_groups; ++g)
          if (!kept[static_cast<size_t>(g)] &&
              (best < 0 || gs[static_cast<size_t>(g)] > gs[static_cast<size_t>(best)]))
            best = g;
        kept[static_cast<size_t>(best)] = true;
      }
      for (int64_t e = 0; e < n; ++e)
        if (!kept[static_cast<size_t>(e / per_group)]) sel[static_cast<size_t>(e)] = ninf;
    }
    std::vector<bool> taken(static_cast<size_t>(n), false);
    double sum = 0;
    for (int j = 0; j < p.top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < n; ++e)
        if (!taken[static_cast<size_t>(e)] &&
            (best < 0 || sel[static_cast<size_t>(e)] > sel[static_cast<size_t>(best)]))
          best = e;
      taken[static_cast<size_t>(best)] = true;
      ids[t * p.top_k + j] = static_cast<int32_t>(best);
      weights[t * p.top_k + j] = scores[static_cast<size_t>(best)];
      sum += scores[static_cast<size_t>(best)];
    }
    for (int j = 0; j < p.top_k; ++j) {
      double& w = weights[t * p.top_k + j];
      w = (p.normalize ? w / (sum + 1e-20) : w) * p.scale;
    }
  }
}

void moe_experts_ref(const MoeExpertsParams& p, std::span<const ExpertWeights> experts, const float* x,
                     int64_t n_tokens, const int32_t* ids, const float* weights, double* y) {
  std::vector<double> g(static_cast<size_t>(p.inter)), u(static_cast<size_t>(p.inter)),
      o(static_cast<size_t>(p.hidden));
  std::vector<float> h(static_cast<size_t>(p.inter));
  for (int64_t t = 0; t < n_tokens; ++t) {
    double* yt = y + t * p.hidden;
    std::fill(yt, yt + p.hidden, 0.0);
    std::vector<int> order(static_cast<size_t>(p.top_k));
    for (int j = 0; j < p.top_k; ++j) order[static_cast<size_t>(j)] = j;
    const int32_t* it = ids + t * p.top_k;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return it[a] < it[b] || (it[a] == it[b] && a < b); });
    for (int j : order) {
      const int32_t e = it[j];
      if (e < 0) continue;
      const ExpertWeights& ew = experts[static_cast<size_t>(e)];
      matmul_ref(ew.gate, x + t * p.hidden, 1, g.data());
      matmul_ref(ew.up, x + t * p.hidden, 1, u.data());
      for (int64_t i = 0; i < p.inter; ++i) {
        const double gi = g[static_cast<size_t>(i)];
        h[static_cast<size_t>(i)] =
            static_cast<float>(gi / (1.0 + std::exp(-gi)) * u[static_cast<size_t>(i)]);
      }
      matmul_ref(ew.down, h.data(), 1, o.data());
      for (int64_t r = 0; r < p.hidden; ++r)
        yt[r] += static_cast<double>(weights[t * p.top_k + j]) * o[static_cast<size_t>(r)];
    }
  }
}

}  // namespace fathom
