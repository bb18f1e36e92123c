// DeepSeek-V3 pipeline stages (stage.h): a run of decoder layers with the embedding on the first
// stage and the final norm, lm_head, cross-entropy and MTP module on the last, driven through
// pipeline::StageModule. The arithmetic is train.h's (block_*, rmsnorm_*, linear_*, mtp_*), in the
// same order as model_forward, so a pipelined forward is bit-identical to the whole-model one.
// Not here: the schedule, MPI, the optimizer and the embedding-copy sum (pipelined.cpp).
#include "train/stage.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "base/check.h"
#include "train/train_impl.h"

namespace fathom::train {

template <class T>
void encode_f64(double v, T* out) {
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  for (int64_t k = 0; k < kF64Elems; ++k) out[k] = static_cast<T>((bits >> (16 * k)) & 0xffffu);
}

template <class T>
double decode_f64(const T* in) {
  uint64_t bits = 0;
  for (int64_t k = 0; k < kF64Elems; ++k) {
    const double piece = static_cast<double>(in[k]);
    CHECK_MSG(piece >= 0 && piece <= 65535 && piece == std::floor(piece),
              "bad f64 piece {} in a stage message", piece);
    bits |= static_cast<uint64_t>(piece) << (16 * k);
  }
  return std::bit_cast<double>(bits);
}

template <class T>
StepLoss decode_loss_record(const T* record) {
  StepLoss l;
  l.total = decode_f64(record);
  l.ce = decode_f64(record + kF64Elems);
  l.mtp_ce = decode_f64(record + 2 * kF64Elems);
  l.balance = decode_f64(record + 3 * kF64Elems);
  l.n_targets = static_cast<int64_t>(decode_f64(record + 4 * kF64Elems));
  return l;
}

Status check_stage_split(const ParamLayout& full, int n_stages, std::span<const int64_t> stage_layers) {
  const ModelConfig& c = full.config;
  if (n_stages < 1) return invalid_argument("train: {} pipeline stages; need at least 1", n_stages);
  if (!stage_layers.empty()) {
    int64_t sum = 0;
    for (int64_t n : stage_layers) {
      if (n < 0) return invalid_argument("train: a stage cannot hold {} layers", n);
      sum += n;
    }
    if (static_cast<int64_t>(stage_layers.size()) != n_stages || sum != c.num_hidden_layers) {
      return invalid_argument(
          "train: the stage layer split has {} stages summing to {} layers; the schedule has {} stages and "
          "the "
          "model num_hidden_layers {}",
          stage_layers.size(), sum, n_stages, c.num_hidden_layers);
    }
  } else if (c.num_hidden_layers < n_stages || c.num_hidden_layers % n_stages != 0) {
    return invalid_argument(
        "train: num_hidden_layers {} does not split into {} pipeline stages of equal size (use a layer "
        "count that is a multiple of the stage count, fewer stages, or an explicit split)",
        c.num_hidden_layers, n_stages);
  }
  constexpr int64_t kExactIds = int64_t{1} << 24;  // token ids travel as exact integers in float
  if (c.vocab_size > kExactIds) {
    return invalid_argument(
        "train: vocab_size {} exceeds {}: token ids would not be exact in a float message", c.vocab_size,
        kExactIds);
  }
  return ok_status();
}

StageParamsSpec stage_params_spec(const ParamLayout& full, int stage, int n_stages,
                                  std::span<const int64_t> stage_layers) {
  const ModelConfig& c = full.config;
  const bool last = stage == n_stages - 1;
  StageParamsSpec spec;
  if (stage_layers.empty()) {
    const int64_t per = c.num_hidden_layers / std::max(1, n_stages);
    spec.layer_begin = stage * per;
    spec.layer_end = spec.layer_begin + per;
  } else {
    for (int s = 0; s < stage; ++s) spec.layer_begin += stage_layers[static_cast<size_t>(s)];
    spec.layer_end = spec.layer_begin + stage_layers[static_cast<size_t>(stage)];
  }
  if (last) spec.layer_end = c.num_hidden_layers + (full.mtp ? 1 : 0);
  // The last stage keeps a copy of the embedding when the MTP module or a tied head needs it.
  spec.embedding = stage == 0 || (last && (full.mtp || c.tie_word_embeddings));
  spec.head = last;
  return spec;
}

template <class T>
struct DeepSeekStage<T>::Slot {
  ModelContextPtr<T> ctx = make_model_context<T>();
};

template <class T>
DeepSeekStage<T>::DeepSeekStage(const ParamLayout& full, const StageConfig& config, ParamLayout layout)
    : config_(config), layout_(std::move(layout)) {
  params_ = make_params<T>(layout_);
  grads_ = make_params<T>(layout_);
  const StageParamsSpec spec = stage_params_spec(full, config.stage, config.n_stages, config.stage_layers);
  layer_begin_ = spec.layer_begin;
  layer_end_ = std::min<int64_t>(spec.layer_end, full.config.num_hidden_layers);
  mtp_ = last() && full.mtp;
}

template <class T>
DeepSeekStage<T>::~DeepSeekStage() = default;

template <class T>
Result<std::unique_ptr<DeepSeekStage<T>>> DeepSeekStage<T>::create(const ParamLayout& full,
                                                                   const StageConfig& config) {
  TRY(check_stage_split(full, config.n_stages, config.stage_layers));
  if (config.stage < 0 || config.stage >= config.n_stages) {
    return invalid_argument("train: stage {} outside 0..{}", config.stage, config.n_stages - 1);
  }
  const SeqShape shape = config.shape;
  if (shape.n_seq < 1 || shape.seq_len < 1 || shape.seq_len > full.config.max_position_embeddings) {
    return invalid_argument(
        "train: micro-batch {} x {} must be positive with seq_len <= max_position_embeddings {}", shape.n_seq,
        shape.seq_len, full.config.max_position_embeddings);
  }
  ParamLayout layout = TRY(
      stage_param_layout(full, stage_params_spec(full, config.stage, config.n_stages, config.stage_layers)));
  std::unique_ptr<DeepSeekStage> stage(new DeepSeekStage(full, config, std::move(layout)));
  init_params(stage->params_, config.seed, config.init_scale);  // per-tensor seeds: the whole model's values
  return stage;
}

template <class T>
int64_t DeepSeekStage<T>::input_elems() const {
  const int64_t n = config_.shape.tokens();
  return first() ? 2 * n : n * layout_.config.hidden_size + 2 * n + kF64Elems;
}

template <class T>
int64_t DeepSeekStage<T>::output_elems() const {
  const int64_t n = config_.shape.tokens();
  return last() ? kLossRecordElems : n * layout_.config.hidden_size + 2 * n + kF64Elems;
}

template <class T>
Status DeepSeekStage<T>::reserve(int n_slots) {
  if (n_slots < 1) return invalid_argument("train: a stage needs at least one slot, got {}", n_slots);
  slots_.clear();
  for (int k = 0; k < n_slots; ++k) slots_.push_back(std::make_unique<Slot>());
  return ok_status();
}

template <class T>
void DeepSeekStage<T>::add_loads(const BlockContext<T>& b, int64_t layer) {
  T* g = grads_.layers[static_cast<size_t>(layer)].router_bias;
  CHECK(g != nullptr && b.moe_ctx.load.size() == static_cast<size_t>(layout_.config.n_routed_experts));
  for (size_t e = 0; e < b.moe_ctx.load.size(); ++e) g[e] += static_cast<T>(b.moe_ctx.load[e]);
}

template <class T>
void DeepSeekStage<T>::forward(int slot, const T* input, T* output) {
  CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size());
  ModelContext<T>& c = *slots_[static_cast<size_t>(slot)]->ctx;
  const ModelConfig& mc = layout_.config;
  const SeqShape shape = config_.shape;
  const int64_t n = shape.tokens(), hd = mc.hidden_size;
  c.has_forward = false;
  c.shape = shape;
  c.options = config_.options;
  const T* ids = first() ? input : input + n * hd;
  c.tokens.resize(static_cast<size_t>(n));
  c.targets.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    c.tokens[size_t(i)] = static_cast<int32_t>(ids[i]);
    c.targets[size_t(i)] = static_cast<int32_t>(ids[n + i]);
    CHECK_MSG(c.tokens[size_t(i)] >= 0 && c.tokens[size_t(i)] < mc.vocab_size && c.targets[size_t(i)] >= -1 &&
                  c.targets[size_t(i)] < mc.vocab_size,
              "stage {}: token/target {}/{} outside the vocabulary (validate batches first)", config_.stage,
              c.tokens[size_t(i)], c.targets[size_t(i)]);
  }
  c.x.resize(static_cast<size_t>(n * hd));
  double balance = 0.0;
  if (first()) {
    embedding_forward(params_.embed, hd, std::span<const int32_t>(c.tokens), c.x.data());
  } else {
    std::copy_n(input, n * hd, c.x.data());
    balance = decode_f64(input + n * hd + 2 * n);
  }
  c.blocks.resize(static_cast<size_t>(layer_end_ - layer_begin_));
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    BlockContext<T>& b = c.blocks[static_cast<size_t>(l - layer_begin_)];
    block_forward(layout_, params_.layers[static_cast<size_t>(l)], l, shape, config_.options, c.x.data(), b);
    if (b.moe) {
      balance += b.moe_ctx.balance_loss;  // in layer order, as model_forward sums it
      add_loads(b, l);
    }
  }
  c.loss = StepLoss{};
  c.loss.balance = balance;
  if (last()) {
    forward_head(*slots_[static_cast<size_t>(slot)], output);
  } else {
    std::copy_n(c.x.data(), n * hd, output);
    std::copy_n(ids, 2 * n, output + n * hd);
    encode_f64(balance, output + n * hd + 2 * n);
  }
  c.has_forward = true;
}

template <class T>
void DeepSeekStage<T>::forward_head(Slot& s, T* output) {
  ModelContext<T>& c = *s.ctx;
  const ModelConfig& mc = layout_.config;
  const int64_t n = c.shape.tokens(), hd = mc.hidden_size, V = mc.vocab_size;
  c.h.resize(c.x.size());
  rmsnorm_forward(c.x.data(), params_.final_norm, n, hd, mc.rms_norm_eps, c.h.data(), c.final_norm);
  StepLoss& loss = c.loss;
  loss.ce = head_forward(params_.head, c.h.data(), std::span<const int32_t>(c.targets), hd, V,
                         config_.options.all_logits, c.head);
  for (int32_t t : c.targets) loss.n_targets += t >= 0;
  c.mtp = mtp_ && c.shape.seq_len > 1;
  if (c.mtp) {
    loss.mtp_ce = mtp_forward(params_, config_.options, c);
    if (c.mtp_block.moe) {
      loss.balance += c.mtp_block.moe_ctx.balance_loss;
      add_loads(c.mtp_block, mc.num_hidden_layers);
    }
  }
  loss.total = loss.ce + (c.mtp ? config_.options.mtp_weight * loss.mtp_ce : 0.0) + loss.balance;
  encode_f64(loss.total, output);
  encode_f64(loss.ce, output + kF64Elems);
  encode_f64(loss.mtp_ce, output + 2 * kF64Elems);
  encode_f64(loss.balance, output + 3 * kF64Elems);
  encode_f64(static_cast<double>(loss.n_targets), output + 4 * kF64Elems);
}

template <class T>
void DeepSeekStage<T>::backward_input(int slot, const T* output_grad, T* input_grad) {
  CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size());
  ModelContext<T>& c = *slots_[static_cast<size_t>(slot)]->ctx;
  CHECK_MSG(c.has_forward, "stage {}: backward without a forward in slot {}", config_.stage, slot);
  const ModelConfig& mc = layout_.config;
  const int64_t n = c.shape.tokens(), hd = mc.hidden_size, V = mc.vocab_size;
  double scale = 0;
  c.dx.resize(static_cast<size_t>(n * hd));
  if (last()) {
    scale = decode_f64(output_grad);
    c.dh.resize(static_cast<size_t>(n * hd));
    head_backward_input(params_.head, c.head, n, hd, V, scale, c.dh.data());
    if (c.mtp) mtp_backward(params_, c, scale, grads_);  // both halves: its W is not deferred
    rmsnorm_backward_input(c.final_norm, params_.final_norm, c.dh.data(), c.dx.data(), false);
  } else {
    scale = decode_f64(output_grad + n * hd + 2 * n);
    std::copy_n(output_grad, n * hd, c.dx.data());
  }
  for (int64_t l = layer_end_ - 1; l >= layer_begin_; --l) {
    block_backward_input(layout_, params_.layers[static_cast<size_t>(l)], scale, c.dx.data(),
                         c.blocks[static_cast<size_t>(l - layer_begin_)]);
  }
  if (input_grad != nullptr && !first()) {
    std::copy_n(c.dx.data(), n * hd, input_grad);
    std::fill_n(input_grad + n * hd, 2 * n, T(0));
    encode_f64(scale, input_grad + n * hd + 2 * n);  // d(objective) / d(incoming balance sum)
  }
}

template <class T>
void DeepSeekStage<T>::backward_weight(int slot) {
  CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size());
  ModelContext<T>& c = *slots_[static_cast<size_t>(slot)]->ctx;
  CHECK_MSG(c.has_forward, "stage {}: weight gradient without a forward in slot {}", config_.stage, slot);
  const ModelConfig& mc = layout_.config;
  const int64_t hd = mc.hidden_size, V = mc.vocab_size;
  if (last()) {
    head_backward_weight(c.head, hd, V, grads_.head);
    rmsnorm_backward_weight(c.final_norm, c.dh.data(), grads_.final_norm);
  }
  for (int64_t l = layer_end_ - 1; l >= layer_begin_; --l) {
    block_backward_weight(layout_, c.blocks[static_cast<size_t>(l - layer_begin_)],
                          grads_.layers[static_cast<size_t>(l)]);
  }
  if (first()) embedding_backward_weight(c.dx.data(), hd, std::span<const int32_t>(c.tokens), grads_.embed);
  c.has_forward = false;  // the slot is free
}

template <class T>
void DeepSeekStage<T>::after_optimizer_step() {
  const int64_t n_layers = static_cast<int64_t>(params_.layers.size());
  std::vector<int64_t> load;
  for (int64_t l = 0; l < n_layers; ++l) {
    T* bias = params_.layers[static_cast<size_t>(l)].router_bias;
    const T* g = grads_.layers[static_cast<size_t>(l)].router_bias;
    if (bias == nullptr || g == nullptr) continue;
    load.assign(static_cast<size_t>(layout_.config.n_routed_experts), 0);
    for (size_t e = 0; e < load.size(); ++e) load[e] = static_cast<int64_t>(std::llround(g[e]));
    moe_update_bias(bias, std::span<const int64_t>(load), config_.options.bias_update_speed);
  }
}

template <class T>
std::span<T> DeepSeekStage<T>::embedding_params() {
  for (const ParamInfo& p : layout_.params) {
    if (p.role == WeightRole::kEmbedding) return {params_.at(p), static_cast<size_t>(p.size)};
  }
  return {};
}

template <class T>
std::span<T> DeepSeekStage<T>::embedding_grads() {
  for (const ParamInfo& p : layout_.params) {
    if (p.role == WeightRole::kEmbedding) return {grads_.at(p), static_cast<size_t>(p.size)};
  }
  return {};
}

template <class T>
const StepLoss& DeepSeekStage<T>::loss(int slot) const {
  CHECK(slot >= 0 && static_cast<size_t>(slot) < slots_.size());
  return slots_[static_cast<size_t>(slot)]->ctx->loss;
}

#define FATHOM_STAGE_INSTANTIATE(T)                  \
  template void encode_f64<T>(double, T*);           \
  template double decode_f64<T>(const T*);           \
  template StepLoss decode_loss_record<T>(const T*); \
  template class DeepSeekStage<T>;
FATHOM_STAGE_INSTANTIATE(float)
FATHOM_STAGE_INSTANTIATE(double)
#undef FATHOM_STAGE_INSTANTIATE

}  // namespace fathom::train
