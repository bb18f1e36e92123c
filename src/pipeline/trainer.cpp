// The training driver (trainer.h): builds the schedule, the local stage modules and the executor,
// runs the steps, gathers losses, op timings, gradients and parameters to rank 0, measures the
// bubble, predicts it with the simulator, and checks the run against the single-process one.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "base/rng.h"
#include "base/timer.h"
#include "pipeline/trainer.h"
#include "pipeline/trainer_impl.h"

namespace fathom::pipeline {

namespace {

// Each rank's bytes, on rank 0 (empty elsewhere).
std::vector<std::vector<uint8_t>> gather_bytes(MPI_Comm comm, const void* data, size_t bytes) {
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  int64_t mine = static_cast<int64_t>(bytes);
  std::vector<int64_t> sizes(static_cast<size_t>(size));
  MPI_Gather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, 0, comm);
  std::vector<std::vector<uint8_t>> out;
  if (rank == 0) {
    out.resize(size_t(size));
    out[0].assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    for (int r = 1; r < size; ++r) {
      out[size_t(r)].resize(size_t(sizes[size_t(r)]));
      MPI_Recv(out[size_t(r)].data(), static_cast<int>(sizes[size_t(r)]), MPI_BYTE, r, 0, comm,
               MPI_STATUS_IGNORE);
    }
  } else {
    MPI_Send(data, static_cast<int>(bytes), MPI_BYTE, 0, 0, comm);
  }
  return out;
}

template <typename T>
std::vector<std::vector<uint8_t>> gather_span(MPI_Comm comm, std::span<const T> v) {
  return gather_bytes(comm, v.data(), v.size_bytes());
}

// One-way time of an activation-sized message between ranks 0 and 1 (ping-pong), in ms.
double measure_p2p_ms(MPI_Comm comm, int64_t bytes) {
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  double ms = 0;
  if (size > 1 && rank < 2) {
    std::vector<uint8_t> buf(static_cast<size_t>(bytes));
    constexpr int kWarmup = 3, kRounds = 20;
    uint64_t t0 = 0;
    for (int i = 0; i < kWarmup + kRounds; ++i) {
      if (i == kWarmup) t0 = now_ns();
      if (rank == 0) {
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 1, 1, comm);
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 1, 1, comm, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 0, 1, comm, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 0, 1, comm);
      }
    }
    ms = static_cast<double>(now_ns() - t0) * 1e-6 / (2.0 * kRounds);
  }
  MPI_Bcast(&ms, 1, MPI_DOUBLE, 0, comm);
  return ms;
}

double rel_err(std::span<const uint8_t> got_bytes, const void* want_data, size_t n, bool f64) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    double a, b;
    if (f64) {
      a = reinterpret_cast<const double*>(got_bytes.data())[i];
      b = static_cast<const double*>(want_data)[i];
    } else {
      a = reinterpret_cast<const float*>(got_bytes.data())[i];
      b = static_cast<const float*>(want_data)[i];
    }
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

uint64_t fnv1a(const std::vector<uint8_t>& bytes, uint64_t h) {
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

template <typename T>
class Driver {
 public:
  Driver(const TrainOptions& o, MPI_Comm comm) : o_(o), comm_(comm) {
    MPI_Comm_size(comm, &size_);
    MPI_Comm_rank(comm, &rank_);
  }
  Result<TrainReport> run();

 private:
  using PerRank = std::vector<std::vector<std::vector<uint8_t>>>;  // [chunk][rank] bytes
  PerRank gather_chunks(bool grads) {
    PerRank out;
    for (auto& m : modules_) {
      std::span<T> v = grads ? m->gradients() : m->parameters();
      out.push_back(gather_span<T>(comm_, std::span<const T>(v.data(), v.size())));
    }
    return out;
  }
  StepMeasure measure(const StepStats& stats, std::vector<std::vector<OpRecord>>* all_records);
  void collect_losses(const StepStats& stats);
  void verify(const PerRank& first_grads, const PerRank& final_params);
  void build_timeline(const std::vector<std::vector<OpRecord>>& records);

  const TrainOptions& o_;
  MPI_Comm comm_;
  int size_ = 0, rank_ = 0;
  TrainReport report_;
  std::vector<std::unique_ptr<StageModule<T>>> modules_;
};

template <typename T>
Result<TrainReport> Driver<T>::run() {
  TRY(check_mlp_config(o_.model));
  if (o_.steps < 1) return invalid_argument("train: --steps must be >= 1, got {}", o_.steps);
  report_.schedule =
      TRY(make_schedule({.kind = o_.kind, .n_ranks = size_, .n_microbatches = o_.microbatches}));
  const Schedule& s = report_.schedule;
  std::vector<StageModule<T>*> chunks;
  for (int c = 0; c < s.chunks_per_rank(); ++c) {
    modules_.push_back(make_mlp_stage<T>(o_.model, s.chunk_task(rank_, c).stage));
    chunks.push_back(modules_.back().get());
  }
  report_.parameters_per_stage = static_cast<int64_t>(modules_[0]->parameters().size());
  auto data = make_synthetic_data<T>(o_.model);
  const ExecutorOptions eo{
      .adamw = o_.adamw, .delay_ms_max = o_.delay_ms_max, .delay_seed = o_.model.seed, .fault = o_.fault};
  auto executor = TRY(Executor<T>::create(s, comm_, chunks, data.get(), eo));
  report_.p2p_ms = measure_p2p_ms(comm_, modules_[0]->output_elems() * int64_t(sizeof(T)));
  PerRank first_grads;
  std::vector<std::vector<OpRecord>> records;
  for (int step = 0; step < o_.steps; ++step) {
    StepStats stats = TRY(executor->run_step(step));
    if (step == 0 && o_.verify) first_grads = gather_chunks(true);
    executor->apply_optimizer();
    collect_losses(stats);
    StepMeasure m = measure(stats, &records);  // collective; filled on rank 0 only
    if (rank_ == 0) report_.steps.push_back(std::move(m));
  }
  const PerRank final_params = gather_chunks(false);
  if (rank_ == 0) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int stage = 0; stage < s.n_stages; ++stage) {
      h = fnv1a(final_params[size_t(s.chunk_of(0, stage))][size_t(s.rank_of(0, stage))], h);
    }
    report_.params_digest = fmt::format("{:016x}", h);
    build_timeline(records);
    if (o_.verify) verify(first_grads, final_params);
  }
  MPI_Bcast(&report_.p2p_ms, 1, MPI_DOUBLE, 0, comm_);
  return std::move(report_);
}

template <typename T>
void Driver<T>::collect_losses(const StepStats& stats) {
  std::vector<double> flat;
  for (auto [mb, loss] : stats.losses) {
    flat.push_back(mb);
    flat.push_back(loss);
  }
  auto all = gather_bytes(comm_, flat.data(), flat.size() * sizeof(double));
  if (rank_ != 0) return;
  std::vector<double> losses(size_t(o_.microbatches), std::nan(""));
  for (const auto& bytes : all) {
    const double* v = reinterpret_cast<const double*>(bytes.data());
    for (size_t k = 0; k + 1 < bytes.size() / sizeof(double); k += 2) losses[size_t(v[k])] = v[k + 1];
  }
  report_.losses.push_back(std::move(losses));
}

template <typename T>
StepMeasure Driver<T>::measure(const StepStats& stats, std::vector<std::vector<OpRecord>>* all_records) {
  std::vector<double> flat;
  for (const OpRecord& r : stats.ops) flat.insert(flat.end(), {double(r.op_index), r.start_ms, r.end_ms});
  auto all = gather_bytes(comm_, flat.data(), flat.size() * sizeof(double));
  double sync = stats.sync_ms;
  MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : &sync, &sync, 1, MPI_DOUBLE, MPI_MAX, 0, comm_);
  StepMeasure m;
  if (rank_ != 0) return m;
  m.sync_ms = sync;
  const Schedule& s = report_.schedule;
  all_records->assign(size_t(size_), {});
  KindTimes total;
  std::vector<std::vector<double>> durations(static_cast<size_t>(size_));  // [rank][op] for the replay
  for (int r = 0; r < size_; ++r) {
    const double* v = reinterpret_cast<const double*>(all[size_t(r)].data());
    KindTimes mine;
    double busy = 0;
    durations[size_t(r)].assign(s.ranks[size_t(r)].size(), 0.0);
    for (size_t k = 0; k + 3 <= all[size_t(r)].size() / sizeof(double); k += 3) {
      const OpRecord rec{.op_index = int(v[k]), .start_ms = v[k + 1], .end_ms = v[k + 2]};
      (*all_records)[size_t(r)].push_back(rec);
      const double d = rec.end_ms - rec.start_ms;
      busy += d;
      durations[size_t(r)][size_t(rec.op_index)] = d;
      m.makespan_ms = std::max(m.makespan_ms, rec.end_ms);
      mine.add(s.ranks[size_t(r)][size_t(rec.op_index)].kind, d);
    }
    m.busy_ms.push_back(busy);
    m.rank_costs.push_back(mine.costs(report_.p2p_ms));
    total.add(mine);
  }
  for (double b : m.busy_ms) m.idle_ms.push_back(m.makespan_ms - b);
  m.bubble_ms = *std::max_element(m.idle_ms.begin(), m.idle_ms.end());
  m.bubble_fraction = m.makespan_ms > 0 ? m.bubble_ms / m.makespan_ms : 0;
  m.costs = total.costs(report_.p2p_ms);
  auto fraction = [](const Result<Simulation>& sim) {
    return sim.ok() && sim->makespan > 0 ? sim->bubble / sim->makespan : 0.0;
  };
  if (auto p = simulate(s, m.costs); p.ok()) {
    m.predicted_makespan = p->makespan;
    m.predicted_bubble_fraction = fraction(p);
  }
  m.predicted_rank_bubble_fraction = fraction(simulate_per_rank(s, m.rank_costs));
  m.replayed_bubble_fraction = fraction(replay(s, durations, report_.p2p_ms));
  return m;
}

template <typename T>
void Driver<T>::build_timeline(const std::vector<std::vector<OpRecord>>& records) {
  const Schedule& s = report_.schedule;
  const StepMeasure& m = report_.steps.back();
  Timeline& t = report_.timeline;
  t.title = fmt::format(
      "{} (measured): {} ranks, {} stages, {} micro-batches, step {}; bubble {:.1f}% (predicted "
      "{:.1f}%)",
      schedule_name(s.params.kind), s.params.n_ranks, s.n_stages, s.params.n_microbatches, o_.steps - 1,
      100 * m.bubble_fraction, 100 * m.predicted_bubble_fraction);
  t.unit = "ms";
  t.n_ranks = s.params.n_ranks;
  t.n_directions = s.n_directions;
  t.makespan = m.makespan_ms;
  t.idle = m.idle_ms;
  for (size_t r = 0; r < records.size(); ++r) {
    for (const OpRecord& rec : records[r]) {
      t.events.push_back({int(r), s.ranks[r][size_t(rec.op_index)], rec.start_ms, rec.end_ms});
    }
  }
}

template <typename T>
void Driver<T>::verify(const PerRank& first_grads, const PerRank& final_params) {
  const Schedule& s = report_.schedule;
  const int model_stages = s.n_stages;  // DualPipe's two directions share one model of n_stages
  const ReferenceRun<T> ref = run_reference<T>(o_, model_stages);
  Verification v;
  v.bound = sizeof(T) == 8 ? 1e-10 : 1e-5;
  v.first_step_losses_identical = true;
  for (int step = 0; step < o_.steps; ++step) {
    for (int mb = 0; mb < o_.microbatches; ++mb) {
      const double got = report_.losses[size_t(step)][size_t(mb)],
                   want = ref.losses[size_t(step)][size_t(mb)];
      if (step == 0) {
        v.first_step_losses_identical &= std::bit_cast<uint64_t>(got) == std::bit_cast<uint64_t>(want);
      } else {
        v.later_loss_rel_err =
            std::max(v.later_loss_rel_err, std::abs(got - want) / std::max(std::abs(want), 1e-300));
      }
    }
  }
  const bool f64 = sizeof(T) == 8;
  for (int r = 0; r < size_; ++r) {
    for (int c = 0; c < s.chunks_per_rank(); ++c) {
      const int stage = s.chunk_task(r, c).stage;
      const auto& g = first_grads[size_t(c)][size_t(r)];
      const auto& p = final_params[size_t(c)][size_t(r)];
      v.grad_rel_err = std::max(v.grad_rel_err, rel_err(g, ref.first_grads[size_t(stage)].data(),
                                                        ref.first_grads[size_t(stage)].size(), f64));
      v.param_rel_err = std::max(v.param_rel_err, rel_err(p, ref.final_params[size_t(stage)].data(),
                                                          ref.final_params[size_t(stage)].size(), f64));
    }
  }
  if (s.params.kind == ScheduleKind::kDualPipe) {
    for (int r = 0; r < size_; ++r) {  // stage r: chunk 0 of rank r and chunk 1 of rank n-1-r
      v.replicas_identical &= final_params[0][size_t(r)] == final_params[1][size_t(size_ - 1 - r)];
    }
  }
  report_.verification = v;
}

}  // namespace

MpiSession::MpiSession() {
  int done = 0;
  MPI_Initialized(&done);
  if (!done) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    owned_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  if (owned_) MPI_Finalize();
}

int threads_per_local_rank(MPI_Comm comm) {
  MPI_Comm local = MPI_COMM_NULL;
  int n = 1;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_size(local, &n);
    MPI_Comm_free(&local);
  }
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cpus / std::max(1, n));
}

Result<std::pair<double, double>> predict_bubble(const Schedule& s, const Costs& costs) {
  const Simulation sim = TRY(simulate(s, costs));
  return std::pair<double, double>{sim.makespan, sim.makespan > 0 ? sim.bubble / sim.makespan : 0.0};
}

Result<TrainReport> train(const TrainOptions& options, MPI_Comm comm) {
  if (options.f64) return Driver<double>(options, comm).run();
  return Driver<float>(options, comm).run();
}

Costs KindTimes::costs(double p2p) const {
  Costs c;
  c.f = mean(OpKind::kForward);
  c.w = mean(OpKind::kWeight);
  c.b = count[int(OpKind::kBackward)] > 0 ? mean(OpKind::kBackward) : mean(OpKind::kBackwardInput) + c.w;
  c.w = std::min(c.w, c.b);
  if (count[int(OpKind::kBackwardInput)] > 0) c.bi = mean(OpKind::kBackwardInput);
  if (count[int(OpKind::kForwardBackward)] > 0) c.fb = mean(OpKind::kForwardBackward);
  c.p2p = p2p;
  return c;
}

}  // namespace fathom::pipeline
