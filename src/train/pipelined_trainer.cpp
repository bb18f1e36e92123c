// `mpirun -np N fathom train --schedule S`: the trainer's loop (trainer.h) with its data, AdamW,
// clipping, schedule, checkpoints and log, and the step's gradients computed by DeepSeek-V3 stages
// on the pipeline executor (pipelined.h). Every rank runs the same loop on a full copy of the
// parameters (identical by construction: same data, same gradients, same optimizer), so
// checkpoints, export and resume are the single-process ones; rank 0 owns RUN_DIR, other ranks
// write theirs under RUN_DIR/.rank<r>/. Per step: the parameters are copied into the local
// stages, the executor runs the schedule, the stages' gradients are all-gathered into the full
// slab, and the losses of every micro-batch are summed in micro-batch order exactly as the
// single-process step does (so per-step losses of the first step are bit-identical to it).
// Stopping (SIGINT, --time-budget) is decided collectively after each step, so all ranks leave
// the loop at the same step.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/thread_pool.h"
#include "base/timer.h"
#include "pipeline/trainer.h"
#include "train/pipelined_impl.h"

namespace fathom::train {

namespace {

// Serves the trainer's current micro-batches to the executor's data source.
class MicroBatches final : public BatchSource {
 public:
  void set(std::span<const Batch> micro) { micro_ = micro; }
  Status batch(int64_t, int mb, std::span<int32_t> tokens, std::span<int32_t> targets) override {
    if (mb < 0 || static_cast<size_t>(mb) >= micro_.size())
      return internal_error("train: no micro-batch {}", mb);
    const Batch& b = micro_[static_cast<size_t>(mb)];
    if (b.tokens.size() != tokens.size() || b.targets.size() != targets.size()) {
      return invalid_argument("train: micro-batch {} has {} tokens, the pipeline stages take {}", mb,
                              b.tokens.size(), tokens.size());
    }
    std::copy(b.tokens.begin(), b.tokens.end(), tokens.begin());
    std::copy(b.targets.begin(), b.targets.end(), targets.begin());
    return ok_status();
  }

 private:
  std::span<const Batch> micro_;
};

// (stage offset, full offset, size) of every tensor a stage holds.
struct Copy {
  int64_t stage = 0, full = 0, size = 0;
  bool trainable = true, embedding = false;
  int64_t layer = -1;
};

std::vector<Copy> copies_of(const ParamLayout& stage, const ParamLayout& full) {
  std::vector<Copy> out;
  for (const ParamInfo& p : stage.params) {
    const ParamInfo* q = full.find(p.name);
    CHECK_MSG(q != nullptr, "stage tensor '{}' not in the model", p.name);
    out.push_back({p.offset, q->offset, p.size, p.trainable, p.role == WeightRole::kEmbedding, p.layer});
  }
  return out;
}

class PipelinedStepComputer final : public StepComputer {
 public:
  PipelinedStepComputer(const ModelConfig& c, const TrainerOptions& t, const PipelinedTrainingOptions& p,
                        MPI_Comm comm)
      : config_(c), train_(t.model), popts_(p), comm_(comm) {
    MPI_Comm_size(comm, &size_);
    MPI_Comm_rank(comm, &rank_);
    options_.schedule = p.schedule;
    options_.microbatches = static_cast<int>(t.micro_batches);
    options_.shape = {t.batch, t.seq_len};
    options_.mtp = t.mtp;
    options_.train = t.model;
    options_.stage_layers = p.stage_layers;
    options_.seed = t.seed;
  }

  Status init();
  Result<StepResult> compute(const ModelParams<float>& params, std::span<const Batch> micro,
                             ModelParams<float>& grads) override;
  Result<StepLoss> evaluate(const ModelParams<float>& params, const Batch& b) override;
  const std::atomic<bool>* stop_flag() const { return &stop_; }
  bool stopped_by_budget() const { return by_budget_; }
  const pipeline::Schedule& schedule() const { return schedule_; }
  double mean_bubble() const { return n_bubbles_ > 0 ? bubble_sum_ / double(n_bubbles_) : 0; }

 private:
  void gather_grads(ModelParams<float>& grads, StepResult& r);
  StepLoss gather_losses();
  void decide_stop();

  const ModelConfig& config_;
  TrainOptions train_;
  PipelinedTrainingOptions popts_;
  MPI_Comm comm_;
  int size_ = 1, rank_ = 0;
  PipelinedOptions options_;
  ParamLayout full_;
  pipeline::Schedule schedule_;
  std::vector<ParamLayout> stage_layouts_;                     // [stage]
  std::vector<std::vector<Copy>> stage_copies_;                // [stage]
  std::vector<std::unique_ptr<DeepSeekStage<float>>> stages_;  // [local chunk]
  MicroBatches micro_;
  std::unique_ptr<StageData<float>> data_;
  std::unique_ptr<pipeline::Executor<float>> executor_;
  ModelContextPtr<float> eval_ctx_ = make_model_context<float>();
  std::atomic<bool> stop_{false};
  bool by_budget_ = false;
  Timer timer_;
  int64_t step_ = 0;
  double bubble_sum_ = 0;
  int64_t n_bubbles_ = 0;
};

Status PipelinedStepComputer::init() {
  TRY(check_pipelined(config_, options_, size_));
  full_ = TRY(make_param_layout(config_, options_.mtp));
  schedule_ = TRY(pipeline::make_schedule(
      {.kind = options_.schedule, .n_ranks = size_, .n_microbatches = options_.microbatches}));
  for (int st = 0; st < schedule_.n_stages; ++st) {
    stage_layouts_.push_back(TRY(
        stage_param_layout(full_, stage_params_spec(full_, st, schedule_.n_stages, options_.stage_layers))));
    stage_copies_.push_back(copies_of(stage_layouts_.back(), full_));
  }
  std::vector<pipeline::StageModule<float>*> chunks;
  for (int c = 0; c < schedule_.chunks_per_rank(); ++c) {
    const StageConfig sc{.stage = schedule_.chunk_task(rank_, c).stage,
                         .n_stages = schedule_.n_stages,
                         .stage_layers = options_.stage_layers,
                         .shape = options_.shape,
                         .options = train_,
                         .seed = options_.seed};
    stages_.push_back(TRY(DeepSeekStage<float>::create(full_, sc)));
    chunks.push_back(stages_.back().get());
  }
  data_ = std::make_unique<StageData<float>>(config_, options_, micro_);
  executor_ = TRY(pipeline::Executor<float>::create(schedule_, comm_, chunks, data_.get(), {}));
  return ok_status();
}

Result<StepResult> PipelinedStepComputer::compute(const ModelParams<float>& params,
                                                  std::span<const Batch> micro, ModelParams<float>& grads) {
  if (static_cast<int>(micro.size()) != options_.microbatches) {
    return invalid_argument("train: the pipeline was built for {} micro-batches per step, got {}",
                            options_.microbatches, micro.size());
  }
  for (auto& st : stages_) {  // this step's parameters into the local stages
    std::span<float> p = st->parameters();
    for (const Copy& c : stage_copies_[static_cast<size_t>(st->config().stage)]) {
      std::copy_n(params.data.data() + c.full, c.size, p.data() + c.stage);
    }
  }
  micro_.set(micro);
  TRY(data_->prefetch(step_));
  const pipeline::StepStats stats = TRY(executor_->run_step(step_++));
  const bool copies =
      stage_params_spec(full_, schedule_.n_stages - 1, schedule_.n_stages, options_.stage_layers).embedding;
  TRY(sync_embedding_grads<float>(schedule_, stages_, copies, comm_));
  StepResult r;
  gather_grads(grads, r);
  r.loss = gather_losses();
  double busy = 0, makespan = stats.ops_ms;  // the bubble: max over ranks of idle / makespan
  for (const pipeline::OpRecord& op : stats.ops) busy += op.end_ms - op.start_ms;
  MPI_Allreduce(MPI_IN_PLACE, &makespan, 1, MPI_DOUBLE, MPI_MAX, comm_);
  double idle = makespan - busy;
  MPI_Allreduce(MPI_IN_PLACE, &idle, 1, MPI_DOUBLE, MPI_MAX, comm_);
  if (makespan > 0) bubble_sum_ += idle / makespan, ++n_bubbles_;
  decide_stop();
  return r;
}

// Every rank gets every stage's gradients (direction 0's copy; the last stage's embedding copy
// is stage 0's after the sync) added into the full slab, and the routed loads from the bias slots.
void PipelinedStepComputer::gather_grads(ModelParams<float>& grads, StepResult& r) {
  std::vector<float> mine;
  for (size_t c = 0; c < stages_.size(); ++c) {
    if (schedule_.chunk_task(rank_, int(c)).direction != 0) continue;
    std::span<float> g = stages_[c]->gradients();
    mine.insert(mine.end(), g.begin(), g.end());
  }
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  const int count = static_cast<int>(mine.size());
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
  int64_t total = 0;
  for (int k = 0; k < size_; ++k) {
    displs[size_t(k)] = static_cast<int>(total);
    total += counts[size_t(k)];
  }
  std::vector<float> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), count, MPI_FLOAT, all.data(), counts.data(), displs.data(), MPI_FLOAT, comm_);
  const int64_t n_layers = config_.num_hidden_layers + (full_.mtp ? 1 : 0);
  r.expert_loads.assign(static_cast<size_t>(n_layers), {});
  for (int st = 0; st < schedule_.n_stages; ++st) {
    const int owner = schedule_.rank_of(0, st);
    int64_t offset = displs[size_t(owner)];
    for (int c = 0; c < schedule_.chunk_of(0, st); ++c) {  // earlier direction-0 chunks of the owner
      if (schedule_.chunk_task(owner, c).direction == 0)
        offset += stage_layouts_[size_t(schedule_.chunk_task(owner, c).stage)].total;
    }
    const float* slab = all.data() + offset;
    for (const Copy& c : stage_copies_[size_t(st)]) {
      if (c.embedding && st > 0) continue;
      if (!c.trainable) {  // e_score_correction_bias: the step's summed routed loads
        auto& loads = r.expert_loads[size_t(c.layer)];
        loads.resize(size_t(c.size));
        for (int64_t e = 0; e < c.size; ++e) loads[size_t(e)] = std::llround(slab[c.stage + e]);
        continue;
      }
      float* dst = grads.data.data() + c.full;
      for (int64_t i = 0; i < c.size; ++i) dst[i] += slab[c.stage + i];
    }
  }
}

// Every micro-batch's loss on every rank, summed in micro-batch order as the single-process step.
StepLoss PipelinedStepComputer::gather_losses() {
  std::vector<double> mine;
  for (const auto& [mb, l] : data_->losses()) {
    mine.insert(mine.end(), {double(mb), l.total, l.ce, l.mtp_ce, l.balance, double(l.n_targets)});
  }
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  const int count = static_cast<int>(mine.size());
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_);
  int total = 0;
  for (int k = 0; k < size_; ++k) displs[size_t(k)] = total, total += counts[size_t(k)];
  std::vector<double> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE, comm_);
  std::vector<StepLoss> per_mb(static_cast<size_t>(options_.microbatches));
  for (size_t k = 0; k + 6 <= all.size(); k += 6) {
    per_mb[size_t(all[k])] = StepLoss{.total = all[k + 1],
                                      .ce = all[k + 2],
                                      .mtp_ce = all[k + 3],
                                      .balance = all[k + 4],
                                      .n_targets = int64_t(all[k + 5])};
  }
  StepLoss sum;
  const double scale = 1.0 / static_cast<double>(per_mb.size());
  for (const StepLoss& l : per_mb) {
    sum.total += l.total * scale;
    sum.ce += l.ce * scale;
    sum.mtp_ce += l.mtp_ce * scale;
    sum.balance += l.balance * scale;
    sum.n_targets += l.n_targets;
  }
  return sum;
}

void PipelinedStepComputer::decide_stop() {
  int why = 0;  // 1: signal, 2: time budget
  if (popts_.signal != nullptr && popts_.signal->load()) why = 1;
  if (why == 0 && popts_.time_budget_s > 0 && timer_.elapsed_s() >= popts_.time_budget_s) why = 2;
  MPI_Allreduce(MPI_IN_PLACE, &why, 1, MPI_INT, MPI_MAX, comm_);
  if (why == 2) by_budget_ = true;
  if (why != 0) stop_.store(true);
}

// Forward only: rank 0 runs the whole model (every rank holds the same parameters), the others
// receive its result.
Result<StepLoss> PipelinedStepComputer::evaluate(const ModelParams<float>& params, const Batch& b) {
  double v[6] = {};
  Status st = ok_status();
  if (rank_ == 0) {
    auto l = model_forward(params, b.shape, b.tokens, b.targets, train_, *eval_ctx_);
    if (l.ok()) {
      v[0] = 1, v[1] = l->total, v[2] = l->ce, v[3] = l->mtp_ce, v[4] = l->balance,
      v[5] = double(l->n_targets);
    } else {
      st = l.status();
    }
  }
  MPI_Bcast(v, 6, MPI_DOUBLE, 0, comm_);
  if (!st.ok()) return st;
  if (v[0] == 0) return unavailable("train: the validation forward failed on rank 0");
  return StepLoss{.total = v[1], .ce = v[2], .mtp_ce = v[3], .balance = v[4], .n_targets = int64_t(v[5])};
}

}  // namespace

struct PipelinedTraining::Impl {
  std::unique_ptr<pipeline::MpiSession> mpi;  // first in, last out: MPI outlives the executor
  std::unique_ptr<PipelinedStepComputer> computer;
};

PipelinedTraining::PipelinedTraining() : impl_(std::make_unique<Impl>()) {}
PipelinedTraining::~PipelinedTraining() {
  if (impl_) impl_->computer.reset();
}

Result<std::unique_ptr<PipelinedTraining>> PipelinedTraining::create(const ModelConfig& config,
                                                                     TrainerOptions& o,
                                                                     const PipelinedTrainingOptions& p) {
  std::unique_ptr<PipelinedTraining> t(new PipelinedTraining());
  t->impl_->mpi = std::make_unique<pipeline::MpiSession>();
  if (p.set_threads) set_default_pool_threads(pipeline::threads_per_local_rank(MPI_COMM_WORLD));
  auto computer = std::make_unique<PipelinedStepComputer>(config, o, p, MPI_COMM_WORLD);
  const Status st = computer->init();
  // Every rank checks the same inputs, so they fail together; an executor error is collective.
  if (!st.ok()) return st;
  t->impl_->computer = std::move(computer);
  t->rank_ = t->impl_->mpi->rank();
  o.stop = t->impl_->computer->stop_flag();
  o.time_budget_s = 0;  // decided collectively by the computer after each step
  if (t->rank_ != 0) {
    if (!o.out_dir.empty()) o.out_dir += fmt::format("/.rank{}", t->rank_);  // empty: the trainer's error
    o.progress = false;
  }
  return t;
}

StepComputer* PipelinedTraining::computer() {
  return impl_->computer.get();
}

bool PipelinedTraining::stopped_by_budget() const {
  return impl_->computer->stopped_by_budget();
}

double PipelinedTraining::mean_bubble_fraction() const {
  return impl_->computer->mean_bubble();
}

const pipeline::Schedule& PipelinedTraining::schedule() const {
  return impl_->computer->schedule();
}

}  // namespace fathom::train
