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

}  // namespace

BufferPlan plan_buffers(const Schedule& s, int rank) {
  const std::vector<Op>& ops = s.ranks[size_t(rank)];
  const Causality causality = trace_causality(s, rank);
  BufferPlan plan;
  plan.ops.resize(ops.size());
  plan.slots = peak_activations_per_chunk(s, rank);
  std::vector<Message> msgs;
  std::map<int64_t, size_t> by_key;  // message key -> index in msgs (tag, or -1 - task for loss gradients)
  auto open = [&](int64_t key, int cls, size_t at) {
    CHECK(!by_key.count(key));
    by_key[key] = msgs.size();
    msgs.push_back(Message{.cls = cls, .start = 2 * int64_t(at)});
    return msgs.size() - 1;
  };
  auto chunk = [&](const Task& t) { return s.chunk_of(t.direction, t.stage); };
  // Tags are >= 0; a loss gradient is keyed by its task, below zero.
  auto loss_key = [&](const Task& t) { return -1 - (int64_t(t.stage) * s.params.n_microbatches + t.mb); };
  // Pass 1: open and close every message; remember which op field uses which message.
  std::vector<std::array<int64_t, 5>> fields(ops.size(),
                                             {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN});
  std::vector<int64_t> comm_key(ops.size(), INT64_MIN);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::kRecv) {
      const int side = op.payload == Payload::kActivation ? 0 : 1;
      open(op.tag, buffer_class(chunk(op.task), side), i);
      comm_key[i] = op.tag;
      continue;
    }
    if (op.kind == OpKind::kSend) {
      comm_key[i] = op.tag;
      auto it = causality.consumer_index.find(op.tag);
      CHECK(it != causality.consumer_index.end());
      // Retire at the first later op that knows the consumer has started.
      Message& m = msgs[by_key.at(op.tag)];
      for (size_t j = i + 1; j < ops.size(); ++j) {
        if (causality.clocks[j][size_t(op.peer)] >= it->second) {
          m.end = 2 * int64_t(j);
          plan.ops[j].retire.push_back(int(i));
          break;
        }
      }
      if (m.end == kForever) plan.finish.push_back(int(i));
      continue;
    }
    Flow in[2], out[2];
    const int n_in = op_inputs(s, op, in), n_out = op_outputs(s, op, out);
    for (int k = 0; k < n_in; ++k) {  // inputs: close their messages after this op
      const int64_t key = s.tag(in[k].payload, in[k].producer);
      msgs[by_key.at(key)].end = 2 * int64_t(i) + 1;
      fields[i][in[k].payload == Payload::kActivation ? 0 : 2] = key;
    }
    for (int k = 0; k < n_out; ++k) {  // outputs: open (a send closes at its retire op)
      const Flow& f = out[k];
      const int64_t key = s.tag(f.payload, f.producer);
      const int side = f.payload == Payload::kActivation ? 1 : 0;
      open(key, buffer_class(chunk(f.producer), side), i);
      fields[i][f.payload == Payload::kActivation ? 1 : 3] = key;
    }
    const bool has_forward = op.kind == OpKind::kForward || op.kind == OpKind::kForwardBackward;
    if (has_forward && op.task.stage == s.n_stages - 1) {
      open(loss_key(op.task), buffer_class(chunk(op.task), 1), i);
      fields[i][4] = loss_key(op.task);
    }
    const bool has_backward = op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardInput ||
                              op.kind == OpKind::kForwardBackward;
    const Task bwd = op.kind == OpKind::kForwardBackward ? op.task2 : op.task;
    if (has_backward && bwd.stage == s.n_stages - 1) {
      msgs[by_key.at(loss_key(bwd))].end = 2 * int64_t(i) + 1;
      fields[i][2] = loss_key(bwd);
    }
  }
  color(msgs, plan);
  // Pass 2: write buffer numbers into the op plans.
  auto ref = [&](int64_t key) {
    if (key == INT64_MIN) return BufferRef{};
    const Message& m = msgs[by_key.at(key)];
    return BufferRef{m.cls, m.buffer};
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    OpBuffers& b = plan.ops[i];
    if (!ops[i].is_compute()) {
      b.buffer = ref(comm_key[i]);
      continue;
    }
    b.in_act = ref(fields[i][0]);
    b.out_act = ref(fields[i][1]);
    b.out_grad = ref(fields[i][2]);
    b.in_grad = ref(fields[i][3]);
    b.loss_grad = ref(fields[i][4]);
  }
  return plan;
}

}  // namespace fathom::pipeline
