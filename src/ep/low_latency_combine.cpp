// Low-latency combine: the expert ranks publish their outputs (shared buffer E, [L, R*T] rows in
// the combine format) and reply to ranks on other nodes with the rows of their tokens in
// (local expert, source token) order; each token's owner then sums weight * row over its top-k
// slots in ascending k (f32, products rounded before the sum), reading node peers' E directly.
#include <algorithm>
#include <cstring>

#include "base/thread_pool.h"
#include "base/timer.h"
#include "ep/codec.h"
#include "ep/group_impl.h"

namespace fathom::ep {

using internal::CallHeader;
using internal::LlState;
using internal::Op;

namespace {

constexpr uint64_t kMsgHead = 256;

uint64_t slots_per_expert(const EpGroup::Impl& m) {
  return static_cast<uint64_t>(m.R) * static_cast<uint64_t>(m.T);
}

Status validate_combine_input(const EpGroup::Impl& m, const Tensor& in) {
  TRY(internal::check_rows(in, "low-latency combine input", -1, m.opt.hidden));
  if (in.ndim != 3 || in.dim(0) != m.L || in.dim(1) != static_cast<int64_t>(slots_per_expert(m)))
    return invalid_argument(
        "ep ll_combine: expert outputs must be [{}, {}, hidden] (local experts, ranks * "
        "max_tokens_per_rank), got {}",
        m.L, slots_per_expert(m), in.shape_string());
  return {};
}

// Valid rows of every local expert into E (converted to the combine format) unless already there.
void stage_outputs(EpGroup::Impl& m, const Tensor& in, int64_t hidden, uint64_t crow) {
  uint8_t* e = m.at(m.rank, m.blk.e_x);
  const DType want = m.opt.combine_format == WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  if (in.data == e && in.dtype == want) return;
  const bool bf16 = in.dtype == DType::kBF16;
  const uint64_t src_row = in.row_bytes(), slots = slots_per_expert(m);
  for (int le = 0; le < m.L; ++le) {
    const int64_t rows = m.ll_total[static_cast<size_t>(le)];
    const uint64_t first = static_cast<uint64_t>(le) * slots;
    default_pool().parallel_for(rows, 16, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const uint64_t at = first + static_cast<uint64_t>(i);
        internal::encode_row(static_cast<const uint8_t*>(in.data) + at * src_row, bf16, m.opt.combine_format,
                             hidden, e + at * crow, nullptr);
      }
    });
  }
}

// Replies to ranks on other nodes: their tokens' rows, per local expert in ascending order.
void pack_combine_replies(EpGroup::Impl& m, const CallHeader& h, uint64_t crow) {
  const int R = m.R;
  const uint8_t* e = m.at(m.rank, m.blk.e_x);
  const int32_t* base = reinterpret_cast<const int32_t*>(m.at(m.rank, m.blk.llbase));
  default_pool().parallel_for(
      static_cast<int64_t>(m.remote_ranks.size()), 1, [&](int64_t d0, int64_t d1, int) {
        for (int64_t di = d0; di < d1; ++di) {
          const int s = m.remote_ranks[static_cast<size_t>(di)];
          uint8_t* msg = m.ll_pack + static_cast<uint64_t>(di) * m.ll_pack_stride;
          int64_t n = 0;
          for (int le = 0; le < m.L && h.error == 0; ++le) {
            const int64_t cnt = m.ll_count[static_cast<size_t>(le * R + s)];
            const uint64_t first =
                static_cast<uint64_t>(le) * slots_per_expert(m) + static_cast<uint64_t>(base[le * R + s]);
            std::memcpy(msg + kMsgHead + static_cast<uint64_t>(n) * crow, e + first * crow,
                        static_cast<size_t>(cnt) * crow);
            n += cnt;
          }
          CallHeader mh = h;
          mh.num_rows = static_cast<int32_t>(n);
          std::memcpy(msg, &mh, sizeof(mh));
        }
      });
}

}  // namespace

Tensor EpGroup::ll_combine_buffer(int64_t hidden) {
  Impl& m = *impl_;
  const DType dt = m.opt.combine_format == WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  hidden = std::clamp<int64_t>(hidden, 1, m.opt.hidden);
  return Tensor::contiguous(dt, {m.L, static_cast<int64_t>(slots_per_expert(m)), hidden},
                            m.at(m.rank, m.blk.e_x));
}

Status EpGroup::ll_combine_send(const Tensor& expert_out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  if (m.ll_state != LlState::kReceived)
    return failed_precondition("ep ll_combine_send: needs a completed ll_dispatch_recv first");
  Timer total;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  const uint32_t seq = m.ll_seq;
  const int p = static_cast<int>(seq % 2);
  Status local = validate_combine_input(m, expert_out);
  const int64_t hidden = local.ok() ? expert_out.cols() : 1;
  const uint64_t crow = wire_row_bytes(m.opt.combine_format, hidden);
  CallHeader h;
  h.op = static_cast<uint8_t>(Op::kLlCombine);
  h.format = static_cast<uint8_t>(m.opt.combine_format);
  h.seq = seq;
  h.num_tokens = static_cast<int32_t>(m.ll_tokens);
  h.hidden = static_cast<int32_t>(hidden);
  h.topk = m.opt.topk;
  h.num_experts = m.opt.num_experts;
  internal::set_error(&h, local);
  Timer copy;
  if (local.ok()) stage_outputs(m, expert_out, hidden, crow);
  std::memcpy(m.at(m.rank, m.blk.llcheader[p]), &h, sizeof(h));
  m.ll_waiter.reset(m.opt.timeout_ms, m.opt.spin_us);
  const int L = m.L;
  for (size_t si = 0; si < m.remote_ranks.size(); ++si)
    MPI_Irecv(m.ll_cin + si * m.ll_cin_stride, static_cast<int>(m.ll_cin_stride), MPI_BYTE,
              m.remote_ranks[si], m.tag(10, seq), m.comm,
              m.ll_waiter.add_request(m.remote_ranks[si], "its low-latency combine reply"));
  pack_combine_replies(m, h, crow);
  m.times.copy_s = copy.elapsed_s();
  for (size_t di = 0; di < m.remote_ranks.size(); ++di) {
    const uint8_t* msg = m.ll_pack + di * m.ll_pack_stride;
    const uint64_t bytes =
        kMsgHead + static_cast<uint64_t>(reinterpret_cast<const CallHeader*>(msg)->num_rows) * crow;
    MPI_Isend(
        msg, static_cast<int>(bytes), MPI_BYTE, m.remote_ranks[di], m.tag(10, seq), m.comm,
        m.ll_waiter.add_request(m.remote_ranks[di], "delivery of this rank's low-latency combine reply"));
    m.bytes_moved += bytes;
  }
  // Where each of this rank's (token, expert) rows sits in the reply of a rank on another node.
  for (int r : m.remote_ranks) {
    int32_t acc = 0;
    for (int le = 0; le < L; ++le) {
      m.ll_prefix[static_cast<size_t>(r * L + le)] = acc;
      acc += m.ll_mycount[static_cast<size_t>(r * L + le)];
    }
  }
  internal::RankCtrl* c = m.ctrl(m.rank);
  internal::publish_word(&c->ll_ready, seq, &c->sleepers);
  m.ll_state = LlState::kCombineSent;
  m.times.total_s = total.elapsed_s();
  return {};
}

Status EpGroup::ll_combine_recv(const float* topk_weights, Tensor out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  if (m.ll_state != LlState::kCombineSent)
    return failed_precondition("ep ll_combine_recv: no low-latency combine was sent");
  Timer total;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  const int p = static_cast<int>(m.ll_seq % 2);
  for (int r : m.node_ranks[static_cast<size_t>(m.my_node)]) {
    if (r == m.rank) continue;
    internal::RankCtrl* c = m.ctrl(r);
    m.ll_waiter.add_word(&c->ll_ready, m.ll_seq, &c->sleepers, r, "its low-latency combine input");
  }
  Timer wait;
  Status w = m.ll_waiter.wait([&](int q, const char* what, bool mpi) {
    return m.describe_peer(q, what, mpi, Op::kLlCombine, m.ll_seq);
  });
  if (!w.ok()) return m.fail_timeout(w, m.ll_waiter);
  m.times.wait_s = wait.elapsed_s();
  m.ll_state = LlState::kIdle;
  for (int r = 0; r < m.R; ++r) {
    const uint8_t* h = m.is_local(r)
                           ? m.at(r, m.blk.llcheader[p])
                           : m.ll_cin + static_cast<size_t>(std::lower_bound(m.remote_ranks.begin(),
                                                                             m.remote_ranks.end(), r) -
                                                            m.remote_ranks.begin()) *
                                            m.ll_cin_stride;
    m.ll_hdr[static_cast<size_t>(r)] = reinterpret_cast<const CallHeader*>(h);
  }
  const CallHeader& mine = *m.ll_hdr[static_cast<size_t>(m.rank)];
  TRY(m.check_headers(mine, m.ll_hdr));
  const int64_t hidden = mine.hidden;
  if (out.dtype != DType::kF32 || !out.is_contiguous() || out.ndim != 2 || out.dim(0) != m.ll_tokens ||
      out.dim(1) != hidden)
    return invalid_argument("ep ll_combine_recv: out must be a contiguous f32 [{}, {}] tensor, got {} {}",
                            m.ll_tokens, hidden, dtype_name(out.dtype), out.shape_string());
  if (m.ll_tokens > 0 && topk_weights == nullptr)
    return invalid_argument("ep ll_combine_recv: topk_weights is required");
  const int K = m.opt.topk, L = m.L, R = m.R;
  const WireFormat f = m.opt.combine_format;
  const uint64_t crow = wire_row_bytes(f, hidden), slots = slots_per_expert(m);
  const int32_t* idx = reinterpret_cast<const int32_t*>(m.at(m.rank, m.blk.s_idx[p]));
  float* o = out.ptr<float>();
  Timer copy;
  default_pool().parallel_for(m.ll_tokens, 8, [&](int64_t t0, int64_t t1, int) {
    const void* rows[64];
    float w[64];
    for (int64_t t = t0; t < t1; ++t) {
      int n = 0;
      for (int k = 0; k < K; ++k) {  // ascending k: out = ((0 + w0 r0) + w1 r1) + ...
        const int32_t e = idx[t * K + k];
        if (e < 0) continue;
        const int r = e / L, le = e % L;
        const int32_t slot = m.ll_slot[static_cast<size_t>(t * K + k)];
        if (m.is_local(r)) {
          const int32_t b = reinterpret_cast<const int32_t*>(m.at(r, m.blk.llbase))[le * R + m.rank];
          rows[n] = m.at(r, m.blk.e_x) +
                    (static_cast<uint64_t>(le) * slots + static_cast<uint64_t>(b + slot)) * crow;
        } else {
          const size_t ri = static_cast<size_t>(
              std::lower_bound(m.remote_ranks.begin(), m.remote_ranks.end(), r) - m.remote_ranks.begin());
          rows[n] = m.ll_cin + ri * m.ll_cin_stride + kMsgHead +
                    static_cast<uint64_t>(m.ll_prefix[static_cast<size_t>(e)] + slot) * crow;
        }
        w[n++] = topk_weights[t * K + k];
      }
      internal::weighted_sum_rows(o + t * hidden, rows, w, n, f, hidden);
    }
  });
  m.times.copy_s = copy.elapsed_s();
  m.times.total_s = total.elapsed_s();
  return {};
}

Status EpGroup::ll_dispatch(const DispatchInput& in, LowLatencyOutput* out) {
  TRY(ll_dispatch_send(in));
  return ll_dispatch_recv(out);
}

Status EpGroup::ll_combine(const Tensor& expert_out, const float* topk_weights, Tensor out) {
  TRY(ll_combine_send(expert_out));
  return ll_combine_recv(topk_weights, out);
}

}  // namespace fathom::ep
