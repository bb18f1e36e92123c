// pipeline: pipeline-parallel training schedules as pure data, and the tools to check, time and
// draw them. The MPI executor that runs a schedule on real stage modules is in executor.h.
//
//   Schedule s = TRY(make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 8, .n_microbatches = 20}));
//   TRY(validate(s));                                   // every rule a runnable schedule obeys
//   Simulation sim = TRY(simulate(s, {.f = 1, .b = 2, .w = 1}));
//   std::string svg = render_svg(timeline_from_simulation(s, sim));
//
// Vocabulary. The model is cut into `n_stages` consecutive stages. A micro-batch travels through
// stages 0..n_stages-1 in one `direction`; DualPipe feeds micro-batches from both ends, so it has
// two directions, and rank r holds stage r of direction 0 and stage n_ranks-1-r of direction 1
// (two copies of the model, whose gradients are summed before the optimizer step). A Task is one
// (direction, stage, micro-batch). Each rank holds one or two model chunks (Schedule::chunk_of).
//
// Costs follow the DualPipe README: F = forward, B = the full backward (input and weight
// gradients), W = its weight-gradient part; a split backward runs an input-gradient op costing
// B - W now and a weight-gradient op costing W later (through a per-rank FIFO); F&B is one
// forward overlapped with one full backward of the other chunk.
//
// Everything here is a pure function of its arguments, thread-safe, and allocates per call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom::pipeline {

enum class ScheduleKind : uint8_t { kGPipe, kOneFOneB, kZB1P, kDualPipe, kDualPipeV };
std::string_view schedule_name(ScheduleKind kind);  // "gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev"
Result<ScheduleKind> parse_schedule_kind(std::string_view name);

struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int n_ranks = 2;         // pipeline ranks (processes)
  int n_microbatches = 8;  // per optimizer step, over both directions
};

struct Task {
  int direction = 0;  // 0, or 1 for DualPipe's reverse pipeline
  int stage = 0;      // model stage, 0..n_stages-1 in the order data flows
  int mb = 0;         // micro-batch, 0..n_microbatches-1 (DualPipe: direction 1 holds the second half)
  friend bool operator==(const Task&, const Task&) = default;
};

enum class OpKind : uint8_t {
  kForward,          // F(task)
  kBackward,         // full backward of task: input and weight gradients (cost B)
  kBackwardInput,    // input gradient of task (cost B - W); its weight gradient joins the FIFO
  kWeight,           // weight gradient of task, the FIFO's front (cost W)
  kForwardBackward,  // F(task) overlapped with the full backward of task2 on the other chunk (F&B)
  kSend,             // post a non-blocking send of the payload `task` produced
  kRecv,             // post a non-blocking receive of the payload `task` consumes
};
enum class Payload : uint8_t { kActivation, kGradient };
std::string_view op_kind_name(OpKind kind);  // "F", "B", "Bi", "W", "F&B", "send", "recv"

struct Op {
  OpKind kind = OpKind::kForward;
  Task task;   // compute ops: the task; F&B: the forward part; send: producer; recv: consumer
  Task task2;  // F&B: the backward part
  Payload payload = Payload::kActivation;  // send/recv
  int peer = -1;                           // send/recv: the other rank
  int tag = -1;                            // send/recv: Schedule::tag(payload, producer task)
  bool is_compute() const { return kind != OpKind::kSend && kind != OpKind::kRecv; }
};
// "F3" forward, "B3" input gradient, "W3" weight gradient, "BW3" full backward, "F4&b9" an F&B pair
// (its backward is a full one); direction 1 in lower case. Sends and receives are spelled out.
std::string op_label(const Op& op);

struct Schedule {
  ScheduleParams params;
  int n_stages = 0;                    // n_ranks, or 2 * n_ranks for DualPipeV
  int n_directions = 1;                // 2 for DualPipe
  std::vector<std::vector<Op>> ranks;  // [rank] -> ops in execution order

  int rank_of(int direction, int stage) const;
  int chunk_of(int direction, int stage) const;  // 0 or 1: the local chunk that runs (direction, stage)
  int chunks_per_rank() const;                   // 2 for DualPipe and DualPipeV, else 1
  // The (direction, stage) local chunk `chunk` of `rank` runs.
  Task chunk_task(int rank, int chunk) const;
  int direction_of(int mb) const;
  int mb_begin(int direction) const;  // the direction's micro-batches are [mb_begin, mb_end)
  int mb_end(int direction) const;
  // Message tag of the payload `producer` makes (an activation for stage+1, a gradient for stage-1).
  int tag(Payload payload, const Task& producer) const;
  int max_tag() const;
};

// The schedule, or invalid_argument naming the rule the parameters break (DualPipe: an even number
// of ranks, an even number of micro-batches, at least 2 per rank).
Result<Schedule> make_schedule(const ScheduleParams& params);

// Every rule an executor relies on; the error names the rank, the op and the rule:
//  - every (direction, stage, micro-batch) has one F, one backward and one weight gradient (a full
//    B counts as both), on rank_of(direction, stage), F before backward before W;
//  - weight-gradient ops pop the FIFO in the order their input-gradient ops pushed it;
//  - an F&B pair uses two different chunks;
//  - every cross-rank dependency has one send after its producer and one matching receive (peer,
//    tag, payload) before its consumer; no other sends or receives;
//  - no deadlock when each rank runs its ops in order and an op waits only for its inputs.
Status validate(const Schedule& schedule);

struct Costs {
  double f = 1;              // forward
  double b = 2;              // full backward (input + weight gradients)
  double w = 1;              // weight-gradient part of b
  std::optional<double> fb;  // overlapped F&B; defaults to f + b
  std::optional<double> bi;  // input-gradient op; defaults to b - w (set it from measurements)
  double p2p = 0;            // latency from a send to its data being usable by the receiver
  double fb_cost() const { return fb ? *fb : f + b; }
  double bi_cost() const { return bi ? *bi : b - w; }
};
Status check_costs(const Costs& costs);

// Per-kind sums of measured op times (F, BW, Bi, W, F&B: OpKind order), turned into the mean costs
// the simulator takes (what `bench pipeline` and pipelined training predict bubbles from).
struct KindTimes {
  double sum[5] = {}, count[5] = {};
  void add(OpKind k, double ms) {
    sum[int(k)] += ms;
    count[int(k)] += 1;
  }
  void add(const KindTimes& o) {
    for (int k = 0; k < 5; ++k) sum[k] += o.sum[k], count[k] += o.count[k];
  }
  double mean(OpKind k) const { return count[int(k)] > 0 ? sum[int(k)] / count[int(k)] : 0.0; }
  Costs costs(double p2p) const;
};

struct OpTime {
  double start = 0;  // compute ops: start and end; send/recv: both equal the post time
  double end = 0;
};

struct Simulation {
  double makespan = 0;                     // last op end over all ranks (all ranks start at 0)
  std::vector<double> busy;                // [rank] sum of compute op costs
  std::vector<double> idle;                // [rank] makespan - busy
  double bubble = 0;                       // max idle
  std::vector<int> peak_activations;       // [rank] most micro-batch activations alive at once (F to W)
  std::vector<std::vector<OpTime>> times;  // [rank][op]
};

// Runs every rank's ops in order; an op starts when its rank is free and its inputs are there (a
// remote input arrives p2p after its send). Exact for integer costs. Errors: bad costs, deadlock.
Result<Simulation> simulate(const Schedule& schedule, const Costs& costs);
// Costs that differ per rank (stages of unequal size, or measured per rank); p2p from rank 0's.
Result<Simulation> simulate_per_rank(const Schedule& schedule, const std::vector<Costs>& per_rank);
// The same with every op's own cost ([rank][op], 0 for sends and receives): a measured run replayed
// without its waiting, to separate compute-time variation from communication and scheduling.
Result<Simulation> replay(const Schedule& schedule, const std::vector<std::vector<double>>& op_durations,
                          double p2p);

// Most simultaneously live activations of each local chunk of `rank` (F to its W or full B): the
// number of saved-activation slots a stage module needs.
std::vector<int> peak_activations_per_chunk(const Schedule& schedule, int rank);

// A timed picture of a run, simulated or real (executor.h makes one from measured op times).
struct TimelineEvent {
  int rank = 0;
  Op op;             // compute ops only
  double start = 0;  // in `unit`s from the start of the step
  double end = 0;
};
struct Timeline {
  std::string title;
  std::string unit = "";  // "ms", or "" for abstract simulator units
  int n_ranks = 0;
  int n_directions = 1;
  double makespan = 0;
  std::vector<double> idle;  // [rank]
  std::vector<TimelineEvent> events;
};
Timeline timeline_from_simulation(const Schedule& schedule, const Simulation& sim, std::string title);

// A per-rank text grid like the DualPipe README figure: one row per rank, one column per `cell`
// time units (0 picks the shortest op). Direction 0 ops are upper case, direction 1 lower case.
std::string render_grid(const Timeline& timeline, double cell = 0);
// Chrome trace event JSON (chrome://tracing, Perfetto): one thread per rank, an X event per op.
std::string render_chrome_trace(const Timeline& timeline);
// A standalone SVG timeline: one lane per rank, one box per op coloured by kind and direction.
std::string render_svg(const Timeline& timeline);

}  // namespace fathom::pipeline
