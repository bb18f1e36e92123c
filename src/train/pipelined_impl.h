// Internals of pipelined training (pipelined.h): the per-tensor AdamW both the pipelined and the
// single-process run use, and the single-process reference run the verify mode compares with.
#pragma once

#include <mpi.h>

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "pipeline/executor.h"
#include "train/pipelined.h"
#include "train/stage.h"

namespace fathom::train {

// AdamW over one slab of `layout`, tensor by tensor: non-trainable tensors (the routing bias) are
// skipped, decay applies to 2-D tensors only. Elementwise, so two copies given the same inputs
// stay bit-identical.
template <class T>
class SlabAdamW {
 public:
  explicit SlabAdamW(const ParamLayout& layout);
  // p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p) with g scaled by clip_coef.
  void step(const OptimizerOptions& o, double lr, double clip_coef, std::span<T> params,
            std::span<const T> grads);

 private:
  const ParamLayout& layout_;
  std::vector<T> m_, v_;
  int64_t t_ = 0;
};

// Sum of squares of the trainable gradients of `layout` (in float64), the embedding left out when
// `skip_embedding` (a copy counted elsewhere).
template <class T>
double grad_sq_norm(const ParamLayout& layout, std::span<const T> grads, bool skip_embedding);

// torch.nn.utils.clip_grad_norm_'s coefficient: min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double clip_coefficient(double clip, double norm);

// The routed loads of the last forward added into the bias gradient slots (what stages do).
template <class T>
void add_expert_loads(const ModelContext<T>& ctx, ModelParams<T>& grads);

template <class T>
struct ReferenceRun {
  std::vector<std::vector<StepLoss>> losses;  // [step][mb]
  std::vector<T> first_grads;                 // the whole model's slab after step 0
  std::vector<T> final_params;                // after the last step
};

// The same model, data, optimizer and bias rule in one process: model_forward / model_backward
// of every micro-batch in order, loss scale 1/microbatches.
template <class T>
Result<ReferenceRun<T>> run_reference(const ParamLayout& full, const PipelinedOptions& options,
                                      BatchSource& batches);

// The executor's data source: the step's batches fetched and checked before the step, token ids
// into the first stage, and the last stage's loss record decoded (its gradient: the loss scale).
template <class T>
class StageData final : public pipeline::DataSource<T> {
 public:
  StageData(const ModelConfig& c, const PipelinedOptions& o, BatchSource& batches)
      : config_(c), o_(o), batches_(batches) {}

  // Collective-free: fetches and validates micro-batches 0..M-1 of `step`.
  Status prefetch(int64_t step) {
    const size_t n = size_t(o_.shape.tokens());
    tokens_.assign(size_t(o_.microbatches), std::vector<int32_t>(n));
    targets_ = tokens_;
    for (int mb = 0; mb < o_.microbatches; ++mb) {
      TRY(batches_.batch(step, mb, tokens_[size_t(mb)], targets_[size_t(mb)]));
      for (size_t i = 0; i < n; ++i) {
        const int32_t t = tokens_[size_t(mb)][i], y = targets_[size_t(mb)][i];
        if (t < 0 || t >= config_.vocab_size || y < -1 || y >= config_.vocab_size) {
          return out_of_range(
              "train: step {} micro-batch {}: token {} / target {} at index {} outside [0, {})", step, mb, t,
              y, i, config_.vocab_size);
        }
      }
    }
    losses_.clear();
    return ok_status();
  }
  void input(int64_t, int mb, T* out) override {
    const auto& t = tokens_[size_t(mb)];
    const auto& y = targets_[size_t(mb)];
    for (size_t i = 0; i < t.size(); ++i) {
      out[i] = T(t[i]);
      out[t.size() + i] = T(y[i]);
    }
  }
  double loss(int64_t, int mb, const T* output, T* output_grad) override {
    const StepLoss l = decode_loss_record(output);
    losses_.emplace_back(mb, l);
    std::fill_n(output_grad, kLossRecordElems, T(0));
    encode_f64(1.0 / o_.microbatches, output_grad);
    return l.total;
  }
  const std::vector<std::pair<int, StepLoss>>& losses() const { return losses_; }

 private:
  const ModelConfig& config_;
  const PipelinedOptions& o_;
  BatchSource& batches_;
  std::vector<std::vector<int32_t>> tokens_, targets_;
  std::vector<std::pair<int, StepLoss>> losses_;
};

// After a step's op list: the first stage's and the last stage's embedding gradients both become
// g_first + g_last (when the last stage holds a copy), locally or with one MPI_Sendrecv.
template <class T>
Status sync_embedding_grads(const pipeline::Schedule& s,
                            std::span<const std::unique_ptr<DeepSeekStage<T>>> stages, bool copies,
                            MPI_Comm comm);

}  // namespace fathom::train
