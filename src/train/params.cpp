// The parameter slab (train.h): layout from the model's Hugging Face weight table (model/names.h),
// named views, deterministic initialisation and import from a safetensors checkpoint.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/ranges.h>

#include "base/check.h"
#include "base/rng.h"
#include "formats/safetensors.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "tensor/convert.h"
#include "train/train.h"

namespace fathom::train {

const ParamInfo* ParamLayout::find(std::string_view name) const {
  for (const ParamInfo& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

Result<ParamLayout> make_param_layout(const ModelConfig& config, bool with_mtp) {
  TRY(config.validate());
  if (config.n_routed_experts > 0 && config.scoring_func != ScoringFunc::kSigmoid) {
    return invalid_argument(
        "train: scoring_func '{}' is not supported for training (DeepSeek-V3's sigmoid only)",
        scoring_func_name(config.scoring_func));
  }
  if (with_mtp && config.num_nextn_predict_layers < 1) {
    return invalid_argument("train: MTP requested but num_nextn_predict_layers is {} (need 1)",
                            config.num_nextn_predict_layers);
  }
  ParamLayout layout;
  layout.config = config;
  layout.mtp = with_mtp;
  if (with_mtp) layout.config.num_nextn_predict_layers = 1;  // depth 1: one module
  for (const HfWeight& w : hf_weights(layout.config, with_mtp)) {
    // The MTP module shares the main model's embedding and output head.
    if (w.layer >= 0 && (w.weight == LayerWeight::kMtpEmbed || w.weight == LayerWeight::kMtpHead)) continue;
    ParamInfo p;
    p.name = w.name;
    p.shape = w.shape;
    p.size = 1;
    for (int64_t d : w.shape) p.size *= d;
    p.offset = layout.total;
    p.layer = w.layer;
    p.weight = w.weight;
    p.expert = w.expert;
    p.role = w.role;
    p.trainable = w.role != WeightRole::kBias;
    layout.total += p.size;
    layout.params.push_back(std::move(p));
  }
  return layout;
}

Result<ParamLayout> stage_param_layout(const ParamLayout& full, const StageParamsSpec& spec) {
  const int64_t n_layers = full.config.num_hidden_layers + (full.mtp ? 1 : 0);
  if (spec.layer_begin < 0 || spec.layer_begin > spec.layer_end || spec.layer_end > n_layers) {
    return invalid_argument("train: stage layers [{}, {}) are outside the model's {} layers",
                            spec.layer_begin, spec.layer_end, n_layers);
  }
  ParamLayout out;
  out.config = full.config;
  out.mtp = full.mtp;
  for (const ParamInfo& p : full.params) {
    const bool keep = p.layer >= 0 ? p.layer >= spec.layer_begin && p.layer < spec.layer_end
                                   : (p.role == WeightRole::kEmbedding ? spec.embedding : spec.head);
    if (!keep) continue;
    ParamInfo q = p;
    q.offset = out.total;
    out.total += q.size;
    out.params.push_back(std::move(q));
  }
  return out;
}

namespace {

template <class T>
T** layer_slot(LayerParams<T>& L, LayerWeight w, int64_t expert) {
  switch (w) {
    case LayerWeight::kAttnNorm:
      return &L.attn_norm;
    case LayerWeight::kQA:
      return &L.q_a;
    case LayerWeight::kQANorm:
      return &L.q_a_norm;
    case LayerWeight::kQB:
      return &L.q_b;
    case LayerWeight::kQ:
      return &L.q;
    case LayerWeight::kKvA:
      return &L.kv_a;
    case LayerWeight::kKvANorm:
      return &L.kv_a_norm;
    case LayerWeight::kKvB:
      return &L.kv_b;
    case LayerWeight::kO:
      return &L.o;
    case LayerWeight::kFfnNorm:
      return &L.ffn_norm;
    case LayerWeight::kMlpGate:
      return &L.mlp_gate;
    case LayerWeight::kMlpUp:
      return &L.mlp_up;
    case LayerWeight::kMlpDown:
      return &L.mlp_down;
    case LayerWeight::kRouter:
      return &L.router;
    case LayerWeight::kRouterBias:
      return &L.router_bias;
    case LayerWeight::kShGate:
      return &L.sh_gate;
    case LayerWeight::kShUp:
      return &L.sh_up;
    case LayerWeight::kShDown:
      return &L.sh_down;
    case LayerWeight::kExpGate:
      return &L.exp_gate[static_cast<size_t>(expert)];
    case LayerWeight::kExpUp:
      return &L.exp_up[static_cast<size_t>(expert)];
    case LayerWeight::kExpDown:
      return &L.exp_down[static_cast<size_t>(expert)];
    case LayerWeight::kEnorm:
      return &L.enorm;
    case LayerWeight::kHnorm:
      return &L.hnorm;
    case LayerWeight::kEhProj:
      return &L.eh_proj;
    case LayerWeight::kMtpHeadNorm:
      return &L.head_norm;
    default:
      return nullptr;
  }
}

}  // namespace

template <class T>
ModelParams<T> make_params(const ParamLayout& layout) {
  const ModelConfig& c = layout.config;
  ModelParams<T> m;
  m.layout = &layout;
  m.data.assign(static_cast<size_t>(layout.total), T(0));
  const int64_t n_layers = c.num_hidden_layers + (layout.mtp ? 1 : 0);
  m.layers.resize(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) {
    LayerParams<T>& L = m.layers[static_cast<size_t>(l)];
    L.moe = l >= c.num_hidden_layers ? c.n_routed_experts > 0 : c.is_moe_layer(l);
    if (L.moe) {
      L.exp_gate.assign(static_cast<size_t>(c.n_routed_experts), nullptr);
      L.exp_up = L.exp_gate;
      L.exp_down = L.exp_gate;
    }
  }
  for (const ParamInfo& p : layout.params) {
    T* ptr = m.data.data() + p.offset;
    if (p.layer < 0) {
      if (p.role == WeightRole::kEmbedding) m.embed = ptr;
      if (p.role == WeightRole::kNorm) m.final_norm = ptr;
      if (p.role == WeightRole::kHead) m.head = ptr;
      continue;
    }
    T** slot = layer_slot(m.layers[static_cast<size_t>(p.layer)], p.weight, p.expert);
    if (slot != nullptr) *slot = ptr;
  }
  if (c.tie_word_embeddings && m.head == nullptr) m.head = m.embed;
  return m;
}

namespace {

// Previous-token heads at initialisation (docs/train.md, "Previous-token heads"). Copying a
// token seen earlier at an arbitrary distance takes two heads in series: one that writes each
// position's previous token into the residual stream, and one in a later layer whose keys match
// that against the current token. Neither half has a gradient until the other exists, which is
// the long plateau before induction forms. Here the first half is built in: heads [0, heads) of
// decoder layer 0 attend to the previous position from step 0, so the second half has a signal
// at once. Everything stays in DeepSeek-V3's shapes (no bias terms exist, so the constant the
// positional query and key need comes from one embedding column):
//   - embedding column 0 is c times the other columns' RMS, and every row has the same RMS over
//     the other columns, so after the input RMSNorm coordinate 0 is the same x0 (about c) for
//     every token;
//   - k_pe (shared by all heads) reads only that coordinate on the top kPairs rotary pairs:
//     k_f = (kappa, 0) at every position;
//   - the q LoRA path carries the constant in latent coordinate 0 (q_a row 0 reads only column
//     0, and large enough to dominate the latent's norm), and the chosen heads' rope queries
//     read only it: q_f = kappa * R(-theta_f) (1, 0).
// The score of query i against key j is then kappa^2 * cs^2 * sum_f cos(theta_f * (i - j - 1)),
// largest at j = i - 1; kappa is set so that the softmax logit of j = i - 1 beats every other
// distance below max_position_embeddings by kLogitMargin. The heads' content queries (q_nope)
// start at zero; values and outputs stay random; training is free to change all of it.
constexpr int64_t kPairs = 6;           // highest-frequency rotary pairs the heads use
constexpr double kEmbedConstant = 4.0;  // embedding column 0, in units of the other columns' RMS
constexpr double kLogitMargin = 6.0;    // softmax logit of the previous position over any other

struct PrevTokenPlan {
  int64_t heads = 0, pairs = 0;  // heads == 0: nothing to build
  double x0 = 0;       // coordinate 0 after the input RMSNorm
  double qan0 = 0;     // q latent coordinate 0 after q_a_layernorm
  double qa_gain = 0;  // q_a[0][0]
  double kappa = 0;    // |q_f| = |k_f| per pair
  std::vector<double> theta;
};

PrevTokenPlan plan_prev_token_heads(const ModelConfig& c, int64_t heads) {
  PrevTokenPlan plan;
  if (heads <= 0) return plan;
  plan.heads = heads;
  const RopeParams rp = rope_params(c);
  const std::vector<double> inv = rope_inv_freq(rp);
  plan.pairs = std::min<int64_t>(kPairs, static_cast<int64_t>(inv.size()));
  plan.theta.assign(inv.begin(), inv.begin() + plan.pairs);
  const double hd = static_cast<double>(c.hidden_size);
  plan.x0 = kEmbedConstant / std::sqrt((hd - 1.0 + kEmbedConstant * kEmbedConstant) / hd);
  // q_a's other rows give latent coordinates of variance ~1 (fan-in init over unit-RMS inputs),
  // whose sum of squares varies from token to token. Row 0 gives sqrt(kQLatentShare * r), so that
  // it holds most of the latent's norm and q_a_layernorm leaves it nearly the same for every
  // token: coordinate 0 is then about sqrt(kQLatentShare * r^2 / ((1 + kQLatentShare) r - 1)).
  if (c.q_lora_rank > 0) {
    constexpr double kQLatentShare = 8.0;
    const double r = static_cast<double>(c.q_lora_rank);
    plan.qa_gain = std::sqrt(kQLatentShare * r) / plan.x0;
    plan.qan0 = std::sqrt(kQLatentShare * r) / std::sqrt(((1.0 + kQLatentShare) * r - 1.0) / r);
  }
  // Margin of distance 1 over every other distance, per unit of kappa^2 * cs^2 * pairs.
  const int64_t span = std::max<int64_t>(c.max_position_embeddings, 2);
  double margin = 1e300;
  for (int64_t dist = 0; dist < span; ++dist) {
    if (dist == 1) continue;
    double m = 0;
    for (double th : plan.theta) m += 1.0 - std::cos(th * static_cast<double>(dist - 1));
    margin = std::min(margin, m);
  }
  const double cs = rope_cos_sin_scale(rp);
  plan.kappa = std::sqrt(kLogitMargin / (c.softmax_scale() * cs * cs * std::max(margin, 1e-3)));
  return plan;
}

template <class T>
void seed_prev_token_heads(const PrevTokenPlan& plan, const ModelConfig& c, const ParamInfo& p, T* dst) {
  if (plan.heads == 0) return;
  const int64_t hd = c.hidden_size;
  if (p.role == WeightRole::kEmbedding) {
    // Every row gets the same RMS over columns 1.., so that x0 is the same for every token: the
    // positional scores are large (kappa^2 * pairs), and a few percent of per-token variation in
    // the key's or query's length would already outweigh the margin between neighbours.
    const int64_t rows = p.shape[0];
    double sq = 0;
    for (int64_t i = 0; i < p.size; ++i) {
      if (i % hd != 0) sq += static_cast<double>(dst[i]) * static_cast<double>(dst[i]);
    }
    const double rms = std::sqrt(sq / static_cast<double>(rows * (hd - 1)));
    for (int64_t v = 0; v < rows; ++v) {
      T* e = dst + v * hd;
      double row_sq = 0;
      for (int64_t k = 1; k < hd; ++k) row_sq += static_cast<double>(e[k]) * static_cast<double>(e[k]);
      const double s = row_sq > 0 ? rms / std::sqrt(row_sq / static_cast<double>(hd - 1)) : 1.0;
      for (int64_t k = 1; k < hd; ++k) e[k] = static_cast<T>(static_cast<double>(e[k]) * s);
      e[0] = static_cast<T>(kEmbedConstant * rms);
    }
    return;
  }
  if (p.layer != 0) return;
  const int64_t nope = c.qk_nope_head_dim, qk = nope + c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t cols = p.shape.back();
  auto row = [&](int64_t r) { return dst + r * cols; };
  const auto set_row = [&](int64_t r, double v0) {
    std::fill(row(r), row(r) + cols, T(0));
    row(r)[0] = static_cast<T>(v0);
  };
  switch (p.weight) {
    case LayerWeight::kKvA:
      for (int64_t f = 0; f < plan.pairs; ++f) {
        set_row(kvl + 2 * f, plan.kappa / plan.x0);
        set_row(kvl + 2 * f + 1, 0.0);
      }
      break;
    case LayerWeight::kQA:
      set_row(0, plan.qa_gain);
      break;
    case LayerWeight::kQB:
    case LayerWeight::kQ: {
      // q_b reads the q latent (coordinate 0 ~ qan0); q_proj without LoRA reads x (x0).
      const double in0 = p.weight == LayerWeight::kQB ? plan.qan0 : plan.x0;
      for (int64_t h = 0; h < std::min<int64_t>(plan.heads, c.num_attention_heads); ++h) {
        const int64_t base = h * qk + nope;
        for (int64_t r = h * qk; r < base; ++r) set_row(r, 0.0);  // no content term at first
        for (int64_t f = 0; f < c.qk_rope_head_dim / 2; ++f) {
          if (f < plan.pairs) {
            set_row(base + 2 * f, plan.kappa * std::cos(plan.theta[f]) / in0);
            set_row(base + 2 * f + 1, -plan.kappa * std::sin(plan.theta[f]) / in0);
          } else {
            set_row(base + 2 * f, 0.0);
            set_row(base + 2 * f + 1, 0.0);
          }
        }
      }
      break;
    }
    default:
      break;
  }
}

// --induction-heads: the whole induction circuit built in, on top of one previous-token head
// (head 0 of layer 0, above). Copying a span seen once in the context (a file name from the
// request, a tool name from the tool list) needs a head that finds where the current token
// occurred before and copies the token that followed it; a small model meets that circuit only
// after a long plateau (docs/MODEL.md, "Why no induction forms"). Here it works at step 0. With
// m = min(32, qk_nope_head_dim, v_head_dim, kv_lora_rank / 2) and the hidden coordinates split
// into 0 (the constant of the previous-token plan), S = [1, 1 + m), S2 = [1 + m, 1 + 2m) and the
// rest F, where the embedding lives (its S and S2 columns start at zero):
//   - layer 0, head 0 (the previous-token head): its value is A x_F (A: m random orthonormal rows
//     over F), written into S: after layer 0, coordinates S hold the previous token's identity;
//   - layer 1, head 0: key = what S holds (the previous token), query = A x_F (the current token),
//     scaled so that a match wins the softmax by a wide margin; value = B x_F (this position's
//     token, B another m orthonormal rows), written into S2;
//   - the output head reads S2 through each token's own B projection, so a token that followed an
//     earlier occurrence of the current token gains ~kCopyLogit nats;
//   - every other residual branch (other heads' o_proj rows, MLP and expert down projections)
//     starts at zero — the model starts as "bigram + copy" and training grows the rest.
// Everything stays in DeepSeek-V3's shapes and is free to change in training.
constexpr double kMatchLogit = 14.0;  // softmax logit of a perfectly matching key (layer 1, head 0)
constexpr double kCopyLogit = 12.0;   // logit gained by the token the circuit copies

int64_t induction_width(const ModelConfig& c) {
  int64_t m = std::min(
      {int64_t{32}, int64_t{c.qk_nope_head_dim}, int64_t{c.v_head_dim}, int64_t{c.kv_lora_rank} / 2});
  if (c.q_lora_rank > 0) m = std::min<int64_t>(m, c.q_lora_rank - 1);
  return m;
}

// m orthonormal rows of length n (Gram-Schmidt over Gaussian rows).
std::vector<double> orthonormal_rows(int64_t m, int64_t n, Rng& rng) {
  std::vector<double> a(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    double* row = a.data() + r * n;
    for (;;) {
      for (int64_t k = 0; k < n; ++k) row[k] = rng.normal();
      for (int64_t q = 0; q < r; ++q) {
        const double* prev = a.data() + q * n;
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += row[k] * prev[k];
        for (int64_t k = 0; k < n; ++k) row[k] -= dot * prev[k];
      }
      double sq = 0;
      for (int64_t k = 0; k < n; ++k) sq += row[k] * row[k];
      if (sq < 1e-6) continue;
      for (int64_t k = 0; k < n; ++k) row[k] /= std::sqrt(sq);
      break;
    }
  }
  return a;
}

}  // namespace

Status check_induction_shape(const ModelConfig& c) {
  const int64_t m = induction_width(c);
  if (c.num_hidden_layers < 2) {
    return invalid_argument("--induction-heads needs at least 2 layers (the model has {})",
                            c.num_hidden_layers);
  }
  if (c.tie_word_embeddings) {
    return invalid_argument("--induction-heads needs an untied output head (tie_word_embeddings is true)");
  }
  if (m < 8) {
    return invalid_argument(
        "--induction-heads needs 8 or more dimensions for keys and values (qk_nope_head_dim {}, v_head_dim "
        "{}, "
        "kv_lora_rank / 2 = {}, q_lora_rank - 1 = {})",
        c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank / 2, c.q_lora_rank - 1);
  }
  if (c.hidden_size < 1 + 4 * m) {
    return invalid_argument(
        "--induction-heads needs hidden_size >= {} ({} reserved coordinates + as many for the embedding); it "
        "is {}",
        1 + 4 * m, 1 + 2 * m, c.hidden_size);
  }
  if (c.qk_rope_head_dim < 2) {
    return invalid_argument("--induction-heads needs rotary dimensions (qk_rope_head_dim is {})",
                            c.qk_rope_head_dim);
  }
  return {};
}

template <class T>
void seed_induction_circuit(ModelParams<T>& params, uint64_t seed) {
  const ModelConfig& c = params.layout->config;
  CHECK(check_induction_shape(c).ok());
  const int64_t m = induction_width(c), d = c.hidden_size, V = c.vocab_size, H = c.num_attention_heads;
  const int64_t S = 1, S2 = 1 + m, F = 1 + 2 * m, nF = d - F;
  const int64_t nope = c.qk_nope_head_dim, qk = nope + c.qk_rope_head_dim, vh = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank, kvbw = nope + vh;
  Rng rng(seed ^ 0x1dc7u);
  const std::vector<double> A = orthonormal_rows(m, nF, rng), B = orthonormal_rows(m, nF, rng);

  // Embedding: S and S2 start empty; F is scaled up to keep each row's energy over columns 1.. (so
  // coordinate 0 after the input RMSNorm, which the previous-token plan set, stays the same).
  for (int64_t v = 0; v < V; ++v) {
    T* e = params.embed + v * d;
    double before = 0, kept = 0;
    for (int64_t k = 1; k < d; ++k) before += double(e[k]) * double(e[k]);
    for (int64_t k = F; k < d; ++k) kept += double(e[k]) * double(e[k]);
    const double s = kept > 0 ? std::sqrt(before / kept) : 1.0;
    for (int64_t k = 1; k < F; ++k) e[k] = T(0);
    for (int64_t k = F; k < d; ++k) e[k] = static_cast<T>(double(e[k]) * s);
  }
  // Every row has the same energy (the previous-token plan equalised them): row 0 stands for all.
  double row_sq = 0;
  for (int64_t k = 0; k < d; ++k) row_sq += double(params.embed[k]) * double(params.embed[k]);
  const double col0 = double(params.embed[0]);
  const double rms0 = std::sqrt(row_sq / double(d));                                 // every row's RMS
  const double rF = std::sqrt((row_sq - col0 * col0) / (rms0 * rms0) / double(nF));  // RMS of A x̂_F per row
  const double beta = rms0;  // what S and S2 get written at
  const double rms1 = std::sqrt((row_sq + beta * beta * double(m)) / double(d));
  const double rmsf = std::sqrt((row_sq + 2.0 * beta * beta * double(m)) / double(d));

  auto zero = [](T* w, int64_t n) { std::fill(w, w + n, T(0)); };
  auto set_row_proj = [&](T* row, const double* proj, double scale) {  // row over d columns reading F
    std::fill(row, row + d, T(0));
    for (int64_t k = 0; k < nF; ++k) row[F + k] = static_cast<T>(proj[k] * scale);
  };
  const int64_t layers = c.num_hidden_layers;
  for (int64_t l = 0; l < layers; ++l) {  // every residual branch starts at zero
    LayerParams<T>& L = params.layers[static_cast<size_t>(l)];
    zero(L.o, d * H * vh);
    if (!L.moe) {
      zero(L.mlp_down, d * c.intermediate_size);
    } else {
      for (T* w : L.exp_down) zero(w, d * c.moe_intermediate_size);
      if (L.sh_down) zero(L.sh_down, d * c.moe_intermediate_size * c.n_shared_experts);
    }
  }
  // Layer 0, head 0: value = A x̂_F (unit variance per coordinate), written into S.
  {
    LayerParams<T>& L = params.layers[0];
    for (int64_t r = 0; r < m; ++r) set_row_proj(L.kv_a + r * d, A.data() + r * nF, 1.0 / rF);
    T* kvb = L.kv_b;  // head 0: rows [0, nope) k_nope, [nope, nope + vh) v
    zero(kvb, kvbw * kvl);
    for (int64_t r = 0; r < m; ++r) kvb[(nope + r) * kvl + r] = T(1);
    for (int64_t r = 0; r < m; ++r) L.o[(S + r) * (H * vh) + r] = static_cast<T>(beta);
  }
  // Layer 1, head 0: key from S, query A x̂_F, value B x̂_F written into S2.
  {
    LayerParams<T>& L = params.layers[1];
    for (int64_t r = 0; r < m; ++r) {
      T* row = L.kv_a + r * d;
      std::fill(row, row + d, T(0));
      row[S + r] = static_cast<T>(rms1 / beta);
      set_row_proj(L.kv_a + (m + r) * d, B.data() + r * nF, rms1 / rms0 / rF);
    }
    T* kvb = L.kv_b;
    zero(kvb, kvbw * kvl);
    for (int64_t r = 0; r < m; ++r) {
      kvb[r * kvl + r] = T(1);
      kvb[(nope + r) * kvl + m + r] = T(1);
    }
    const double kappa = kMatchLogit / (c.softmax_scale() * double(m));
    if (c.q_lora_rank > 0) {
      const int64_t ql = c.q_lora_rank;
      for (int64_t r = 0; r < m; ++r) set_row_proj(L.q_a + (1 + r) * d, A.data() + r * nF, rms1 / rms0 / rF);
      zero(L.q_b, qk * ql);
      for (int64_t r = 0; r < m; ++r) L.q_b[r * ql + 1 + r] = static_cast<T>(kappa);
    } else {
      zero(L.q, qk * d);
      for (int64_t r = 0; r < m; ++r) set_row_proj(L.q + r * d, A.data() + r * nF, kappa * rms1 / rms0 / rF);
    }
    for (int64_t r = 0; r < m; ++r) L.o[(S2 + r) * (H * vh) + r] = static_cast<T>(beta);
  }
  // Output head: S2 read through each token's own B projection; S not read.
  const double lambda = kCopyLogit * rmsf / (beta * double(m));
  std::vector<double> x(static_cast<size_t>(nF));
  for (int64_t v = 0; v < V; ++v) {
    const T* e = params.embed + v * d;
    T* h = params.head + v * d;
    for (int64_t k = 0; k < nF; ++k) x[static_cast<size_t>(k)] = double(e[F + k]) / rms0;
    for (int64_t r = 0; r < m; ++r) {
      double u = 0;
      for (int64_t k = 0; k < nF; ++k) u += B[static_cast<size_t>(r * nF + k)] * x[static_cast<size_t>(k)];
      h[S2 + r] = static_cast<T>(lambda * u / rF);
      h[S + r] = T(0);
    }
  }
}

template <class T>
void init_params(ModelParams<T>& params, uint64_t seed, double init_scale, int prev_token_heads) {
  const ModelConfig& config = params.layout->config;
  const PrevTokenPlan plan = plan_prev_token_heads(config, prev_token_heads);
  for (const ParamInfo& p : params.layout->params) {
    T* dst = params.at(p);
    Rng rng(seed ^ hash_name(p.name));
    switch (p.role) {
      case WeightRole::kNorm:
        for (int64_t i = 0; i < p.size; ++i) dst[i] = T(1);
        break;
      case WeightRole::kBias:
        for (int64_t i = 0; i < p.size; ++i) dst[i] = T(0);
        break;
      case WeightRole::kEmbedding: {
        // A tied embedding is also the output head, so it starts like one: logits of unit scale
        // (docs/train.md, "Tied embeddings"). An untied one keeps U(-1, 1), which the RMSNorm of
        // the first layer makes scale-free.
        const bool tied = params.layout->config.tie_word_embeddings;
        const double a = tied ? init_scale * std::sqrt(3.0 / static_cast<double>(p.shape.back())) : 1.0;
        for (int64_t i = 0; i < p.size; ++i) dst[i] = static_cast<T>(a * (2.0 * rng.uniform() - 1.0));
        break;
      }
      default: {
        const double a = init_scale * std::sqrt(3.0 / static_cast<double>(p.shape.back()));
        for (int64_t i = 0; i < p.size; ++i) dst[i] = static_cast<T>(a * (2.0 * rng.uniform() - 1.0));
      }
    }
    seed_prev_token_heads(plan, config, p, dst);
  }
}

Status load_params_hf(ModelParams<float>& params, const std::string& path) {
  auto ckpt = TRY(SafetensorsCheckpoint::open(path));
  for (const ParamInfo& p : params.layout->params) {
    const SafetensorsCheckpoint::Located* t = ckpt->find(p.name);
    if (t == nullptr) return not_found("{}: tensor '{}' is missing", path, p.name);
    if (t->entry->shape != p.shape) {
      return invalid_argument("{}: tensor '{}' has shape [{}], expected [{}]", path, p.name,
                              fmt::join(t->entry->shape, ", "), fmt::join(p.shape, ", "));
    }
    const DType dt = t->entry->dtype;
    if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) {
      return invalid_argument("{}: tensor '{}' is {}; training imports f32, bf16 or f16 only", path, p.name,
                              dtype_name(dt));
    }
    const Tensor tensor = ckpt->view(*t);
    TRY(to_f32(dt, tensor.data, params.at(p), p.size));
  }
  return ok_status();
}

template ModelParams<float> make_params<float>(const ParamLayout&);
template ModelParams<double> make_params<double>(const ParamLayout&);
template void init_params<float>(ModelParams<float>&, uint64_t, double, int);
template void init_params<double>(ModelParams<double>&, uint64_t, double, int);
template void seed_induction_circuit<float>(ModelParams<float>&, uint64_t);
template void seed_induction_circuit<double>(ModelParams<double>&, uint64_t);

}  // namespace fathom::train
