// Internals shared by the schedule generators: limits and the per-rank compute orders (compute
// ops only; make_schedule adds the sends and receives with insert_communication).
#pragma once

#include <vector>

#include "base/function_ref.h"

#include "pipeline/pipeline.h"

namespace fathom::pipeline {

// Limits that keep every message tag below 2^31 (Schedule::max_tag < 2 * kMaxMicrobatches * 2 * kMaxRanks).
inline constexpr int kMaxRanks = 1024;
inline constexpr int kMaxMicrobatches = 1 << 18;

std::vector<Op> gpipe_order(const ScheduleParams& p, int rank);
std::vector<Op> one_f_one_b_order(const ScheduleParams& p, int rank);
std::vector<Op> zb1p_order(const ScheduleParams& p, int rank);
// DualPipe and DualPipeV (p.kind says which).
std::vector<Op> dualpipe_order(const ScheduleParams& p, int rank);

// One stage-to-stage data dependency: an activation flows to stage+1, a gradient to stage-1.
struct Flow {
  Payload payload = Payload::kActivation;
  Task producer;
  Task consumer;
};
// The flows a compute op consumes (op_inputs) or produces (op_outputs), at most two (F&B); local
// ones included. Returns the count written to `out`.
int op_inputs(const Schedule& s, const Op& op, Flow out[2]);
int op_outputs(const Schedule& s, const Op& op, Flow out[2]);

// Runs the ops under dependency semantics (as simulate() does) and calls visit(rank, op index) for
// each op in an order where every op comes after everything it depends on. Error on deadlock.
Status walk_schedule(const Schedule& s, FunctionRef<void(int rank, size_t index)> visit);

std::vector<Op> insert_communication(const Schedule& s, int rank, const std::vector<Op>& compute);

}  // namespace fathom::pipeline
