// Normal-mode dispatch (and cached dispatch): header exchange with counts, then every row goes
// straight to its final slot. A node peer's slot is written through shared memory; rows for
// other nodes are packed once per destination rank (flat) or once per destination node
// (hierarchical, where the node's proxy rank forwards them through its own shared memory) and
// sent with MPI at exact sizes, received directly into the final slots (flat) or the proxy's
// staging. The receiver's rows are ordered by source rank, then source token.
#include <algorithm>
#include <bit>
#include <cstring>

#include "base/thread_pool.h"
#include "base/timer.h"
#include "ep/codec.h"
#include "ep/group_impl.h"

namespace fathom::ep {

using internal::CallHeader;
using internal::Op;

namespace {

// One dispatch call's shapes, shared by the steps below.
struct Call {
  const uint8_t* x = nullptr;
  bool src_bf16 = false;
  uint64_t src_row = 0;  // bytes of an input row
  const int32_t* topk = nullptr;
  const float* weights = nullptr;
  WireFormat f = WireFormat::kBF16;
  bool cached = false;
  int64_t tokens = 0, hidden = 0, S = 0;  // S: scale columns (kFP8) or 0
  uint64_t row = 0;                       // wire bytes of a row
  int K = 0;
  bool stream = false;  // large dispatches stream rows to their slots (they leave the cache anyway)
};

// Byte offsets inside a pack slot (flat: rows, scales, ids, weights, source tokens; hierarchical:
// rows, scales, token records).
struct PackLayout {
  uint64_t rows = 0, scales = 0, idx = 0, w = 0, src = 0, rec = 0, rec_bytes = 0;
};

PackLayout pack_layout(const Call& c, int64_t T) {
  PackLayout p;
  const uint64_t t = static_cast<uint64_t>(T), K = static_cast<uint64_t>(c.K);
  p.scales = t * c.row;
  p.idx = p.scales + t * static_cast<uint64_t>(c.S) * 4;
  p.w = p.idx + t * K * 4;
  p.src = p.w + t * K * 4;
  p.rec = p.idx;  // hierarchical packs hold records instead of ids/weights/sources
  p.rec_bytes = 16 + 8 * K;
  return p;
}

// Token record of the hierarchical path: [src token, pad, mask (u64), ids[K] (global), weights[K]].
struct RecordView {
  uint8_t* p;
  int32_t& src() { return *reinterpret_cast<int32_t*>(p); }
  uint64_t& mask() { return *reinterpret_cast<uint64_t*>(p + 8); }
  int32_t* ids() { return reinterpret_cast<int32_t*>(p + 16); }
  float* w(int K) { return reinterpret_cast<float*>(p + 16 + 4 * K); }
};

Status validate(const EpGroup::Impl& m, const Tensor& x, WireFormat f, const int32_t* topk, const float* w,
                bool cached, int64_t expect_tokens) {
  TRY(internal::check_rows(x, "dispatch input x", cached ? expect_tokens : -1, m.opt.hidden));
  if (x.ndim != 2)
    return invalid_argument("ep dispatch: x must be [tokens, hidden], got {}", x.shape_string());
  if (x.dim(0) > m.T)
    return out_of_range("ep dispatch: x has {} tokens, more than max_tokens_per_rank {}", x.dim(0), m.T);
  if (wire_row_bytes(f, 1) > wire_row_bytes(m.opt.max_dispatch_format, 1))
    return invalid_argument("ep dispatch: wire format {} is wider than the group's max_dispatch_format {}",
                            wire_format_name(f), wire_format_name(m.opt.max_dispatch_format));
  if (!cached && x.dim(0) > 0 && (topk == nullptr || w == nullptr))
    return invalid_argument("ep dispatch: topk_idx and topk_weights are required");
  return {};
}

// Writes one token's row into a destination slot: from the input when no conversion is needed,
// else from the once-encoded scratch (or encoding straight into a single destination).
struct RowWriter {
  const Call& c;
  const uint8_t* src;
  uint8_t* scratch;
  const uint8_t* enc = nullptr;  // encoded row (src itself when no conversion)
  const float* enc_scales = nullptr;
  int dests;
  RowWriter(const Call& call, int64_t t, uint8_t* scr, int n_dests) : c(call), scratch(scr), dests(n_dests) {
    src = c.x + static_cast<uint64_t>(t) * c.src_row;
    const bool same = (c.f == WireFormat::kF32 && !c.src_bf16) || (c.f == WireFormat::kBF16 && c.src_bf16);
    if (same) enc = src;
  }
  void write(uint8_t* dst, float* dst_scales) {
    if (enc == nullptr && dests == 1) {
      internal::encode_row(src, c.src_bf16, c.f, c.hidden, dst, dst_scales);
      return;
    }
    if (enc == nullptr) {
      float* sc = reinterpret_cast<float*>(scratch + c.row);
      internal::encode_row(src, c.src_bf16, c.f, c.hidden, scratch, sc);
      enc = scratch, enc_scales = sc;
    }
    if (c.stream) {
      internal::copy_row_stream(dst, enc, c.row);
    } else {
      std::memcpy(dst, enc, c.row);
    }
    if (c.S) std::memcpy(dst_scales, enc_scales, static_cast<size_t>(c.S) * 4);
  }
};

void write_meta(const Call& c, int64_t t, int dest_rank, int L, int32_t* idx, float* w, int32_t* src) {
  for (int k = 0; k < c.K; ++k) {
    const int32_t e = c.topk[t * c.K + k];
    const bool here = e >= 0 && e / L == dest_rank;
    idx[k] = here ? e % L : -1;
    w[k] = c.weights[t * c.K + k];
  }
  *src = static_cast<int32_t>(t);
}

// Step 2: every token to every destination: node peers directly, remote ones into pack slots.
void push_rows(EpGroup::Impl& m, const Call& c, const EpHandle& h) {
  const int R = m.R, K = c.K;
  const PackLayout pl = pack_layout(c, m.T);
  const Layout& lay = h.layout;
  default_pool().parallel_for(c.tokens, 16, [&](int64_t t0, int64_t t1, int thread) {
    uint8_t* scratch = m.scratch_for(thread);
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* in = &lay.token_in_rank[static_cast<size_t>(t * R)];
      int dests = 0;
      for (int r = 0; r < R; ++r) dests += in[r];
      RowWriter wr(c, t, scratch, dests);
      uint64_t nodes_done = 0;
      for (int r = 0; r < R; ++r) {
        if (!in[r]) continue;
        const int64_t slot = lay.slot_in_rank[static_cast<size_t>(t * R + r)];
        if (m.is_local(r)) {
          const int64_t row = m.send_off[static_cast<size_t>(r)] + slot;
          wr.write(m.at(r, m.blk.a_x) + static_cast<uint64_t>(row) * c.row,
                   reinterpret_cast<float*>(m.at(r, m.blk.a_scales)) + row * c.S);
          if (!c.cached)
            write_meta(c, t, r, m.L, reinterpret_cast<int32_t*>(m.at(r, m.blk.a_idx)) + row * K,
                       reinterpret_cast<float*>(m.at(r, m.blk.a_w)) + row * K,
                       reinterpret_cast<int32_t*>(m.at(r, m.blk.a_src)) + row);
          continue;
        }
        const int n = m.placement.node_of_rank[static_cast<size_t>(r)];
        if (!m.opt.hierarchical) {
          const size_t di = static_cast<size_t>(
              std::lower_bound(m.remote_ranks.begin(), m.remote_ranks.end(), r) - m.remote_ranks.begin());
          uint8_t* base = m.send_pack + di * m.send_pack_stride;
          wr.write(base + static_cast<uint64_t>(slot) * c.row,
                   reinterpret_cast<float*>(base + pl.scales) + slot * c.S);
          if (!c.cached)
            write_meta(c, t, r, m.L, reinterpret_cast<int32_t*>(base + pl.idx) + slot * K,
                       reinterpret_cast<float*>(base + pl.w) + slot * K,
                       reinterpret_cast<int32_t*>(base + pl.src) + slot);
          continue;
        }
        if (nodes_done >> n & 1) continue;
        nodes_done |= uint64_t{1} << n;
        const int64_t ns = lay.slot_in_node[static_cast<size_t>(t * m.N + n)];
        uint8_t* base = m.send_pack + static_cast<uint64_t>(n) * m.send_pack_stride;
        wr.write(base + static_cast<uint64_t>(ns) * c.row,
                 reinterpret_cast<float*>(base + pl.scales) + ns * c.S);
        if (c.cached) continue;
        RecordView rec{base + pl.rec + static_cast<uint64_t>(ns) * pl.rec_bytes};
        rec.src() = static_cast<int32_t>(t);
        uint64_t mask = 0;
        const auto& nr = m.node_ranks[static_cast<size_t>(n)];
        for (size_t i = 0; i < nr.size(); ++i) mask |= static_cast<uint64_t>(in[nr[i]]) << i;
        rec.mask() = mask;
        std::memcpy(rec.ids(), c.topk + t * K, static_cast<size_t>(K) * 4);
        std::memcpy(rec.w(K), c.weights + t * K, static_cast<size_t>(K) * 4);
      }
    }
    internal::stream_fence();  // streamed rows must be visible before "rows written" is published
  });
}

int64_t offset_at(const EpHandle& h, int R, int s, int r) {
  int64_t off = 0;
  for (int q = 0; q < s; ++q) off += h.counts[static_cast<size_t>(q * R + r)];
  return off;
}

// Steps 1 and 3: receives straight into final slots (flat) or proxy staging; sends of the packs.
void post_messages(EpGroup::Impl& m, const Call& c, const EpHandle& h) {
  const PackLayout pl = pack_layout(c, m.T);
  const int K = c.K, R = m.R;
  auto irecv = [&](void* p, uint64_t bytes, int peer, int kind, const char* what) {
    MPI_Irecv(p, static_cast<int>(bytes), MPI_BYTE, peer, m.tag(kind, m.seq), m.comm,
              m.waiter.add_request(peer, what));
  };
  const uint64_t k4 = static_cast<uint64_t>(K) * 4, s4 = static_cast<uint64_t>(c.S) * 4;
  if (!m.opt.hierarchical) {
    for (int s : m.remote_ranks) {
      const uint64_t n = static_cast<uint64_t>(h.counts[static_cast<size_t>(s * R + m.rank)]);
      if (n == 0) continue;
      const int64_t row = h.recv_offset[static_cast<size_t>(s)];
      irecv(m.at(m.rank, m.blk.a_x) + static_cast<uint64_t>(row) * c.row, n * c.row, s, 2, "its rows");
      if (c.S)
        irecv(m.at(m.rank, m.blk.a_scales) + static_cast<uint64_t>(row) * s4, n * s4, s, 3, "its FP8 scales");
      if (c.cached) continue;
      irecv(m.at(m.rank, m.blk.a_idx) + static_cast<uint64_t>(row) * k4, n * k4, s, 4, "its top-k ids");
      irecv(m.at(m.rank, m.blk.a_w) + static_cast<uint64_t>(row) * k4, n * k4, s, 5, "its top-k weights");
      irecv(m.at(m.rank, m.blk.a_src) + static_cast<uint64_t>(row) * 4, n * 4, s, 6, "its source token ids");
    }
    return;
  }
  for (size_t pi = 0; pi < m.proxied.size(); ++pi) {
    const int s = m.proxied[pi];
    const uint64_t n = static_cast<uint64_t>(m.counts_node_of(s)[m.my_node]);
    if (n == 0) continue;
    uint8_t* base = m.proxy_stage + pi * m.proxy_stride;
    irecv(base, n * c.row, s, 2, "its rows for this node");
    if (c.S) irecv(base + pl.scales, n * s4, s, 3, "its FP8 scales for this node");
    if (!c.cached) irecv(base + pl.rec, n * pl.rec_bytes, s, 7, "its token records for this node");
  }
}

void post_sends(EpGroup::Impl& m, const Call& c, const EpHandle& h) {
  const PackLayout pl = pack_layout(c, m.T);
  const uint64_t k4 = static_cast<uint64_t>(c.K) * 4, s4 = static_cast<uint64_t>(c.S) * 4;
  auto isend = [&](const void* p, uint64_t bytes, int peer, int kind) {
    MPI_Isend(p, static_cast<int>(bytes), MPI_BYTE, peer, m.tag(kind, m.seq), m.comm,
              m.waiter.add_request(peer, "delivery of this rank's rows"));
    m.bytes_moved += bytes;
  };
  if (!m.opt.hierarchical) {
    for (size_t di = 0; di < m.remote_ranks.size(); ++di) {
      const int r = m.remote_ranks[di];
      const uint64_t n = static_cast<uint64_t>(h.layout.tokens_per_rank[static_cast<size_t>(r)]);
      if (n == 0) continue;
      const uint8_t* base = m.send_pack + di * m.send_pack_stride;
      isend(base, n * c.row, r, 2);
      if (c.S) isend(base + pl.scales, n * s4, r, 3);
      if (c.cached) continue;
      isend(base + pl.idx, n * k4, r, 4);
      isend(base + pl.w, n * k4, r, 5);
      isend(base + pl.src, n * 4, r, 6);
    }
    return;
  }
  for (int n = 0; n < m.N; ++n) {
    if (n == m.my_node) continue;
    const uint64_t cnt = static_cast<uint64_t>(h.layout.tokens_per_node[static_cast<size_t>(n)]);
    if (cnt == 0) continue;
    const auto& nr = m.node_ranks[static_cast<size_t>(n)];
    const int proxy = nr[static_cast<size_t>(m.local_index[static_cast<size_t>(m.rank)]) % nr.size()];
    const uint8_t* base = m.send_pack + static_cast<uint64_t>(n) * m.send_pack_stride;
    isend(base, cnt * c.row, proxy, 2);
    if (c.S) isend(base + pl.scales, cnt * s4, proxy, 3);
    if (!c.cached) isend(base + pl.rec, cnt * pl.rec_bytes, proxy, 7);
  }
}

// Hierarchical, on a proxy: fans the rows received for each proxied source out to this node's
// ranks (final slots), remembering the destination masks in the handle.
void forward_proxied(EpGroup::Impl& m, const Call& c, EpHandle& h) {
  const PackLayout pl = pack_layout(c, m.T);
  const auto& mine = m.node_ranks[static_cast<size_t>(m.my_node)];
  const int nl = static_cast<int>(mine.size()), K = c.K;
  for (size_t pi = 0; pi < m.proxied.size(); ++pi) {
    const int s = m.proxied[pi];
    const int64_t n = m.counts_node_of(s)[m.my_node];
    uint8_t* base = m.proxy_stage + pi * m.proxy_stride;
    uint64_t* masks = &h.proxy_masks[pi * static_cast<size_t>(m.T)];
    if (!c.cached) {
      for (int64_t j = 0; j < n; ++j)
        masks[j] = RecordView{base + pl.rec + static_cast<uint64_t>(j) * pl.rec_bytes}.mask();
      h.proxy_count[pi] = static_cast<int32_t>(n);
    }
    int64_t off[64];
    int32_t next[64] = {};
    for (int i = 0; i < nl; ++i) off[i] = offset_at(h, m.R, s, mine[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < n; ++j)
      for (int i = 0; i < nl; ++i)
        m.positions[static_cast<size_t>(j * 64 + i)] = masks[j] >> i & 1 ? next[i]++ : -1;
    default_pool().parallel_for(n, 16, [&](int64_t j0, int64_t j1, int) {
      for (int64_t j = j0; j < j1; ++j) {
        const uint8_t* row = base + static_cast<uint64_t>(j) * c.row;
        const float* sc = reinterpret_cast<const float*>(base + pl.scales) + j * c.S;
        RecordView rec{base + pl.rec + static_cast<uint64_t>(j) * pl.rec_bytes};
        for (int i = 0; i < nl; ++i) {
          const int32_t pos = m.positions[static_cast<size_t>(j * 64 + i)];
          if (pos < 0) continue;
          const int r = mine[static_cast<size_t>(i)];
          const int64_t dst = off[i] + pos;
          uint8_t* to = m.at(r, m.blk.a_x) + static_cast<uint64_t>(dst) * c.row;
          if (c.stream) {
            internal::copy_row_stream(to, row, c.row);
          } else {
            std::memcpy(to, row, c.row);
          }
          if (c.S)
            std::memcpy(reinterpret_cast<float*>(m.at(r, m.blk.a_scales)) + dst * c.S, sc,
                        static_cast<size_t>(c.S) * 4);
          if (c.cached) continue;
          int32_t* idx = reinterpret_cast<int32_t*>(m.at(r, m.blk.a_idx)) + dst * K;
          for (int k = 0; k < K; ++k) {
            const int32_t e = rec.ids()[k];
            idx[k] = e >= 0 && e / m.L == r ? e % m.L : -1;
          }
          std::memcpy(reinterpret_cast<float*>(m.at(r, m.blk.a_w)) + dst * K, rec.w(K),
                      static_cast<size_t>(K) * 4);
          reinterpret_cast<int32_t*>(m.at(r, m.blk.a_src))[dst] = rec.src();
        }
      }
      internal::stream_fence();
    });
    for (int i = 0; i < nl; ++i)
      m.bytes_moved += static_cast<uint64_t>(next[i]) * (c.row + static_cast<uint64_t>(c.S) * 4);
  }
}

// Rows of each local expert, in row order, with their weights.
void group_by_expert(EpGroup::Impl& m, int64_t n_recv, int K) {
  const int32_t* idx = reinterpret_cast<const int32_t*>(m.at(m.rank, m.blk.a_idx));
  const float* w = reinterpret_cast<const float*>(m.at(m.rank, m.blk.a_w));
  std::fill(m.expert_count.begin(), m.expert_count.end(), 0);
  for (int64_t i = 0; i < n_recv * K; ++i)
    if (idx[i] >= 0) m.expert_count[static_cast<size_t>(idx[i])]++;
  m.expert_offset[0] = 0;
  for (int e = 0; e < m.L; ++e)
    m.expert_offset[static_cast<size_t>(e + 1)] =
        m.expert_offset[static_cast<size_t>(e)] + m.expert_count[static_cast<size_t>(e)];
  std::vector<int32_t>& next = m.expert_count;  // reuse as cursors, then restore the counts
  for (int e = 0; e < m.L; ++e) next[static_cast<size_t>(e)] = m.expert_offset[static_cast<size_t>(e)];
  for (int64_t i = 0; i < n_recv; ++i)
    for (int k = 0; k < K; ++k) {
      const int32_t e = idx[i * K + k];
      if (e < 0) continue;
      const int32_t at = next[static_cast<size_t>(e)]++;
      m.expert_rows[static_cast<size_t>(at)] = static_cast<int32_t>(i);
      m.expert_weights[static_cast<size_t>(at)] = w[i * K + k];
    }
  for (int e = 0; e < m.L; ++e)
    m.expert_count[static_cast<size_t>(e)] =
        m.expert_offset[static_cast<size_t>(e + 1)] - m.expert_offset[static_cast<size_t>(e)];
}

void fill_output(EpGroup::Impl& m, const Call& c, const EpHandle& h, DispatchOutput* out) {
  const int64_t n = h.num_recv;
  const DType xt = c.f == WireFormat::kF32    ? DType::kF32
                   : c.f == WireFormat::kBF16 ? DType::kBF16
                                              : DType::kU8;
  *out = DispatchOutput{};
  out->x = Tensor::contiguous(xt, {n, c.hidden}, m.at(m.rank, m.blk.a_x));
  if (c.S) out->x_scales = Tensor::contiguous(DType::kF32, {n, c.S}, m.at(m.rank, m.blk.a_scales));
  out->rank_offset = std::span<const int32_t>(h.recv_offset);
  if (c.cached) return;
  out->topk_idx = Tensor::contiguous(DType::kI32, {n, c.K}, m.at(m.rank, m.blk.a_idx));
  out->topk_weights = Tensor::contiguous(DType::kF32, {n, c.K}, m.at(m.rank, m.blk.a_w));
  out->src_token = Tensor::contiguous(DType::kI32, {n}, m.at(m.rank, m.blk.a_src));
  group_by_expert(m, n, c.K);
  const size_t total = static_cast<size_t>(m.expert_offset[static_cast<size_t>(m.L)]);
  out->tokens_per_expert = std::span<const int32_t>(m.expert_count);
  out->expert_offset = std::span<const int32_t>(m.expert_offset);
  out->expert_rows = std::span<const int32_t>(m.expert_rows.data(), total);
  out->expert_weights = std::span<const float>(m.expert_weights.data(), total);
}

// After the headers: the counts matrix, receive offsets and capacity (same verdict on every rank).
Status fill_handle(EpGroup::Impl& m, EpHandle& h) {
  const int R = m.R;
  for (int s = 0; s < R; ++s)
    for (int r = 0; r < R; ++r) h.counts[static_cast<size_t>(s * R + r)] = m.counts_rank_of(s)[r];
  for (int r = 0; r < R; ++r) {
    int64_t total = 0;
    for (int s = 0; s < R; ++s) total += h.counts[static_cast<size_t>(s * R + r)];
    if (total > m.cap)
      return resource_exhausted(
          "ep dispatch #{}: rank {} would receive {} rows, more than its capacity "
          "max_recv_tokens {}; raise EpOptions::max_recv_tokens",
          m.seq, r, total, m.cap);
  }
  h.recv_offset[0] = 0;
  for (int s = 0; s < R; ++s)
    h.recv_offset[static_cast<size_t>(s + 1)] =
        h.recv_offset[static_cast<size_t>(s)] + h.counts[static_cast<size_t>(s * R + m.rank)];
  h.num_recv = h.recv_offset[static_cast<size_t>(R)];
  h.dispatch_id = m.seq;
  h.num_tokens = h.layout.num_tokens;
  return {};
}

Status run_dispatch(EpGroup::Impl& m, Call& c, EpHandle& h, DispatchOutput* out, Status local) {
  Timer total;
  c.stream = static_cast<int64_t>(static_cast<uint64_t>(c.tokens) * c.row) > m.opt.stream_min_bytes;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  if (local.ok() && !c.cached) {
    Timer t;
    local = compute_layout(m.placement, c.topk, c.tokens, c.K, &h.layout);
    m.times.layout_s = t.elapsed_s();
  }
  CallHeader mine;
  mine.op = static_cast<uint8_t>(c.cached ? Op::kDispatchCached : Op::kDispatch);
  mine.format = static_cast<uint8_t>(c.f);
  mine.seq = m.seq;
  mine.num_tokens = static_cast<int32_t>(c.tokens);
  mine.hidden = static_cast<int32_t>(c.hidden);
  mine.topk = c.K;
  mine.num_experts = m.opt.num_experts;
  mine.handle_id = c.cached ? h.dispatch_id : m.seq;
  internal::set_error(&mine, local);
  const bool have = local.ok();
  if (!c.cached) h.dispatch_id = 0;  // a failed dispatch leaves the handle unusable, not stale
  Timer sync;
  TRY(m.exchange_headers(mine, have ? h.layout.tokens_per_rank.data() : nullptr,
                         have ? h.layout.tokens_per_node.data() : nullptr));
  m.times.sync_s = sync.elapsed_s();
  if (!c.cached) TRY(fill_handle(m, h));
  for (int r = 0; r < m.R; ++r) m.send_off[static_cast<size_t>(r)] = offset_at(h, m.R, m.rank, r);
  m.waiter.reset(m.opt.timeout_ms, m.opt.spin_us);
  post_messages(m, c, h);
  Timer copy;
  push_rows(m, c, h);
  m.times.copy_s = copy.elapsed_s();
  for (int r = 0; r < m.R; ++r)
    if (m.is_local(r))
      m.bytes_moved += static_cast<uint64_t>(h.layout.tokens_per_rank[static_cast<size_t>(r)]) *
                       (c.row + static_cast<uint64_t>(c.S) * 4);
  post_sends(m, c, h);
  Timer wait;
  const Op op = static_cast<Op>(mine.op);
  if (m.opt.hierarchical && !m.proxied.empty()) {
    Status s =
        m.waiter.wait([&](int p, const char* w, bool mpi) { return m.describe_peer(p, w, mpi, op, m.seq); });
    if (!s.ok()) return m.fail_timeout(s, m.waiter);
    forward_proxied(m, c, h);
  }
  internal::RankCtrl* me = m.ctrl(m.rank);
  internal::publish_word(&me->progress, m.seq * 4 + 2, &me->sleepers);
  TRY(m.wait_progress(m.seq * 4 + 2, op, "rows written"));
  m.times.wait_s = wait.elapsed_s();
  fill_output(m, c, h, out);
  m.times.total_s = total.elapsed_s();
  return {};
}

}  // namespace

Status EpGroup::dispatch(const DispatchInput& in, EpHandle* handle, DispatchOutput* out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  ++m.seq;
  Status local = m.check_handle(*handle, false);
  if (local.ok()) local = validate(m, in.x, in.format, in.topk_idx, in.topk_weights, false, -1);
  Call c;
  if (local.ok()) {
    c.x = static_cast<const uint8_t*>(in.x.data);
    c.src_bf16 = in.x.dtype == DType::kBF16;
    c.src_row = in.x.row_bytes();
    c.tokens = in.x.dim(0);
    c.hidden = in.x.dim(1);
  }
  c.topk = in.topk_idx;
  c.weights = in.topk_weights;
  c.f = in.format;
  c.K = m.opt.topk;
  c.S = in.format == WireFormat::kFP8 ? fp8_scale_cols(c.hidden) : 0;
  c.row = wire_row_bytes(in.format, c.hidden);
  return run_dispatch(m, c, *handle, out, local);
}

Status EpGroup::dispatch_cached(const Tensor& x, WireFormat format, const EpHandle& handle,
                                DispatchOutput* out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  ++m.seq;
  Status local = m.check_handle(handle, true);
  if (local.ok()) local = validate(m, x, format, nullptr, nullptr, true, handle.num_tokens);
  Call c;
  if (local.ok()) {
    c.x = static_cast<const uint8_t*>(x.data);
    c.src_bf16 = x.dtype == DType::kBF16;
    c.src_row = x.row_bytes();
    c.tokens = x.dim(0);
    c.hidden = x.dim(1);
  }
  c.f = format;
  c.K = m.opt.topk;
  c.cached = true;
  c.S = format == WireFormat::kFP8 ? fp8_scale_cols(c.hidden) : 0;
  c.row = wire_row_bytes(format, c.hidden);
  // The handle is only read: cached dispatch never changes the routes.
  return run_dispatch(m, c, const_cast<EpHandle&>(handle), out, local);
}

}  // namespace fathom::ep
