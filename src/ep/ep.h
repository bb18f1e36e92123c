// ep: expert-parallel dispatch and combine for MoE layers across processes (DeepEP on CPUs).
//
// Every rank of an MPI communicator holds num_experts / num_ranks routed experts (rank r owns
// experts [r*L, (r+1)*L), L = local experts). A MoE layer sends each token to the ranks holding
// its top-k experts (dispatch), runs its local experts on what arrived, and sends the results
// back (combine). Ranks on one machine exchange rows through one shared-memory arena per node;
// ranks on different nodes through MPI point-to-point messages of exact sizes.
//
// Two modes, as in DeepEP:
// - Normal (high throughput, prefill/training): dispatch() sends each token once per destination
//   rank; the receiver gets [n_recv, hidden] rows ordered by source rank, then source token, with
//   their local top-k ids and weights. combine() sums the per-rank results back (no weights: the
//   caller folded them in). Intra-node, the sender writes each row once, directly into its final
//   slot of the receiver's output. Options: hierarchical inter-node routing (one copy per
//   destination node, fanned out through shared memory there), cached dispatch (reuse a handle).
// - Low latency (decode): fixed capacity max_tokens_per_rank, no counts pre-exchange, output
//   [local_experts, ranks * max_tokens_per_rank, hidden] plus per-expert counts, split into
//   send/recv so computation can overlap; combine applies the top-k weights.
//
// Lifetime and threading: an EpGroup is created collectively (every rank of the communicator
// calls create with the same options) and sizes every buffer once; no call allocates. Calls are
// collective and must be made in the same order on every rank, from one thread per rank (MPI is
// driven from the calling thread; row copies use default_pool()). Output views point into the
// group's buffers: normal-mode outputs stay valid until the next normal-mode dispatch, low-latency
// outputs until the next ll_dispatch_send.
//
// Errors: every wait has a deadline (EpOptions::timeout_ms) and a timeout names the stalled peer
// and phase; the group is unusable after a timeout. Calls that disagree between ranks (hidden size,
// format, top-k, handle, capacity) fail on every rank with the same message, and the group stays
// usable. Wire formats and the protocol are in docs/ep.md.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace fathom::ep {

// ---- Wire formats ---------------------------------------------------------------------------
// Row formats on the wire and in the outputs. FP8 is e4m3 with one f32 scale per 128 values of a
// row (DeepEP's per_token_cast_to_fp8: amax over the group clamped to 1e-4, q = x * (448 / amax),
// scale = amax / 448, value = q * scale); dispatch only. Combine uses kF32 or kBF16.
enum class WireFormat : uint8_t { kF32 = 0, kBF16 = 1, kFP8 = 2 };

constexpr int64_t kFp8Group = 128;
std::string_view wire_format_name(WireFormat f);
Result<WireFormat> parse_wire_format(std::string_view name);  // "f32", "bf16", "fp8"
inline int64_t fp8_scale_cols(int64_t hidden) {
  return (hidden + kFp8Group - 1) / kFp8Group;
}
uint64_t wire_row_bytes(WireFormat f, int64_t hidden);  // data bytes of one row (scales apart)

// x: [rows, hidden] f32 or bf16 -> q: [rows, hidden] e4m3, scales: [rows, fp8_scale_cols] f32.
Status per_token_cast_to_fp8(const Tensor& x, uint8_t* q, float* scales);
// q: [rows, hidden] e4m3 with scales [rows, fp8_scale_cols] -> out: [rows, hidden] f32.
void per_token_cast_back(const uint8_t* q, const float* scales, int64_t rows, int64_t hidden, float* out);

// ---- Layout (DeepEP's get_dispatch_layout) ---------------------------------------------------
// Where experts live: expert e on rank e / (num_experts / num_ranks); node_of_rank groups ranks
// into nodes (ascending node ids 0..nodes-1).
struct Placement {
  int num_experts = 0;
  int num_ranks = 0;
  std::vector<int> node_of_rank;  // [num_ranks]
  int num_nodes() const;
  int experts_per_rank() const { return num_ranks ? num_experts / num_ranks : 0; }
  Status validate() const;
};

// Sized once for max_tokens; compute_layout fills the first num_tokens rows.
struct Layout {
  int64_t num_tokens = 0;
  int num_ranks = 0, num_nodes = 0, num_experts = 0;
  std::vector<int32_t> tokens_per_rank;    // [ranks]: tokens sent to each rank (once per rank)
  std::vector<int32_t> tokens_per_node;    // [nodes]: tokens sent to each node (once per node)
  std::vector<int32_t> tokens_per_expert;  // [experts]
  std::vector<uint8_t> token_in_rank;      // [max_tokens, ranks]: 1 if the token goes to the rank
  std::vector<int32_t> slot_in_rank;       // [max_tokens, ranks]: its index among that rank's tokens, or -1
  std::vector<int32_t> slot_in_node;       // [max_tokens, nodes]: its index among that node's tokens, or -1
  static Layout sized(const Placement& p, int64_t max_tokens);
};

// topk_idx: [num_tokens, topk] expert ids, -1 = none. An id out of range or selected twice by
// one token is an error naming the token.
Status compute_layout(const Placement& placement, const int32_t* topk_idx, int64_t num_tokens, int topk,
                      Layout* layout);

// ---- The group ------------------------------------------------------------------------------
struct EpOptions {
  int64_t max_tokens_per_rank = 4096;  // tokens one rank dispatches per call (both modes)
  int64_t hidden = 7168;               // largest row width a call may use
  int topk = 8;
  int num_experts = 256;  // physical experts (with EPLB replicas), a multiple of ranks
  WireFormat max_dispatch_format = WireFormat::kBF16;  // buffers hold rows up to this width
  WireFormat combine_format = WireFormat::kBF16;       // kF32 or kBF16
  bool normal_mode = true;                             // size the normal-mode buffers
  bool low_latency_mode = true;                        // size the low-latency buffers
  // Normal-mode rows one rank can receive; 0 means the worst case ranks * max_tokens_per_rank.
  int64_t max_recv_tokens = 0;
  // 0: ranks sharing memory (MPI_COMM_TYPE_SHARED) form a node. k > 0: nodes of k consecutive
  // ranks (each inside one shared-memory domain); 1 treats every rank as its own node, so all
  // traffic between ranks goes through MPI (with --mca btl self,tcp: over TCP).
  int ranks_per_node = 0;
  bool hierarchical = false;   // normal mode across nodes: one copy per destination node
  int64_t timeout_ms = 60000;  // every wait fails after this long, naming the stalled peer
  // Normal-mode calls moving more than this many bytes per rank write rows with non-temporal
  // stores (they leave the cache anyway; skipping the read-for-ownership saves bandwidth).
  int64_t stream_min_bytes = int64_t{4} << 20;
  int spin_us = 50;  // busy-wait this long before yielding/blocking
  // Low-latency dispatch on one node: write this rank's rows straight into their slots of the
  // receivers' outputs (encoding and streaming stores overlap) instead of leaving the receivers to
  // copy them from its staging. Per rank; the outputs are the same either way (docs/ep.md).
  bool ll_direct_write = true;
};

// Caller-owned record of one normal-mode dispatch, filled by dispatch() and used by combine()
// and dispatch_cached(). Sized once by EpGroup::new_handle(); keep one per layer for backward.
struct EpHandle {
  uint64_t dispatch_id = 0;  // 0: never filled
  int64_t num_tokens = 0;    // tokens this rank dispatched
  int64_t num_recv = 0;      // rows this rank received
  Layout layout;
  std::vector<int32_t> counts;       // [ranks, ranks]: counts[s*R + r] tokens from s to r
  std::vector<int32_t> recv_offset;  // [ranks + 1]: rows from source s are [off[s], off[s+1])
  // Hierarchical mode, on a proxy: destination-rank masks of the tokens it forwarded, per source.
  std::vector<uint64_t> proxy_masks;  // [proxied sources, max_tokens]
  std::vector<int32_t> proxy_count;   // [proxied sources]
};

struct DispatchInput {
  Tensor x;                               // [tokens, hidden] f32 or bf16
  const int32_t* topk_idx = nullptr;      // [tokens, topk]; -1 = none
  const float* topk_weights = nullptr;    // [tokens, topk]
  WireFormat format = WireFormat::kBF16;  // on the wire and in the output
};

// Normal-mode output: views into the group's receive buffer.
struct DispatchOutput {
  Tensor x;         // [n_recv, hidden] in the wire format (u8 e4m3 for kFP8)
  Tensor x_scales;  // kFP8: [n_recv, fp8_scale_cols] f32; else empty
  // The next three are empty after dispatch_cached (the routes are the handle's).
  Tensor topk_idx;                       // [n_recv, topk] i32: local expert id (0..L-1) or -1
  Tensor topk_weights;                   // [n_recv, topk] f32
  Tensor src_token;                      // [n_recv] i32: token index at its source rank
  std::span<const int32_t> rank_offset;  // [ranks + 1]: rows from source s are [off[s], off[s+1])
  // Rows grouped per local expert (ascending row order): expert e uses rows
  // expert_rows[expert_offset[e] .. expert_offset[e+1]) with weights expert_weights[same].
  std::span<const int32_t> tokens_per_expert;  // [L]
  std::span<const int32_t> expert_offset;      // [L + 1]
  std::span<const int32_t> expert_rows;
  std::span<const float> expert_weights;
};

// Low-latency output: views into the group's buffers.
struct LowLatencyOutput {
  Tensor x;         // [L, ranks * max_tokens_per_rank, hidden]; expert e's rows [0, count[e]) valid
  Tensor x_scales;  // kFP8: [L, ranks * max_tokens_per_rank, fp8_scale_cols] f32
  Tensor src_info;  // [L, ranks * max_tokens_per_rank, 2] i32: (source rank, source token)
  std::span<const int32_t> count;  // [L]; rows are ordered by source rank, then source token
};

// Time spent in the phases of the last call (for benchmarks), seconds.
struct PhaseTimes {
  double total_s = 0, layout_s = 0, sync_s = 0, copy_s = 0, wait_s = 0;
};

class EpGroup {
 public:
  // Collective over comm (duplicated internally). Validates that every rank passed the same options.
  static Result<std::unique_ptr<EpGroup>> create(MPI_Comm comm, const EpOptions& options);
  ~EpGroup();
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int rank() const;
  int num_ranks() const;
  int num_nodes() const;
  int node_of_rank(int r) const;
  int local_experts() const;
  const EpOptions& options() const;
  const Placement& placement() const;
  EpHandle new_handle() const;

  // ---- Normal mode
  Status dispatch(const DispatchInput& in, EpHandle* handle, DispatchOutput* out);
  // Re-sends new rows along an earlier dispatch's routes (backward pass): x only, same row count.
  Status dispatch_cached(const Tensor& x, WireFormat format, const EpHandle& handle, DispatchOutput* out);
  // [handle.num_recv, hidden] in combine_format, in shared memory: expert outputs written here
  // are combined without a copy.
  Tensor combine_buffer(const EpHandle& handle, int64_t hidden);
  // expert_out: [handle.num_recv, hidden] f32/bf16, one row per received row (the caller's sum of
  // weight * expert(row) over its local experts). out: [handle.num_tokens, hidden] f32 receives,
  // per token, the sum over destination ranks in ascending rank order, accumulated in f32
  // (hierarchical: over nodes of per-node partial sums rounded to combine_format; docs/ep.md).
  Status combine(const Tensor& expert_out, const EpHandle& handle, Tensor out);

  // ---- Low-latency mode: ll_dispatch_send, ll_dispatch_recv, [ll_combine_send, ll_combine_recv]
  // Returns at once; a bad call (too many tokens, bad ids) still takes part and is reported by
  // ll_dispatch_recv on every rank. topk_weights is unused here (combine takes the weights).
  Status ll_dispatch_send(const DispatchInput& in);
  Status ll_dispatch_recv(LowLatencyOutput* out);
  Tensor ll_combine_buffer(int64_t hidden);  // [L, ranks * max_tokens_per_rank, hidden], shared
  // expert_out: [L, ranks * max_tokens_per_rank, hidden] f32/bf16 (rows as in the recv output).
  Status ll_combine_send(const Tensor& expert_out);
  // out[t] = sum over k (ascending) of topk_weights[t, k] * expert output of (t, k), in f32.
  Status ll_combine_recv(const float* topk_weights, Tensor out);
  Status ll_dispatch(const DispatchInput& in, LowLatencyOutput* out);
  Status ll_combine(const Tensor& expert_out, const float* topk_weights, Tensor out);

  const PhaseTimes& last_times() const;
  // Bytes written into shared memory and sent over MPI by the last call (for benchmarks).
  uint64_t last_bytes_moved() const;

  struct Impl;

 private:
  explicit EpGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Initialises MPI (MPI_THREAD_FUNNELED) unless already done, finalising at exit. Idempotent.
Status init_mpi(int* argc = nullptr, char*** argv = nullptr);

// ---- The plain way: the same routing through MPI_Alltoallv (baseline and test oracle) ---------
// Pack rows per destination rank, exchange counts (MPI_Alltoall), MPI_Alltoallv the rows, top-k
// and weights, unpack. Output layout as DispatchOutput (normal) or LowLatencyOutput (ll=true).
// Buffers are sized once by create.
class AlltoallvBaseline {
 public:
  static Result<std::unique_ptr<AlltoallvBaseline>> create(MPI_Comm comm, const EpOptions& options);
  ~AlltoallvBaseline();
  Status dispatch(const DispatchInput& in, DispatchOutput* out);
  Status dispatch_ll(const DispatchInput& in, LowLatencyOutput* out);
  // Normal-mode combine of [n_recv, hidden] rows (from the last dispatch) into out [tokens, hidden] f32.
  Status combine(const Tensor& expert_out, Tensor out);
  // Low-latency combine of [L, ranks*T, hidden] rows into out with the top-k weights.
  Status combine_ll(const Tensor& expert_out, const float* topk_weights, Tensor out);
  struct Impl;

 private:
  explicit AlltoallvBaseline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom::ep
