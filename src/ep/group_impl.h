// EpGroup::Impl: the state shared by group.cpp (creation, topology, header exchange),
// normal_dispatch.cpp, normal_combine.cpp and low_latency.cpp. Internal to ep/.
//
// Shared memory: one arena per node, one block per local rank, the same block layout on every
// rank (offsets in BlockLayout). A block holds the rank's control words and headers, its normal-
// mode receive buffer A (rows written by senders into their final slots), two combine buffers B
// (by call parity), two low-latency send stagings and two low-latency outputs (by parity; senders
// write their rows into the outputs directly, or receivers pull them from the stagings) and the
// low-latency combine buffer E (pulled by the tokens' owners). Peers on other nodes exchange the
// same data through MPI messages into private staging.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/function_ref.h"
#include "ep/ep.h"
#include "ep/shm.h"
#include "ep/sync.h"

namespace fathom::ep::internal {

constexpr uint32_t kHeaderMagic = 0x31465045;  // "EPF1"
constexpr uint16_t kProtocolVersion = 2;       // 2: low-latency direct writes (flags, ll_routed)
constexpr int kErrorText = 192;

enum class Op : uint8_t { kNone = 0, kDispatch, kDispatchCached, kCombine, kLlDispatch, kLlCombine };
const char* op_name(Op op);

// One rank's description of a call, exchanged before (normal) or with (low latency) the data.
struct CallHeader {
  uint32_t magic = kHeaderMagic;
  uint16_t version = kProtocolVersion;
  uint8_t op = 0;
  uint8_t format = 0;
  uint32_t seq = 0;
  int32_t num_tokens = 0;
  int32_t hidden = 0;
  int32_t topk = 0;
  int32_t num_experts = 0;
  int32_t error = 0;     // StatusCode of a local error, 0 if none
  int32_t num_rows = 0;  // low-latency messages: rows that follow
  int32_t flags = 0;     // kLlDirect
  uint64_t handle_id = 0;
  char error_text[kErrorText] = {};
};
static_assert(sizeof(CallHeader) == 240);
// Low-latency dispatch: the sender wrote its rows into their slots of every node peer's output
// (the receivers copy nothing from its staging).
constexpr int32_t kLlDirect = 1;

// Control words of a rank (first bytes of its block), each on its own cache line.
struct RankCtrl {
  alignas(64) uint32_t progress;  // normal mode: seq * 4 + phase (1 header published, 2 rows written)
  uint32_t progress_op;           // Op of that seq
  alignas(64) uint32_t ll_routed;  // last low-latency dispatch whose header and top-k ids are out
  alignas(64) uint32_t ll_sent;    // last low-latency dispatch published
  alignas(64) uint32_t ll_ready;  // last low-latency combine input published
  alignas(64) uint32_t sleepers;  // waiters blocked on any of these words
};

// Byte offsets inside a rank block.
struct BlockLayout {
  uint64_t ctrl = 0, nheader[2] = {0, 0}, llheader[2] = {0, 0}, llcheader[2] = {0, 0}, llbase = 0;
  uint64_t a_x = 0, a_scales = 0, a_idx = 0, a_w = 0, a_src = 0, b_x[2] = {0, 0};
  uint64_t s_x[2] = {0, 0}, s_scales[2] = {0, 0}, s_idx[2] = {0, 0}, e_x = 0;
  uint64_t ll_x[2] = {0, 0}, ll_sc[2] = {0, 0};  // low-latency outputs [L, R*T], by call parity
  uint64_t bytes = 0;
};

// A row copy planned by a sequential pass and executed in parallel.
struct CopyJob {
  const uint8_t* src;
  const float* src_scales;
  int32_t dst_row;
  int32_t src_rank;
  int32_t src_token;
};

enum class LlState : uint8_t { kIdle, kSent, kReceived, kCombineSent };

}  // namespace fathom::ep::internal

namespace fathom::ep {

struct EpGroup::Impl {
  // ---- configuration and topology
  EpOptions opt;
  MPI_Comm comm = MPI_COMM_NULL, node_comm = MPI_COMM_NULL;
  int rank = 0, R = 0, L = 0, N = 0, my_node = 0;
  Placement placement;
  std::vector<std::vector<int>> node_ranks;  // ranks of each node, ascending
  std::vector<int> local_index;              // [R]: index of a rank within its node
  std::vector<int> remote_ranks;             // ranks on other nodes, ascending
  std::vector<int> proxied;                  // hierarchical: remote sources this rank forwards for
  std::vector<int> proxied_slot;             // [R]: index in proxied, or -1
  int64_t T = 0, cap = 0, S = 0;             // max tokens, normal receive capacity, fp8 scale cols
  uint64_t max_row = 0, comb_row = 0;        // bytes of a row at max dispatch format / combine format

  // ---- memory
  std::unique_ptr<internal::SharedArena> arena;
  internal::BlockLayout blk;
  std::vector<uint8_t*> block;  // [R]: a node peer's block in this process, nullptr for remote ranks
  internal::PrivateRegion priv;
  uint8_t* send_pack = nullptr;    // normal: rows/meta packed per remote destination (rank or node)
  uint64_t send_pack_stride = 0;   // bytes per destination slot
  uint8_t* comb_stage = nullptr;   // normal: combine rows from remote ranks/nodes
  uint8_t* proxy_stage = nullptr;  // hierarchical: rows forwarded by this proxy, per proxied source
  uint64_t proxy_stride = 0;
  uint8_t* proxy_pack = nullptr;  // hierarchical combine: partial sums per proxied source
  uint8_t* ll_out = nullptr;      // low latency: this call's [L, R*T] rows and scales (shared, by parity)
  float* ll_out_scales = nullptr;
  int32_t* ll_out_src = nullptr;  // [L, R*T] source rank and token (private)
  uint8_t* ll_in = nullptr;  // low latency: messages from remote ranks, per remote rank
  uint64_t ll_in_stride = 0;
  uint8_t* ll_pack = nullptr;  // low latency: messages to remote ranks (dispatch and combine)
  uint64_t ll_pack_stride = 0;
  uint8_t* ll_cin = nullptr;  // low latency: combine rows from remote ranks
  uint64_t ll_cin_stride = 0;
  std::vector<uint8_t> scratch;  // per pool thread: one encoded row + scales, two f32 rows
  uint64_t scratch_stride = 0;

  // ---- per-call state
  internal::Waiter waiter, ll_waiter;
  uint32_t seq = 0, ll_seq = 0;
  Status broken;  // a timeout leaves peers in unknown states: every later call fails with it
  std::vector<internal::CallHeader> hdr_out;        // [R] outgoing header copies (MPI sends)
  std::vector<uint8_t> hdr_in;                      // [R, header_msg] headers received over MPI
  uint64_t header_msg = 0;                          // CallHeader + counts per rank + counts per node
  std::vector<const internal::CallHeader*> hdr_of;  // [R] this call's header of each rank
  std::vector<int32_t> expert_count, expert_offset, expert_rows;  // normal output grouping
  std::vector<float> expert_weights;
  std::vector<internal::CopyJob> jobs;
  std::vector<int32_t> positions;  // hierarchical proxy: [T, ranks of my node]
  std::vector<int64_t> send_off;   // [R]: where this rank's rows start in each receiver's buffer
  PhaseTimes times;
  uint64_t bytes_moved = 0;

  // ---- low-latency state
  internal::LlState ll_state = internal::LlState::kIdle;
  int64_t ll_tokens = 0, ll_hidden = 0;
  WireFormat ll_format = WireFormat::kBF16;
  bool ll_failed = false;
  std::vector<int32_t> ll_slot;     // [T, K]: my token's slot among my tokens choosing that expert
  std::vector<int32_t> ll_mycount;  // [E]: my tokens per expert
  std::vector<int32_t> ll_count;    // [L, R]: rows per (local expert, source)
  std::vector<int32_t> ll_total;    // [L]
  std::vector<const internal::CallHeader*> ll_hdr;  // [R]
  std::vector<int32_t> ll_prefix;  // [E]: rows before expert e's in the reply of its (remote) rank
  std::vector<int32_t> ll_cursor;  // [L]
  bool ll_direct_ok = false;       // opt.ll_direct_write and every lower rank shares this node
  std::vector<int32_t> ll_lower;   // [E]: rows the lower ranks send to expert e this call

  Impl(int max_words, int max_requests)
      : waiter(max_words, max_requests), ll_waiter(max_words, max_requests) {}

  // ---- helpers (group.cpp)
  bool is_local(int r) const { return block[static_cast<size_t>(r)] != nullptr; }
  internal::RankCtrl* ctrl(int r) const {
    return reinterpret_cast<internal::RankCtrl*>(block[static_cast<size_t>(r)]);
  }
  uint8_t* at(int r, uint64_t off) const { return block[static_cast<size_t>(r)] + off; }
  uint8_t* scratch_for(int thread) { return scratch.data() + static_cast<uint64_t>(thread) * scratch_stride; }
  int tag(int kind, uint32_t s) const { return kind + 16 * static_cast<int>(s & 1023u); }
  Status check_usable() const;
  Status fail_timeout(Status s, internal::Waiter& w);
  std::string describe_peer(int peer, const char* what, bool is_mpi, internal::Op op, uint32_t s) const;
  // Normal mode: publishes this rank's header (+ counts), gathers every rank's, checks agreement.
  Status exchange_headers(const internal::CallHeader& mine, const int32_t* counts_rank,
                          const int32_t* counts_node);
  Status check_headers(const internal::CallHeader& mine,
                       const std::vector<const internal::CallHeader*>& hdrs) const;
  const int32_t* counts_rank_of(int r) const;
  const int32_t* counts_node_of(int r) const;
  Status wait_progress(uint32_t target, internal::Op op, const char* what);
  // A handle made by this group's new_handle() (and, when filled, by one of its dispatches).
  Status check_handle(const EpHandle& h, bool must_be_filled) const;
};

namespace internal {
// Fills a header's error fields from a Status.
void set_error(CallHeader* h, const Status& s);
// Top-k ids in [-1, num_experts), no expert twice per token; errors name the token.
Status check_topk_ids(const int32_t* topk, int64_t tokens, int topk_n, int num_experts);
// Checks a tensor is contiguous 2-D (or 3-D) f32/bf16 with the given leading dims; names `what`.
Status check_rows(const Tensor& t, std::string_view what, int64_t rows, int64_t max_hidden);
}  // namespace internal

}  // namespace fathom::ep
