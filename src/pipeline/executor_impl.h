// Executor internals: the buffer plan (which buffer every message of a rank uses, and when each
// send may be completed), computed once per schedule from the op lists alone, and AdamW.
#pragma once

#include <span>
#include <vector>

#include "pipeline/executor.h"
#include "pipeline/pipeline.h"

namespace fathom::pipeline {

// Buffer classes: a buffer holds one micro-batch at one side of one local chunk.
//   class = chunk * 2 + side, side 0: the chunk's input (input_elems), 1: its output (output_elems).
inline int buffer_class(int chunk, int side) {
  return chunk * 2 + side;
}
inline constexpr int kBufferClasses = 4;

// A buffer: its class and its number within the class.
struct BufferRef {
  int cls = -1;
  int index = -1;
  bool valid() const { return index >= 0; }
};

// What each op of the rank touches; invalid refs are not used.
struct OpBuffers {
  // Compute ops (F&B: the forward half uses the *_act fields, the backward half the *_grad ones).
  BufferRef in_act;     // the forward's input (a receive or a local hand-over); invalid: data source
  BufferRef out_act;    // the forward's output if it leaves the chunk; invalid: last stage (loss)
  BufferRef out_grad;   // the backward's output gradient (received, handed over, or the loss's)
  BufferRef in_grad;    // the backward's input gradient; invalid: first stage (not needed)
  BufferRef loss_grad;  // a last-stage forward writes d(loss)/d(output) here
  BufferRef buffer;     // send and receive ops: their message's buffer
  // Send ops (indices into this rank's ops) whose requests are completed before this op runs.
  std::vector<int> retire;
};

struct BufferPlan {
  std::vector<OpBuffers> ops;          // [op index]
  int n_buffers[kBufferClasses] = {};  // buffers to allocate per class
  std::vector<int> finish;             // sends still open after the last op: completed at the step's end
  std::vector<int> slots;              // [chunk] saved-activation slots needed (peak live activations)
};

// Buffers are reused as soon as their message is done: a receive from its post until its consumer
// ends; a send from its producer until its retire op; a local hand-over or a loss gradient from its
// producer until its consumer ends. A send retires at the first op that happens after (through the
// schedule's messages) the receiver's consumer started; then its data is in the receiver's hands
// and MPI_Wait returns without needing the receiver to do anything more.
BufferPlan plan_buffers(const Schedule& schedule, int rank);

template <typename T>
class AdamW {
 public:
  explicit AdamW(size_t n) : m_(n, T(0)), v_(n, T(0)) {}
  // One step: p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), bias-corrected.
  void step(const AdamWParams& a, std::span<T> params, std::span<const T> grads);
  int64_t steps() const { return t_; }

 private:
  std::vector<T> m_, v_;
  int64_t t_ = 0;
};

}  // namespace fathom::pipeline
