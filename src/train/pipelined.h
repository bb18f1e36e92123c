// Pipelined training of a DeepSeek-V3 model under MPI: the model cut into stages (stage.h), run by
// the pipeline executor (pipeline/executor.h) on a schedule (1F1B, ZB1P, GPipe, DualPipe,
// DualPipeV), with AdamW, gradient clipping and a warmup + cosine schedule applied per stage,
// the routers' aux-loss-free bias update, the executor's per-op timing turned into a measured
// bubble next to the simulator's prediction, and a verify mode that checks the run against a
// single process running model_forward / model_backward on the same micro-batches:
//  - first-step StepLoss of every micro-batch bit-identical (total, ce, mtp_ce, balance);
//  - first-step gradients and later losses within `bound` relative (float64 1e-10, float32 1e-5:
//    only the order of the micro-batch and embedding-copy gradient sums and of the global norm
//    differ);
//  - DualPipe's two copies of each stage, and the embedding copies of the first and last stage,
//    bit-identical after the last step.
//
//   auto batches = make_synthetic_batches(config, {2, 32}, seed);
//   auto report = TRY(train_pipelined(config, {.schedule = ScheduleKind::kDualPipe}, *batches,
//   MPI_COMM_WORLD));
//
// Every rank calls it (collective over `comm`, whose size is the rank count of the schedule);
// the report is complete on rank 0. Bad shapes (layers that do not split into the schedule's
// stages, micro-batch counts the schedule refuses, a wrong rank count) fail on every rank before
// any work, with the rule they break.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "pipeline/executor.h"
#include "pipeline/pipeline.h"
#include "train/train.h"
#include "train/trainer.h"

namespace fathom::train {

// Where micro-batches come from: micro-batch `mb` of step `step`, [n_seq, seq_len] tokens and
// targets (targets[t] = the token after tokens[t], -1 for none). Must be deterministic: the
// single-process check and every rank that needs a batch ask for it independently.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Status batch(int64_t step, int mb, std::span<int32_t> tokens, std::span<int32_t> targets) = 0;
};

// Learnable synthetic data, a pure function of (seed, step, mb): each sequence follows
// t[i+1] = (a * t[i] + b) mod vocab with (a, b) drawn from a few rules, plus 10% random tokens.
std::unique_ptr<BatchSource> make_synthetic_batches(const ModelConfig& config, SeqShape shape, uint64_t seed);

struct OptimizerOptions {
  double lr = 1e-3;      // peak learning rate
  double min_lr = 1e-4;  // the cosine's floor
  int64_t warmup_steps = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; on 2-D tensors (projections, embedding, head), not norms
  double grad_clip = 1.0;     // max global L2 norm of the step's gradient; 0: off
};
// Linear warmup over warmup_steps, then cosine from lr to min_lr at step total_steps.
double learning_rate(const OptimizerOptions& o, int64_t step, int64_t total_steps);

struct PipelinedOptions {
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kDualPipe;
  int microbatches = 4;  // per step (over both directions for DualPipe)
  int64_t steps = 2;
  SeqShape shape{1, 16};              // one micro-batch
  std::vector<int64_t> stage_layers;  // decoder layers per stage (stage order); empty: equal runs
  bool mtp = true;                    // train the MTP module (needs num_nextn_predict_layers >= 1)
  bool f64 = false;                   // float64 instead of float32 (tests)
  TrainOptions train;
  OptimizerOptions optimizer;
  uint64_t seed = 1;  // parameters (init_params)
  double init_scale = 1.0;
  bool verify = false;      // compare with a single-process run (on rank 0)
  double delay_ms_max = 0;  // random sleeps before ops (results must not change)
  // Testing the verify mode: the executor breaks one thing on rank 0 in step 0.
  pipeline::ExecutorOptions::Fault fault = pipeline::ExecutorOptions::Fault::kNone;
};

struct PipelinedStepMeasure {
  double makespan_ms = 0;                     // the op list, first op start to last op end
  std::vector<double> busy_ms, idle_ms;       // [rank]
  double bubble_fraction = 0;                 // max idle / makespan
  pipeline::Costs costs;                      // mean measured F, B (full), W, Bi, F&B, p2p
  double predicted_bubble_fraction = 0;       // the simulator's, from `costs`
  double predicted_rank_bubble_fraction = 0;  // from each rank's own mean costs (stages differ)
  double replayed_bubble_fraction = 0;        // the simulator replaying every op's measured time
  double sync_ms = 0;                         // gradient exchange + norm + optimizer (max over ranks)
  double grad_norm = 0;                       // before clipping
  double lr = 0;
};

struct PipelinedVerification {
  double bound = 0;
  bool first_step_losses_identical = false;
  double later_loss_rel_err = 0;   // max over steps > 0 and micro-batches (total loss)
  double grad_rel_err = 0;         // max over stages, relative L2, after step 0
  double param_rel_err = 0;        // the same for the parameters after the last step
  bool replicas_identical = true;  // DualPipe copies and embedding copies, bit for bit
  bool passed() const {
    return first_step_losses_identical && later_loss_rel_err <= bound && grad_rel_err <= bound &&
           param_rel_err <= bound && replicas_identical;
  }
};

struct PipelinedReport {  // complete on rank 0
  pipeline::Schedule schedule;
  int64_t parameters = 0;                     // the whole model's
  std::vector<int64_t> stage_parameters;      // [stage]
  std::vector<std::vector<StepLoss>> losses;  // [step][mb]
  std::vector<PipelinedStepMeasure> steps;
  pipeline::Timeline timeline;  // the last step, in ms
  std::optional<PipelinedVerification> verification;
  std::string params_digest;  // FNV-1a of every stage's final parameters, in stage order
  double p2p_ms = 0;
  double tokens_per_s = 0;  // over all steps, wall time
};

// The checks train_pipelined makes before any work, for a given rank count.
Status check_pipelined(const ModelConfig& config, const PipelinedOptions& options, int n_ranks);

Result<PipelinedReport> train_pipelined(const ModelConfig& config, const PipelinedOptions& options,
                                        BatchSource& batches, MPI_Comm comm);

// ---- `mpirun -np N fathom train --schedule S`: the trainer's loop on pipeline stages -------------
//
//   auto pp = TRY(PipelinedTraining::create(config, trainer_options, {.schedule = ScheduleKind::kDualPipe}));
//   auto summary = TRY(train_model(config, trainer_options, pp->computer()));  // on every rank
//   if (pp->rank() == 0) print(summary);
//
// Every rank runs train_model (trainer.h) on a full copy of the parameters; the StepComputer
// runs each step's micro-batches (TrainerOptions::micro_batches, each `batch` x `seq_len`)
// through this rank's stages on the schedule and all-gathers the gradients and losses, so data,
// AdamW, clipping, learning-rate schedule, router-bias rule, checkpoints and export are the
// single-process trainer's. create() initialises MPI (finalised on destruction), checks shapes
// before any work, and adjusts `trainer_options`: ranks > 0 write under RUN_DIR/.rank<r>/ with no
// progress bar, and stopping (the signal flag, the time budget) becomes a collective decision.
struct PipelinedTrainingOptions {
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kDualPipe;
  std::vector<int64_t> stage_layers;          // empty: equal runs
  double time_budget_s = 0;                   // 0: none
  const std::atomic<bool>* signal = nullptr;  // SIGINT/SIGTERM flag of this process
  bool set_threads = true;                    // share the node's cores among its ranks
};

class PipelinedTraining {
 public:
  static Result<std::unique_ptr<PipelinedTraining>> create(const ModelConfig& config,
                                                           TrainerOptions& trainer_options,
                                                           const PipelinedTrainingOptions& options);
  ~PipelinedTraining();
  StepComputer* computer();
  int rank() const { return rank_; }
  bool stopped_by_budget() const;
  double mean_bubble_fraction() const;  // measured, max idle over ranks / op-list time, per step
  const pipeline::Schedule& schedule() const;

 private:
  struct Impl;
  PipelinedTraining();
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
};

}  // namespace fathom::train
