// Grouped expert SwiGLU (see moe.h). One call runs every routed expert over its tokens:
//   0. bucket the (token, slot) assignments by expert (counting sort, stable);
//   1. prepare x once per token in the gate/up weights' activation form, gather the prepared rows
//      into expert order (A = assignments rows);
//   2. tasks (expert, chunk of inter rows): gate and up rows of that chunk for the expert's tokens,
//      then h = silu(gate) * up in place;
//   3. prepare h (A rows) in the down weights' form;
//   4. tasks (expert, chunk of hidden rows): down rows of the chunk -> per-assignment outputs
//      (reusing the gathered-x buffer, dead by then);
//   5. per token: y = (y or 0) + sum of weight * output over its slots in ascending expert id.
// Every expert matrix row is read once per call; tasks are claimed dynamically over the pool, the
// heaviest experts' from one end of the list and the lightest experts' from the other, and each
// kernel call is told the weights its thread reads next (NextWeightsScope).
// Not here: expert-parallel exchange (ep/), the gate (moe_gate.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "base/check.h"
#include "kernels/matmul_impl.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "tensor/tensor.h"

namespace fathom {

using namespace matmul_internal;

namespace {
constexpr int kMaxTopK = 64;
}  // namespace

struct MoeWorkspace::Impl {
  struct Task {
    int32_t expert;
    int64_t r0, r1;
  };
  std::vector<int32_t> counts, offsets;  // [n_experts], [n_experts + 1]
  std::vector<int32_t> assign_token;     // [A] token of each assignment, grouped by expert
  std::vector<int32_t> slot_assign;      // [T * top_k] assignment of each slot, -1 when skipped
  std::vector<int32_t> order;            // the routed-to experts, most tokens first (expert_order)
  std::vector<Task> tasks, down_tasks;   // gate/up tasks, down tasks
  Buffer x_prep, xg, gate_out, up_out, h_prep;
};

MoeWorkspace::~MoeWorkspace() = default;

Result<std::unique_ptr<MoeWorkspace>> MoeWorkspace::create(const MoeExpertsParams& p, int64_t max_tokens) {
  if (p.n_experts < 1 || p.hidden < 1 || p.inter < 1 || p.top_k < 1 || p.top_k > kMaxTopK) {
    return invalid_argument(
        "moe workspace: n_experts {}, hidden {}, inter {} must be positive and top_k {} in [1, {}]",
        p.n_experts, p.hidden, p.inter, p.top_k, kMaxTopK);
  }
  if (max_tokens < 1 || max_tokens > (int64_t{1} << 24))
    return invalid_argument("moe workspace: max_tokens {} out of range", max_tokens);
  std::unique_ptr<MoeWorkspace> ws(new MoeWorkspace());
  ws->params_ = p;
  ws->max_tokens_ = max_tokens;
  ws->impl_ = std::make_unique<Impl>();
  Impl& s = *ws->impl_;
  const int64_t a = max_tokens * p.top_k;
  s.counts.resize(static_cast<size_t>(p.n_experts));
  s.offsets.resize(static_cast<size_t>(p.n_experts + 1));
  s.assign_token.resize(static_cast<size_t>(a));
  s.slot_assign.resize(static_cast<size_t>(a));
  s.order.reserve(static_cast<size_t>(p.n_experts));
  s.tasks.reserve(static_cast<size_t>(p.n_experts * ((p.inter + 63) / 64 + 1)));
  s.down_tasks.reserve(static_cast<size_t>(p.n_experts * ((p.hidden + 63) / 64 + 1)));
  s.x_prep = Buffer::allocate(act_scratch_bytes_any(max_tokens, p.hidden));
  s.xg = Buffer::allocate(
      std::max<uint64_t>(act_scratch_bytes_any(a, p.hidden), static_cast<uint64_t>(a * p.hidden) * 4));
  s.gate_out = Buffer::allocate(static_cast<uint64_t>(a * p.inter) * 4);
  s.up_out = Buffer::allocate(static_cast<uint64_t>(a * p.inter) * 4);
  s.h_prep = Buffer::allocate(act_scratch_bytes_any(a, p.inter));
  return ws;
}

Status validate_experts(const MoeExpertsParams& p, std::span<const ExpertWeights> experts) {
  if (static_cast<int64_t>(experts.size()) != p.n_experts) {
    return invalid_argument("moe experts: {} expert weights given for n_experts {}", experts.size(),
                            p.n_experts);
  }
  DType gate_type = DType::kCount, down_type = DType::kCount;
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& x = experts[e];
    if (x.gate.data == nullptr) continue;  // not held here
    const std::string name = fmt::format("expert {}", e);
    TRY(validate_weight(x.gate, name + " gate"));
    TRY(validate_weight(x.up, name + " up"));
    TRY(validate_weight(x.down, name + " down"));
    if (x.gate.rows != p.inter || x.gate.cols != p.hidden || x.up.rows != p.inter || x.up.cols != p.hidden) {
      return invalid_argument("{}: gate/up are [{}, {}] / [{}, {}], expected [inter {}, hidden {}]", name,
                              x.gate.rows, x.gate.cols, x.up.rows, x.up.cols, p.inter, p.hidden);
    }
    if (x.down.rows != p.hidden || x.down.cols != p.inter) {
      return invalid_argument("{}: down is [{}, {}], expected [hidden {}, inter {}]", name, x.down.rows,
                              x.down.cols, p.hidden, p.inter);
    }
    if (x.gate.dtype != x.up.dtype)
      return invalid_argument("{}: gate is {} but up is {}", name, dtype_name(x.gate.dtype),
                              dtype_name(x.up.dtype));
    if (gate_type == DType::kCount) {
      gate_type = x.gate.dtype;
      down_type = x.down.dtype;
    } else if (x.gate.dtype != gate_type || x.down.dtype != down_type) {
      return invalid_argument("{}: dtypes {}/{} differ from the other experts' {}/{}", name,
                              dtype_name(x.gate.dtype), dtype_name(x.down.dtype), dtype_name(gate_type),
                              dtype_name(down_type));
    }
  }
  return {};
}

namespace {

// Rows per task for an expert with n tokens: a multiple of the kernel's panel, at least 64.
int64_t chunk_rows(DType dtype, SimdLevel level, int64_t n) {
  const int64_t g = rows_granularity(dtype, level, n);
  // Row-wise (few tokens): long runs of rows, because each task's first rows are read before its
  // prefetching gets ahead of them (64-row tasks measured 10-15% slower per call than 256-row ones
  // at 1-16 tokens, `fathom bench moe`). Blocked GEMM (more tokens): a panel's worth per task.
  const int64_t want = n <= matvec_max_m(dtype, level) ? 256 : 64;
  return g * ((want + g - 1) / g);
}

// Counting sort of the assignments by expert; returns the number of assignments.
int64_t bucket(MoeWorkspace::Impl& s, int64_t n_experts, int top_k, const int32_t* ids, int64_t n_tokens,
               std::span<const ExpertWeights> experts) {
  std::fill(s.counts.begin(), s.counts.end(), 0);
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    const int32_t e = ids[i];
    if (e < 0) continue;
    CHECK_MSG(e < n_experts, "moe_experts: expert id {} >= n_experts {}", e, n_experts);
    CHECK_MSG(experts[static_cast<size_t>(e)].gate.data != nullptr,
              "moe_experts: expert {} is routed to but not held here", e);
    ++s.counts[static_cast<size_t>(e)];
  }
  s.offsets[0] = 0;
  for (int64_t e = 0; e < n_experts; ++e)
    s.offsets[static_cast<size_t>(e + 1)] =
        s.offsets[static_cast<size_t>(e)] + s.counts[static_cast<size_t>(e)];
  std::fill(s.counts.begin(), s.counts.end(), 0);
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    const int32_t e = ids[i];
    if (e < 0) {
      s.slot_assign[static_cast<size_t>(i)] = -1;
      continue;
    }
    const int32_t a = s.offsets[static_cast<size_t>(e)] + s.counts[static_cast<size_t>(e)]++;
    s.assign_token[static_cast<size_t>(a)] = static_cast<int32_t>(i / top_k);
    s.slot_assign[static_cast<size_t>(i)] = a;
  }
  return s.offsets[static_cast<size_t>(n_experts)];
}

// The experts with tokens, most tokens first (then by id), into s.order: the order of the task
// lists, which ThreadPool::run_from_both_ends claims from both ends. An expert with a few tokens
// streams its weights at what one core reads from memory, one with more tokens is bound by its
// arithmetic (docs/PERFORMANCE.md, "Expert tasks from both ends"), so with the light tasks claimed
// from the back while the heavy ones run from the front, both kinds share the cores: 1.01-1.02x
// at 24-48 tokens (`bench moe`, model-167 Xeon VM).
void expert_order(MoeWorkspace::Impl& s, int64_t n_experts) {
  const auto tokens = [&](int32_t e) {
    return s.offsets[static_cast<size_t>(e + 1)] - s.offsets[static_cast<size_t>(e)];
  };
  s.order.clear();
  for (int32_t e = 0; e < n_experts; ++e)
    if (tokens(e) > 0) s.order.push_back(e);
  std::sort(s.order.begin(), s.order.end(),
            [&](int32_t a, int32_t b) { return tokens(a) != tokens(b) ? tokens(a) > tokens(b) : a < b; });
}

// Tasks of `rows` rows per expert in s.order, each a run of rows for the expert's token count.
void make_tasks(const MoeWorkspace::Impl& s, int64_t rows, DType dtype, SimdLevel level,
                std::vector<MoeWorkspace::Impl::Task>& tasks) {
  tasks.clear();
  for (const int32_t e : s.order) {
    const int64_t n = s.offsets[static_cast<size_t>(e + 1)] - s.offsets[static_cast<size_t>(e)];
    const int64_t c = chunk_rows(dtype, level, n);
    for (int64_t r0 = 0; r0 < rows; r0 += c) tasks.push_back({e, r0, std::min(rows, r0 + c)});
  }
}

// The weight rows task i of `tasks` reads from matrix `which` of its expert, with their row length,
// for NextWeightsScope; none for i outside the list (no task).
NextWeights task_weights(std::span<const ExpertWeights> experts,
                         const std::vector<MoeWorkspace::Impl::Task>& tasks, int64_t i,
                         WeightView ExpertWeights::*which) {
  if (i < 0 || i >= static_cast<int64_t>(tasks.size())) return {};
  const MoeWorkspace::Impl::Task& t = tasks[static_cast<size_t>(i)];
  const WeightView& w = experts[static_cast<size_t>(t.expert)].*which;
  const auto at = [&](int64_t r) {
    return static_cast<int64_t>(dtype_bytes(w.dtype, static_cast<uint64_t>(r * w.cols)));
  };
  return {static_cast<const uint8_t*>(w.data) + at(t.r0), at(t.r1) - at(t.r0), at(1)};
}

DType first_dtype(std::span<const ExpertWeights> experts, bool down) {
  for (const auto& x : experts)
    if (x.gate.data != nullptr) return down ? x.down.dtype : x.gate.dtype;
  return DType::kF32;
}

// Step 5: y[t] = (y[t] or 0) + sum over t's slots, in ascending expert id, of weight * output.
void combine(const MoeExpertsParams& p, const MoeWorkspace::Impl& s, const int32_t* ids, const float* weights,
             const float* out, int64_t n_tokens, float* y, bool accumulate, ThreadPool& pool) {
  pool.parallel_for(n_tokens, 4, [&](int64_t t0, int64_t t1, int) {
    int order_storage[kMaxTopK];
    std::span<int> order(order_storage, static_cast<size_t>(p.top_k));
    for (int64_t t = t0; t < t1; ++t) {
      float* yt = y + t * p.hidden;
      if (!accumulate) std::memset(yt, 0, static_cast<size_t>(p.hidden) * 4);
      for (int j = 0; j < p.top_k; ++j) order[static_cast<size_t>(j)] = j;
      const int32_t* it = ids + t * p.top_k;
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return it[a] < it[b] || (it[a] == it[b] && a < b); });
      for (int j : order) {
        const int32_t a = s.slot_assign[static_cast<size_t>(t * p.top_k + j)];
        if (a < 0) continue;
        const float w = weights[t * p.top_k + j];
        const float* o = out + static_cast<int64_t>(a) * p.hidden;
        for (int64_t r = 0; r < p.hidden; ++r) yt[r] += w * o[r];
      }
    }
  });
}

}  // namespace

void moe_experts(const MoeExpertsParams& p, std::span<const ExpertWeights> experts, const float* x,
                 int64_t n_tokens, const int32_t* ids, const float* weights, float* y, bool accumulate,
                 MoeWorkspace& ws, ThreadPool& pool) {
  const MoeExpertsParams& wp = ws.params();
  CHECK(wp.n_experts == p.n_experts && wp.hidden == p.hidden && wp.inter == p.inter && wp.top_k == p.top_k);
  CHECK_MSG(n_tokens >= 0 && n_tokens <= ws.max_tokens(), "moe_experts: {} tokens > workspace max {}",
            n_tokens, ws.max_tokens());
  CHECK(static_cast<int64_t>(experts.size()) == p.n_experts);
  MoeWorkspace::Impl& s = ws.impl();
  const int64_t n_assign = bucket(s, p.n_experts, p.top_k, ids, n_tokens, experts);
  if (n_assign == 0) {
    if (!accumulate) std::memset(y, 0, static_cast<size_t>(n_tokens * p.hidden) * 4);
    return;
  }
  const SimdLevel level = simd_level();
  const DType gate_type = first_dtype(experts, false), down_type = first_dtype(experts, true);
  const RowsKernel gate_kernel = rows_kernel_for(gate_type, level),
                   down_kernel = rows_kernel_for(down_type, level);

  // 1. prepare x per token, gather into expert order (with the rows' fp16 form when some expert's
  // token count is in the fp8 fp16 kernel's range)
  bool f16_counts = false;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const int64_t n = s.offsets[static_cast<size_t>(e + 1)] - s.offsets[static_cast<size_t>(e)];
    f16_counts = f16_counts || (n >= 2 && n <= kFp8F16MaxM);
  }
  const ActView xp = prepare_activations(gate_type, level, x, n_tokens, p.hidden, p.hidden, s.x_prep.data(),
                                         pool, false, f16_counts ? 1 : 0);
  ActView xg = layout_activations(xp.kind, xp.bf16_perm64, n_assign, p.hidden, s.xg.data());
  if (xp.f16 != nullptr) act_enable_f16(xg);
  pool.parallel_for(n_assign, 16, [&](int64_t a0, int64_t a1, int) {
    for (int64_t a = a0; a < a1; ++a) copy_act_row(xp, s.assign_token[static_cast<size_t>(a)], xg, a);
  });
  act_build_xt(xg, gate_type, level, pool, /*lanes=*/false);

  // 2. gate and up, then h = silu(gate) * up
  auto* gate_out = s.gate_out.as<float>();
  auto* up_out = s.up_out.as<float>();
  expert_order(s, p.n_experts);
  make_tasks(s, p.inter, gate_type, level, s.tasks);
  make_tasks(s, p.hidden, down_type, level, s.down_tasks);
  const int64_t n_up = static_cast<int64_t>(s.tasks.size()),
                n_down = static_cast<int64_t>(s.down_tasks.size());
  pool.run_from_both_ends_ahead(n_up, [&](const ThreadPool::BothEndsStep& step, int) {
    const auto& task = s.tasks[static_cast<size_t>(step.task)];
    const ExpertWeights& ew = experts[static_cast<size_t>(task.expert)];
    const int64_t off = s.offsets[static_cast<size_t>(task.expert)],
                  n = s.offsets[static_cast<size_t>(task.expert + 1)] - off;
    const ActView xe = act_rows(xg, off, n);
    // Each kernel call's far L2 requests run on into what the thread reads next (NextWeightsScope):
    // from the gate rows into the up rows, from those into the thread's next task's gate rows
    // (after its last, the first down rows from its end of the list).
    {
      NextWeightsScope next(task_weights(experts, s.tasks, step.task, &ExpertWeights::up));
      gate_kernel(ew.gate, xe, gate_out + off * p.inter, p.inter, false, task.r0, task.r1);
    }
    {
      const int64_t first_down = step.from_front ? 0 : n_down - 1;
      NextWeightsScope next(step.next >= 0
                                ? task_weights(experts, s.tasks, step.next, &ExpertWeights::gate)
                                : task_weights(experts, s.down_tasks, first_down, &ExpertWeights::down));
      gate_kernel(ew.up, xe, up_out + off * p.inter, p.inter, false, task.r0, task.r1);
    }
    for (int64_t i = off; i < off + n; ++i) {
      float* g = gate_out + i * p.inter + task.r0;
      silu_mul(g, up_out + i * p.inter + task.r0, g, task.r1 - task.r0);
    }
  });

  // 3. prepare h; 4. down into per-assignment outputs (the gathered-x buffer is free again)
  ActView hp = prepare_activations(down_type, level, gate_out, n_assign, p.inter, p.inter, s.h_prep.data(),
                                   pool, false, f16_counts ? 1 : 0);
  act_build_xt(hp, down_type, level, pool, /*lanes=*/false);
  auto* out = s.xg.as<float>();
  pool.run_from_both_ends_ahead(n_down, [&](const ThreadPool::BothEndsStep& step, int) {
    const auto& task = s.down_tasks[static_cast<size_t>(step.task)];
    const int64_t off = s.offsets[static_cast<size_t>(task.expert)],
                  n = s.offsets[static_cast<size_t>(task.expert + 1)] - off;
    NextWeightsScope next(task_weights(experts, s.down_tasks, step.next, &ExpertWeights::down));
    down_kernel(experts[static_cast<size_t>(task.expert)].down, act_rows(hp, off, n), out + off * p.hidden,
                p.hidden, false, task.r0, task.r1);
  });

  // 5. weighted sum per token
  combine(p, s, ids, weights, out, n_tokens, y, accumulate, pool);
}

}  // namespace fathom
