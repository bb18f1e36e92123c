// Float64 reference forward pass (see reference.h). Slow by design: O(n^2) attention, every
// weight row dequantised per use.
#include "model/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/check.h"
#include "tensor/convert.h"

namespace fathom {
namespace {

using Vec = std::vector<double>;

Vec vector_of(const VectorView& v) {
  std::vector<float> f(static_cast<size_t>(v.n));
  CHECK_OK(to_f32(v.dtype, v.data, f.data(), v.n));
  return Vec(f.begin(), f.end());
}

// rows x [m, cols] (double) -> y [m, w.rows], through the kernels' float64 matmul reference.
Vec linear(const WeightView& w, const Vec& x, int64_t m) {
  std::vector<float> xf(x.begin(), x.end());
  Vec y(static_cast<size_t>(m * w.rows));
  matmul_ref(w, xf.data(), m, y.data());
  return y;
}

void rms_norm(Vec& x, int64_t rows, int64_t dim, int64_t stride, const Vec& weight, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double* p = x.data() + r * stride;
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += p[d] * p[d];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t d = 0; d < dim; ++d) p[d] = p[d] * inv * weight[static_cast<size_t>(d)];
  }
}

// YaRN inverse frequencies, re-derived from DeepSeek's precompute_freqs_cis.
Vec inv_freq(const ModelConfig& c) {
  const int64_t dim = c.qk_rope_head_dim;
  Vec f(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) f[static_cast<size_t>(i)] = 1.0 / std::pow(c.rope_theta, 2.0 * i / dim);
  if (!c.rope_scaling.yarn || c.rope_scaling.factor <= 1.0) return f;
  const double base = c.rope_theta, orig = static_cast<double>(c.rope_scaling.original_max_position_embeddings);
  auto corr_dim = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(base)); };
  const double low = std::max(std::floor(corr_dim(c.rope_scaling.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(c.rope_scaling.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double smooth = 1.0 - ramp;
    f[static_cast<size_t>(i)] = f[static_cast<size_t>(i)] / c.rope_scaling.factor * (1 - smooth) + f[static_cast<size_t>(i)] * smooth;
  }
  return f;
}

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

void rope(double* x, int64_t pos, const Vec& freq, double cs_scale) {
  for (size_t i = 0; i < freq.size(); ++i) {
    const double a = static_cast<double>(pos) * freq[i];
    const double c = std::cos(a) * cs_scale, s = std::sin(a) * cs_scale;
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// The cache stores each latent token rounded to its dtype.
void round_like_cache(double* tok, const ModelConfig& c, MlaKvDType dtype) {
  MlaKvFormat f;
  f.d_latent = static_cast<int>(c.kv_lora_rank);
  f.d_rope = static_cast<int>(c.qk_rope_head_dim);
  f.dtype = dtype;
  std::vector<float> in(static_cast<size_t>(f.d_qk())), out(in.size());
  std::vector<uint8_t> bytes(static_cast<size_t>(f.token_bytes()));
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(tok[i]);
  mla_kv_encode_token(f, in.data(), bytes.data());
  mla_kv_decode_token(f, bytes.data(), out.data());
  for (size_t i = 0; i < in.size(); ++i) tok[i] = out[i];
}

// MoE gate in double, from model.py's Gate.forward.
void gate(const ModelConfig& c, const double* logits, const std::vector<float>& bias, std::vector<int>& ids,
          std::vector<double>& weights) {
  const int64_t E = c.n_routed_experts;
  Vec s(static_cast<size_t>(E));
  if (c.scoring_func == ScoringFunc::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) s[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double mx = *std::max_element(logits, logits + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
    for (auto& v : s) v /= sum;
  }
  Vec b = s;
  if (!bias.empty()) for (int64_t e = 0; e < E; ++e) b[static_cast<size_t>(e)] += bias[static_cast<size_t>(e)];
  const bool grouped = c.topk_method != TopkMethod::kGreedy && c.n_group > 1;
  if (grouped) {
    const int64_t per = E / c.n_group;
    std::vector<std::pair<double, int64_t>> gs;
    for (int64_t g = 0; g < c.n_group; ++g) {
      Vec part(b.begin() + g * per, b.begin() + (g + 1) * per);
      std::sort(part.rbegin(), part.rend());
      gs.push_back({c.topk_method == TopkMethod::kNoauxTc ? part[0] + part[1] : part[0], g});
    }
    std::stable_sort(gs.begin(), gs.end(), [](auto& x, auto& y) { return x.first > y.first; });
    for (size_t k = static_cast<size_t>(c.topk_group); k < gs.size(); ++k) {
      for (int64_t e = 0; e < per; ++e) b[static_cast<size_t>(gs[k].second * per + e)] = -std::numeric_limits<double>::infinity();
    }
  }
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return b[static_cast<size_t>(x)] > b[static_cast<size_t>(y)]; });
  ids.assign(order.begin(), order.begin() + c.num_experts_per_tok);
  weights.clear();
  double sum = 0;
  for (int e : ids) sum += s[static_cast<size_t>(e)];
  const bool v2 = c.scoring_func == ScoringFunc::kSoftmax;
  const double scale = v2 && c.norm_topk_prob ? 1.0 : c.routed_scaling_factor;
  for (int e : ids) weights.push_back(s[static_cast<size_t>(e)] / (c.norm_topk_prob ? sum + 1e-20 : 1.0) * scale);
}

// Gate weights of given experts from a token's router logits (as the gate computes them).
void gate_weights_for(const ModelConfig& c, const double* logits, const std::vector<int32_t>& chosen, std::vector<int>& ids,
                      std::vector<double>& weights) {
  const int64_t E = c.n_routed_experts;
  Vec s(static_cast<size_t>(E));
  if (c.scoring_func == ScoringFunc::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) s[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double mx = *std::max_element(logits, logits + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
    for (auto& v : s) v /= sum;
  }
  ids.assign(chosen.begin(), chosen.end());
  double sum = 0;
  for (int e : ids) sum += s[static_cast<size_t>(e)];
  const bool v2 = c.scoring_func == ScoringFunc::kSoftmax;
  const double scale = v2 && c.norm_topk_prob ? 1.0 : c.routed_scaling_factor;
  weights.clear();
  for (int e : ids) weights.push_back(s[static_cast<size_t>(e)] / (c.norm_topk_prob ? sum + 1e-20 : 1.0) * scale);
}

Vec swiglu(const WeightView& g, const WeightView& u, const WeightView& d, const Vec& x, int64_t m) {
  Vec a = linear(g, x, m), b = linear(u, x, m);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return linear(d, a, m);
}

// One decoder layer over all n positions (in place on x [n, hidden]).
struct LayerContext {
  int64_t index = 0;
  MlaKvDType kv_dtype = MlaKvDType::kBF16;
  const RoutingTrace* routing = nullptr;
  ReferenceResult* result = nullptr;
  bool bf16_attention = false;
};

double round_bf16(double x) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
}

void layer(const ModelWeights& w, const LayerWeights& L, Vec& x, int64_t n, int64_t pos0, const LayerContext& lc) {
  const MlaKvDType kv_dtype = lc.kv_dtype;
  const ModelConfig& c = w.config;
  const int64_t hd = c.hidden_size, H = c.num_attention_heads, nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim;
  const int64_t qk = nope + rd, kvl = c.kv_lora_rank, vd = c.v_head_dim, kvw = kvl + rd;
  const Vec freq = inv_freq(c);
  const double cs = c.rope_scaling.yarn
                        ? yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale) /
                              yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim)
                        : 1.0;
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c.rope_scaling.yarn && c.rope_scaling.mscale_all_dim != 0) {
    const double m = yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  Vec xn = x;
  rms_norm(xn, n, hd, hd, vector_of(L.attn_norm), c.rms_norm_eps);
  Vec q;
  if (c.q_lora_rank > 0) {
    Vec qa = linear(L.q_a, xn, n);
    rms_norm(qa, n, c.q_lora_rank, c.q_lora_rank, vector_of(L.q_a_norm), c.rms_norm_eps);
    q = linear(L.q_b, qa, n);
  } else {
    q = linear(L.q, xn, n);
  }
  Vec kv = linear(L.kv_a, xn, n);
  rms_norm(kv, n, kvl, kvw, vector_of(L.kv_a_norm), c.rms_norm_eps);
  for (int64_t t = 0; t < n; ++t) {
    rope(kv.data() + t * kvw + kvl, pos0 + t, freq, cs);
    for (int64_t h = 0; h < H; ++h) rope(q.data() + (t * H + h) * qk + nope, pos0 + t, freq, cs);
    round_like_cache(kv.data() + t * kvw, c, kv_dtype);
  }
  // Naive MLA: K_nope and V decompressed from the stored latents.
  Vec lat(static_cast<size_t>(n * kvl));
  for (int64_t t = 0; t < n; ++t) std::copy(kv.begin() + t * kvw, kv.begin() + t * kvw + kvl, lat.begin() + t * kvl);
  Vec kn = linear(L.w_k, lat, n), vv = linear(L.w_v, lat, n);
  Vec qa = q, kpe = kv;  // the attention's operands (rounded like the tiles' when asked)
  if (lc.bf16_attention) {
    for (auto* v : {&kn, &vv, &qa, &kpe})
      for (double& e : *v) e = round_bf16(e);
  }
  Vec att(static_cast<size_t>(n * H * vd), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      Vec s(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < nope; ++d)
          dot += qa[static_cast<size_t>((i * H + h) * qk + d)] *
                 kn[static_cast<size_t>(j * H * nope + h * nope + d)];
        for (int64_t d = 0; d < rd; ++d)
          dot += qa[static_cast<size_t>((i * H + h) * qk + nope + d)] *
                 kpe[static_cast<size_t>(j * kvw + kvl + d)];
        s[static_cast<size_t>(j)] = dot * scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (auto& v : s) sum += v = lc.bf16_attention ? round_bf16(std::exp(v - mx)) : std::exp(v - mx);
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t d = 0; d < vd; ++d) {
          att[static_cast<size_t>(i * H * vd + h * vd + d)] += s[static_cast<size_t>(j)] / sum * vv[static_cast<size_t>(j * H * vd + h * vd + d)];
        }
      }
    }
  }
  const Vec o = linear(L.o, att, n);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  xn = x;
  rms_norm(xn, n, hd, hd, vector_of(L.ffn_norm), c.rms_norm_eps);
  if (!L.moe) {
    const Vec y = swiglu(L.mlp_gate, L.mlp_up, L.mlp_down, xn, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    return;
  }
  const Vec logits = linear(L.router, xn, n);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> ids;
    std::vector<double> wts;
    gate(c, logits.data() + t * c.n_routed_experts, L.router_bias, ids, wts);
    if (lc.routing != nullptr) {
      auto it = lc.routing->ids.find({lc.index, pos0 + t});
      if (it != lc.routing->ids.end()) {
        ++lc.result->routing_decisions;
        std::vector<int> a(ids), b(it->second.begin(), it->second.end());
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a != b) ++lc.result->routing_disagreements;
        // The reference's own weights for the recorded experts.
        gate_weights_for(c, logits.data() + t * c.n_routed_experts, it->second, ids, wts);
      }
    }
    const Vec xt(xn.begin() + t * hd, xn.begin() + (t + 1) * hd);
    for (size_t k = 0; k < ids.size(); ++k) {
      const ExpertWeights& e = L.experts[static_cast<size_t>(ids[k])];
      const Vec y = swiglu(e.gate, e.up, e.down, xt, 1);
      for (int64_t d = 0; d < hd; ++d) x[static_cast<size_t>(t * hd + d)] += wts[k] * y[static_cast<size_t>(d)];
    }
  }
  if (c.n_shared_experts > 0) {
    const Vec y = swiglu(L.sh_gate, L.sh_up, L.sh_down, xn, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
}

Vec embed(const ModelWeights& w, std::span<const int32_t> tokens) {
  const int64_t hd = w.config.hidden_size;
  Vec x(tokens.size() * static_cast<size_t>(hd));
  std::vector<float> row(static_cast<size_t>(hd));
  for (size_t t = 0; t < tokens.size(); ++t) {
    dequantize_weight_row(w.embed, tokens[t], row.data());
    std::copy(row.begin(), row.end(), x.begin() + static_cast<int64_t>(t) * hd);
  }
  return x;
}

}  // namespace

Result<ReferenceResult> reference_forward(const ModelWeights& w, std::span<const int32_t> tokens,
                                          const ReferenceOptions& options) {
  const ModelConfig& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size()), hd = c.hidden_size;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size) return out_of_range("reference: token {} outside the vocabulary", t);
  }
  Vec x = embed(w, tokens);
  ReferenceResult r;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer(w, w.layers[static_cast<size_t>(l)], x, n, 0,
          LayerContext{l, options.kv_dtype, options.routing, &r, options.bf16_attention});
  }
  r.hidden = x;
  rms_norm(r.hidden, n, hd, hd, vector_of(w.final_norm), c.rms_norm_eps);
  r.logits = linear(w.head, r.hidden, n);
  if (options.with_mtp && w.n_mtp_layers > 0 && n > 1) {
    const LayerWeights& L = w.layers[static_cast<size_t>(c.num_hidden_layers)];
    Vec e = embed(w, tokens.subspan(1));
    Vec h(r.hidden.begin(), r.hidden.begin() + (n - 1) * hd);
    rms_norm(e, n - 1, hd, hd, vector_of(L.enorm), c.rms_norm_eps);
    rms_norm(h, n - 1, hd, hd, vector_of(L.hnorm), c.rms_norm_eps);
    Vec cat(static_cast<size_t>((n - 1) * 2 * hd));
    for (int64_t t = 0; t < n - 1; ++t) {
      std::copy(e.begin() + t * hd, e.begin() + (t + 1) * hd, cat.begin() + t * 2 * hd);
      std::copy(h.begin() + t * hd, h.begin() + (t + 1) * hd, cat.begin() + t * 2 * hd + hd);
    }
    Vec y = linear(L.eh_proj, cat, n - 1);
    layer(w, L, y, n - 1, 0,
          LayerContext{c.num_hidden_layers, options.kv_dtype, options.routing, &r, options.bf16_attention});
    rms_norm(y, n - 1, hd, hd, vector_of(L.head_norm), c.rms_norm_eps);
    r.mtp_logits = linear(w.head, y, n - 1);
  }
  return r;
}

}  // namespace fathom
