// The pipeline executor: runs one rank's op list (pipeline.h) on real stage modules, with MPI
// point-to-point between ranks. One executor per rank, all ranks of the communicator together.
//
//   auto ex = TRY(Executor<float>::create(schedule, MPI_COMM_WORLD, {&chunk0, &chunk1}, &data, {}));
//   for (int64_t step = 0; step < n_steps; ++step) {
//     StepStats stats = TRY(ex->run_step(step));  // forward/backward of every micro-batch + gradient sync
//     ex->apply_optimizer();                      // AdamW on each chunk, then its hook
//   }
//
// How it runs: receives are posted where the op list posts them (one compute op ahead) into
// buffers sized once from the schedule; a compute op waits only for the messages it consumes;
// sends are posted right after their producer and completed lazily, at the first op where the
// schedule proves the receiver has consumed them (so waiting can never block on a peer). Input-
// gradient ops push the weight gradient to a FIFO that W ops pop. With DualPipe, after the last
// op each stage's gradients are summed with the other copy's (rank n-1-r) in a fixed order, so the
// two copies stay bit-identical. Every compute op is timed.
//
// Results depend only on the op order, never on timing: the same schedule gives bit-identical
// losses and parameters with or without injected delays.
//
// Thread safety: an executor and its modules are used by one thread; MPI needs no more than
// MPI_THREAD_FUNNELED (modules may use the thread pool inside an op).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "pipeline/pipeline.h"

namespace fathom::pipeline {

// One model chunk on one rank: a run of consecutive layers with the backward split in two.
// Activations saved by forward() live in a slot until backward_weight() frees it; the executor
// picks slot numbers in [0, n_slots) and never uses a slot for two micro-batches at once.
// T is float or double.
template <typename T>
class StageModule {
 public:
  virtual ~StageModule() = default;
  virtual int64_t input_elems() const = 0;   // per micro-batch, at the chunk's input
  virtual int64_t output_elems() const = 0;  // per micro-batch, at its output
  // Allocates saved-activation storage for `n_slots` micro-batches in flight. Called once.
  virtual Status reserve(int n_slots) = 0;
  // input: [input_elems] -> output: [output_elems]; saves what the backward needs in `slot`.
  virtual void forward(int slot, const T* input, T* output) = 0;
  // output_grad: [output_elems] -> input_grad: [input_elems] (nullptr on the first stage: not
  // needed). Keeps what backward_weight needs.
  virtual void backward_input(int slot, const T* output_grad, T* input_grad) = 0;
  // Adds the slot's weight gradients to gradients() and frees the slot.
  virtual void backward_weight(int slot) = 0;
  // One forward of this chunk overlapped with a full backward of `other` (an F&B pair). The
  // default runs them one after the other; a module with communication inside (expert
  // parallelism) overlaps one's compute with the other's transfers here.
  virtual void forward_backward(int slot, const T* input, T* output, StageModule& other, int other_slot,
                                const T* other_output_grad, T* other_input_grad) {
    forward(slot, input, output);
    other.backward_input(other_slot, other_output_grad, other_input_grad);
    other.backward_weight(other_slot);
  }
  // All parameters and their gradients, each one contiguous slab in the same layout.
  virtual std::span<T> parameters() = 0;
  virtual std::span<T> gradients() = 0;
  // Called after the optimizer changed parameters() (to refresh derived copies, e.g. quantised).
  virtual void after_optimizer_step() {}
};

// Where micro-batches come from and how the last stage's output is scored.
template <typename T>
class DataSource {
 public:
  virtual ~DataSource() = default;
  // The first stage's input for micro-batch `mb` of step `step`: [first stage input_elems].
  virtual void input(int64_t step, int mb, T* out) = 0;
  // The loss of the last stage's output and d(loss)/d(output) into output_grad.
  virtual double loss(int64_t step, int mb, const T* output, T* output_grad) = 0;
};

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct ExecutorOptions {
  AdamWParams adamw;
  // Testing: sleep a uniform random time in [0, delay_ms_max] before each op (seeded per rank
  // and step). Results must not change.
  double delay_ms_max = 0;
  uint64_t delay_seed = 1;
  // Testing the checks: break one thing on rank 0 in step 0 (skip its first weight-gradient pass,
  // or add 1 to the first activation it sends).
  enum class Fault : uint8_t { kNone, kDropWeightGradient, kCorruptActivation };
  Fault fault = Fault::kNone;
};

// One compute op of this rank, timed from the step's start (after a barrier), in milliseconds.
struct OpRecord {
  int op_index = 0;     // into schedule.ranks[rank]
  double wait_ms = 0;   // start minus when the op began waiting for its inputs
  double start_ms = 0;  // inputs there, compute begins
  double end_ms = 0;
};

struct StepStats {
  std::vector<std::pair<int, double>> losses;  // (micro-batch, loss) for last stages on this rank
  std::vector<OpRecord> ops;                   // this rank's compute ops, in order
  double ops_ms = 0;                           // the op list, start to last op end
  double sync_ms = 0;                          // DualPipe's gradient exchange between copies
};

template <typename T>
class Executor {
 public:
  // chunks[c] runs Schedule::chunk_task(rank, c) (chunks_per_rank() of them); `data` feeds the
  // first stages and scores the last. Fails on a communicator whose size is not the schedule's
  // rank count, an invalid schedule, mismatched chunk sizes or tags past MPI_TAG_UB.
  static Result<std::unique_ptr<Executor>> create(const Schedule& schedule, MPI_Comm comm,
                                                  std::vector<StageModule<T>*> chunks, DataSource<T>* data,
                                                  const ExecutorOptions& options);
  virtual ~Executor() = default;

  // Zeroes the gradients, runs every op of this rank for step `step` and, for DualPipe, sums
  // each stage's gradients over its two copies. Collective over the communicator.
  virtual Result<StepStats> run_step(int64_t step) = 0;
  // AdamW on every chunk's parameters with the summed gradients, then after_optimizer_step().
  virtual void apply_optimizer() = 0;
};

extern template class Executor<float>;
extern template class Executor<double>;

}  // namespace fathom::pipeline
