// Schedule placement (which rank and chunk run a stage), names, parameter rules, and the pass that
// turns per-rank compute orders into full op lists with sends and receives. The compute orders
// themselves are in schedule_1f1b.cpp and schedule_dualpipe.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "base/check.h"
#include "base/strings.h"
#include "pipeline/pipeline.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kZB1P:
      return "zb1p";
    case ScheduleKind::kDualPipe:
      return "dualpipe";
    case ScheduleKind::kDualPipeV:
      return "dualpipev";
  }
  return "?";
}

Result<ScheduleKind> parse_schedule_kind(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZB1P,
                         ScheduleKind::kDualPipe, ScheduleKind::kDualPipeV}) {
    if (name == schedule_name(k)) return k;
  }
  return invalid_argument("unknown schedule '{}' (expected gpipe, 1f1b, zb1p, dualpipe or dualpipev)", name);
}

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kForward:
      return "F";
    case OpKind::kBackward:
      return "B";
    case OpKind::kBackwardInput:
      return "Bi";
    case OpKind::kWeight:
      return "W";
    case OpKind::kForwardBackward:
      return "F&B";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "?";
}

namespace {
// "F3" for direction 0, "f3" for direction 1.
std::string task_label(std::string letters, const Task& t) {
  for (char& c : letters) c = static_cast<char>(t.direction == 0 ? std::toupper(c) : std::tolower(c));
  return fmt::format("{}{}", letters, t.mb);
}
}  // namespace

std::string op_label(const Op& op) {
  switch (op.kind) {
    case OpKind::kForward:
      return task_label("F", op.task);
    case OpKind::kBackward:
      return task_label("BW", op.task);
    case OpKind::kBackwardInput:
      return task_label("B", op.task);
    case OpKind::kWeight:
      return task_label("W", op.task);
    case OpKind::kForwardBackward:
      return task_label("F", op.task) + "&" + task_label("b", op.task2);
    case OpKind::kSend:
    case OpKind::kRecv:
      return fmt::format("{} {} of stage {} mb {} {} rank {} (tag {})", op_kind_name(op.kind),
                         op.payload == Payload::kActivation ? "activation" : "gradient", op.task.stage,
                         op.task.mb, op.kind == OpKind::kSend ? "to" : "from", op.peer, op.tag);
  }
  return "?";
}

int Schedule::rank_of(int direction, int stage) const {
  const int p = params.n_ranks;
  switch (params.kind) {
    case ScheduleKind::kDualPipe:
      return direction == 0 ? stage : p - 1 - stage;
    case ScheduleKind::kDualPipeV:
      return stage < p ? stage : 2 * p - 1 - stage;
    default:
      return stage;
  }
}

int Schedule::chunk_of(int direction, int stage) const {
  switch (params.kind) {
    case ScheduleKind::kDualPipe:
      return direction;
    case ScheduleKind::kDualPipeV:
      return stage < params.n_ranks ? 0 : 1;
    default:
      return 0;
  }
}

int Schedule::chunks_per_rank() const {
  return params.kind == ScheduleKind::kDualPipe || params.kind == ScheduleKind::kDualPipeV ? 2 : 1;
}

Task Schedule::chunk_task(int rank, int chunk) const {
  const int p = params.n_ranks;
  switch (params.kind) {
    case ScheduleKind::kDualPipe:
      return chunk == 0 ? Task{0, rank, 0} : Task{1, p - 1 - rank, 0};
    case ScheduleKind::kDualPipeV:
      return chunk == 0 ? Task{0, rank, 0} : Task{0, 2 * p - 1 - rank, 0};
    default:
      return Task{0, rank, 0};
  }
}

int Schedule::direction_of(int mb) const {
  return n_directions == 2 && mb >= params.n_microbatches / 2 ? 1 : 0;
}

int Schedule::mb_begin(int direction) const {
  return direction == 0 ? 0 : params.n_microbatches / 2;
}

int Schedule::mb_end(int direction) const {
  return n_directions == 2 && direction == 0 ? params.n_microbatches / 2 : params.n_microbatches;
}

int Schedule::tag(Payload payload, const Task& producer) const {
  return (producer.mb * 2 + static_cast<int>(payload)) * n_stages + producer.stage;
}

int Schedule::max_tag() const {
  return tag(Payload::kGradient, Task{0, n_stages - 1, params.n_microbatches - 1});
}

int op_inputs(const Schedule& s, const Op& op, Flow out[2]) {
  int n = 0;
  auto activation = [&](const Task& t) {
    if (t.stage > 0) out[n++] = Flow{Payload::kActivation, Task{t.direction, t.stage - 1, t.mb}, t};
  };
  auto gradient = [&](const Task& t) {
    if (t.stage < s.n_stages - 1)
      out[n++] = Flow{Payload::kGradient, Task{t.direction, t.stage + 1, t.mb}, t};
  };
  switch (op.kind) {
    case OpKind::kForward:
      activation(op.task);
      break;
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
      gradient(op.task);
      break;
    case OpKind::kForwardBackward:
      activation(op.task);
      gradient(op.task2);
      break;
    default:
      break;
  }
  return n;
}

int op_outputs(const Schedule& s, const Op& op, Flow out[2]) {
  int n = 0;
  auto activation = [&](const Task& t) {
    if (t.stage < s.n_stages - 1)
      out[n++] = Flow{Payload::kActivation, t, Task{t.direction, t.stage + 1, t.mb}};
  };
  auto gradient = [&](const Task& t) {
    if (t.stage > 0) out[n++] = Flow{Payload::kGradient, t, Task{t.direction, t.stage - 1, t.mb}};
  };
  switch (op.kind) {
    case OpKind::kForward:
      activation(op.task);
      break;
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
      gradient(op.task);
      break;
    case OpKind::kForwardBackward:
      activation(op.task);
      gradient(op.task2);
      break;
    default:
      break;
  }
  return n;
}

namespace {

Status check_params(const ScheduleParams& p) {
  const std::string_view name = schedule_name(p.kind);
  if (p.n_ranks < 1 || p.n_ranks > kMaxRanks) {
    return invalid_argument("{}: the number of ranks must be in [1, {}], got {}", name, kMaxRanks, p.n_ranks);
  }
  if (p.n_microbatches < 1 || p.n_microbatches > kMaxMicrobatches) {
    return invalid_argument("{}: the number of micro-batches must be in [1, {}], got {}", name,
                            kMaxMicrobatches, p.n_microbatches);
  }
  if (p.kind == ScheduleKind::kDualPipe) {
    if (p.n_ranks % 2 != 0) {
      return invalid_argument("dualpipe needs an even number of ranks (rank r pairs with rank n-1-r), got {}",
                              p.n_ranks);
    }
    if (p.n_microbatches % 2 != 0) {
      return invalid_argument(
          "dualpipe needs an even number of micro-batches (half enter from each end), got {}",
          p.n_microbatches);
    }
  }
  if (p.kind == ScheduleKind::kDualPipe || p.kind == ScheduleKind::kDualPipeV) {
    if (p.n_microbatches < 2 * p.n_ranks) {
      return invalid_argument("{} needs at least 2 micro-batches per rank ({} for {} ranks), got {}", name,
                              2 * p.n_ranks, p.n_ranks, p.n_microbatches);
    }
  }
  return {};
}

void append_comm(const Schedule& s, int rank, const Op& op, OpKind kind, std::vector<Op>& out) {
  Flow flows[2];
  const int n = kind == OpKind::kRecv ? op_inputs(s, op, flows) : op_outputs(s, op, flows);
  for (int i = 0; i < n; ++i) {
    const Flow& f = flows[i];
    const int peer = kind == OpKind::kRecv ? s.rank_of(f.producer.direction, f.producer.stage)
                                           : s.rank_of(f.consumer.direction, f.consumer.stage);
    if (peer == rank) continue;  // DualPipeV's turn: handed over locally
    out.push_back(Op{.kind = kind,
                     .task = kind == OpKind::kRecv ? f.consumer : f.producer,
                     .payload = f.payload,
                     .peer = peer,
                     .tag = s.tag(f.payload, f.producer)});
  }
}
void append_recvs(const Schedule& s, int rank, const Op& op, std::vector<Op>& out) {
  append_comm(s, rank, op, OpKind::kRecv, out);
}
void append_sends(const Schedule& s, int rank, const Op& op, std::vector<Op>& out) {
  append_comm(s, rank, op, OpKind::kSend, out);
}

}  // namespace

// Receives are posted one compute op ahead of their consumer, so the transfer overlaps the op
// before it; sends are posted right after their producer.
std::vector<Op> insert_communication(const Schedule& s, int rank, const std::vector<Op>& compute) {
  std::vector<Op> out;
  out.reserve(compute.size() * 3);
  if (!compute.empty()) append_recvs(s, rank, compute[0], out);
  for (size_t k = 0; k < compute.size(); ++k) {
    if (k + 1 < compute.size()) append_recvs(s, rank, compute[k + 1], out);
    out.push_back(compute[k]);
    append_sends(s, rank, compute[k], out);
  }
  return out;
}

Result<Schedule> make_schedule(const ScheduleParams& params) {
  TRY(check_params(params));
  Schedule s;
  s.params = params;
  s.n_stages = params.kind == ScheduleKind::kDualPipeV ? 2 * params.n_ranks : params.n_ranks;
  s.n_directions = params.kind == ScheduleKind::kDualPipe ? 2 : 1;
  s.ranks.resize(static_cast<size_t>(params.n_ranks));
  for (int r = 0; r < params.n_ranks; ++r) {
    std::vector<Op> compute;
    switch (params.kind) {
      case ScheduleKind::kGPipe:
        compute = gpipe_order(params, r);
        break;
      case ScheduleKind::kOneFOneB:
        compute = one_f_one_b_order(params, r);
        break;
      case ScheduleKind::kZB1P:
        compute = zb1p_order(params, r);
        break;
      case ScheduleKind::kDualPipe:
      case ScheduleKind::kDualPipeV:
        compute = dualpipe_order(params, r);
        break;
    }
    s.ranks[static_cast<size_t>(r)] = insert_communication(s, r, compute);
  }
  return s;
}

}  // namespace fathom::pipeline
