// DeepSeekMoE forward/backward (train_impl.h), DeepSeek-V3 flavour:
//  - router: scores s = sigmoid(x . Wr^T); selection on s + e_score_correction_bias (the bias only
//    chooses experts, it never weights them), group-limited: groups ranked by the sum of their
//    top-2 biased scores (noaux_tc; max for group_limited_greedy), topk_group kept, then top-k;
//  - gate weights w_k = s_k / (sum of the selected s + 1e-20) (norm_topk_prob) * routed_scaling_factor;
//  - y = sum_k w_k SwiGLU_k(x) + shared SwiGLU(x);
//  - sequence-wise balance loss (V3 eq. 17-20): L = alpha * sum_i f_i P_i per sequence, averaged
//    over sequences, f_i = E / (K S) * #tokens routed to i (a constant), P_i = mean_t s'_{t,i},
//    s' = s normalised over all experts. Its gradient flows into the router through s.
// Selection (top-k) is piecewise constant: gradients flow through the gate weights and the
// balance term's P only, as in every MoE trainer. Softmax scoring (V2) is rejected by the layout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/check.h"
#include "train/train_impl.h"

namespace fathom::train {

// Ties break toward the lower index (what a stable descending sort gives), with per-thread
// buffers so routing allocates nothing per token.
void moe_select(const ModelConfig& c, const double* scores, const double* bias, int32_t* ids) {
  const int64_t E = c.n_routed_experts;
  thread_local std::vector<double> b;
  thread_local std::vector<int32_t> order;
  thread_local std::vector<std::pair<double, int64_t>> groups;
  b.assign(scores, scores + E);
  if (bias != nullptr) {
    for (int64_t e = 0; e < E; ++e) b[static_cast<size_t>(e)] += bias[e];
  }
  if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1) {
    const int64_t per = E / c.n_group;
    groups.clear();
    for (int64_t g = 0; g < c.n_group; ++g) {
      double top1 = -std::numeric_limits<double>::infinity(), top2 = top1;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        const double v = b[static_cast<size_t>(e)];
        if (v > top1) {
          top2 = top1;
          top1 = v;
        } else if (v > top2) {
          top2 = v;
        }
      }
      groups.push_back({c.topk_method == TopkMethod::kNoauxTc && per > 1 ? top1 + top2 : top1, g});
    }
    std::sort(groups.begin(), groups.end(), [](auto& x, auto& y) {
      return x.first > y.first || (x.first == y.first && x.second < y.second);
    });
    for (size_t k = static_cast<size_t>(c.topk_group); k < groups.size(); ++k) {
      for (int64_t e = 0; e < per; ++e) {
        b[static_cast<size_t>(groups[k].second * per + e)] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  order.resize(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + c.num_experts_per_tok, order.end(),
                    [&](int32_t x, int32_t y) {
                      const double bx = b[static_cast<size_t>(x)], by = b[static_cast<size_t>(y)];
                      return bx > by || (bx == by && x < y);
                    });
  std::copy_n(order.begin(), c.num_experts_per_tok, ids);
}

namespace {

// Scores, selection and gate weights of every token; expert loads and the balance loss's f.
template <class T>
void route(const ModelConfig& c, const LayerParams<T>& p, MoeContext<T>& ctx) {
  const int64_t n = ctx.n, E = ctx.n_experts, K = ctx.top_k, S = ctx.shape.seq_len;
  linear_forward(ctx.x.data(), p.router, n, ctx.hidden, E, ctx.scores.data());
  std::vector<double> s(static_cast<size_t>(E)), bias(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    bias[static_cast<size_t>(e)] = p.router_bias != nullptr ? static_cast<double>(p.router_bias[e]) : 0.0;
  }
  ctx.load.assign(static_cast<size_t>(E), 0);
  for (auto& v : ctx.slots) v.clear();
  ctx.balance_f.assign(static_cast<size_t>(ctx.shape.n_seq * E), T(0));
  for (int64_t t = 0; t < n; ++t) {
    T* st = ctx.scores.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      st[e] = T(1) / (T(1) + std::exp(-st[e]));
      s[static_cast<size_t>(e)] = static_cast<double>(st[e]);
    }
    int32_t* ids = ctx.ids.data() + t * K;
    moe_select(c, s.data(), bias.data(), ids);
    T sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += st[ids[k]];
    const T denom = c.norm_topk_prob ? sum + static_cast<T>(1e-20) : T(1);
    for (int64_t k = 0; k < K; ++k) {
      ctx.weights[static_cast<size_t>(t * K + k)] =
          st[ids[k]] / denom * static_cast<T>(c.routed_scaling_factor);
      ctx.slots[static_cast<size_t>(ids[k])].push_back(t * K + k);
      ++ctx.load[static_cast<size_t>(ids[k])];
      ctx.balance_f[static_cast<size_t>((t / S) * E + ids[k])] += static_cast<T>(E) / static_cast<T>(K * S);
    }
  }
}

// alpha * sum_i f_i P_i per sequence, averaged over sequences.
template <class T>
double balance_loss(const MoeContext<T>& ctx) {
  const int64_t E = ctx.n_experts, S = ctx.shape.seq_len;
  double total = 0;
  for (int64_t t = 0; t < ctx.n; ++t) {
    const T* st = ctx.scores.data() + t * E;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(st[e]);
    const T* f = ctx.balance_f.data() + (t / S) * E;
    for (int64_t e = 0; e < E; ++e) total += static_cast<double>(f[e]) * static_cast<double>(st[e]) / sum;
  }
  return ctx.balance_alpha * total / static_cast<double>(S * ctx.shape.n_seq);
}

// ctx.dlogits [n, E] from d(gate weight) (ctx.dweights [n, K]) and the balance loss (scaled by
// loss_scale): through the gate normalisation to the scores, then through the sigmoid.
template <class T>
void router_backward(const ModelConfig& c, double loss_scale, MoeContext<T>& ctx) {
  const int64_t n = ctx.n, E = ctx.n_experts, K = ctx.top_k, S = ctx.shape.seq_len;
  const std::vector<T>& dw = ctx.dweights;
  ctx.dlogits.assign(static_cast<size_t>(n * E), T(0));
  const T rsf = static_cast<T>(c.routed_scaling_factor);
  const double bal_k = ctx.balance_alpha * loss_scale / static_cast<double>(S * ctx.shape.n_seq);
  for (int64_t t = 0; t < n; ++t) {
    const T* st = ctx.scores.data() + t * E;
    T* dl = ctx.dlogits.data() + t * E;
    const int32_t* ids = ctx.ids.data() + t * K;
    const T* dwt = dw.data() + t * K;
    if (c.norm_topk_prob) {
      T sum = 0, wsum = 0;
      for (int64_t k = 0; k < K; ++k) sum += st[ids[k]];
      sum += static_cast<T>(1e-20);
      for (int64_t k = 0; k < K; ++k) wsum += dwt[k] * st[ids[k]];
      for (int64_t k = 0; k < K; ++k) dl[ids[k]] += rsf * (dwt[k] / sum - wsum / (sum * sum));
    } else {
      for (int64_t k = 0; k < K; ++k) dl[ids[k]] += rsf * dwt[k];
    }
    if (bal_k > 0) {
      // L += bal_k * sum_i f_i s_i / sum_j s_j
      const T* f = ctx.balance_f.data() + (t / S) * E;
      double ssum = 0, fs = 0;
      for (int64_t e = 0; e < E; ++e) {
        ssum += static_cast<double>(st[e]);
        fs += static_cast<double>(f[e]) * static_cast<double>(st[e]);
      }
      for (int64_t e = 0; e < E; ++e) {
        dl[e] += static_cast<T>(bal_k * (static_cast<double>(f[e]) / ssum - fs / (ssum * ssum)));
      }
    }
    for (int64_t e = 0; e < E; ++e) dl[e] *= st[e] * (T(1) - st[e]);
  }
}

}  // namespace

template <class T>
void moe_forward(const ModelConfig& c, const LayerParams<T>& p, SeqShape shape, double balance_alpha,
                 const T* x, T* y, MoeContext<T>& ctx) {
  const int64_t n = shape.tokens(), hd = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t inter = c.moe_intermediate_size;
  ctx.shape = shape;
  ctx.n = n;
  ctx.n_experts = E;
  ctx.top_k = K;
  ctx.hidden = hd;
  ctx.balance_alpha = balance_alpha;
  ctx.x.assign(x, x + n * hd);
  ctx.scores.resize(static_cast<size_t>(n * E));
  ctx.ids.resize(static_cast<size_t>(n * K));
  ctx.weights.resize(static_cast<size_t>(n * K));
  ctx.slots.resize(static_cast<size_t>(E));
  ctx.experts.resize(static_cast<size_t>(E));
  ctx.expert_out.resize(static_cast<size_t>(E));
  route(c, p, ctx);
  ctx.balance_loss = balance_alpha > 0 ? balance_loss(ctx) : 0.0;
  // Shared experts over every token, then each routed expert over its gathered tokens.
  if (c.n_shared_experts > 0) {
    swiglu_forward(x, p.sh_gate, p.sh_up, p.sh_down, n, hd, c.n_shared_experts * inter, y, ctx.shared);
  } else {
    std::fill(y, y + n * hd, T(0));
  }
  ctx.gathered.resize(static_cast<size_t>(n * hd));
  for (int64_t e = 0; e < E; ++e) {
    const auto& slots = ctx.slots[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(slots.size());
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(x + (slots[static_cast<size_t>(i)] / K) * hd, hd, ctx.gathered.data() + i * hd);
    auto& out = ctx.expert_out[static_cast<size_t>(e)];
    out.resize(static_cast<size_t>(m * hd));
    if (m == 0) continue;
    swiglu_forward(ctx.gathered.data(), p.exp_gate[static_cast<size_t>(e)], p.exp_up[static_cast<size_t>(e)],
                   p.exp_down[static_cast<size_t>(e)], m, hd, inter, out.data(),
                   ctx.experts[static_cast<size_t>(e)]);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t slot = slots[static_cast<size_t>(i)];
      const T w = ctx.weights[static_cast<size_t>(slot)];
      T* yt = y + (slot / K) * hd;
      const T* o = out.data() + i * hd;
      for (int64_t d = 0; d < hd; ++d) yt[d] += w * o[d];
    }
  }
}

template <class T>
void moe_backward_input(const ModelConfig& c, const LayerParams<T>& p, const T* dy, double loss_scale, T* dx,
                        MoeContext<T>& ctx) {
  const int64_t n = ctx.n, hd = ctx.hidden, E = ctx.n_experts, K = ctx.top_k;
  if (c.n_shared_experts > 0) {
    swiglu_backward_input(ctx.shared, p.sh_gate, p.sh_up, p.sh_down, dy, dx, false);
  } else {
    std::fill(dx, dx + n * hd, T(0));
  }
  // d(gate weight) per slot, and each expert's output gradient w_k * dy.
  std::vector<T>& dw = ctx.dweights;
  dw.assign(static_cast<size_t>(n * K), T(0));
  for (int64_t e = 0; e < E; ++e) {
    const auto& slots = ctx.slots[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(slots.size());
    if (m == 0) continue;
    const auto& out = ctx.expert_out[static_cast<size_t>(e)];
    for (int64_t i = 0; i < m; ++i) {
      const int64_t slot = slots[static_cast<size_t>(i)];
      const T* dyt = dy + (slot / K) * hd;
      const T* o = out.data() + i * hd;
      T acc = 0;
      for (int64_t d = 0; d < hd; ++d) acc += dyt[d] * o[d];
      dw[static_cast<size_t>(slot)] = acc;
      const T w = ctx.weights[static_cast<size_t>(slot)];
      for (int64_t d = 0; d < hd; ++d) ctx.gathered[static_cast<size_t>(i * hd + d)] = w * dyt[d];
    }
    SwigluContext<T>& ec = ctx.experts[static_cast<size_t>(e)];
    std::vector<T>& dxe = ctx.expert_dx;
    dxe.resize(static_cast<size_t>(m * hd));
    swiglu_backward_input(ec, p.exp_gate[static_cast<size_t>(e)], p.exp_up[static_cast<size_t>(e)],
                          p.exp_down[static_cast<size_t>(e)], ctx.gathered.data(), dxe.data(), false);
    for (int64_t i = 0; i < m; ++i) {
      T* dxt = dx + (slots[static_cast<size_t>(i)] / K) * hd;
      for (int64_t d = 0; d < hd; ++d) dxt[d] += dxe[static_cast<size_t>(i * hd + d)];
    }
  }
  router_backward(c, loss_scale, ctx);
  linear_backward_input(ctx.dlogits.data(), p.router, n, hd, E, dx, true);
}

template <class T>
void moe_backward_weight(const ModelConfig& c, const MoeContext<T>& ctx, LayerParams<T>& g) {
  if (c.n_shared_experts > 0) swiglu_backward_weight(ctx.shared, g.sh_gate, g.sh_up, g.sh_down);
  for (int64_t e = 0; e < ctx.n_experts; ++e) {
    if (ctx.slots[static_cast<size_t>(e)].empty()) continue;
    swiglu_backward_weight(ctx.experts[static_cast<size_t>(e)], g.exp_gate[static_cast<size_t>(e)],
                           g.exp_up[static_cast<size_t>(e)], g.exp_down[static_cast<size_t>(e)]);
  }
  linear_backward_weight(ctx.dlogits.data(), ctx.x.data(), ctx.n, ctx.hidden, ctx.n_experts, g.router);
}

template <class T>
void moe_update_bias(T* bias, std::span<const int64_t> expert_load, double speed) {
  if (expert_load.empty()) return;
  double mean = 0;
  for (int64_t l : expert_load) mean += static_cast<double>(l);
  mean /= static_cast<double>(expert_load.size());
  for (size_t e = 0; e < expert_load.size(); ++e) {
    const double l = static_cast<double>(expert_load[e]);
    if (l < mean) bias[e] += static_cast<T>(speed);
    if (l > mean) bias[e] -= static_cast<T>(speed);
  }
}

#define FATHOM_MOE_INSTANTIATE(T)                                                                         \
  template void moe_forward<T>(const ModelConfig&, const LayerParams<T>&, SeqShape, double, const T*, T*, \
                               MoeContext<T>&);                                                           \
  template void moe_backward_input<T>(const ModelConfig&, const LayerParams<T>&, const T*, double, T*,    \
                                      MoeContext<T>&);                                                    \
  template void moe_backward_weight<T>(const ModelConfig&, const MoeContext<T>&, LayerParams<T>&);        \
  template void moe_update_bias<T>(T*, std::span<const int64_t>, double);
FATHOM_MOE_INSTANTIATE(float)
FATHOM_MOE_INSTANTIATE(double)
#undef FATHOM_MOE_INSTANTIATE

}  // namespace fathom::train
