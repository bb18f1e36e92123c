// The MPI executor: one rank's op list on real stage modules (contract in executor.h). Buffers and
// send completion points come from the buffer plan (buffer_plan.cpp); this file does the MPI
// calls, the weight-gradient FIFO, DualPipe's gradient exchange and the per-op timing.
#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "pipeline/executor_impl.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {

namespace {

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

Status mpi_status(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return {};
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return unavailable("pipeline: {}: MPI error: {}", what, std::string_view(text, static_cast<size_t>(len)));
}

double ms_since(uint64_t t0) {
  return static_cast<double>(now_ns() - t0) * 1e-6;
}

template <typename T>
class ExecutorImpl final : public Executor<T> {
 public:
  ExecutorImpl(const Schedule& s, MPI_Comm comm, int rank, std::vector<StageModule<T>*> chunks,
               DataSource<T>* data, const ExecutorOptions& o)
      : s_(s), comm_(comm), rank_(rank), chunks_(std::move(chunks)), data_(data), options_(o) {}
  ~ExecutorImpl() override {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Status init();
  Result<StepStats> run_step(int64_t step) override;
  void apply_optimizer() override;

 private:
  T* buffer(BufferRef r) {
    CHECK(r.valid());
    return slabs_[size_t(r.cls)].data() + size_t(r.index) * size_t(class_elems_[size_t(r.cls)]);
  }
  int chunk_of(const Task& t) const { return s_.chunk_of(t.direction, t.stage); }
  Status check_sizes();
  Status wait_inputs(const Op& op);
  Status run_op(size_t i, StepStats& stats);
  void run_compute(size_t i, const Op& op, StepStats& stats);
  void forward_half(const Op& op, const OpBuffers& b, const T** in, T** out);
  // True once, on rank 0 in step 0, if `fault` is the one to inject.
  bool inject(ExecutorOptions::Fault fault) {
    if (options_.fault != fault || rank_ != 0 || step_ != 0 || injected_) return false;
    injected_ = true;
    return true;
  }
  int acquire_slot(const Task& t);
  void release_slot(const Task& t);
  Status exchange_gradients();

  const Schedule s_;
  MPI_Comm comm_;
  const int rank_;
  std::vector<StageModule<T>*> chunks_;
  DataSource<T>* data_;
  const ExecutorOptions options_;
  BufferPlan plan_;
  std::vector<T> slabs_[kBufferClasses];
  int64_t class_elems_[kBufferClasses] = {};
  std::vector<MPI_Request> requests_;         // [op index] for sends and receives
  std::unordered_map<int, size_t> recv_op_;   // tag -> index of its receive op
  std::vector<int> slot_of_;                  // [chunk * n_microbatches + mb]
  std::vector<std::vector<int>> free_slots_;  // [chunk]
  std::deque<Task> fifo_;                     // weight gradients to run, oldest first
  std::vector<T> first_input_, last_output_;  // the data source's input, the last stage's output
  std::vector<AdamW<T>> adamw_;
  std::vector<std::vector<T>> peer_grads_;  // DualPipe: the other copy's gradients [chunk]
  int64_t step_ = 0;
  bool injected_ = false;
};

template <typename T>
Status ExecutorImpl<T>::init() {
  TRY(validate(s_));
  const int n_chunks = s_.chunks_per_rank();
  if (static_cast<int>(chunks_.size()) != n_chunks) {
    return invalid_argument("{} needs {} chunks per rank, got {}", schedule_name(s_.params.kind), n_chunks,
                            chunks_.size());
  }
  int* tag_ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &flag);
  if (flag && *tag_ub < s_.max_tag() + 2) {
    return resource_exhausted(
        "pipeline: the schedule needs message tags up to {} but MPI_TAG_UB is {}; use fewer "
        "micro-batches or stages",
        s_.max_tag() + 2, *tag_ub);
  }
  TRY(check_sizes());
  plan_ = plan_buffers(s_, rank_);
  for (int c = 0; c < n_chunks; ++c) {
    class_elems_[buffer_class(c, 0)] = chunks_[size_t(c)]->input_elems();
    class_elems_[buffer_class(c, 1)] = chunks_[size_t(c)]->output_elems();
    TRY(chunks_[size_t(c)]->reserve(std::max(1, plan_.slots[size_t(c)])));
    free_slots_.emplace_back();
    for (int k = plan_.slots[size_t(c)] - 1; k >= 0; --k) free_slots_.back().push_back(k);
    adamw_.emplace_back(chunks_[size_t(c)]->parameters().size());
    if (s_.params.kind == ScheduleKind::kDualPipe)
      peer_grads_.emplace_back(chunks_[size_t(c)]->gradients().size());
  }
  for (int k = 0; k < kBufferClasses; ++k) {
    slabs_[k].assign(size_t(plan_.n_buffers[k]) * size_t(class_elems_[k]), T(0));
  }
  const auto& ops = s_.ranks[size_t(rank_)];
  requests_.assign(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::kRecv) recv_op_[ops[i].tag] = i;
  }
  slot_of_.assign(size_t(n_chunks) * size_t(s_.params.n_microbatches), -1);
  int64_t first = 0, last = 0;  // sized for whichever local chunk is a first or last stage
  for (auto* c : chunks_) {
    first = std::max(first, c->input_elems());
    last = std::max(last, c->output_elems());
  }
  first_input_.resize(size_t(first));
  last_output_.resize(size_t(last));
  return {};
}

// Every stage's output must be as long as the next stage's input, across ranks, and DualPipe's two
// copies of a stage must have the same parameter count.
template <typename T>
Status ExecutorImpl<T>::check_sizes() {
  constexpr int kPer = 6;  // per rank: (input, output, parameters) of up to two chunks
  const int n = s_.params.n_ranks;
  std::vector<int64_t> mine(kPer, -1), all(static_cast<size_t>(kPer * n));
  for (int c = 0; c < s_.chunks_per_rank(); ++c) {
    mine[size_t(3 * c)] = chunks_[size_t(c)]->input_elems();
    mine[size_t(3 * c + 1)] = chunks_[size_t(c)]->output_elems();
    mine[size_t(3 * c + 2)] = static_cast<int64_t>(chunks_[size_t(c)]->parameters().size());
  }
  TRY(mpi_status(MPI_Allgather(mine.data(), kPer, MPI_INT64_T, all.data(), kPer, MPI_INT64_T, comm_),
                 "size check"));
  auto size_of = [&](int d, int stage, int what) {
    return all[size_t(kPer * s_.rank_of(d, stage) + 3 * s_.chunk_of(d, stage) + what)];
  };
  for (int d = 0; d < s_.n_directions; ++d) {
    for (int stage = 0; stage < s_.n_stages; ++stage) {
      if (stage + 1 < s_.n_stages && size_of(d, stage, 1) != size_of(d, stage + 1, 0)) {
        return invalid_argument("pipeline: stage {} outputs {} values per micro-batch but stage {} takes {}",
                                stage, size_of(d, stage, 1), stage + 1, size_of(d, stage + 1, 0));
      }
      if (d == 1 && size_of(0, stage, 2) != size_of(1, stage, 2)) {
        return invalid_argument("pipeline: the two copies of stage {} have {} and {} parameters", stage,
                                size_of(0, stage, 2), size_of(1, stage, 2));
      }
    }
  }
  return {};
}

template <typename T>
int ExecutorImpl<T>::acquire_slot(const Task& t) {
  const int c = chunk_of(t);
  auto& free = free_slots_[size_t(c)];
  CHECK_MSG(!free.empty(), "no free activation slot on chunk {} (plan said {})", c, plan_.slots[size_t(c)]);
  const int slot = free.back();
  free.pop_back();
  slot_of_[size_t(c * s_.params.n_microbatches + t.mb)] = slot;
  return slot;
}

template <typename T>
void ExecutorImpl<T>::release_slot(const Task& t) {
  const int c = chunk_of(t);
  int& slot = slot_of_[size_t(c * s_.params.n_microbatches + t.mb)];
  CHECK(slot >= 0);
  free_slots_[size_t(c)].push_back(slot);
  slot = -1;
}

// Waits for the receives this op consumes (and only those).
template <typename T>
Status ExecutorImpl<T>::wait_inputs(const Op& op) {
  Flow flows[2];
  const int n = op_inputs(s_, op, flows);
  for (int k = 0; k < n; ++k) {
    if (s_.rank_of(flows[k].producer.direction, flows[k].producer.stage) == rank_) continue;
    const size_t r = recv_op_.at(s_.tag(flows[k].payload, flows[k].producer));
    TRY(mpi_status(MPI_Wait(&requests_[r], MPI_STATUS_IGNORE), "wait for a receive"));
  }
  return {};
}

template <typename T>
void ExecutorImpl<T>::forward_half(const Op& op, const OpBuffers& b, const T** in, T** out) {
  const Task& t = op.task;
  if (t.stage == 0) {
    data_->input(step_, t.mb, first_input_.data());
    *in = first_input_.data();
  } else {
    *in = buffer(b.in_act);
  }
  *out = t.stage == s_.n_stages - 1 ? last_output_.data() : buffer(b.out_act);
}

template <typename T>
void ExecutorImpl<T>::run_compute(size_t i, const Op& op, StepStats& stats) {
  const OpBuffers& b = plan_.ops[i];
  auto score = [&](const Task& t) {  // the last stage: loss and its gradient right after the forward
    if (t.stage == s_.n_stages - 1) {
      stats.losses.push_back({t.mb, data_->loss(step_, t.mb, last_output_.data(), buffer(b.loss_grad))});
    }
  };
  auto slot_of = [&](const Task& t) {
    return slot_of_[size_t(chunk_of(t) * s_.params.n_microbatches + t.mb)];
  };
  switch (op.kind) {
    case OpKind::kForward: {
      const T* in;
      T* out;
      forward_half(op, b, &in, &out);
      chunks_[size_t(chunk_of(op.task))]->forward(acquire_slot(op.task), in, out);
      score(op.task);
      break;
    }
    case OpKind::kBackward:
    case OpKind::kBackwardInput: {
      StageModule<T>& m = *chunks_[size_t(chunk_of(op.task))];
      m.backward_input(slot_of(op.task), buffer(b.out_grad),
                       op.task.stage == 0 ? nullptr : buffer(b.in_grad));
      if (op.kind == OpKind::kBackward) {
        if (!inject(ExecutorOptions::Fault::kDropWeightGradient)) m.backward_weight(slot_of(op.task));
        release_slot(op.task);
      } else {
        fifo_.push_back(op.task);
      }
      break;
    }
    case OpKind::kWeight: {
      CHECK(!fifo_.empty() && fifo_.front() == op.task);
      fifo_.pop_front();
      if (!inject(ExecutorOptions::Fault::kDropWeightGradient)) {
        chunks_[size_t(chunk_of(op.task))]->backward_weight(slot_of(op.task));
      }
      release_slot(op.task);
      break;
    }
    case OpKind::kForwardBackward: {
      const T* in;
      T* out;
      forward_half(op, b, &in, &out);
      const Task& tb = op.task2;
      const int slot_f = acquire_slot(op.task);
      chunks_[size_t(chunk_of(op.task))]->forward_backward(slot_f, in, out, *chunks_[size_t(chunk_of(tb))],
                                                           slot_of(tb), buffer(b.out_grad),
                                                           tb.stage == 0 ? nullptr : buffer(b.in_grad));
      release_slot(tb);
      score(op.task);
      break;
    }
    default:
      break;
  }
}

template <typename T>
Status ExecutorImpl<T>::run_op(size_t i, StepStats& stats) {
  const Op& op = s_.ranks[size_t(rank_)][i];
  const OpBuffers& b = plan_.ops[i];
  for (int k : b.retire) {
    TRY(mpi_status(MPI_Wait(&requests_[size_t(k)], MPI_STATUS_IGNORE), "complete a send"));
  }
  const MPI_Datatype type = mpi_type<T>();
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
    const int count = static_cast<int>(class_elems_[size_t(b.buffer.cls)]);
    T* data = buffer(b.buffer);
    if (op.kind == OpKind::kSend && op.payload == Payload::kActivation &&
        inject(ExecutorOptions::Fault::kCorruptActivation)) {
      data[0] += T(1);
    }
    const int rc = op.kind == OpKind::kSend
                       ? MPI_Isend(data, count, type, op.peer, op.tag, comm_, &requests_[i])
                       : MPI_Irecv(data, count, type, op.peer, op.tag, comm_, &requests_[i]);
    return mpi_status(rc, op.kind == OpKind::kSend ? "post a send" : "post a receive");
  }
  const uint64_t t_wait = now_ns();
  TRY(wait_inputs(op));
  const uint64_t t_start = now_ns();
  run_compute(i, op, stats);
  const uint64_t t_end = now_ns();
  stats.ops.push_back(OpRecord{.op_index = static_cast<int>(i),
                               .wait_ms = static_cast<double>(t_start - t_wait) * 1e-6,
                               .start_ms = static_cast<double>(t_start) * 1e-6,
                               .end_ms = static_cast<double>(t_end) * 1e-6});
  return {};
}

template <typename T>
Result<StepStats> ExecutorImpl<T>::run_step(int64_t step) {
  step_ = step;
  for (auto* c : chunks_) std::fill(c->gradients().begin(), c->gradients().end(), T(0));
  StepStats stats;
  Rng delays(splitmix64(options_.delay_seed ^ splitmix64(uint64_t(rank_) * 1000003u + uint64_t(step))));
  TRY(mpi_status(MPI_Barrier(comm_), "barrier"));
  const uint64_t t0 = now_ns();
  const size_t n_ops = s_.ranks[size_t(rank_)].size();
  for (size_t i = 0; i < n_ops; ++i) {
    if (options_.delay_ms_max > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double, std::milli>(delays.uniform() * options_.delay_ms_max));
    }
    TRY(run_op(i, stats));
  }
  for (int k : plan_.finish) {
    TRY(mpi_status(MPI_Wait(&requests_[size_t(k)], MPI_STATUS_IGNORE), "complete a send"));
  }
  CHECK(fifo_.empty());
  stats.ops_ms = ms_since(t0);
  const double origin = static_cast<double>(t0) * 1e-6;
  for (OpRecord& r : stats.ops) {
    r.start_ms -= origin;
    r.end_ms -= origin;
  }
  const uint64_t t_sync = now_ns();
  if (s_.params.kind == ScheduleKind::kDualPipe) TRY(exchange_gradients());
  stats.sync_ms = ms_since(t_sync);
  return stats;
}

// DualPipe: rank r's chunk c and rank n-1-r's chunk 1-c are the two copies of one stage. Both
// ranks add direction 0's gradient to direction 1's, in that order, so the sums are bit-identical.
template <typename T>
Status ExecutorImpl<T>::exchange_gradients() {
  const int partner = s_.params.n_ranks - 1 - rank_;
  const int base = s_.max_tag() + 1;
  MPI_Request reqs[4];
  for (int c = 0; c < 2; ++c) {
    std::span<T> g = chunks_[size_t(c)]->gradients();
    const int count = static_cast<int>(g.size());
    // Chunk c holds direction c; the partner's copy of the same stage is its direction 1-c.
    TRY(mpi_status(MPI_Isend(g.data(), count, mpi_type<T>(), partner, base + c, comm_, &reqs[2 * c]),
                   "send grads"));
    TRY(mpi_status(MPI_Irecv(peer_grads_[size_t(c)].data(), count, mpi_type<T>(), partner, base + (1 - c),
                             comm_, &reqs[2 * c + 1]),
                   "receive grads"));
  }
  TRY(mpi_status(MPI_Waitall(4, reqs, MPI_STATUSES_IGNORE), "gradient exchange"));
  for (int c = 0; c < 2; ++c) {
    std::span<T> g = chunks_[size_t(c)]->gradients();
    const T* peer = peer_grads_[size_t(c)].data();
    if (c == 0) {
      for (size_t k = 0; k < g.size(); ++k) g[k] = g[k] + peer[k];
    } else {
      for (size_t k = 0; k < g.size(); ++k) g[k] = peer[k] + g[k];
    }
  }
  return {};
}

template <typename T>
void ExecutorImpl<T>::apply_optimizer() {
  for (size_t c = 0; c < chunks_.size(); ++c) {
    adamw_[c].step(options_.adamw, chunks_[c]->parameters(), chunks_[c]->gradients());
    chunks_[c]->after_optimizer_step();
  }
}

}  // namespace

template <typename T>
Result<std::unique_ptr<Executor<T>>> Executor<T>::create(const Schedule& schedule, MPI_Comm comm,
                                                         std::vector<StageModule<T>*> chunks,
                                                         DataSource<T>* data,
                                                         const ExecutorOptions& options) {
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  if (size != schedule.params.n_ranks) {
    return invalid_argument(
        "pipeline: the schedule has {} ranks but the communicator has {} processes (run it as "
        "mpirun -np {})",
        schedule.params.n_ranks, size, schedule.params.n_ranks);
  }
  if (data == nullptr) return invalid_argument("pipeline: no data source");
  for (auto* c : chunks) {
    if (c == nullptr) return invalid_argument("pipeline: a null stage module");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  TRY(mpi_status(MPI_Comm_dup(comm, &dup), "duplicate the communicator"));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  auto ex = std::make_unique<ExecutorImpl<T>>(schedule, dup, rank, std::move(chunks), data, options);
  TRY(ex->init());
  return std::unique_ptr<Executor<T>>(std::move(ex));
}

template class Executor<float>;
template class Executor<double>;

}  // namespace fathom::pipeline
