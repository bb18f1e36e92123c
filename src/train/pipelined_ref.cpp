// The pieces of pipelined training (pipelined.h) that need no MPI: synthetic batches, the learning
// rate schedule, the per-tensor AdamW, the gradient norm, and the single-process reference run the
// verify mode compares the pipeline with.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/rng.h"
#include "train/pipelined_impl.h"
#include "train/train_impl.h"

namespace fathom::train {

namespace {

class SyntheticBatches final : public BatchSource {
 public:
  SyntheticBatches(const ModelConfig& c, SeqShape shape, uint64_t seed)
      : vocab_(c.vocab_size), shape_(shape), seed_(seed) {}

  Status batch(int64_t step, int mb, std::span<int32_t> tokens, std::span<int32_t> targets) override {
    const int64_t S = shape_.seq_len;
    if (static_cast<int64_t>(tokens.size()) != shape_.tokens() || targets.size() != tokens.size()) {
      return invalid_argument("synthetic batches: {} tokens asked for, the shape is {} x {}", tokens.size(),
                              shape_.n_seq, S);
    }
    for (int64_t s = 0; s < shape_.n_seq; ++s) {
      Rng rng(splitmix64(seed_ ^ splitmix64(uint64_t(step) * 1000003u + uint64_t(mb) * 1009u + uint64_t(s))));
      constexpr int kRules = 4;  // a few affine successor rules the model can learn
      const int rule = int(rng.below(kRules));
      const int64_t a = 2 * rule + 3, b = 7 * rule + 1;
      int64_t t = int64_t(rng.below(uint64_t(vocab_)));
      for (int64_t i = 0; i <= S; ++i) {
        if (i < S) tokens[size_t(s * S + i)] = int32_t(t);
        if (i > 0) targets[size_t(s * S + i - 1)] = int32_t(t);
        t = rng.below(10) == 0 ? int64_t(rng.below(uint64_t(vocab_))) : (a * t + b) % vocab_;
      }
    }
    return ok_status();
  }

 private:
  int64_t vocab_;
  SeqShape shape_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<BatchSource> make_synthetic_batches(const ModelConfig& config, SeqShape shape,
                                                    uint64_t seed) {
  return std::make_unique<SyntheticBatches>(config, shape, seed);
}

double learning_rate(const OptimizerOptions& o, int64_t step, int64_t total_steps) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const int64_t span = total_steps - o.warmup_steps;
  if (span <= 1) return o.lr;
  const double progress = std::clamp(double(step - o.warmup_steps) / double(span - 1), 0.0, 1.0);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
}

double clip_coefficient(double clip, double norm) {
  if (clip <= 0) return 1.0;
  return std::min(1.0, clip / (norm + 1e-6));
}

template <class T>
SlabAdamW<T>::SlabAdamW(const ParamLayout& layout)
    : layout_(layout), m_(size_t(layout.total), T(0)), v_(size_t(layout.total), T(0)) {}

template <class T>
void SlabAdamW<T>::step(const OptimizerOptions& o, double lr, double clip_coef, std::span<T> params,
                        std::span<const T> grads) {
  CHECK(params.size() == m_.size() && grads.size() == m_.size());
  ++t_;
  const T b1 = T(o.beta1), b2 = T(o.beta2), eps = T(o.eps), coef = T(clip_coef), step_lr = T(lr);
  const T c1 = T(1.0 / (1.0 - std::pow(o.beta1, double(t_))));
  const T c2 = T(1.0 / (1.0 - std::pow(o.beta2, double(t_))));
  for (const ParamInfo& info : layout_.params) {
    if (!info.trainable) continue;
    const T decay = info.shape.size() == 2 ? T(1.0 - lr * o.weight_decay) : T(1);
    T* p = params.data() + info.offset;
    const T* g = grads.data() + info.offset;
    T* m = m_.data() + info.offset;
    T* v = v_.data() + info.offset;
    for (int64_t i = 0; i < info.size; ++i) {
      const T gi = g[i] * coef;
      m[i] = b1 * m[i] + (T(1) - b1) * gi;
      v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
      p[i] = p[i] * decay - step_lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
    }
  }
}

template <class T>
double grad_sq_norm(const ParamLayout& layout, std::span<const T> grads, bool skip_embedding) {
  double sum = 0;
  for (const ParamInfo& info : layout.params) {
    if (!info.trainable || (skip_embedding && info.role == WeightRole::kEmbedding)) continue;
    const T* g = grads.data() + info.offset;
    for (int64_t i = 0; i < info.size; ++i) sum += double(g[i]) * double(g[i]);
  }
  return sum;
}

template <class T>
void add_expert_loads(const ModelContext<T>& ctx, ModelParams<T>& grads) {
  const auto loads = model_expert_loads(ctx);
  for (size_t l = 0; l < loads.size() && l < grads.layers.size(); ++l) {
    T* g = grads.layers[l].router_bias;
    if (g == nullptr) continue;
    for (size_t e = 0; e < loads[l].size(); ++e) g[e] += T(loads[l][e]);
  }
}

template <class T>
Result<ReferenceRun<T>> run_reference(const ParamLayout& full, const PipelinedOptions& o,
                                      BatchSource& batches) {
  ModelParams<T> params = make_params<T>(full), grads = make_params<T>(full);
  init_params(params, o.seed, o.init_scale);
  SlabAdamW<T> adamw(full);
  auto ctx = make_model_context<T>();
  std::vector<int32_t> tokens(size_t(o.shape.tokens())), targets(tokens.size());
  ReferenceRun<T> run;
  for (int64_t step = 0; step < o.steps; ++step) {
    std::fill(grads.data.begin(), grads.data.end(), T(0));
    std::vector<StepLoss> losses;
    for (int mb = 0; mb < o.microbatches; ++mb) {
      TRY(batches.batch(step, mb, tokens, targets));
      losses.push_back(TRY(model_forward(params, o.shape, tokens, targets, o.train, *ctx)));
      model_backward(params, *ctx, 1.0 / o.microbatches, grads);
      add_expert_loads(*ctx, grads);
    }
    run.losses.push_back(std::move(losses));
    if (step == 0) run.first_grads = grads.data;
    const double norm = std::sqrt(grad_sq_norm<T>(full, grads.data, false));
    adamw.step(o.optimizer, learning_rate(o.optimizer, step, o.steps),
               clip_coefficient(o.optimizer.grad_clip, norm), params.data, grads.data);
    // The aux-loss-free bias rule from the step's summed loads (the bias gradient slots).
    for (size_t l = 0; l < params.layers.size(); ++l) {
      T* bias = params.layers[l].router_bias;
      if (bias == nullptr) continue;
      std::vector<int64_t> load(size_t(full.config.n_routed_experts));
      for (size_t e = 0; e < load.size(); ++e) load[e] = std::llround(grads.layers[l].router_bias[e]);
      moe_update_bias(bias, std::span<const int64_t>(load), o.train.bias_update_speed);
    }
  }
  run.final_params = params.data;
  return run;
}

#define FATHOM_PIPELINED_REF_INSTANTIATE(T)                                                      \
  template class SlabAdamW<T>;                                                                   \
  template double grad_sq_norm<T>(const ParamLayout&, std::span<const T>, bool);                 \
  template void add_expert_loads<T>(const ModelContext<T>&, ModelParams<T>&);                    \
  template Result<ReferenceRun<T>> run_reference<T>(const ParamLayout&, const PipelinedOptions&, \
                                                    BatchSource&);
FATHOM_PIPELINED_REF_INSTANTIATE(float)
FATHOM_PIPELINED_REF_INSTANTIATE(double)
#undef FATHOM_PIPELINED_REF_INSTANTIATE

}  // namespace fathom::train
