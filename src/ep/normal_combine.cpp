// Normal-mode combine: every rank puts its expert outputs in its shared combine buffer B (by call
// parity, so a fast peer's next combine never overwrites rows still being read), exchanges
// headers, and each token's owner pulls and sums the rows for its tokens: from node peers'
// buffers directly, from other nodes through MPI (flat: each holder sends its block of rows;
// hierarchical: the proxy that forwarded the token sums its node's rows first and sends one
// partial row per token). Summation order (documented in docs/ep.md): flat, destination ranks in
// ascending order; hierarchical, nodes in ascending order of partial sums, each partial the sum
// over the node's ranks in ascending order rounded to the combine format. All sums in f32.
#include <algorithm>
#include <cstring>

#include "base/thread_pool.h"
#include "base/timer.h"
#include "ep/codec.h"
#include "ep/group_impl.h"

namespace fathom::ep {

using internal::CallHeader;
using internal::Op;

namespace {

int64_t offset_at(const EpHandle& h, int R, int s, int r) {
  int64_t off = 0;
  for (int q = 0; q < s; ++q) off += h.counts[static_cast<size_t>(q * R + r)];
  return off;
}

struct Comb {
  WireFormat f;
  int64_t hidden;
  uint64_t row;
  int parity;
};

Status validate(const EpGroup::Impl& m, const Tensor& in, const EpHandle& h, const Tensor& out) {
  TRY(m.check_handle(h, true));
  TRY(internal::check_rows(in, "combine input", h.num_recv, m.opt.hidden));
  if (out.dtype != DType::kF32 || !out.is_contiguous() || (out.data == nullptr && out.numel() > 0) ||
      out.ndim != 2 || out.dim(0) != h.num_tokens || out.dim(1) != in.cols())
    return invalid_argument("ep combine: out must be a contiguous f32 [{}, {}] tensor, got {} {}",
                            h.num_tokens, in.cols(), dtype_name(out.dtype), out.shape_string());
  return {};
}

// The caller's rows into B (converted to the combine format) unless they are already there.
void stage_input(EpGroup::Impl& m, const Tensor& in, const Comb& c, int64_t rows) {
  uint8_t* b = m.at(m.rank, m.blk.b_x[c.parity]);
  const DType want = c.f == WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  if (in.data == b && in.dtype == want) return;
  const bool bf16 = in.dtype == DType::kBF16;
  const uint8_t* src = static_cast<const uint8_t*>(in.data);
  const uint64_t src_row = in.row_bytes();
  default_pool().parallel_for(rows, 32, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      internal::encode_row(src + static_cast<uint64_t>(i) * src_row, bf16, c.f, c.hidden,
                           b + static_cast<uint64_t>(i) * c.row, nullptr);
  });
}

// Hierarchical, on a proxy: one partial row per forwarded token (sum over this node's ranks).
void proxy_partials(EpGroup::Impl& m, const Comb& c, const EpHandle& h) {
  const auto& mine = m.node_ranks[static_cast<size_t>(m.my_node)];
  const int nl = static_cast<int>(mine.size());
  for (size_t pi = 0; pi < m.proxied.size(); ++pi) {
    const int s = m.proxied[pi];
    const int64_t n = h.proxy_count[pi];
    const uint64_t* masks = &h.proxy_masks[pi * static_cast<size_t>(m.T)];
    int64_t off[64];
    int32_t next[64] = {};
    for (int i = 0; i < nl; ++i) off[i] = offset_at(h, m.R, s, mine[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < n; ++j)
      for (int i = 0; i < nl; ++i)
        m.positions[static_cast<size_t>(j * 64 + i)] = masks[j] >> i & 1 ? next[i]++ : -1;
    uint8_t* pack = m.proxy_pack + pi * static_cast<uint64_t>(m.T) * m.comb_row;
    default_pool().parallel_for(n, 16, [&](int64_t j0, int64_t j1, int thread) {
      float* acc =
          reinterpret_cast<float*>(m.scratch_for(thread) + m.max_row + static_cast<uint64_t>(m.S) * 4);
      const void* rows[64];
      for (int64_t j = j0; j < j1; ++j) {
        int k = 0;
        for (int i = 0; i < nl; ++i) {
          const int32_t pos = m.positions[static_cast<size_t>(j * 64 + i)];
          if (pos < 0) continue;
          rows[k++] = m.at(mine[static_cast<size_t>(i)], m.blk.b_x[c.parity]) +
                      static_cast<uint64_t>(off[i] + pos) * c.row;
        }
        internal::sum_rows(acc, rows, k, c.f, c.hidden, false);
        internal::encode_row(acc, false, c.f, c.hidden, pack + static_cast<uint64_t>(j) * c.row, nullptr);
      }
    });
  }
}

void post_combine_messages(EpGroup::Impl& m, const Comb& c, const EpHandle& h) {
  const int R = m.R;
  const uint64_t slot_bytes = static_cast<uint64_t>(m.T) * c.row;
  auto irecv = [&](void* p, uint64_t rows, int peer, const char* what) {
    MPI_Irecv(p, static_cast<int>(rows * c.row), MPI_BYTE, peer, m.tag(8, m.seq), m.comm,
              m.waiter.add_request(peer, what));
  };
  auto isend = [&](const void* p, uint64_t rows, int peer) {
    MPI_Isend(p, static_cast<int>(rows * c.row), MPI_BYTE, peer, m.tag(8, m.seq), m.comm,
              m.waiter.add_request(peer, "delivery of this rank's expert outputs"));
    m.bytes_moved += rows * c.row;
  };
  if (!m.opt.hierarchical) {
    for (size_t di = 0; di < m.remote_ranks.size(); ++di) {
      const int r = m.remote_ranks[di];
      const uint64_t mine = static_cast<uint64_t>(h.counts[static_cast<size_t>(m.rank * R + r)]);
      if (mine) irecv(m.comb_stage + di * slot_bytes, mine, r, "its expert outputs for this rank's tokens");
      const uint64_t theirs = static_cast<uint64_t>(h.counts[static_cast<size_t>(r * R + m.rank)]);
      if (theirs)
        isend(m.at(m.rank, m.blk.b_x[c.parity]) +
                  static_cast<uint64_t>(h.recv_offset[static_cast<size_t>(r)]) * c.row,
              theirs, r);
    }
    return;
  }
  for (int n = 0; n < m.N; ++n) {
    const uint64_t cnt = static_cast<uint64_t>(h.layout.tokens_per_node[static_cast<size_t>(n)]);
    if (n == m.my_node || cnt == 0) continue;
    const auto& nr = m.node_ranks[static_cast<size_t>(n)];
    const int proxy = nr[static_cast<size_t>(m.local_index[static_cast<size_t>(m.rank)]) % nr.size()];
    irecv(m.comb_stage + static_cast<uint64_t>(n) * slot_bytes, cnt, proxy,
          "its node's partial sums for this rank's tokens");
  }
  for (size_t pi = 0; pi < m.proxied.size(); ++pi)
    if (h.proxy_count[pi] > 0)
      isend(m.proxy_pack + pi * static_cast<uint64_t>(m.T) * m.comb_row,
            static_cast<uint64_t>(h.proxy_count[pi]), m.proxied[pi]);
}

// out[t] = the documented sum of every row holding token t's expert outputs.
void reduce_tokens(EpGroup::Impl& m, const Comb& c, const EpHandle& h, float* out) {
  const int R = m.R, N = m.N;
  const Layout& lay = h.layout;
  const uint64_t slot_bytes = static_cast<uint64_t>(m.T) * c.row;
  for (int r = 0; r < R; ++r) m.send_off[static_cast<size_t>(r)] = offset_at(h, R, m.rank, r);
  const auto& mine = m.node_ranks[static_cast<size_t>(m.my_node)];
  // Large outputs are written with non-temporal stores (no read-for-ownership).
  const uint64_t out_row = static_cast<uint64_t>(c.hidden) * 4;
  const bool stream =
      static_cast<int64_t>(static_cast<uint64_t>(h.num_tokens) * out_row) > m.opt.stream_min_bytes;
  default_pool().parallel_for(h.num_tokens, 16, [&](int64_t t0, int64_t t1, int thread) {
    uint8_t* scratch = m.scratch_for(thread);
    float* partial = reinterpret_cast<float*>(scratch + m.max_row + static_cast<uint64_t>(m.S) * 4);
    const void* rows[64];
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = out + t * c.hidden;
      const uint8_t* in = &lay.token_in_rank[static_cast<size_t>(t * R)];
      auto local_row = [&](int r) {
        return m.at(r, m.blk.b_x[c.parity]) +
               static_cast<uint64_t>(m.send_off[static_cast<size_t>(r)] +
                                     lay.slot_in_rank[static_cast<size_t>(t * R + r)]) *
                   c.row;
      };
      int n = 0;
      if (!m.opt.hierarchical) {  // ranks ascending, summed in registers: ((0 + r0) + r1) + ...
        for (int r = 0; r < R; ++r) {
          if (!in[r]) continue;
          if (m.is_local(r)) {
            rows[n++] = local_row(r);
          } else {
            const size_t di = static_cast<size_t>(
                std::lower_bound(m.remote_ranks.begin(), m.remote_ranks.end(), r) - m.remote_ranks.begin());
            rows[n++] = m.comb_stage + di * slot_bytes +
                        static_cast<uint64_t>(lay.slot_in_rank[static_cast<size_t>(t * R + r)]) * c.row;
          }
        }
        internal::sum_rows(acc, rows, n, c.f, c.hidden, stream);
        continue;
      }
      for (int nd = 0; nd < N; ++nd) {  // nodes ascending; this node's partial rounded like a remote one
        const int32_t ns = lay.slot_in_node[static_cast<size_t>(t * N + nd)];
        if (ns < 0) continue;
        if (nd != m.my_node) {
          rows[n++] =
              m.comb_stage + static_cast<uint64_t>(nd) * slot_bytes + static_cast<uint64_t>(ns) * c.row;
          continue;
        }
        const void* peers[64];
        int np = 0;
        for (int r : mine)
          if (in[r]) peers[np++] = local_row(r);
        internal::sum_rows(partial, peers, np, c.f, c.hidden, false);
        internal::encode_row(partial, false, c.f, c.hidden, scratch, nullptr);
        rows[n++] = scratch;
      }
      internal::sum_rows(acc, rows, n, c.f, c.hidden, stream);
    }
    internal::stream_fence();
  });
}

}  // namespace

Tensor EpGroup::combine_buffer(const EpHandle& handle, int64_t hidden) {
  Impl& m = *impl_;
  const DType dt = m.opt.combine_format == WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  hidden = std::clamp<int64_t>(hidden, 1, m.opt.hidden);
  return Tensor::contiguous(dt, {handle.num_recv, hidden}, m.at(m.rank, m.blk.b_x[(m.seq + 1) % 2]));
}

Status EpGroup::combine(const Tensor& expert_out, const EpHandle& handle, Tensor out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  Timer total;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  ++m.seq;
  Status local = validate(m, expert_out, handle, out);
  Comb c{m.opt.combine_format, local.ok() ? expert_out.cols() : 0, 0, static_cast<int>(m.seq % 2)};
  c.row = wire_row_bytes(c.f, c.hidden);
  Timer copy;
  if (local.ok()) stage_input(m, expert_out, c, handle.num_recv);
  m.times.copy_s = copy.elapsed_s();
  CallHeader mine;
  mine.op = static_cast<uint8_t>(Op::kCombine);
  mine.format = static_cast<uint8_t>(c.f);
  mine.seq = m.seq;
  mine.num_tokens = static_cast<int32_t>(handle.num_tokens);
  mine.hidden = static_cast<int32_t>(c.hidden);
  mine.topk = m.opt.topk;
  mine.num_experts = m.opt.num_experts;
  mine.handle_id = handle.dispatch_id;
  internal::set_error(&mine, local);
  Timer sync;
  TRY(m.exchange_headers(mine, nullptr, nullptr));
  m.times.sync_s = sync.elapsed_s();
  Timer wait;
  m.waiter.reset(m.opt.timeout_ms, m.opt.spin_us);
  if (m.opt.hierarchical) proxy_partials(m, c, handle);
  post_combine_messages(m, c, handle);
  Status s = m.waiter.wait(
      [&](int p, const char* w, bool mpi) { return m.describe_peer(p, w, mpi, Op::kCombine, m.seq); });
  if (!s.ok()) return m.fail_timeout(s, m.waiter);
  m.times.wait_s = wait.elapsed_s();
  Timer reduce;
  reduce_tokens(m, c, handle, out.ptr<float>());
  m.times.copy_s += reduce.elapsed_s();
  for (int r = 0; r < m.R; ++r)
    if (m.is_local(r))
      m.bytes_moved += static_cast<uint64_t>(handle.layout.tokens_per_rank[static_cast<size_t>(r)]) * c.row;
  m.times.total_s = total.elapsed_s();
  return {};
}

}  // namespace fathom::ep
