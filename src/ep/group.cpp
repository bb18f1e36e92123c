// EpGroup creation (option agreement, node topology, buffer sizing, the shared arena), the
// normal-mode header exchange with its agreement checks, and timeout reporting. The data paths
// live in normal_dispatch.cpp, normal_combine.cpp and low_latency.cpp.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "ep/group_impl.h"

namespace fathom::ep {

using internal::CallHeader;
using internal::Op;

namespace internal {

const char* op_name(Op op) {
  switch (op) {
    case Op::kNone:
      return "none";
    case Op::kDispatch:
      return "dispatch";
    case Op::kDispatchCached:
      return "cached dispatch";
    case Op::kCombine:
      return "combine";
    case Op::kLlDispatch:
      return "low-latency dispatch";
    case Op::kLlCombine:
      return "low-latency combine";
  }
  return "?";
}

void set_error(CallHeader* h, const Status& s) {
  h->error = s.ok() ? 0 : static_cast<int32_t>(s.code());
  std::snprintf(h->error_text, sizeof(h->error_text), "%s", s.message().c_str());
}

Status check_rows(const Tensor& t, std::string_view what, int64_t rows, int64_t max_hidden) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16)
    return invalid_argument("ep: {} must be f32 or bf16, got {}", what, dtype_name(t.dtype));
  if (t.ndim < 2 || !t.is_contiguous() || (t.data == nullptr && t.numel() > 0))
    return invalid_argument("ep: {} must be a contiguous tensor of rows, got shape {}", what,
                            t.shape_string());
  if (rows >= 0 && t.rows() != rows)
    return invalid_argument("ep: {} has {} rows {}, expected {}", what, t.rows(), t.shape_string(), rows);
  if (t.cols() < 1 || t.cols() > max_hidden)
    return invalid_argument("ep: {} rows have {} values, expected 1..{} (the group's hidden size)", what,
                            t.cols(), max_hidden);
  return {};
}

}  // namespace internal

namespace {

constexpr uint64_t kPage = 4096;
uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// Every option, as fixed-size integers, so ranks can compare what they were created with.
struct OptionsWire {
  int64_t max_tokens_per_rank, hidden, max_recv_tokens, timeout_ms, stream_min_bytes;
  int32_t topk, num_experts, max_dispatch_format, combine_format, normal_mode, low_latency_mode,
      ranks_per_node, hierarchical;
  int32_t physical_node;  // lowest world rank sharing memory with this rank
  int32_t pad;
};

OptionsWire to_wire(const EpOptions& o) {
  return {o.max_tokens_per_rank,
          o.hidden,
          o.max_recv_tokens,
          o.timeout_ms,
          o.stream_min_bytes,
          o.topk,
          o.num_experts,
          static_cast<int32_t>(o.max_dispatch_format),
          static_cast<int32_t>(o.combine_format),
          o.normal_mode,
          o.low_latency_mode,
          o.ranks_per_node,
          o.hierarchical,
          0,
          0};
}

Status validate_options(const EpOptions& o, int ranks) {
  if (o.max_tokens_per_rank < 1 || o.max_tokens_per_rank > (int64_t{1} << 24))
    return invalid_argument("ep: max_tokens_per_rank {} is out of range (1..2^24)", o.max_tokens_per_rank);
  if (o.hidden < 1 || o.hidden > (int64_t{1} << 20))
    return invalid_argument("ep: hidden {} is out of range (1..2^20)", o.hidden);
  if (o.num_experts < ranks || o.num_experts % ranks != 0)
    return invalid_argument("ep: num_experts {} must be a positive multiple of the {} ranks", o.num_experts,
                            ranks);
  if (o.topk < 1 || o.topk > o.num_experts || o.topk > 64)
    return invalid_argument("ep: topk {} is out of range (1..min(64, num_experts {}))", o.topk,
                            o.num_experts);
  if (o.combine_format == WireFormat::kFP8)
    return invalid_argument("ep: combine_format must be f32 or bf16 (FP8 is for dispatch only)");
  if (o.ranks_per_node < 0) return invalid_argument("ep: ranks_per_node {} must be >= 0", o.ranks_per_node);
  if (o.max_recv_tokens < 0)
    return invalid_argument("ep: max_recv_tokens {} must be >= 0", o.max_recv_tokens);
  if (o.timeout_ms < 1) return invalid_argument("ep: timeout_ms {} must be >= 1", o.timeout_ms);
  if (!o.normal_mode && !o.low_latency_mode)
    return invalid_argument("ep: enable normal_mode, low_latency_mode or both");
  // The largest message: a low-latency combine reply of max_tokens * min(topk, local experts) f32 rows.
  const uint64_t msg = static_cast<uint64_t>(o.max_tokens_per_rank) *
                       wire_row_bytes(WireFormat::kF32, o.hidden) *
                       static_cast<uint64_t>(std::min(o.topk, o.num_experts / ranks));
  if (msg >= (uint64_t{1} << 31))
    return invalid_argument(
        "ep: max_tokens_per_rank {} x hidden {} makes MPI messages over 2 GiB; lower them",
        o.max_tokens_per_rank, o.hidden);
  return {};
}

Status compare_options(const std::vector<OptionsWire>& all) {
  const OptionsWire& a = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const OptionsWire& b = all[r];
#define FATHOM_EP_SAME(field)                                                                        \
  if (a.field != b.field)                                                                            \
    return invalid_argument("ep: ranks created the group with different options: rank 0 has " #field \
                            " {}, "                                                                  \
                            "rank {} has {}",                                                        \
                            a.field, r, b.field);
    FATHOM_EP_SAME(max_tokens_per_rank)
    FATHOM_EP_SAME(hidden)
    FATHOM_EP_SAME(max_recv_tokens)
    FATHOM_EP_SAME(topk)
    FATHOM_EP_SAME(num_experts)
    FATHOM_EP_SAME(max_dispatch_format)
    FATHOM_EP_SAME(combine_format)
    FATHOM_EP_SAME(normal_mode)
    FATHOM_EP_SAME(low_latency_mode)
    FATHOM_EP_SAME(ranks_per_node)
    FATHOM_EP_SAME(hierarchical)
    FATHOM_EP_SAME(stream_min_bytes)
#undef FATHOM_EP_SAME
  }
  return {};
}

// Node ids in order of first appearance; ranks_per_node > 0 groups consecutive ranks and must
// stay inside a shared-memory domain.
Result<std::vector<int>> assign_nodes(const std::vector<OptionsWire>& all, int ranks_per_node) {
  const int R = static_cast<int>(all.size());
  std::vector<int> key(static_cast<size_t>(R)), node(static_cast<size_t>(R), -1);
  for (int r = 0; r < R; ++r) key[r] = ranks_per_node > 0 ? r / ranks_per_node : all[r].physical_node;
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < r; ++q)
      if (key[q] == key[r] && all[q].physical_node != all[r].physical_node)
        return invalid_argument(
            "ep: ranks_per_node {} puts ranks {} and {} in one node, but they do not share memory",
            ranks_per_node, q, r);
  int next = 0;
  for (int r = 0; r < R; ++r) {
    if (node[r] >= 0) continue;
    for (int q = r; q < R; ++q)
      if (key[q] == key[r]) node[q] = next;
    ++next;
  }
  return node;
}

}  // namespace

Status init_mpi(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return {};
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return unavailable("ep: MPI_Init_thread failed");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
  return {};
}

// ---- creation --------------------------------------------------------------------------------

namespace {

Status build_topology(EpGroup::Impl& m, const std::vector<int>& node_of) {
  m.placement = Placement{m.opt.num_experts, m.R, node_of};
  TRY(m.placement.validate());
  m.N = m.placement.num_nodes();
  m.L = m.placement.experts_per_rank();
  m.my_node = node_of[static_cast<size_t>(m.rank)];
  m.node_ranks.assign(static_cast<size_t>(m.N), {});
  m.local_index.assign(static_cast<size_t>(m.R), 0);
  for (int r = 0; r < m.R; ++r) {
    auto& nr = m.node_ranks[static_cast<size_t>(node_of[static_cast<size_t>(r)])];
    m.local_index[static_cast<size_t>(r)] = static_cast<int>(nr.size());
    nr.push_back(r);
  }
  for (const auto& nr : m.node_ranks)
    if (nr.size() > 64)
      return invalid_argument("ep: a node holds {} ranks; at most 64 are supported", nr.size());
  if (m.opt.hierarchical && m.N > 64)
    return invalid_argument("ep: hierarchical mode supports at most 64 nodes, got {}", m.N);
  for (int r = 0; r < m.R; ++r)
    if (node_of[static_cast<size_t>(r)] != m.my_node) m.remote_ranks.push_back(r);
  m.proxied_slot.assign(static_cast<size_t>(m.R), -1);
  if (m.opt.hierarchical) {
    const auto& mine = m.node_ranks[static_cast<size_t>(m.my_node)];
    for (int s : m.remote_ranks) {
      const int proxy = mine[static_cast<size_t>(m.local_index[static_cast<size_t>(s)]) % mine.size()];
      if (proxy != m.rank) continue;
      m.proxied_slot[static_cast<size_t>(s)] = static_cast<int>(m.proxied.size());
      m.proxied.push_back(s);
    }
  }
  return {};
}

// Offsets of everything in a rank block (identical on every rank).
void plan_block(EpGroup::Impl& m) {
  internal::BlockLayout& b = m.blk;
  const uint64_t T = static_cast<uint64_t>(m.T), cap = static_cast<uint64_t>(m.cap),
                 K = static_cast<uint64_t>(m.opt.topk);
  const uint64_t S4 = static_cast<uint64_t>(m.S) * 4;  // FP8 scales: any max format admits FP8 calls
  uint64_t off = sizeof(internal::RankCtrl);
  auto take = [&](uint64_t bytes, uint64_t align) {
    off = align_up(off, align);
    const uint64_t at = off;
    off += bytes;
    return at;
  };
  for (int i = 0; i < 2; ++i) b.nheader[i] = take(m.header_msg, 64);
  for (int i = 0; i < 2; ++i) b.llheader[i] = take(sizeof(CallHeader), 64);
  for (int i = 0; i < 2; ++i) b.llcheader[i] = take(sizeof(CallHeader), 64);
  b.llbase = take(static_cast<uint64_t>(m.L) * static_cast<uint64_t>(m.R) * 4, 64);
  if (m.opt.normal_mode) {
    b.a_x = take(cap * m.max_row, kPage);
    b.a_scales = take(cap * S4, 64);
    b.a_idx = take(cap * K * 4, 64);
    b.a_w = take(cap * K * 4, 64);
    b.a_src = take(cap * 4, 64);
    for (int i = 0; i < 2; ++i) b.b_x[i] = take(cap * m.comb_row, kPage);
  }
  if (m.opt.low_latency_mode) {
    for (int i = 0; i < 2; ++i) {
      b.s_x[i] = take(T * m.max_row, kPage);
      b.s_scales[i] = take(T * S4, 64);
      b.s_idx[i] = take(T * K * 4, 64);
    }
    const uint64_t slots = static_cast<uint64_t>(m.L) * static_cast<uint64_t>(m.R) * T;
    for (int i = 0; i < 2; ++i) {
      b.ll_x[i] = take(slots * m.max_row, kPage);
      b.ll_sc[i] = take(slots * S4, 64);
    }
    b.e_x = take(slots * m.comb_row, kPage);
  }
  b.bytes = align_up(off, kPage);
}

uint64_t ll_dispatch_msg_bytes(const EpGroup::Impl& m) {
  const uint64_t T = static_cast<uint64_t>(m.T), K = static_cast<uint64_t>(m.opt.topk);
  const uint64_t S4 = static_cast<uint64_t>(m.S) * 4;  // FP8 scales: any max format admits FP8 calls
  return align_up(sizeof(CallHeader) + T * (1 + K) * 4, 64) + T * (m.max_row + S4) + 64;
}

uint64_t ll_combine_msg_bytes(const EpGroup::Impl& m) {
  const uint64_t rows = static_cast<uint64_t>(m.T) * static_cast<uint64_t>(std::min(m.opt.topk, m.L));
  return align_up(sizeof(CallHeader), 64) + rows * m.comb_row;
}

// Private staging for MPI traffic and the low-latency source info, reserved (not committed) at once.
Status plan_private(EpGroup::Impl& m) {
  const uint64_t T = static_cast<uint64_t>(m.T), K = static_cast<uint64_t>(m.opt.topk);
  const uint64_t S4 = static_cast<uint64_t>(m.S) * 4;  // FP8 scales: any max format admits FP8 calls
  const uint64_t n_remote = m.remote_ranks.size(), n_prox = m.proxied.size();
  const uint64_t dests = m.opt.hierarchical ? static_cast<uint64_t>(m.N) : n_remote;
  const uint64_t record = 16 + 8 * K;  // hierarchical token record: src, pad, mask, ids, weights
  m.send_pack_stride = align_up(T * (m.max_row + S4 + 8 * K + 4 + record), kPage);
  m.proxy_stride = align_up(T * (m.max_row + S4 + record), kPage);
  uint64_t off = 0;
  std::vector<std::pair<uint8_t**, uint64_t>> parts;
  uint64_t ll_in = 0, ll_pack = 0, ll_cin = 0, ll_src = 0;
  if (m.opt.normal_mode && (n_remote > 0)) {
    parts.push_back({&m.send_pack, dests * m.send_pack_stride});
    parts.push_back({&m.comb_stage, dests * T * m.comb_row});
    parts.push_back({&m.proxy_stage, n_prox * m.proxy_stride});
    parts.push_back({&m.proxy_pack, n_prox * T * m.comb_row});
  }
  if (m.opt.low_latency_mode) {
    const uint64_t slots = static_cast<uint64_t>(m.L) * static_cast<uint64_t>(m.R) * T;
    ll_src = slots * 8;
    m.ll_in_stride = align_up(ll_dispatch_msg_bytes(m), kPage);
    m.ll_pack_stride = align_up(std::max(ll_dispatch_msg_bytes(m), ll_combine_msg_bytes(m)), kPage);
    m.ll_cin_stride = align_up(ll_combine_msg_bytes(m), kPage);
    ll_in = n_remote * m.ll_in_stride, ll_pack = n_remote * m.ll_pack_stride,
    ll_cin = n_remote * m.ll_cin_stride;
  }
  uint8_t* ll_src_ptr = nullptr;
  parts.push_back({&ll_src_ptr, ll_src});
  parts.push_back({&m.ll_in, ll_in});
  parts.push_back({&m.ll_pack, ll_pack});
  parts.push_back({&m.ll_cin, ll_cin});
  std::vector<uint64_t> offs;
  for (auto& [p, bytes] : parts) {
    off = align_up(off, kPage);
    offs.push_back(off);
    off += bytes;
  }
  for (uint64_t msg : {m.send_pack_stride, m.ll_in_stride, m.ll_pack_stride, m.ll_cin_stride, m.header_msg})
    if (msg >= (uint64_t{1} << 31))
      return invalid_argument(
          "ep: a message of {} bytes would exceed MPI's int counts; lower max_tokens_per_rank or "
          "hidden",
          msg);
  m.priv = TRY(internal::PrivateRegion::allocate(std::max<uint64_t>(off, kPage), "ep staging"));
  for (size_t i = 0; i < parts.size(); ++i)
    *parts[i].first = parts[i].second ? m.priv.data() + offs[i] : nullptr;
  m.ll_out_src = reinterpret_cast<int32_t*>(ll_src_ptr);
  return {};
}

void size_state(EpGroup::Impl& m) {
  const size_t R = static_cast<size_t>(m.R), K = static_cast<size_t>(m.opt.topk),
               L = static_cast<size_t>(m.L);
  const size_t T = static_cast<size_t>(m.T), cap = static_cast<size_t>(m.cap);
  m.hdr_in.assign(R * m.header_msg, 0);
  m.hdr_of.assign(R, nullptr);
  m.ll_hdr.assign(R, nullptr);
  m.expert_count.assign(L, 0);
  m.expert_offset.assign(L + 1, 0);
  m.expert_rows.assign(cap * std::min(K, L), 0);
  m.expert_weights.assign(cap * std::min(K, L), 0.0f);
  m.jobs.resize(std::max(cap, R * T * std::min(K, L)));
  m.positions.assign(T * 64, 0);
  m.send_off.assign(R, 0);
  m.ll_slot.assign(T * K, -1);
  m.ll_mycount.assign(static_cast<size_t>(m.opt.num_experts), 0);
  m.ll_count.assign(L * R, 0);
  m.ll_total.assign(L, 0);
  m.ll_prefix.assign(static_cast<size_t>(m.opt.num_experts), 0);
  m.ll_cursor.assign(L, 0);
  m.ll_lower.assign(static_cast<size_t>(m.opt.num_experts), 0);
  m.ll_direct_ok = m.opt.low_latency_mode && m.opt.ll_direct_write;
  for (int r = 0; r < m.rank; ++r) m.ll_direct_ok = m.ll_direct_ok && m.is_local(r);
  const int threads = default_pool().size();
  m.scratch_stride =
      align_up(m.max_row + static_cast<uint64_t>(m.S) * 4 + 2 * static_cast<uint64_t>(m.opt.hidden) * 4, 64);
  m.scratch.assign(static_cast<size_t>(threads) * m.scratch_stride, 0);
}

Status exchange_options(EpGroup::Impl& m, std::vector<OptionsWire>* all) {
  MPI_Comm shared;
  MPI_Comm_split_type(m.comm, MPI_COMM_TYPE_SHARED, m.rank, MPI_INFO_NULL, &shared);
  int lowest = m.rank;
  MPI_Request req;
  MPI_Iallreduce(&m.rank, &lowest, 1, MPI_INT, MPI_MIN, shared, &req);
  Status s = internal::wait_collective(&req, m.opt.timeout_ms, "finding the ranks that share memory");
  MPI_Comm_free(&shared);
  TRY(s);
  OptionsWire mine = to_wire(m.opt);
  mine.physical_node = lowest;
  all->resize(static_cast<size_t>(m.R));
  MPI_Iallgather(&mine, sizeof(OptionsWire), MPI_BYTE, all->data(), sizeof(OptionsWire), MPI_BYTE, m.comm,
                 &req);
  return internal::wait_collective(&req, m.opt.timeout_ms, "EpGroup::create (exchanging options)");
}

Status setup(EpGroup::Impl& m, MPI_Comm comm) {
  MPI_Comm_dup(comm, &m.comm);
  MPI_Comm_rank(m.comm, &m.rank);
  MPI_Comm_size(m.comm, &m.R);
  // Validate locally, but still join the exchange so every rank sees the same outcome.
  Status local = validate_options(m.opt, m.R);
  std::vector<OptionsWire> all;
  TRY(exchange_options(m, &all));
  int ok_local = local.ok() ? 1 : 0, ok_all = 0;
  MPI_Request req;
  MPI_Iallreduce(&ok_local, &ok_all, 1, MPI_INT, MPI_MIN, m.comm, &req);
  TRY(internal::wait_collective(&req, m.opt.timeout_ms, "EpGroup::create (checking options)"));
  TRY(local);
  if (!ok_all) return invalid_argument("ep: another rank passed invalid options to EpGroup::create");
  TRY(compare_options(all));
  const std::vector<int> node_of = TRY(assign_nodes(all, m.opt.ranks_per_node));
  TRY(build_topology(m, node_of));
  m.T = m.opt.max_tokens_per_rank;
  m.cap = m.opt.max_recv_tokens > 0 ? m.opt.max_recv_tokens : m.T * m.R;
  m.S = fp8_scale_cols(m.opt.hidden);
  m.max_row = wire_row_bytes(m.opt.max_dispatch_format, m.opt.hidden);
  m.comb_row = wire_row_bytes(m.opt.combine_format, m.opt.hidden);
  m.header_msg = align_up(sizeof(CallHeader) + 4 * static_cast<uint64_t>(m.R + m.N), 8);
  plan_block(m);
  MPI_Comm_split(m.comm, m.my_node, m.rank, &m.node_comm);
  const auto& mine = m.node_ranks[static_cast<size_t>(m.my_node)];
  m.arena = TRY(internal::SharedArena::create(m.node_comm, m.blk.bytes * mine.size(), m.opt.timeout_ms));
  m.block.assign(static_cast<size_t>(m.R), nullptr);
  for (size_t i = 0; i < mine.size(); ++i)
    m.block[static_cast<size_t>(mine[i])] = m.arena->data() + i * m.blk.bytes;
  TRY(plan_private(m));
  size_state(m);
  return {};
}

}  // namespace

Result<std::unique_ptr<EpGroup>> EpGroup::create(MPI_Comm comm, const EpOptions& options) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return failed_precondition("ep: MPI is not initialised (call ep::init_mpi first)");
  int size = 1;
  MPI_Comm_size(comm, &size);
  // Capacity of the waits: one word per node peer; a few requests per peer and message kind.
  auto impl = std::make_unique<Impl>(size + 4, 8 * size + 8);
  impl->opt = options;
  TRY(setup(*impl, comm));
  log_debug("ep: rank {}/{} on node {}/{} ({} local ranks), {} experts per rank, arena {} per rank",
            impl->rank, impl->R, impl->my_node, impl->N,
            impl->node_ranks[static_cast<size_t>(impl->my_node)].size(), impl->L, impl->blk.bytes);
  return std::unique_ptr<EpGroup>(new EpGroup(std::move(impl)));
}

EpGroup::EpGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EpGroup::~EpGroup() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  impl_->waiter.abandon();
  impl_->ll_waiter.abandon();
  if (impl_->node_comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->node_comm);
  if (impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

int EpGroup::rank() const {
  return impl_->rank;
}
int EpGroup::num_ranks() const {
  return impl_->R;
}
int EpGroup::num_nodes() const {
  return impl_->N;
}
int EpGroup::node_of_rank(int r) const {
  return impl_->placement.node_of_rank[static_cast<size_t>(r)];
}
int EpGroup::local_experts() const {
  return impl_->L;
}
const EpOptions& EpGroup::options() const {
  return impl_->opt;
}
const Placement& EpGroup::placement() const {
  return impl_->placement;
}
const PhaseTimes& EpGroup::last_times() const {
  return impl_->times;
}
uint64_t EpGroup::last_bytes_moved() const {
  return impl_->bytes_moved;
}

EpHandle EpGroup::new_handle() const {
  const Impl& m = *impl_;
  EpHandle h;
  h.layout = Layout::sized(m.placement, m.T);
  h.counts.assign(static_cast<size_t>(m.R * m.R), 0);
  h.recv_offset.assign(static_cast<size_t>(m.R + 1), 0);
  h.proxy_masks.assign(m.proxied.size() * static_cast<size_t>(m.T), 0);
  h.proxy_count.assign(m.proxied.size(), 0);
  return h;
}

Status EpGroup::Impl::check_handle(const EpHandle& h, bool must_be_filled) const {
  if (h.counts.size() != static_cast<size_t>(R) * static_cast<size_t>(R) ||
      h.layout.token_in_rank.size() != static_cast<size_t>(T) * static_cast<size_t>(R) ||
      h.proxy_masks.size() != proxied.size() * static_cast<size_t>(T))
    return invalid_argument("ep: the handle was not made by this group's new_handle()");
  if (must_be_filled && h.dispatch_id == 0)
    return invalid_argument("ep: the handle was never filled by a dispatch");
  return {};
}

// ---- calls: agreement and waiting --------------------------------------------------------------

Status EpGroup::Impl::check_usable() const {
  if (broken.ok()) return {};
  return failed_precondition("ep: this group is unusable after an earlier timeout ({})", broken.message());
}

Status EpGroup::Impl::fail_timeout(Status s, internal::Waiter& w) {
  w.abandon();
  broken = s;
  return s;
}

std::string EpGroup::Impl::describe_peer(int peer, const char* what, bool is_mpi, Op op, uint32_t s) const {
  std::string msg = fmt::format("ep {} #{}: timed out after {} ms waiting for rank {} ({})",
                                internal::op_name(op), s, opt.timeout_ms, peer, what);
  if (is_mpi || !is_local(peer)) {
    msg += fmt::format(
        "; rank {} is on node {}, reached over MPI, and its message has not arrived: is it alive, "
        "and did it make the same call?",
        peer, placement.node_of_rank[static_cast<size_t>(peer)]);
    return msg;
  }
  const internal::RankCtrl* c = ctrl(peer);
  const uint32_t p = internal::load_word(&c->progress);
  const uint32_t ll_sent = internal::load_word(&c->ll_sent), ll_ready = internal::load_word(&c->ll_ready);
  if (p == 0 && ll_sent == 0)
    return msg + fmt::format("; rank {} shares this node and has made no ep call yet", peer);
  const char* phase = p % 4 == 1 ? "header published" : p % 4 == 2 ? "rows written" : "started";
  msg += fmt::format(
      "; rank {} shares this node: its last normal-mode step is {} #{} ({}), its last low-latency "
      "dispatch #{} and combine #{}",
      peer, internal::op_name(static_cast<Op>(internal::load_word(&c->progress_op))), p / 4, phase, ll_sent,
      ll_ready);
  return msg;
}

const int32_t* EpGroup::Impl::counts_rank_of(int r) const {
  return reinterpret_cast<const int32_t*>(reinterpret_cast<const uint8_t*>(hdr_of[static_cast<size_t>(r)]) +
                                          sizeof(CallHeader));
}

const int32_t* EpGroup::Impl::counts_node_of(int r) const {
  return counts_rank_of(r) + R;
}

Status EpGroup::Impl::wait_progress(uint32_t target, Op op, const char* what) {
  for (int r : node_ranks[static_cast<size_t>(my_node)])
    if (r != rank) waiter.add_word(&ctrl(r)->progress, target, &ctrl(r)->sleepers, r, what);
  Status s = waiter.wait(
      [&](int peer, const char* w, bool is_mpi) { return describe_peer(peer, w, is_mpi, op, seq); });
  if (!s.ok()) return fail_timeout(s, waiter);
  return {};
}

Status EpGroup::Impl::exchange_headers(const CallHeader& mine, const int32_t* counts_rank,
                                       const int32_t* counts_node) {
  uint8_t* slot = at(rank, blk.nheader[seq % 2]);
  std::memcpy(slot, &mine, sizeof(CallHeader));
  int32_t* counts = reinterpret_cast<int32_t*>(slot + sizeof(CallHeader));
  for (int i = 0; i < R; ++i) counts[i] = counts_rank ? counts_rank[i] : 0;
  for (int i = 0; i < N; ++i) counts[R + i] = counts_node ? counts_node[i] : 0;
  internal::RankCtrl* c = ctrl(rank);
  internal::publish_word(&c->progress_op, static_cast<uint32_t>(mine.op), &c->sleepers);
  internal::publish_word(&c->progress, seq * 4 + 1, &c->sleepers);
  waiter.reset(opt.timeout_ms, opt.spin_us);
  const int n = static_cast<int>(header_msg);
  for (int r : remote_ranks) {
    MPI_Irecv(&hdr_in[static_cast<size_t>(r) * header_msg], n, MPI_BYTE, r, tag(1, seq), comm,
              waiter.add_request(r, "its call header"));
    MPI_Isend(slot, n, MPI_BYTE, r, tag(1, seq), comm,
              waiter.add_request(r, "delivery of this rank's call header"));
  }
  TRY(wait_progress(seq * 4 + 1, static_cast<Op>(mine.op), "its call header"));
  for (int r = 0; r < R; ++r) {
    const uint8_t* h =
        is_local(r) ? at(r, blk.nheader[seq % 2]) : &hdr_in[static_cast<size_t>(r) * header_msg];
    hdr_of[static_cast<size_t>(r)] = reinterpret_cast<const CallHeader*>(h);
  }
  return check_headers(mine, hdr_of);
}

// The same verdict on every rank: every check compares all ranks against rank 0 in rank order.
Status EpGroup::Impl::check_headers(const CallHeader& mine,
                                    const std::vector<const CallHeader*>& hdrs) const {
  const char* what = internal::op_name(static_cast<Op>(mine.op));
  for (int r = 0; r < R; ++r) {
    const CallHeader& h = *hdrs[static_cast<size_t>(r)];
    if (h.magic != internal::kHeaderMagic || h.version != internal::kProtocolVersion)
      return corrupt(
          "ep {} #{}: rank {} sent a header with magic {:#x} version {} (expected {:#x} version {}); "
          "every rank must run the same fathom build",
          what, mine.seq, r, h.magic, h.version, internal::kHeaderMagic, internal::kProtocolVersion);
    if (h.seq != mine.seq)
      return internal_error("ep {} #{}: rank {} sent the header of call #{}", what, mine.seq, r, h.seq);
  }
  for (int r = 0; r < R; ++r) {
    const CallHeader& h = *hdrs[static_cast<size_t>(r)];
    if (h.error != 0)
      return Status(static_cast<StatusCode>(h.error),
                    fmt::format("ep {} #{} failed on every rank because rank {} could not make it: {}", what,
                                mine.seq, r, h.error_text));
  }
  const CallHeader& a = *hdrs[0];
  for (int r = 1; r < R; ++r) {
    const CallHeader& b = *hdrs[static_cast<size_t>(r)];
    auto differ = [&](const char* field, auto x, auto y) {
      return invalid_argument("ep call #{}: ranks disagree on the {}: rank 0 has {}, rank {} has {}",
                              mine.seq, field, x, r, y);
    };
    if (a.op != b.op)
      return differ("operation", internal::op_name(static_cast<Op>(a.op)),
                    internal::op_name(static_cast<Op>(b.op)));
    if (a.format != b.format)
      return differ("wire format", wire_format_name(static_cast<WireFormat>(a.format)),
                    wire_format_name(static_cast<WireFormat>(b.format)));
    if (a.hidden != b.hidden) return differ("hidden size", a.hidden, b.hidden);
    if (a.topk != b.topk) return differ("top-k", a.topk, b.topk);
    if (a.num_experts != b.num_experts) return differ("number of experts", a.num_experts, b.num_experts);
    if (a.handle_id != b.handle_id)
      return differ("handle (id of the dispatch it came from)", a.handle_id, b.handle_id);
  }
  return {};
}

}  // namespace fathom::ep
