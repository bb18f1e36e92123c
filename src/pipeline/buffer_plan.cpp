// The executor's buffer plan: every message a rank touches gets a buffer for exactly its lifetime,
// and every send a retire op. Retire ops come from vector clocks over a dependency-ordered walk of
// all ranks: op i of rank r "knows" op c of rank q once a chain of messages leads from c to i.
#include <algorithm>
#include <array>
#include <map>
#include <queue>
#include <unordered_map>

#include "base/check.h"
#include "pipeline/executor_impl.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

namespace {

constexpr int64_t kForever = INT64_MAX;

using Clock = std::vector<int32_t>;  // [rank] -> index of the latest op of that rank known here

// For every op of `rank`, its vector clock; for each of rank's sends, the consumer op on the peer.
struct Causality {
  std::vector<Clock> clocks;                    // [op index of rank]
  std::unordered_map<int, int> consumer_index;  // tag -> compute op index on the receiving rank
};

Causality trace_causality(const Schedule& s, int rank) {
  const size_t n = s.ranks.size();
  Causality out;
  out.clocks.resize(s.ranks[size_t(rank)].size());
  std::vector<Clock> current(n, Clock(n, -1));
  std::unordered_map<int, Clock> sent;  // tag -> clock of its send op
  Status st = walk_schedule(s, [&](int r, size_t i) {
    const Op& op = s.ranks[size_t(r)][i];
    Clock& c = current[size_t(r)];
    c[size_t(r)] = static_cast<int32_t>(i);
    if (op.is_compute()) {
      Flow flows[2];
      const int k = op_inputs(s, op, flows);
      for (int f = 0; f < k; ++f) {
        if (s.rank_of(flows[f].producer.direction, flows[f].producer.stage) == r) continue;
        const int tag = s.tag(flows[f].payload, flows[f].producer);
        const Clock& from = sent.at(tag);
        for (size_t q = 0; q < n; ++q) c[q] = std::max(c[q], from[q]);
        out.consumer_index[tag] = static_cast<int>(i);
      }
    } else if (op.kind == OpKind::kSend) {
      sent[op.tag] = c;
    }
    if (r == rank) out.clocks[i] = c;
  });
  CHECK_MSG(st.ok(), "plan_buffers on an invalid schedule: {}", st.to_string());
  return out;
}

struct Message {
  int cls = 0;
  int64_t start = 0;       // acquire before this half-step (2 * op index)
  int64_t end = kForever;  // release at this half-step (2 * op + 1: after op; 2 * op: before op)
  int buffer = -1;
};

// Assigns each message the lowest free buffer of its class, in start order.
void color(std::vector<Message>& msgs, BufferPlan& plan) {
  std::vector<size_t> order(msgs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return msgs[a].start < msgs[b].start; });
  using Busy = std::pair<int64_t, int>;  // (end, buffer)
  std::priority_queue<Busy, std::vector<Busy>, std::greater<>> busy[kBufferClasses];
  std::priority_queue<int, std::vector<int>, std::greater<>> free_ids[kBufferClasses];
  for (size_t k : order) {
    Message& m = msgs[k];
    auto& b = busy[m.cls];
    auto& f = free_ids[m.cls];
    while (!b.empty() && b.top().first <= m.start) {
      f.push(b.top().second);
      b.pop();
    }
    if (f.empty()) f.push(plan.n_buffers[m.cls]++);
    m.buffer = f.top();
    f.pop();
    b.push({m.end, m.buffer});
  }
}

// Builds one rank's plan: pass 1 opens and closes every message and remembers which op field
// uses which message; color() numbers the buffers; pass 2 writes the numbers into the op plans.
class Planner {
 public:
  Planner(const Schedule& s, int rank)
      : s_(s), ops_(s.ranks[size_t(rank)]), causality_(trace_causality(s, rank)) {
    plan_.ops.resize(ops_.size());
    plan_.slots = peak_activations_per_chunk(s, rank);
    fields_.assign(ops_.size(), {kNone, kNone, kNone, kNone, kNone});
  }

  BufferPlan build() {
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      if (op.kind == OpKind::kRecv) {
        open(op.tag, buffer_class(chunk(op.task), op.payload == Payload::kActivation ? 0 : 1), i);
        fields_[i][kComm] = op.tag;
      } else if (op.kind == OpKind::kSend) {
        fields_[i][kComm] = op.tag;
        retire(i, op);
      } else {
        compute(i, op);
      }
    }
    color(msgs_, plan_);
    for (size_t i = 0; i < ops_.size(); ++i) {
      OpBuffers& b = plan_.ops[i];
      if (!ops_[i].is_compute()) {
        b.buffer = ref(fields_[i][kComm]);
        continue;
      }
      b.in_act = ref(fields_[i][kInAct]);
      b.out_act = ref(fields_[i][kOutAct]);
      b.out_grad = ref(fields_[i][kOutGrad]);
      b.in_grad = ref(fields_[i][kInGrad]);
      b.loss_grad = ref(fields_[i][kLossGrad]);
    }
    return std::move(plan_);
  }

 private:
  static constexpr int64_t kNone = INT64_MIN;
  // Field slots; a send or receive uses kComm (= kInAct: comm ops have no compute fields).
  enum { kInAct = 0, kOutAct = 1, kOutGrad = 2, kInGrad = 3, kLossGrad = 4, kComm = 0 };

  int chunk(const Task& t) const { return s_.chunk_of(t.direction, t.stage); }
  // Tags are >= 0; a loss gradient is keyed by its task, below zero.
  int64_t loss_key(const Task& t) const { return -1 - (int64_t(t.stage) * s_.params.n_microbatches + t.mb); }

  void open(int64_t key, int cls, size_t at) {
    CHECK(!by_key_.count(key));
    by_key_[key] = msgs_.size();
    msgs_.push_back(Message{.cls = cls, .start = 2 * int64_t(at)});
  }
  void close_after(int64_t key, size_t at) { msgs_[by_key_.at(key)].end = 2 * int64_t(at) + 1; }

  // A send retires at the first later op that knows its consumer has started.
  void retire(size_t i, const Op& op) {
    auto it = causality_.consumer_index.find(op.tag);
    CHECK(it != causality_.consumer_index.end());
    Message& m = msgs_[by_key_.at(op.tag)];
    for (size_t j = i + 1; j < ops_.size(); ++j) {
      if (causality_.clocks[j][size_t(op.peer)] >= it->second) {
        m.end = 2 * int64_t(j);
        plan_.ops[j].retire.push_back(int(i));
        return;
      }
    }
    plan_.finish.push_back(int(i));
  }

  void compute(size_t i, const Op& op) {
    Flow in[2], out[2];
    const int n_in = op_inputs(s_, op, in), n_out = op_outputs(s_, op, out);
    for (int k = 0; k < n_in; ++k) {  // inputs: their messages end after this op
      const int64_t key = s_.tag(in[k].payload, in[k].producer);
      close_after(key, i);
      fields_[i][in[k].payload == Payload::kActivation ? kInAct : kOutGrad] = key;
    }
    for (int k = 0; k < n_out; ++k) {  // outputs start here (a send ends at its retire op)
      const Flow& f = out[k];
      const int64_t key = s_.tag(f.payload, f.producer);
      const bool act = f.payload == Payload::kActivation;
      open(key, buffer_class(chunk(f.producer), act ? 1 : 0), i);
      fields_[i][act ? kOutAct : kInGrad] = key;
    }
    const bool has_forward = op.kind == OpKind::kForward || op.kind == OpKind::kForwardBackward;
    if (has_forward && op.task.stage == s_.n_stages - 1) {  // the loss gradient lives until the backward
      open(loss_key(op.task), buffer_class(chunk(op.task), 1), i);
      fields_[i][kLossGrad] = loss_key(op.task);
    }
    const bool has_backward = op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardInput ||
                              op.kind == OpKind::kForwardBackward;
    const Task& bwd = op.kind == OpKind::kForwardBackward ? op.task2 : op.task;
    if (has_backward && bwd.stage == s_.n_stages - 1) {
      close_after(loss_key(bwd), i);
      fields_[i][kOutGrad] = loss_key(bwd);
    }
  }

  BufferRef ref(int64_t key) const {
    if (key == kNone) return BufferRef{};
    const Message& m = msgs_[by_key_.at(key)];
    return BufferRef{m.cls, m.buffer};
  }

  const Schedule& s_;
  const std::vector<Op>& ops_;
  const Causality causality_;
  BufferPlan plan_;
  std::vector<Message> msgs_;
  std::map<int64_t, size_t> by_key_;            // message key -> index in msgs_
  std::vector<std::array<int64_t, 5>> fields_;  // [op] message key per field
};

}  // namespace

BufferPlan plan_buffers(const Schedule& s, int rank) {
  return Planner(s, rank).build();
}

}  // namespace fathom::pipeline
