// The first stage model and the training driver behind `fathom pipeline train` and
// `fathom bench pipeline`: a stack of pre-norm SwiGLU MLP blocks with RMSNorm, cut into stages,
// trained with AdamW on synthetic regression data, on any schedule, under MPI.
//
// The driver runs the executor (executor.h) for a number of steps, times every op, turns the last
// step into a timeline (pipeline.h pictures), predicts the bubble with the simulator from the
// measured op times, and can check the run against a single-process run of the same model:
// first-step losses bit-identical, gradients and later losses within a relative bound (1e-10 in
// f64, 1e-5 in f32: only the order of the micro-batch gradient sums differs), and DualPipe's two
// copies of each stage bit-identical after the last step.
//
// Issue 11 replaces MlpStage with DeepSeek-V3 layers through the same StageModule interface.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "pipeline/executor.h"
#include "pipeline/pipeline.h"

namespace fathom::pipeline {

struct MlpConfig {
  int64_t tokens = 16;       // rows per micro-batch
  int64_t hidden = 64;       // the residual stream
  int64_t ffn = 128;         // SwiGLU inner width
  int blocks_per_stage = 1;  // blocks in one stage
  uint64_t seed = 1;         // weights and data
};
Status check_mlp_config(const MlpConfig& c);

// Stage `stage` of an n_stages-stage model: blocks_per_stage blocks
//   y = x + W_down (silu(W_gate n) * (W_up n)),  n = rmsnorm(x) * gamma
// with hand-written forward, input-gradient and weight-gradient passes. Weights depend only on
// (seed, stage), so every copy of a stage starts identical. T is float or double.
template <typename T>
std::unique_ptr<StageModule<T>> make_mlp_stage(const MlpConfig& config, int stage);

// Inputs uniform in [-1, 1) and targets uniform in [-0.5, 0.5) per (seed, step, micro-batch);
// loss 0.5 * mean((y - target)^2).
template <typename T>
std::unique_ptr<DataSource<T>> make_synthetic_data(const MlpConfig& config);

struct TrainOptions {
  ScheduleKind kind = ScheduleKind::kDualPipe;
  int microbatches = 8;
  int steps = 3;
  bool f64 = false;  // double instead of float
  MlpConfig model;
  AdamWParams adamw;
  double delay_ms_max = 0;  // random sleeps before ops (results must not change)
  bool verify = false;      // compare with a single-process run (rank 0)
  ExecutorOptions::Fault fault = ExecutorOptions::Fault::kNone;  // testing the checks
};

struct StepMeasure {
  double makespan_ms = 0;
  std::vector<double> busy_ms, idle_ms;  // [rank]
  double bubble_ms = 0;                  // max idle
  double bubble_fraction = 0;            // bubble / makespan
  Costs costs;                           // mean measured F, B, W, F&B, Bi and the p2p latency
  double predicted_makespan = 0;         // the simulator's, from `costs`
  double predicted_bubble_fraction = 0;
  std::vector<Costs> rank_costs;              // [rank] mean measured costs of that rank's ops
  double predicted_rank_bubble_fraction = 0;  // the simulator's, from rank_costs
  double replayed_bubble_fraction = 0;        // the simulator replaying every op's measured time
  double sync_ms = 0;                         // DualPipe gradient exchange (max over ranks)
};

struct Verification {
  double bound = 0;  // relative bound for gradients and later losses
  bool first_step_losses_identical = false;
  double later_loss_rel_err = 0;   // max over steps > 0 and micro-batches
  double grad_rel_err = 0;         // max over stages of |g - g_ref| / |g_ref| after step 0
  double param_rel_err = 0;        // the same for parameters after the last step
  bool replicas_identical = true;  // DualPipe: both copies of each stage, bit for bit
  bool passed() const {
    return first_step_losses_identical && later_loss_rel_err <= bound && grad_rel_err <= bound &&
           replicas_identical;
  }
};

struct TrainReport {  // complete on rank 0; other ranks get the schedule and p2p_ms only
  Schedule schedule;
  std::vector<std::vector<double>> losses;  // [step][mb]
  std::vector<StepMeasure> steps;
  Timeline timeline;  // the last step, in ms
  std::optional<Verification> verification;
  std::string params_digest;  // FNV-1a of every stage's final parameters, stage order
  double p2p_ms = 0;          // measured one-way latency of an activation message
  int64_t parameters_per_stage = 0;
};

// MPI for the duration of a command: initialised (MPI_THREAD_FUNNELED) unless it already is, and
// finalised on destruction if it was initialised here.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

// This node's CPUs shared evenly among its ranks (at least 1 thread each).
int threads_per_local_rank(MPI_Comm comm);

// Collective over `comm` (whose size is the number of pipeline ranks).
Result<TrainReport> train(const TrainOptions& options, MPI_Comm comm);

// The simulator's prediction for measured per-op costs (shared by train and the benchmark).
Result<std::pair<double, double>> predict_bubble(const Schedule& s,
                                                 const Costs& costs);  // (makespan, fraction)

}  // namespace fathom::pipeline
