// AdamW over the parameter slab, global gradient clipping, the warmup + cosine schedule, the
// single-process StepComputer and the model-FLOPs count used for MFU. Every reduction runs in a
// fixed order over fixed chunks, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/thread_pool.h"
#include "train/trainer.h"

namespace fathom::train {
namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per reduction / update chunk

bool decays(const ParamInfo& p) {
  return p.role != WeightRole::kNorm && p.role != WeightRole::kBias;
}

}  // namespace

AdamW::AdamW(const ParamLayout& layout, AdamWOptions options)
    : o_(options), m_(static_cast<size_t>(layout.total), 0.0f), v_(static_cast<size_t>(layout.total), 0.0f) {
  for (const ParamInfo& p : layout.params) {
    if (p.trainable) ranges_.push_back({p.offset, p.offset + p.size, decays(p)});
  }
}

void AdamW::step(double lr_d, std::span<float> params, std::span<const float> grads) {
  CHECK(params.size() == m_.size() && grads.size() == m_.size());
  ++t_;
  const float b1 = static_cast<float>(o_.beta1), b2 = static_cast<float>(o_.beta2);
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(o_.beta1, static_cast<double>(t_))));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(o_.beta2, static_cast<double>(t_))));
  const float lr = static_cast<float>(lr_d), eps = static_cast<float>(o_.eps);
  const float decay = static_cast<float>(1.0 - lr_d * o_.weight_decay);
  for (const Range& r : ranges_) {
    const float d = r.decay ? decay : 1.0f;
    float* p = params.data();
    const float* g = grads.data();
    float* m = m_.data();
    float* v = v_.data();
    default_pool().parallel_for(r.end - r.begin, kChunk, [&](int64_t a, int64_t b, int) {
      for (int64_t i = r.begin + a; i < r.begin + b; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] = p[i] * d - lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
      }
    });
  }
}

double clip_grad_norm(const ParamLayout& layout, std::span<float> grads, double max_norm) {
  double sum = 0;
  std::vector<double> partial;
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    const int64_t n_chunks = (p.size + kChunk - 1) / kChunk;
    partial.assign(static_cast<size_t>(n_chunks), 0.0);
    const float* g = grads.data() + p.offset;
    default_pool().parallel_for(n_chunks, 1, [&](int64_t a, int64_t b, int) {
      for (int64_t c = a; c < b; ++c) {
        double s = 0;
        for (int64_t i = c * kChunk; i < std::min(p.size, (c + 1) * kChunk); ++i) s += double{g[i]} * g[i];
        partial[static_cast<size_t>(c)] = s;
      }
    });
    for (double s : partial) sum += s;
  }
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-12));
    for (const ParamInfo& p : layout.params) {
      if (!p.trainable) continue;
      float* g = grads.data() + p.offset;
      default_pool().parallel_for(p.size, kChunk, [&](int64_t a, int64_t b, int) {
        for (int64_t i = a; i < b; ++i) g[i] *= scale;
      });
    }
  }
  return norm;
}

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(1, steps - warmup);
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(span), 0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
}

namespace {

class LocalStepComputer final : public StepComputer {
 public:
  explicit LocalStepComputer(const TrainOptions& options)
      : options_(options), ctx_(make_model_context<float>()) {}

  Result<StepResult> compute(const ModelParams<float>& params, std::span<const Batch> micro,
                             ModelParams<float>& grads) override {
    StepResult r;
    const double scale = 1.0 / static_cast<double>(micro.size());
    for (const Batch& b : micro) {
      const StepLoss l = TRY(model_forward(params, b.shape, b.tokens, b.targets, options_, *ctx_));
      model_backward(params, *ctx_, scale, grads);
      r.loss.total += l.total * scale;
      r.loss.ce += l.ce * scale;
      r.loss.mtp_ce += l.mtp_ce * scale;
      r.loss.balance += l.balance * scale;
      r.loss.n_targets += l.n_targets;
      const auto loads = model_expert_loads(*ctx_);
      if (r.expert_loads.empty()) r.expert_loads.resize(loads.size());
      for (size_t l2 = 0; l2 < loads.size(); ++l2) {
        auto& acc = r.expert_loads[l2];
        if (acc.empty()) acc.assign(loads[l2].size(), 0);
        for (size_t e = 0; e < loads[l2].size(); ++e) acc[e] += loads[l2][e];
      }
    }
    return r;
  }

  Result<StepLoss> evaluate(const ModelParams<float>& params, const Batch& b) override {
    return model_forward(params, b.shape, b.tokens, b.targets, options_, *ctx_);
  }

 private:
  TrainOptions options_;
  ModelContextPtr<float> ctx_;
};

}  // namespace

std::unique_ptr<StepComputer> make_local_step_computer(const TrainOptions& options) {
  return std::make_unique<LocalStepComputer>(options);
}

double model_forward_flops(const ParamLayout& layout, SeqShape shape) {
  const ModelConfig& c = layout.config;
  double per_token = 0;
  for (const ParamInfo& p : layout.params) {
    if (p.shape.size() != 2 || p.role == WeightRole::kEmbedding) continue;
    double frac = p.expert >= 0
                      ? static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.n_routed_experts)
                      : 1.0;
    if (p.layer >= c.num_hidden_layers)
      frac *= static_cast<double>(shape.seq_len - 1) / static_cast<double>(shape.seq_len);
    per_token += 2.0 * static_cast<double>(p.size) * frac;
  }
  if (c.tie_word_embeddings) per_token += 2.0 * static_cast<double>(c.vocab_size * c.hidden_size);
  if (layout.mtp) per_token += 2.0 * static_cast<double>(c.vocab_size * c.hidden_size);  // shared head again
  const double layers = static_cast<double>(c.num_hidden_layers + (layout.mtp ? 1 : 0));
  const double pairs = static_cast<double>(shape.seq_len * (shape.seq_len + 1) / 2);  // causal (i, j)
  const double attn =
      2.0 * pairs * static_cast<double>(c.num_attention_heads * (c.qk_head_dim() + c.v_head_dim));
  return per_token * static_cast<double>(shape.tokens()) + attn * layers * static_cast<double>(shape.n_seq);
}

}  // namespace fathom::train
