// Internals of pipelined training (pipelined.h): the per-tensor AdamW both the pipelined and the
// single-process run use, and the single-process reference run the verify mode compares with.
#pragma once

#include <span>
#include <vector>

#include "train/pipelined.h"

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

}  // namespace fathom::train
