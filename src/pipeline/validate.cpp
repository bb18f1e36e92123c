// The schedule validator: the rules an executor relies on (see validate() in pipeline.h). It
// checks a hand-made or mutated schedule as strictly as a generated one; each error names the
// rank, the op and the rule it breaks.
#include <fmt/format.h>

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "pipeline/pipeline.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

Status check_runs_to_end(const Schedule& s);  // simulate.cpp

namespace {

struct TaskCounts {
  int forward = 0;
  int backward = 0;  // input gradients (B, Bi or the backward half of F&B)
  int weight = 0;    // weight gradients (B, W or the backward half of F&B)
};

class Validator {
 public:
  explicit Validator(const Schedule& s) : s_(s) {
    counts_.resize(static_cast<size_t>(s.n_stages) * static_cast<size_t>(s.params.n_microbatches));
  }

  Status run() {
    if (static_cast<int>(s_.ranks.size()) != s_.params.n_ranks) {
      return invalid_argument("schedule has {} op lists for {} ranks", s_.ranks.size(), s_.params.n_ranks);
    }
    for (int r = 0; r < s_.params.n_ranks; ++r) TRY(check_rank(r));
    TRY(check_totals());
    return check_runs_to_end(s_);
  }

 private:
  size_t index(const Task& t) const {
    return static_cast<size_t>(t.stage) * static_cast<size_t>(s_.params.n_microbatches) +
           static_cast<size_t>(t.mb);
  }

  Status fail(int rank, size_t i, const Op& op, std::string rule) const {
    return invalid_argument("rank {} op {} ({}): {}", rank, i, op_label(op), rule);
  }

  bool in_range(const Task& t) const {
    return t.direction >= 0 && t.direction < s_.n_directions && t.stage >= 0 && t.stage < s_.n_stages &&
           t.mb >= s_.mb_begin(t.direction) && t.mb < s_.mb_end(t.direction);
  }

  // Per-rank state while scanning its ops.
  struct RankState {
    std::vector<bool> forward_done, backward_done;  // [task index] on this rank, so far
    std::unordered_set<int> posted, consumed;       // receive tags
    std::deque<Task> fifo;                          // weight gradients waiting
  };

  Status check_rank(int r);
  Status check_compute(int r, size_t i, const Op& op, RankState& st);
  Status check_inputs(int r, size_t i, const Op& op, RankState& st);
  Status check_comm(int r, size_t i, const Op& op, RankState& st);
  Status check_totals() const;

  const Schedule& s_;
  std::vector<TaskCounts> counts_;
  std::unordered_map<int, int> sends_;  // tag -> sends seen
};

Status Validator::check_rank(int r) {
  RankState st;
  st.forward_done.assign(counts_.size(), false);
  st.backward_done.assign(counts_.size(), false);
  const std::vector<Op>& ops = s_.ranks[static_cast<size_t>(r)];
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!in_range(op.task) || (op.kind == OpKind::kForwardBackward && !in_range(op.task2))) {
      return fail(r, i, op, "the task is out of range (direction, stage or micro-batch)");
    }
    if (op.is_compute()) {
      TRY(check_compute(r, i, op, st));
    } else {
      TRY(check_comm(r, i, op, st));
    }
  }
  if (!st.fifo.empty()) {
    return invalid_argument(
        "rank {}: {} weight gradients are left in the FIFO (an input-gradient op without its W)", r,
        st.fifo.size());
  }
  return {};
}

Status Validator::check_compute(int r, size_t i, const Op& op, RankState& st) {
  auto on_rank = [&](const Task& t) { return s_.rank_of(t.direction, t.stage) == r; };
  if (!on_rank(op.task) || (op.kind == OpKind::kForwardBackward && !on_rank(op.task2))) {
    return fail(r, i, op,
                fmt::format("stage {} of direction {} belongs to rank {}", op.task.stage, op.task.direction,
                            s_.rank_of(op.task.direction, op.task.stage)));
  }
  TRY(check_inputs(r, i, op, st));
  auto forward = [&](const Task& t) {
    counts_[index(t)].forward++;
    st.forward_done[index(t)] = true;
  };
  auto backward = [&](const Task& t, bool with_weight) -> Status {
    if (!st.forward_done[index(t)]) return fail(r, i, op, "a backward before its forward");
    counts_[index(t)].backward++;
    if (with_weight) counts_[index(t)].weight++;
    st.backward_done[index(t)] = true;
    return {};
  };
  switch (op.kind) {
    case OpKind::kForward:
      forward(op.task);
      break;
    case OpKind::kBackward:
      TRY(backward(op.task, true));
      break;
    case OpKind::kBackwardInput:
      TRY(backward(op.task, false));
      st.fifo.push_back(op.task);
      break;
    case OpKind::kWeight:
      if (st.fifo.empty()) return fail(r, i, op, "a weight-gradient op with an empty FIFO");
      if (!(st.fifo.front() == op.task)) {
        return fail(r, i, op,
                    fmt::format("weight gradients pop the FIFO in order; its front is {}",
                                op_label(Op{.kind = OpKind::kWeight, .task = st.fifo.front()})));
      }
      st.fifo.pop_front();
      counts_[index(op.task)].weight++;
      break;
    case OpKind::kForwardBackward:
      if (s_.chunk_of(op.task.direction, op.task.stage) == s_.chunk_of(op.task2.direction, op.task2.stage)) {
        return fail(r, i, op, "an overlapped F&B pair must use two different chunks");
      }
      forward(op.task);
      TRY(backward(op.task2, true));
      break;
    default:
      break;
  }
  return {};
}

// A local input must be produced earlier on this rank; a remote one received into a receive posted
// earlier on this rank.
Status Validator::check_inputs(int r, size_t i, const Op& op, RankState& st) {
  Flow flows[2];
  const int n = op_inputs(s_, op, flows);
  for (int k = 0; k < n; ++k) {
    const Flow& f = flows[k];
    const char* what = f.payload == Payload::kActivation ? "activation" : "gradient";
    if (s_.rank_of(f.producer.direction, f.producer.stage) == r) {
      const auto& done = f.payload == Payload::kActivation ? st.forward_done : st.backward_done;
      if (!done[index(f.producer)]) {
        return fail(
            r, i, op,
            fmt::format("its {} from stage {} (same rank) is not produced earlier", what, f.producer.stage));
      }
      continue;
    }
    const int tag = s_.tag(f.payload, f.producer);
    if (!st.posted.count(tag)) {
      return fail(r, i, op, fmt::format("no receive for its {} (tag {}) is posted before it", what, tag));
    }
    if (!st.consumed.insert(tag).second)
      return fail(r, i, op, fmt::format("receive tag {} consumed twice", tag));
  }
  return {};
}

Status Validator::check_comm(int r, size_t i, const Op& op, RankState& st) {
  const Task& t = op.task;
  const bool act = op.payload == Payload::kActivation;
  if (op.peer < 0 || op.peer >= s_.params.n_ranks || op.peer == r) {
    return fail(r, i, op, "the peer must be another rank");
  }
  if (s_.rank_of(t.direction, t.stage) != r) {
    return fail(r, i, op, fmt::format("stage {} of direction {} is not on this rank", t.stage, t.direction));
  }
  if (op.kind == OpKind::kSend) {
    const int to = act ? t.stage + 1 : t.stage - 1;
    if (to < 0 || to >= s_.n_stages || s_.rank_of(t.direction, to) != op.peer) {
      return fail(r, i, op, fmt::format("stage {} does not send this payload to rank {}", t.stage, op.peer));
    }
    if (op.tag != s_.tag(op.payload, t))
      return fail(r, i, op, fmt::format("expected tag {}", s_.tag(op.payload, t)));
    if (!(act ? st.forward_done : st.backward_done)[index(t)]) {
      return fail(r, i, op, "a send before the op that produces its data");
    }
    if (++sends_[op.tag] > 1) return fail(r, i, op, "a second send of the same data");
    return {};
  }
  const int from = act ? t.stage - 1 : t.stage + 1;
  if (from < 0 || from >= s_.n_stages || s_.rank_of(t.direction, from) != op.peer) {
    return fail(r, i, op, fmt::format("stage {} receives no such payload from rank {}", t.stage, op.peer));
  }
  const Task producer{t.direction, from, t.mb};
  if (op.tag != s_.tag(op.payload, producer)) {
    return fail(r, i, op, fmt::format("expected tag {}", s_.tag(op.payload, producer)));
  }
  if (!st.posted.insert(op.tag).second) return fail(r, i, op, "a second receive with the same tag");
  return {};
}

Status Validator::check_totals() const {
  for (int d = 0; d < s_.n_directions; ++d) {
    for (int stage = 0; stage < s_.n_stages; ++stage) {
      for (int mb = s_.mb_begin(d); mb < s_.mb_end(d); ++mb) {
        const Task t{d, stage, mb};
        const TaskCounts& c = counts_[index(t)];
        if (c.forward != 1 || c.backward != 1 || c.weight != 1) {
          return invalid_argument(
              "direction {} stage {} micro-batch {} (rank {}) has {} forwards, {} backwards and {} weight "
              "gradients; exactly one of each is required",
              d, stage, mb, s_.rank_of(d, stage), c.forward, c.backward, c.weight);
        }
        // Each cross-rank flow this task produces needs exactly one send (its receive was checked
        // at the consumer).
        Flow flows[2];
        const int n = op_outputs(s_, Op{.kind = OpKind::kForwardBackward, .task = t, .task2 = t}, flows);
        for (int k = 0; k < n; ++k) {
          const Flow& f = flows[k];
          if (s_.rank_of(f.consumer.direction, f.consumer.stage) == s_.rank_of(d, stage)) continue;
          auto it = sends_.find(s_.tag(f.payload, f.producer));
          if (it == sends_.end()) {
            return invalid_argument("the {} of direction {} stage {} micro-batch {} is never sent",
                                    f.payload == Payload::kActivation ? "activation" : "gradient", d, stage,
                                    mb);
          }
        }
      }
    }
  }
  return {};
}

}  // namespace

Status validate(const Schedule& schedule) {
  if (schedule.n_stages < 1 || schedule.params.n_microbatches < 1) {
    return invalid_argument("schedule has no stages or no micro-batches");
  }
  return Validator(schedule).run();
}

}  // namespace fathom::pipeline
