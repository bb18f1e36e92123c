// The parameter slab (train.h): layout from the model's Hugging Face weight table (model/names.h),
// named views, deterministic initialisation and import from a safetensors checkpoint.
#include <cmath>
#include <cstring>

#include <fmt/ranges.h>

#include "base/rng.h"
#include "formats/safetensors.h"
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

template <class T>
void init_params(ModelParams<T>& params, uint64_t seed, double init_scale) {
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
template void init_params<float>(ModelParams<float>&, uint64_t, double);
template void init_params<double>(ModelParams<double>&, uint64_t, double);

}  // namespace fathom::train
