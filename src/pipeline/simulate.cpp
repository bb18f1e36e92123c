// The schedule simulator: every rank runs its ops in order; a compute op starts when its rank is
// free and its inputs are there. A local input is there when its producer ends; a remote one p2p
// after its send was posted. Sends and receives take no time. The same engine is the validator's
// deadlock check (validate.cpp), so "no deadlock" means exactly "this simulation finishes".
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "base/check.h"
#include "base/function_ref.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

class Engine {
 public:
  Engine(const Schedule& s, const Costs& c, FunctionRef<void(int rank, size_t index)>* visit = nullptr)
      : s_(s), c_(c), visit_(visit) {
    const size_t n = static_cast<size_t>(s.n_stages) * static_cast<size_t>(s.params.n_microbatches);
    f_end_.assign(n, kNotYet);
    g_end_.assign(n, kNotYet);
    next_.assign(s.ranks.size(), 0);
    clock_.assign(s.ranks.size(), 0.0);
    times_.resize(s.ranks.size());
    for (size_t r = 0; r < s.ranks.size(); ++r) times_[r].resize(s.ranks[r].size());
  }

  // Runs until every rank is done or none can move. Returns false on deadlock.
  bool run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < static_cast<int>(s_.ranks.size()); ++r) {
        while (step(r)) progress = true;
      }
    }
    for (size_t r = 0; r < s_.ranks.size(); ++r) {
      if (next_[r] < s_.ranks[r].size()) return false;
    }
    return true;
  }

  std::string stuck_report() const {
    std::string out;
    for (size_t r = 0; r < s_.ranks.size(); ++r) {
      if (next_[r] >= s_.ranks[r].size()) continue;
      if (!out.empty()) out += "; ";
      out += fmt::format("rank {} waits at op {} ({})", r, next_[r], op_label(s_.ranks[r][next_[r]]));
    }
    return out;
  }

  const std::vector<std::vector<OpTime>>& times() const { return times_; }
  double clock(size_t r) const { return clock_[r]; }

 private:
  size_t index(const Task& t) const {
    return static_cast<size_t>(t.stage) * static_cast<size_t>(s_.params.n_microbatches) +
           static_cast<size_t>(t.mb);
  }

  double cost(size_t rank, size_t index, const Op& op) const {
    if (durations_ != nullptr) return (*durations_)[rank][index];
    const Costs& c = per_rank_ != nullptr ? (*per_rank_)[rank] : c_;
    switch (op.kind) {
      case OpKind::kForward:
        return c.f;
      case OpKind::kBackward:
        return c.b;
      case OpKind::kBackwardInput:
        return c.bi_cost();
      case OpKind::kWeight:
        return c.w;
      case OpKind::kForwardBackward:
        return c.fb_cost();
      default:
        return 0;
    }
  }

  // When the flow's data is usable on `rank`, or NaN if it has not been produced/sent yet.
  double flow_ready(int rank, const Flow& f) const {
    const int producer_rank = s_.rank_of(f.producer.direction, f.producer.stage);
    if (producer_rank == rank) {
      return f.payload == Payload::kActivation ? f_end_[index(f.producer)] : g_end_[index(f.producer)];
    }
    auto it = sent_.find(s_.tag(f.payload, f.producer));
    return it == sent_.end() ? kNotYet : it->second + c_.p2p;
  }

  // The earliest start of compute op `op` on `rank` from its inputs (NaN: not ready).
  double ready(int rank, const Op& op) const {
    double t = 0;
    bool ok = true;
    auto needs = [&](double v) {
      if (std::isnan(v))
        ok = false;
      else
        t = std::max(t, v);
    };
    Flow flows[2];
    const int n = op_inputs(s_, op, flows);
    for (int i = 0; i < n; ++i) needs(flow_ready(rank, flows[i]));
    switch (op.kind) {
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        needs(f_end_[index(op.task)]);
        break;  // its activations, or its loss
      case OpKind::kWeight:
        needs(g_end_[index(op.task)]);
        break;
      case OpKind::kForwardBackward:
        needs(f_end_[index(op.task2)]);
        break;
      default:
        break;
    }
    return ok ? t : kNotYet;
  }

  bool step(int rank) {
    const size_t r = static_cast<size_t>(rank);
    if (next_[r] >= s_.ranks[r].size()) return false;
    const Op& op = s_.ranks[r][next_[r]];
    OpTime& time = times_[r][next_[r]];
    if (op.kind == OpKind::kRecv) {
      time = {clock_[r], clock_[r]};
    } else if (op.kind == OpKind::kSend) {
      const Task& t = op.task;
      const double produced = op.payload == Payload::kActivation ? f_end_[index(t)] : g_end_[index(t)];
      if (std::isnan(produced)) return false;  // sending what this rank has not made yet
      sent_[op.tag] = clock_[r];
      time = {clock_[r], clock_[r]};
    } else {
      const double t = ready(rank, op);
      if (std::isnan(t)) return false;
      time.start = std::max(clock_[r], t);
      time.end = time.start + cost(r, next_[r], op);
      clock_[r] = time.end;
      record(op, time.end);
    }
    if (visit_) (*visit_)(rank, next_[r]);
    ++next_[r];
    return true;
  }

  void record(const Op& op, double end) {
    switch (op.kind) {
      case OpKind::kForward:
        f_end_[index(op.task)] = end;
        break;
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        g_end_[index(op.task)] = end;
        break;
      case OpKind::kForwardBackward:
        f_end_[index(op.task)] = end;
        g_end_[index(op.task2)] = end;
        break;
      default:
        break;
    }
  }

  const Schedule& s_;
  const Costs c_;  // by value: callers pass temporaries
  FunctionRef<void(int, size_t)>* visit_;

 public:
  const std::vector<std::vector<double>>* durations_ = nullptr;  // replay: [rank][op] costs
  const std::vector<Costs>* per_rank_ = nullptr;                 // [rank] op costs (p2p from c_)

 private:
  std::vector<double> f_end_, g_end_;     // [stage * n_microbatches + mb]
  std::unordered_map<int, double> sent_;  // tag -> post time of its send
  std::vector<size_t> next_;
  std::vector<double> clock_;
  std::vector<std::vector<OpTime>> times_;
};

}  // namespace

Status check_costs(const Costs& c) {
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(c.f) || c.f <= 0) return invalid_argument("cost F must be a positive number, got {}", c.f);
  if (!finite(c.b) || c.b <= 0) return invalid_argument("cost B must be a positive number, got {}", c.b);
  if (!finite(c.w) || c.w < 0 || c.w > c.b) {
    return invalid_argument("cost W must be in [0, B] (it is part of the full backward B = {}), got {}", c.b,
                            c.w);
  }
  if (c.fb && (!finite(*c.fb) || *c.fb <= 0)) {
    return invalid_argument("cost F&B must be a positive number, got {}", *c.fb);
  }
  if (c.bi && (!finite(*c.bi) || *c.bi < 0)) {
    return invalid_argument("cost of the input-gradient op must be >= 0, got {}", *c.bi);
  }
  if (!finite(c.p2p) || c.p2p < 0) return invalid_argument("p2p latency must be >= 0, got {}", c.p2p);
  return {};
}

Status walk_schedule(const Schedule& s, FunctionRef<void(int rank, size_t index)> visit) {
  Engine engine(s, Costs{}, &visit);
  if (!engine.run()) return failed_precondition("deadlock: {}", engine.stuck_report());
  return {};
}

// Used by validate(): true when the schedule runs to the end under dependency semantics.
Status check_runs_to_end(const Schedule& s) {
  Engine engine(s, Costs{});
  if (!engine.run()) return failed_precondition("deadlock: {}", engine.stuck_report());
  return {};
}

std::vector<int> peak_activations_per_chunk(const Schedule& s, int rank) {
  std::vector<int> live(static_cast<size_t>(s.chunks_per_rank()), 0), peak = live;
  auto add = [&](const Task& t, int delta) {
    const size_t c = static_cast<size_t>(s.chunk_of(t.direction, t.stage));
    live[c] += delta;
    peak[c] = std::max(peak[c], live[c]);
  };
  for (const Op& op : s.ranks[static_cast<size_t>(rank)]) {
    switch (op.kind) {
      case OpKind::kForward:
        add(op.task, 1);
        break;
      case OpKind::kBackward:
      case OpKind::kWeight:
        add(op.task, -1);
        break;
      case OpKind::kForwardBackward:  // the forward runs first: both are alive at once
        add(op.task, 1);
        add(op.task2, -1);
        break;
      default:
        break;
    }
  }
  return peak;
}

namespace {
int peak_activations(const Schedule& s, int rank) {
  int live = 0, peak = 0;
  for (const Op& op : s.ranks[static_cast<size_t>(rank)]) {
    if (op.kind == OpKind::kForward || op.kind == OpKind::kForwardBackward) peak = std::max(peak, ++live);
    if (op.kind == OpKind::kBackward || op.kind == OpKind::kWeight || op.kind == OpKind::kForwardBackward)
      --live;
  }
  return peak;
}
}  // namespace

namespace {

Result<Simulation> run_engine(const Schedule& s, const Costs& costs,
                              const std::vector<std::vector<double>>* durations,
                              const std::vector<Costs>* per_rank = nullptr) {
  TRY(validate(s));
  Engine engine(s, costs);
  engine.durations_ = durations;
  engine.per_rank_ = per_rank;
  if (!engine.run()) return failed_precondition("deadlock: {}", engine.stuck_report());
  Simulation sim;
  const size_t n = s.ranks.size();
  sim.busy.assign(n, 0);
  sim.times = engine.times();
  for (size_t r = 0; r < n; ++r) {
    sim.makespan = std::max(sim.makespan, engine.clock(r));
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      if (s.ranks[r][i].is_compute()) sim.busy[r] += sim.times[r][i].end - sim.times[r][i].start;
    }
    sim.peak_activations.push_back(peak_activations(s, static_cast<int>(r)));
  }
  for (size_t r = 0; r < n; ++r) sim.idle.push_back(sim.makespan - sim.busy[r]);
  sim.bubble = *std::max_element(sim.idle.begin(), sim.idle.end());
  return sim;
}

}  // namespace

Result<Simulation> simulate(const Schedule& s, const Costs& costs) {
  TRY(check_costs(costs));
  return run_engine(s, costs, nullptr);
}

Result<Simulation> simulate_per_rank(const Schedule& s, const std::vector<Costs>& per_rank) {
  if (per_rank.size() != s.ranks.size()) {
    return invalid_argument("simulate: costs for {} ranks, the schedule has {}", per_rank.size(), s.ranks.size());
  }
  for (const Costs& c : per_rank) TRY(check_costs(c));
  return run_engine(s, per_rank[0], nullptr, &per_rank);
}

Result<Simulation> replay(const Schedule& s, const std::vector<std::vector<double>>& op_durations,
                          double p2p) {
  if (op_durations.size() != s.ranks.size()) {
    return invalid_argument("replay: {} ranks of durations for {} ranks", op_durations.size(),
                            s.ranks.size());
  }
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    if (op_durations[r].size() != s.ranks[r].size()) {
      return invalid_argument("replay: rank {} has {} durations for {} ops", r, op_durations[r].size(),
                              s.ranks[r].size());
    }
    for (double d : op_durations[r]) {
      if (!std::isfinite(d) || d < 0) return invalid_argument("replay: rank {} has a duration of {}", r, d);
    }
  }
  if (!std::isfinite(p2p) || p2p < 0) return invalid_argument("p2p latency must be >= 0, got {}", p2p);
  return run_engine(s, Costs{.p2p = p2p}, &op_durations);
}

}  // namespace fathom::pipeline
