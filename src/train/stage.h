// A pipeline stage of a DeepSeek-V3 model: decoder layers [begin, end) of a ModelConfig plus the
// embedding (first stage) and the final norm, lm_head, cross-entropy and MTP module (last stage),
// as a pipeline::StageModule the MPI executor (pipeline/executor.h) drives. Built on
// stage_param_layout and the block_* functions of train.h; the backward's B / W split maps to
// backward_input / backward_weight; one saved-activation context per slot (micro-batch in flight).
//
// What travels between stages (T elements per micro-batch, n = n_seq * seq_len tokens):
//   first stage input:         [tokens n | targets n]                    (ids as exact integers)
//   activation (stage i -> i+1): [x n*hidden | tokens n | targets n | balance kF64Elems]
//   gradient   (stage i+1 -> i): [dx n*hidden | 0 n | 0 n | loss_scale kF64Elems]
//   last stage output:           the loss record [total | ce | mtp_ce | balance | n_targets]
//   its output gradient:         [loss_scale kF64Elems | 0 ...]
// `balance` is the running sum of the MoE balance losses of the stages before, so the last stage
// adds them in the same order as model_forward and the total is bit-identical to it; the gradient
// of the objective w.r.t. that running sum is loss_scale, which is how every stage learns the
// scale its balance-loss gradients enter with. Doubles travel as four 16-bit pieces (each exact
// in float), so nothing depends on how MPI or a copy treats unusual bit patterns.
//
// The last stage keeps its own copy of the embedding when the MTP module needs it (DeepSeek-V3
// shares it) or when the head is tied to it; the runner (pipelined.h) sums the two copies'
// gradients before the optimizer, so they stay identical. The routed experts' loads of every
// forward are summed into the gradient slot of e_score_correction_bias (not trainable, so the
// slot is otherwise unused): the executor zeroes them each step and sums DualPipe's two copies
// like any gradient, and after_optimizer_step() applies the aux-loss-free bias update from the
// step's total load.
//
// Thread safety: one thread drives a stage (the GEMMs fan out on the default pool).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "pipeline/executor.h"
#include "train/train.h"

namespace fathom::train {

inline constexpr int64_t kF64Elems = 4;                     // one double as four 16-bit pieces
inline constexpr int64_t kLossRecordElems = 5 * kF64Elems;  // total, ce, mtp_ce, balance, n_targets

template <class T>
void encode_f64(double v, T* out);  // out[0..kF64Elems)
template <class T>
double decode_f64(const T* in);
template <class T>
StepLoss decode_loss_record(const T* record);

// Where a model of `full` is cut into n_stages runs of decoder layers: `stage_layers[s]` layers
// on stage s (they must sum to num_hidden_layers), or equal runs when it is empty (the layer count
// must then be a multiple of n_stages). The MTP layer rides on the last stage. Errors (before any
// work) name what does not divide or fit.
Status check_stage_split(const ParamLayout& full, int n_stages, std::span<const int64_t> stage_layers = {});
StageParamsSpec stage_params_spec(const ParamLayout& full, int stage, int n_stages,
                                  std::span<const int64_t> stage_layers = {});

struct StageConfig {
  int stage = 0;
  int n_stages = 1;
  std::vector<int64_t> stage_layers;  // decoder layers per stage; empty: equal runs
  SeqShape shape;                     // every micro-batch
  TrainOptions options;
  uint64_t seed = 1;  // init_params(seed, init_scale): the same values as the whole model's
  double init_scale = 1.0;
};

template <class T>
class DeepSeekStage final : public pipeline::StageModule<T> {
 public:
  // `full` must outlive the stage. Fails on a bad split or shape (check_stage_split).
  static Result<std::unique_ptr<DeepSeekStage>> create(const ParamLayout& full, const StageConfig& config);
  ~DeepSeekStage() override;

  int64_t input_elems() const override;
  int64_t output_elems() const override;
  Status reserve(int n_slots) override;
  void forward(int slot, const T* input, T* output) override;
  void backward_input(int slot, const T* output_grad, T* input_grad) override;
  void backward_weight(int slot) override;
  std::span<T> parameters() override { return params_.data; }
  std::span<T> gradients() override { return grads_.data; }
  // The aux-loss-free bias update of every local MoE layer from the loads summed in gradients().
  void after_optimizer_step() override;

  const StageConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  bool first() const { return config_.stage == 0; }
  bool last() const { return config_.stage == config_.n_stages - 1; }
  // The embedding's parameters and gradients (empty when the stage holds none).
  std::span<T> embedding_params();
  std::span<T> embedding_grads();
  // The loss of the slot's last forward (last stage only).
  const StepLoss& loss(int slot) const;

 private:
  struct Slot;
  DeepSeekStage(const ParamLayout& full, const StageConfig& config, ParamLayout layout);
  void forward_head(Slot& s, T* output);
  void add_loads(const BlockContext<T>& b, int64_t layer);

  StageConfig config_;
  ParamLayout layout_;  // before params_/grads_, which point at it
  ModelParams<T> params_, grads_;
  int64_t layer_begin_ = 0, layer_end_ = 0;  // main decoder layers held
  bool mtp_ = false;                         // the MTP module (last stage)
  std::vector<std::unique_ptr<Slot>> slots_;
};

extern template class DeepSeekStage<float>;
extern template class DeepSeekStage<double>;

}  // namespace fathom::train
