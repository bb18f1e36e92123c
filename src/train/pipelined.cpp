// Pipelined DeepSeek-V3 training under MPI (pipelined.h): builds the schedule and this rank's
// stages, feeds them through a pipeline::DataSource, runs the executor step by step, sums the
// embedding copies' gradients, clips by the global norm, applies AdamW and the bias rule per stage,
// measures the bubble, and (verify) compares everything with the single-process run on rank 0.
// Not here: the stage arithmetic (stage.cpp), the optimizer and reference run (pipelined_ref.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>

#include "base/check.h"
#include "base/timer.h"
#include "pipeline/executor.h"
#include "train/pipelined_impl.h"
#include "train/stage.h"

namespace fathom::train {

namespace {

using pipeline::ScheduleKind;

template <class T>
MPI_Datatype mpi_type() {
  return sizeof(T) == 8 ? MPI_DOUBLE : MPI_FLOAT;
}

// Each rank's bytes, on rank 0 (empty elsewhere).
std::vector<std::vector<uint8_t>> gather_bytes(MPI_Comm comm, const void* data, size_t bytes) {
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  int64_t mine = int64_t(bytes);
  std::vector<int64_t> sizes(size_t(size), 0);
  MPI_Gather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, 0, comm);
  std::vector<std::vector<uint8_t>> out;
  if (rank == 0) {
    out.resize(size_t(size));
    out[0].assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    for (int r = 1; r < size; ++r) {
      out[size_t(r)].resize(size_t(sizes[size_t(r)]));
      MPI_Recv(out[size_t(r)].data(), int(sizes[size_t(r)]), MPI_BYTE, r, 7, comm, MPI_STATUS_IGNORE);
    }
  } else {
    MPI_Send(data, int(bytes), MPI_BYTE, 0, 7, comm);
  }
  return out;
}

template <class T>
std::vector<T> as_values(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// One-way time of an activation-sized message between ranks 0 and 1 (ping-pong), in ms.
double measure_p2p_ms(MPI_Comm comm, int64_t bytes) {
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_INT64_T, MPI_MAX, comm);  // ranks' stages differ
  double ms = 0;
  if (size > 1 && rank < 2) {
    std::vector<uint8_t> buf(size_t(std::max<int64_t>(bytes, 1)));
    constexpr int kWarmup = 2, kRounds = 10;
    uint64_t t0 = 0;
    for (int i = 0; i < kWarmup + kRounds; ++i) {
      if (i == kWarmup) t0 = now_ns();
      const int peer = 1 - rank;
      if (rank == 0) MPI_Send(buf.data(), int(buf.size()), MPI_BYTE, peer, 3, comm);
      MPI_Recv(buf.data(), int(buf.size()), MPI_BYTE, peer, 3, comm, MPI_STATUS_IGNORE);
      if (rank == 1) MPI_Send(buf.data(), int(buf.size()), MPI_BYTE, peer, 3, comm);
    }
    ms = double(now_ns() - t0) * 1e-6 / (2.0 * kRounds);
  }
  MPI_Bcast(&ms, 1, MPI_DOUBLE, 0, comm);
  return ms;
}

uint64_t fnv1a(const std::vector<uint8_t>& bytes, uint64_t h) {
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

// The last stage's embedding copy (MTP, tied head) and stage 0's get the same sum, g0 + gLast, in
// that order on every holder, so all copies stay bit-identical.
template <class T>
Status sync_embedding_grads(const pipeline::Schedule& s,
                            std::span<const std::unique_ptr<DeepSeekStage<T>>> stages, bool copies,
                            MPI_Comm comm) {
  const int last = s.n_stages - 1;
  if (last == 0 || !copies) return ok_status();
  DeepSeekStage<T>* first_chunk = nullptr;
  DeepSeekStage<T>* last_chunk = nullptr;
  for (const auto& st : stages) {
    if (st->first() && first_chunk == nullptr) first_chunk = st.get();
    if (st->last() && last_chunk == nullptr) last_chunk = st.get();
  }
  if (first_chunk == nullptr && last_chunk == nullptr) return ok_status();
  if (first_chunk != nullptr && last_chunk != nullptr) {
    std::span<T> g0 = first_chunk->embedding_grads(), g1 = last_chunk->embedding_grads();
    for (size_t i = 0; i < g0.size(); ++i) g0[i] = g0[i] + g1[i];
    std::copy(g0.begin(), g0.end(), g1.begin());
    return ok_status();
  }
  std::span<T> mine = (first_chunk ? first_chunk : last_chunk)->embedding_grads();
  std::vector<T> other(mine.size());
  const int peer = first_chunk != nullptr ? s.rank_of(0, last) : s.rank_of(0, 0);
  const int tag = s.max_tag() + 8;
  const int rc = MPI_Sendrecv(mine.data(), int(mine.size()), mpi_type<T>(), peer, tag, other.data(),
                              int(other.size()), mpi_type<T>(), peer, tag, comm, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return unavailable("train: embedding gradient exchange with rank {} failed", peer);
  if (first_chunk != nullptr) {
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = mine[i] + other[i];
  } else {
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = other[i] + mine[i];
  }
  return ok_status();
}

template Status sync_embedding_grads<float>(const pipeline::Schedule&,
                                            std::span<const std::unique_ptr<DeepSeekStage<float>>>, bool,
                                            MPI_Comm);
template Status sync_embedding_grads<double>(const pipeline::Schedule&,
                                             std::span<const std::unique_ptr<DeepSeekStage<double>>>, bool,
                                             MPI_Comm);

namespace {

template <class T>
class Runner {
 public:
  Runner(const ModelConfig& c, const PipelinedOptions& o, BatchSource& b, MPI_Comm comm)
      : config_(c), o_(o), batches_(b), comm_(comm), data_(c, o, b) {
    MPI_Comm_size(comm, &size_);
    MPI_Comm_rank(comm, &rank_);
  }
  Result<PipelinedReport> run();

 private:
  Status setup();
  Status all_ok(Status local);  // collective: the first failing rank's error on every rank
  Status sync_embedding();
  double global_grad_norm();
  void optimizer_step(int64_t step, PipelinedStepMeasure& m);
  void collect_losses();
  PipelinedStepMeasure measure(const pipeline::StepStats& stats);
  void build_timeline(const pipeline::StepStats& stats, const PipelinedStepMeasure& m);
  std::vector<std::vector<uint8_t>> gather_chunk(int chunk, bool grads);
  using PerChunk = std::vector<std::vector<std::vector<uint8_t>>>;  // [chunk][rank] bytes
  Status verify(const PerChunk& first_grads, const PerChunk& final_params);
  double stage_rel_err(int stage, const std::vector<uint8_t>& bytes, const std::vector<T>& want);

  const ModelConfig& config_;
  const PipelinedOptions& o_;
  BatchSource& batches_;
  MPI_Comm comm_;
  int size_ = 0, rank_ = 0;
  StageData<T> data_;
  ParamLayout full_;
  PipelinedReport report_;
  std::vector<std::unique_ptr<DeepSeekStage<T>>> stages_;  // [local chunk]
  std::vector<SlabAdamW<T>> adamw_;
  std::unique_ptr<pipeline::Executor<T>> executor_;
  std::vector<std::vector<pipeline::OpRecord>> records_;  // rank 0: the last measured step's ops [rank]
};

template <class T>
Status Runner<T>::all_ok(Status local) {
  int bad = local.ok() ? 0 : 1, first_bad = size_;
  int mine = local.ok() ? size_ : rank_;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm_);
  if (!bad) return ok_status();
  MPI_Allreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, comm_);
  if (!local.ok()) return local;
  return unavailable("train: rank {} failed (its error is in its own output)", first_bad);
}

template <class T>
Status Runner<T>::setup() {
  TRY(check_pipelined(config_, o_, size_));
  full_ = TRY(make_param_layout(config_, o_.mtp));
  report_.schedule = TRY(
      pipeline::make_schedule({.kind = o_.schedule, .n_ranks = size_, .n_microbatches = o_.microbatches}));
  const pipeline::Schedule& s = report_.schedule;
  std::vector<pipeline::StageModule<T>*> chunks;
  for (int c = 0; c < s.chunks_per_rank(); ++c) {
    const StageConfig sc{.stage = s.chunk_task(rank_, c).stage,
                         .n_stages = s.n_stages,
                         .stage_layers = o_.stage_layers,
                         .shape = o_.shape,
                         .options = o_.train,
                         .seed = o_.seed,
                         .init_scale = o_.init_scale};
    stages_.push_back(TRY(DeepSeekStage<T>::create(full_, sc)));
    adamw_.emplace_back(stages_.back()->layout());
    chunks.push_back(stages_.back().get());
  }
  report_.parameters = full_.total;
  for (int st = 0; st < s.n_stages; ++st) {
    report_.stage_parameters.push_back(
        TRY(stage_param_layout(full_, stage_params_spec(full_, st, s.n_stages, o_.stage_layers))).total);
  }
  const pipeline::ExecutorOptions eo{
      .delay_ms_max = o_.delay_ms_max, .delay_seed = o_.seed, .fault = o_.fault};
  executor_ = TRY(pipeline::Executor<T>::create(s, comm_, chunks, &data_, eo));
  return ok_status();
}

template <class T>
Status Runner<T>::sync_embedding() {
  const pipeline::Schedule& s = report_.schedule;
  const bool copies = stage_params_spec(full_, s.n_stages - 1, s.n_stages, o_.stage_layers).embedding;
  return sync_embedding_grads<T>(s, stages_, copies, comm_);
}

// Every stage counted once (DualPipe's direction-1 copies and the last stage's embedding copy
// left out); partials summed in rank order on every rank, so every rank gets the same bits.
template <class T>
double Runner<T>::global_grad_norm() {
  const pipeline::Schedule& s = report_.schedule;
  double part = 0;
  for (int c = 0; c < int(stages_.size()); ++c) {
    if (s.chunk_task(rank_, c).direction != 0) continue;
    DeepSeekStage<T>& st = *stages_[size_t(c)];
    const bool copy = st.last() && !st.first();
    part += grad_sq_norm<T>(st.layout(), st.gradients(), copy);
  }
  std::vector<double> parts(static_cast<size_t>(size_));
  MPI_Allgather(&part, 1, MPI_DOUBLE, parts.data(), 1, MPI_DOUBLE, comm_);
  double sum = 0;
  for (double p : parts) sum += p;
  return std::sqrt(sum);
}

template <class T>
void Runner<T>::optimizer_step(int64_t step, PipelinedStepMeasure& m) {
  m.grad_norm = global_grad_norm();
  m.lr = learning_rate(o_.optimizer, step, o_.steps);
  const double coef = clip_coefficient(o_.optimizer.grad_clip, m.grad_norm);
  for (size_t c = 0; c < stages_.size(); ++c) {
    adamw_[c].step(o_.optimizer, m.lr, coef, stages_[c]->parameters(), stages_[c]->gradients());
    stages_[c]->after_optimizer_step();
  }
}

template <class T>
void Runner<T>::collect_losses() {
  std::vector<double> flat;
  for (const auto& [mb, l] : data_.losses()) {
    flat.insert(flat.end(), {double(mb), l.total, l.ce, l.mtp_ce, l.balance, double(l.n_targets)});
  }
  auto all = gather_bytes(comm_, flat.data(), flat.size() * sizeof(double));
  if (rank_ != 0) return;
  std::vector<StepLoss> losses(size_t(o_.microbatches), StepLoss{.total = std::nan("")});
  for (const auto& bytes : all) {
    const std::vector<double> v = as_values<double>(bytes);
    for (size_t k = 0; k + 6 <= v.size(); k += 6) {
      losses[size_t(v[k])] = StepLoss{.total = v[k + 1],
                                      .ce = v[k + 2],
                                      .mtp_ce = v[k + 3],
                                      .balance = v[k + 4],
                                      .n_targets = int64_t(v[k + 5])};
    }
  }
  report_.losses.push_back(std::move(losses));
}

template <class T>
std::vector<std::vector<uint8_t>> Runner<T>::gather_chunk(int chunk, bool grads) {
  std::span<T> v = grads ? stages_[size_t(chunk)]->gradients() : stages_[size_t(chunk)]->parameters();
  return gather_bytes(comm_, v.data(), v.size_bytes());
}

template <class T>
Result<PipelinedReport> Runner<T>::run() {
  TRY(all_ok(setup()));
  const pipeline::Schedule& s = report_.schedule;
  report_.p2p_ms = measure_p2p_ms(comm_, stages_[0]->output_elems() * int64_t(sizeof(T)));
  PerChunk first_grads, final_params;
  const uint64_t t0 = now_ns();
  pipeline::StepStats last_stats;
  for (int64_t step = 0; step < o_.steps; ++step) {
    TRY(all_ok(data_.prefetch(step)));
    pipeline::StepStats stats = TRY(executor_->run_step(step));
    const uint64_t t_sync = now_ns();
    TRY(all_ok(sync_embedding()));
    if (step == 0 && o_.verify) {
      for (int c = 0; c < s.chunks_per_rank(); ++c) first_grads.push_back(gather_chunk(c, true));
    }
    PipelinedStepMeasure m;
    optimizer_step(step, m);
    stats.sync_ms += double(now_ns() - t_sync) * 1e-6;
    collect_losses();
    PipelinedStepMeasure timed = measure(stats);
    timed.grad_norm = m.grad_norm;
    timed.lr = m.lr;
    if (rank_ == 0) report_.steps.push_back(timed);
    if (step + 1 == o_.steps && rank_ == 0) build_timeline(stats, timed);
  }
  report_.tokens_per_s = double(o_.steps) * o_.microbatches * double(o_.shape.tokens()) /
                         std::max(1e-9, double(now_ns() - t0) * 1e-9);
  for (int c = 0; c < s.chunks_per_rank(); ++c) final_params.push_back(gather_chunk(c, false));
  if (rank_ == 0) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int st = 0; st < s.n_stages; ++st)
      h = fnv1a(final_params[size_t(s.chunk_of(0, st))][size_t(s.rank_of(0, st))], h);
    report_.params_digest = fmt::format("{:016x}", h);
  }
  if (o_.verify) TRY(all_ok(rank_ == 0 ? verify(first_grads, final_params) : ok_status()));
  return std::move(report_);
}

template <class T>
PipelinedStepMeasure Runner<T>::measure(const pipeline::StepStats& stats) {
  std::vector<double> flat;
  for (const pipeline::OpRecord& r : stats.ops)
    flat.insert(flat.end(), {double(r.op_index), r.start_ms, r.end_ms});
  auto all = gather_bytes(comm_, flat.data(), flat.size() * sizeof(double));
  double sync = stats.sync_ms;
  MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : &sync, &sync, 1, MPI_DOUBLE, MPI_MAX, 0, comm_);
  PipelinedStepMeasure m;
  if (rank_ != 0) return m;
  m.sync_ms = sync;
  const pipeline::Schedule& s = report_.schedule;
  records_.assign(size_t(size_), {});
  pipeline::KindTimes kinds;
  std::vector<pipeline::Costs> rank_costs;
  std::vector<std::vector<double>> durations(static_cast<size_t>(size_));  // [rank][op] for the replay
  for (int r = 0; r < size_; ++r) {
    const std::vector<double> v = as_values<double>(all[size_t(r)]);
    durations[size_t(r)].assign(s.ranks[size_t(r)].size(), 0.0);
    double busy = 0;
    pipeline::KindTimes mine;
    for (size_t k = 0; k + 3 <= v.size(); k += 3) {
      const pipeline::OpRecord rec{.op_index = int(v[k]), .start_ms = v[k + 1], .end_ms = v[k + 2]};
      records_[size_t(r)].push_back(rec);
      const double d = rec.end_ms - rec.start_ms;
      busy += d;
      durations[size_t(r)][size_t(rec.op_index)] = d;
      m.makespan_ms = std::max(m.makespan_ms, rec.end_ms);
      kinds.add(s.ranks[size_t(r)][size_t(rec.op_index)].kind, d);
      mine.add(s.ranks[size_t(r)][size_t(rec.op_index)].kind, d);
    }
    m.busy_ms.push_back(busy);
    rank_costs.push_back(mine.costs(report_.p2p_ms));
  }
  double bubble = 0;
  for (double b : m.busy_ms) {
    m.idle_ms.push_back(m.makespan_ms - b);
    bubble = std::max(bubble, m.makespan_ms - b);
  }
  m.bubble_fraction = m.makespan_ms > 0 ? bubble / m.makespan_ms : 0;
  m.costs = kinds.costs(report_.p2p_ms);
  if (auto p = pipeline::simulate(s, m.costs); p.ok() && p->makespan > 0) {
    m.predicted_bubble_fraction = p->bubble / p->makespan;
  }
  if (auto p = pipeline::simulate_per_rank(s, rank_costs); p.ok() && p->makespan > 0) {
    m.predicted_rank_bubble_fraction = p->bubble / p->makespan;
  }
  if (auto p = pipeline::replay(s, durations, report_.p2p_ms); p.ok() && p->makespan > 0) {
    m.replayed_bubble_fraction = p->bubble / p->makespan;
  }
  return m;
}

template <class T>
void Runner<T>::build_timeline(const pipeline::StepStats&, const PipelinedStepMeasure& m) {
  const pipeline::Schedule& s = report_.schedule;
  pipeline::Timeline& t = report_.timeline;
  t.title = fmt::format(
      "DeepSeek-V3 {} (measured): {} ranks, {} stages, {} micro-batches; bubble {:.1f}% (predicted {:.1f}%)",
      pipeline::schedule_name(s.params.kind), s.params.n_ranks, s.n_stages, s.params.n_microbatches,
      100 * m.bubble_fraction, 100 * m.predicted_bubble_fraction);
  t.unit = "ms";
  t.n_ranks = s.params.n_ranks;
  t.n_directions = s.n_directions;
  t.makespan = m.makespan_ms;
  t.idle = m.idle_ms;
  for (size_t r = 0; r < records_.size(); ++r) {
    for (const pipeline::OpRecord& rec : records_[r]) {
      t.events.push_back({int(r), s.ranks[r][size_t(rec.op_index)], rec.start_ms, rec.end_ms});
    }
  }
}

// Relative L2 difference between a stage's slab and the same tensors of a whole-model slab.
template <class T>
double Runner<T>::stage_rel_err(int stage, const std::vector<uint8_t>& bytes, const std::vector<T>& want) {
  const std::vector<T> got = as_values<T>(bytes);
  auto layout =
      stage_param_layout(full_, stage_params_spec(full_, stage, report_.schedule.n_stages, o_.stage_layers));
  CHECK(layout.ok() && int64_t(got.size()) == layout->total);
  double diff = 0, norm = 0;
  for (const ParamInfo& p : layout->params) {
    const ParamInfo* q = full_.find(p.name);
    CHECK(q != nullptr);
    for (int64_t i = 0; i < p.size; ++i) {
      const double a = double(got[size_t(p.offset + i)]), b = double(want[size_t(q->offset + i)]);
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

bool same_bits(const StepLoss& a, const StepLoss& b) {
  auto eq = [](double x, double y) { return std::bit_cast<uint64_t>(x) == std::bit_cast<uint64_t>(y); };
  return eq(a.total, b.total) && eq(a.ce, b.ce) && eq(a.mtp_ce, b.mtp_ce) && eq(a.balance, b.balance) &&
         a.n_targets == b.n_targets;
}

template <class T>
Status Runner<T>::verify(const PerChunk& first_grads, const PerChunk& final_params) {
  const pipeline::Schedule& s = report_.schedule;
  const ReferenceRun<T> ref = TRY(run_reference<T>(full_, o_, batches_));
  PipelinedVerification v;
  v.bound = sizeof(T) == 8 ? 1e-10 : 1e-5;
  v.first_step_losses_identical = true;
  for (int64_t step = 0; step < o_.steps; ++step) {
    for (int mb = 0; mb < o_.microbatches; ++mb) {
      const StepLoss& got = report_.losses[size_t(step)][size_t(mb)];
      const StepLoss& want = ref.losses[size_t(step)][size_t(mb)];
      if (step == 0) {
        v.first_step_losses_identical &= same_bits(got, want);
      } else {
        const double err = std::abs(got.total - want.total) / std::max(std::abs(want.total), 1e-300);
        v.later_loss_rel_err = std::max(v.later_loss_rel_err, std::isnan(err) ? 1.0 : err);
      }
    }
  }
  for (int r = 0; r < size_; ++r) {
    for (int c = 0; c < s.chunks_per_rank(); ++c) {
      const int stage = s.chunk_task(r, c).stage;
      v.grad_rel_err =
          std::max(v.grad_rel_err, stage_rel_err(stage, first_grads[size_t(c)][size_t(r)], ref.first_grads));
      v.param_rel_err = std::max(v.param_rel_err,
                                 stage_rel_err(stage, final_params[size_t(c)][size_t(r)], ref.final_params));
    }
  }
  if (s.n_directions == 2) {  // DualPipe: stage st on (direction 0) and (direction 1), bit for bit
    for (int st = 0; st < s.n_stages; ++st) {
      v.replicas_identical &= final_params[size_t(s.chunk_of(0, st))][size_t(s.rank_of(0, st))] ==
                              final_params[size_t(s.chunk_of(1, st))][size_t(s.rank_of(1, st))];
    }
  }
  const int last = s.n_stages - 1;
  if (last > 0 &&
      stage_params_spec(full_, last, s.n_stages, o_.stage_layers).embedding) {  // the embedding copies
    auto l0 = TRY(stage_param_layout(full_, stage_params_spec(full_, 0, s.n_stages, o_.stage_layers)));
    auto l1 = TRY(stage_param_layout(full_, stage_params_spec(full_, last, s.n_stages, o_.stage_layers)));
    const ParamInfo* e0 = l0.find(kHfEmbed);
    const ParamInfo* e1 = l1.find(kHfEmbed);
    CHECK(e0 != nullptr && e1 != nullptr);
    const auto& b0 = final_params[size_t(s.chunk_of(0, 0))][size_t(s.rank_of(0, 0))];
    const auto& b1 = final_params[size_t(s.chunk_of(0, last))][size_t(s.rank_of(0, last))];
    v.replicas_identical &=
        std::memcmp(b0.data() + e0->offset * int64_t(sizeof(T)), b1.data() + e1->offset * int64_t(sizeof(T)),
                    size_t(e0->size) * sizeof(T)) == 0;
  }
  report_.verification = v;
  return ok_status();
}

}  // namespace

Status check_pipelined(const ModelConfig& config, const PipelinedOptions& o, int n_ranks) {
  if (o.steps < 1) return invalid_argument("train: --steps must be >= 1, got {}", o.steps);
  if (o.microbatches < 1)
    return invalid_argument("train: --microbatches must be >= 1, got {}", o.microbatches);
  const pipeline::Schedule s = TRY(
      pipeline::make_schedule({.kind = o.schedule, .n_ranks = n_ranks, .n_microbatches = o.microbatches}));
  const ParamLayout full = TRY(make_param_layout(config, o.mtp));
  TRY(check_stage_split(full, s.n_stages, o.stage_layers));
  if (o.shape.n_seq < 1 || o.shape.seq_len < 1 || o.shape.seq_len > config.max_position_embeddings) {
    return invalid_argument(
        "train: micro-batch {} x {} must be positive with seq_len <= max_position_embeddings {}",
        o.shape.n_seq, o.shape.seq_len, config.max_position_embeddings);
  }
  return ok_status();
}

Result<PipelinedReport> train_pipelined(const ModelConfig& config, const PipelinedOptions& options,
                                        BatchSource& batches, MPI_Comm comm) {
  if (options.f64) return Runner<double>(config, options, batches, comm).run();
  return Runner<float>(config, options, batches, comm).run();
}

}  // namespace fathom::train
