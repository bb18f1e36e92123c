// Low-latency mode. No counts pre-exchange: every sender publishes its top-k ids and encoded rows
// once (shared-memory staging, double-buffered by call parity, so a sender can run one call ahead
// without overwriting what a slow receiver still reads), and sends one message of exact size to
// each rank on another node; receivers post capacity-sized receives. Rows land in [L, R*T] slots
// (double-buffered outputs in shared memory) whose positions are a pure function of the routing:
// expert e's rows from source 0 first, then source 1, each in source token order (no atomics, the
// same on every run). A sender whose lower ranks share its node writes its rows into the node
// peers' slots itself as it encodes them (direct writes); ll_dispatch_recv waits, checks every
// rank's header, and copies the rest from the stagings and messages. Combine pulls the expert
// outputs back to each token's owner (shared memory) or sends them in expert order (MPI) and sums
// weight * row over the top-k slots in ascending k, in f32.
#include <algorithm>
#include <atomic>
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

constexpr uint64_t kMsgHead = 256;  // CallHeader, padded
uint64_t align64(uint64_t v) {
  return (v + 63) / 64 * 64;
}

struct MsgLayout {
  uint64_t meta, rows, scales;
};
MsgLayout msg_layout(int64_t n, int K, uint64_t row) {
  MsgLayout l;
  l.meta = kMsgHead;
  l.rows = align64(kMsgHead + static_cast<uint64_t>(n) * static_cast<uint64_t>(1 + K) * 4);
  l.scales = l.rows + static_cast<uint64_t>(n) * row;
  return l;
}

uint64_t ll_row(const EpGroup::Impl& m) {
  return wire_row_bytes(m.ll_format, m.ll_hidden);
}
int64_t ll_S(const EpGroup::Impl& m) {
  return m.ll_format == WireFormat::kFP8 ? fp8_scale_cols(m.ll_hidden) : 0;
}
uint64_t slots_per_expert(const EpGroup::Impl& m) {
  return static_cast<uint64_t>(m.R) * static_cast<uint64_t>(m.T);
}

Status validate_send(const EpGroup::Impl& m, const DispatchInput& in) {
  TRY(internal::check_rows(in.x, "low-latency dispatch input x", -1, m.opt.hidden));
  if (in.x.ndim != 2)
    return invalid_argument("ep ll_dispatch: x must be [tokens, hidden], got {}", in.x.shape_string());
  if (in.x.dim(0) > m.T)
    return out_of_range("ep ll_dispatch: {} tokens exceed the low-latency capacity max_tokens_per_rank {}",
                        in.x.dim(0), m.T);
  if (wire_row_bytes(in.format, 1) > wire_row_bytes(m.opt.max_dispatch_format, 1))
    return invalid_argument("ep ll_dispatch: wire format {} is wider than the group's max_dispatch_format {}",
                            wire_format_name(in.format), wire_format_name(m.opt.max_dispatch_format));
  if (in.x.dim(0) > 0 && in.topk_idx == nullptr)
    return invalid_argument("ep ll_dispatch: topk_idx is required");
  return internal::check_topk_ids(in.topk_idx, in.x.dim(0), m.opt.topk, m.opt.num_experts);
}

// Numbers each (token, expert) pair: the token's position among this rank's tokens choosing it.
void number_tokens(EpGroup::Impl& m, const DispatchInput& in) {
  std::fill(m.ll_mycount.begin(), m.ll_mycount.end(), 0);
  for (int64_t i = 0; i < m.ll_tokens * m.opt.topk; ++i) {
    const int32_t e = in.topk_idx[i];
    m.ll_slot[static_cast<size_t>(i)] = e < 0 ? -1 : m.ll_mycount[static_cast<size_t>(e)]++;
  }
}

// Direct writes. A sender can put its rows straight into their slots of the node peers' outputs
// once it knows how many rows each lower rank puts before its own in every expert, which is the
// lower ranks' top-k ids: every rank publishes its header and ids (ll_routed) before encoding.
// Whether the lower ranks' ids for this call are out and usable: kWait (not all out yet), kReady,
// or kNever (a lower rank failed, so its ids were not checked; no direct writes this call). Only
// what the slot positions depend on is checked: a lower rank that disagrees on anything else
// fails the call on every rank in ll_dispatch_recv, and rows written into it stay in bounds.
enum class Lower { kWait, kReady, kNever };
Lower lower_ranks(const EpGroup::Impl& m, const CallHeader& h, int p) {
  for (int s = 0; s < m.rank; ++s)
    if (!internal::word_reached(internal::load_word(&m.ctrl(s)->ll_routed), h.seq)) return Lower::kWait;
  for (int s = 0; s < m.rank; ++s) {
    const CallHeader& o = *reinterpret_cast<const CallHeader*>(m.at(s, m.blk.llheader[p]));
    if (o.seq != h.seq || o.error != 0 || o.num_tokens < 0 || o.num_tokens > m.T) return Lower::kNever;
  }
  return Lower::kReady;
}

// ll_lower[e]: rows the lower ranks send to expert e (they come first in its slots).
void count_lower(EpGroup::Impl& m, int p) {
  const int K = m.opt.topk;
  std::fill(m.ll_lower.begin(), m.ll_lower.end(), 0);
  for (int s = 0; s < m.rank; ++s) {
    const int32_t* idx = reinterpret_cast<const int32_t*>(m.at(s, m.blk.s_idx[p]));
    const int64_t n = reinterpret_cast<const CallHeader*>(m.at(s, m.blk.llheader[p]))->num_tokens * K;
    for (int64_t i = 0; i < n; ++i)
      if (idx[i] >= 0) m.ll_lower[static_cast<size_t>(idx[i])]++;
  }
}

// The slots of token t on this node's ranks: rows and (kFP8) scales. Returns how many.
int direct_slots(const EpGroup::Impl& m, const int32_t* topk, int64_t t, int p, uint8_t** dsts,
                 float** dst_scales) {
  const int K = m.opt.topk, L = m.L;
  const uint64_t row = ll_row(m), slots = slots_per_expert(m);
  const int64_t S = ll_S(m);
  int nd = 0;
  for (int k = 0; k < K; ++k) {
    const int32_t e = topk[t * K + k];
    if (e < 0 || !m.is_local(e / L)) continue;
    const uint64_t slot = static_cast<uint64_t>(e % L) * slots +
                          static_cast<uint64_t>(m.ll_lower[static_cast<size_t>(e)]) +
                          static_cast<uint64_t>(m.ll_slot[static_cast<size_t>(t * K + k)]);
    dsts[nd] = m.at(e / L, m.blk.ll_x[p]) + slot * row;
    dst_scales[nd] = S ? reinterpret_cast<float*>(m.at(e / L, m.blk.ll_sc[p])) + slot * S : nullptr;
    ++nd;
  }
  return nd;
}

// What encode_tokens does with each token: encode it into this rank's staging only (kStage), also
// stream it into its slots group by group as it is encoded (kDirect), or copy it, staged earlier,
// from the staging into its slots (kPlace).
enum class Rows { kStage, kDirect, kPlace };

// Tokens [t0, t1) as `mode` says. Returns the rows written to slots.
int64_t encode_tokens(EpGroup::Impl& m, const DispatchInput& in, int p, int64_t t0, int64_t t1, Rows mode) {
  const uint64_t row = ll_row(m);
  const int64_t S = ll_S(m);
  uint8_t* sx = m.at(m.rank, m.blk.s_x[p]);
  float* ss = reinterpret_cast<float*>(m.at(m.rank, m.blk.s_scales[p]));
  const bool bf16 = in.x.dtype == DType::kBF16;
  std::atomic<int64_t> written{0};
  default_pool().parallel_for(t1 - t0, 16, [&](int64_t i0, int64_t i1, int) {
    uint8_t* dsts[64];
    float* dsc[64];
    int64_t rows = 0;
    for (int64_t t = t0 + i0; t < t0 + i1; ++t) {
      uint8_t* stage = sx + static_cast<uint64_t>(t) * row;
      float* scales = ss + t * S;
      const int nd = mode == Rows::kStage ? 0 : direct_slots(m, in.topk_idx, t, p, dsts, dsc);
      if (mode == Rows::kPlace) {
        internal::copy_row_stream_multi(dsts, nd, stage, row);
        for (int k = 0; k < nd && S; ++k) std::memcpy(dsc[k], scales, static_cast<size_t>(S) * 4);
      } else if (mode == Rows::kDirect) {
        internal::encode_row_multi(in.x.row_ptr(t), bf16, m.ll_format, m.ll_hidden, stage, scales, dsts, dsc,
                                   nd);
      } else {
        internal::encode_row(in.x.row_ptr(t), bf16, m.ll_format, m.ll_hidden, stage, scales);
      }
      rows += nd;
    }
    if (rows) internal::stream_fence();  // the rows are published by ll_sent, after this returns
    written += rows;
  });
  return written.load();
}

// Encodes this rank's tokens, writing them into their node peers' outputs when the lower ranks'
// ids are known: checked before every block of tokens, so a late lower rank only costs the rows
// staged before it appeared (copied to their slots then). Returns the header flags.
int32_t send_tokens(EpGroup::Impl& m, const DispatchInput& in, const CallHeader& h, int p) {
  constexpr int64_t kBlock = 16;
  const int64_t n = m.ll_tokens;
  Lower lower = m.ll_direct_ok ? lower_ranks(m, h, p) : Lower::kNever;
  int64_t t0 = 0;
  while (lower == Lower::kWait && t0 < n) {
    const int64_t t1 = std::min(n, t0 + kBlock);
    encode_tokens(m, in, p, t0, t1, Rows::kStage);
    t0 = t1;
    lower = lower_ranks(m, h, p);
  }
  if (lower != Lower::kReady) {
    encode_tokens(m, in, p, t0, n, Rows::kStage);
    return 0;
  }
  count_lower(m, p);
  int64_t rows = encode_tokens(m, in, p, 0, t0, Rows::kPlace);
  rows += encode_tokens(m, in, p, t0, n, Rows::kDirect);
  m.bytes_moved += static_cast<uint64_t>(rows) * (ll_row(m) + static_cast<uint64_t>(ll_S(m)) * 4);
  return internal::kLlDirect;
}

// One message per rank on another node: the tokens that picked any of its experts.
void pack_dispatch_messages(EpGroup::Impl& m, const CallHeader& h, int p) {
  const int K = m.opt.topk, L = m.L;
  const uint64_t row = ll_row(m);
  const int64_t S = ll_S(m);
  const int32_t* idx = reinterpret_cast<const int32_t*>(m.at(m.rank, m.blk.s_idx[p]));
  const uint8_t* sx = m.at(m.rank, m.blk.s_x[p]);
  const float* ss = reinterpret_cast<const float*>(m.at(m.rank, m.blk.s_scales[p]));
  const int64_t tokens = h.error ? 0 : m.ll_tokens;
  default_pool().parallel_for(static_cast<int64_t>(m.remote_ranks.size()), 1,
                              [&](int64_t d0, int64_t d1, int) {
                                for (int64_t di = d0; di < d1; ++di) {
                                  const int r = m.remote_ranks[static_cast<size_t>(di)];
                                  uint8_t* msg = m.ll_pack + static_cast<uint64_t>(di) * m.ll_pack_stride;
                                  int64_t n = 0;
                                  for (int64_t t = 0; t < tokens; ++t)
                                    for (int k = 0; k < K; ++k)
                                      if (idx[t * K + k] >= 0 && idx[t * K + k] / L == r) {
                                        ++n;
                                        break;
                                      }
                                  const MsgLayout ml = msg_layout(n, K, row);
                                  int32_t* meta = reinterpret_cast<int32_t*>(msg + ml.meta);
                                  int64_t j = 0;
                                  for (int64_t t = 0; t < tokens; ++t) {
                                    bool any = false;
                                    for (int k = 0; k < K; ++k)
                                      any |= idx[t * K + k] >= 0 && idx[t * K + k] / L == r;
                                    if (!any) continue;
                                    for (int k = 0; k < K; ++k) {
                                      const int32_t e = idx[t * K + k];
                                      meta[j * (1 + K) + 1 + k] = e >= 0 && e / L == r ? e % L : -1;
                                    }
                                    meta[j * (1 + K)] = static_cast<int32_t>(t);
                                    std::memcpy(msg + ml.rows + static_cast<uint64_t>(j) * row,
                                                sx + static_cast<uint64_t>(t) * row, row);
                                    if (S)
                                      std::memcpy(reinterpret_cast<float*>(msg + ml.scales) + j * S,
                                                  ss + t * S, static_cast<size_t>(S) * 4);
                                    ++j;
                                  }
                                  CallHeader mh = h;
                                  mh.num_rows = static_cast<int32_t>(n);
                                  mh.flags = 0;
                                  std::memcpy(msg, &mh, sizeof(mh));
                                }
                              });
}

uint64_t dispatch_msg_bytes(const EpGroup::Impl& m, const uint8_t* msg) {
  const CallHeader* h = reinterpret_cast<const CallHeader*>(msg);
  const MsgLayout ml = msg_layout(h->num_rows, m.opt.topk, ll_row(m));
  return ml.scales + static_cast<uint64_t>(h->num_rows) * static_cast<uint64_t>(ll_S(m)) * 4;
}

Status wait_ll(EpGroup::Impl& m, bool combine) {
  for (int r : m.node_ranks[static_cast<size_t>(m.my_node)]) {
    if (r == m.rank) continue;
    internal::RankCtrl* c = m.ctrl(r);
    m.ll_waiter.add_word(combine ? &c->ll_ready : &c->ll_sent, m.ll_seq, &c->sleepers, r,
                         combine ? "its low-latency combine input" : "its low-latency dispatch rows");
  }
  const Op op = combine ? Op::kLlCombine : Op::kLlDispatch;
  Status s = m.ll_waiter.wait(
      [&](int p, const char* w, bool mpi) { return m.describe_peer(p, w, mpi, op, m.ll_seq); });
  if (!s.ok()) return m.fail_timeout(s, m.ll_waiter);
  return {};
}

// Plans every row copy of the receive side: counts, parity-independent bases, then jobs.
int64_t plan_receive(EpGroup::Impl& m, int p) {
  const int K = m.opt.topk, L = m.L, R = m.R;
  const uint64_t row = ll_row(m);
  const int64_t S = ll_S(m);
  std::fill(m.ll_count.begin(), m.ll_count.end(), 0);
  auto for_each_row = [&](int s, auto&& fn) {  // fn(local expert, source token, row ptr, scales ptr)
    if (m.is_local(s)) {
      const int32_t* idx = reinterpret_cast<const int32_t*>(m.at(s, m.blk.s_idx[p]));
      const uint8_t* sx = m.at(s, m.blk.s_x[p]);
      const float* ss = reinterpret_cast<const float*>(m.at(s, m.blk.s_scales[p]));
      for (int64_t t = 0; t < m.ll_hdr[static_cast<size_t>(s)]->num_tokens; ++t)
        for (int k = 0; k < K; ++k) {
          const int32_t e = idx[t * K + k];
          if (e >= 0 && e / L == m.rank) fn(e % L, t, sx + static_cast<uint64_t>(t) * row, ss + t * S);
        }
      return;
    }
    const size_t si = static_cast<size_t>(std::lower_bound(m.remote_ranks.begin(), m.remote_ranks.end(), s) -
                                          m.remote_ranks.begin());
    const uint8_t* msg = m.ll_in + si * m.ll_in_stride;
    const int64_t n = reinterpret_cast<const CallHeader*>(msg)->num_rows;
    const MsgLayout ml = msg_layout(n, K, row);
    const int32_t* meta = reinterpret_cast<const int32_t*>(msg + ml.meta);
    for (int64_t j = 0; j < n; ++j)
      for (int k = 0; k < K; ++k) {
        const int32_t le = meta[j * (1 + K) + 1 + k];
        if (le >= 0)
          fn(le, meta[j * (1 + K)], msg + ml.rows + static_cast<uint64_t>(j) * row,
             reinterpret_cast<const float*>(msg + ml.scales) + j * S);
      }
  };
  for (int s = 0; s < R; ++s)
    for_each_row(s, [&](int le, int64_t, const uint8_t*, const float*) {
      m.ll_count[static_cast<size_t>(le * R + s)]++;
    });
  int32_t* base = reinterpret_cast<int32_t*>(m.at(m.rank, m.blk.llbase));
  for (int le = 0; le < L; ++le) {
    int32_t acc = 0;
    for (int s = 0; s < R; ++s) {
      base[le * R + s] = acc;
      acc += m.ll_count[static_cast<size_t>(le * R + s)];
    }
    m.ll_total[static_cast<size_t>(le)] = acc;
  }
  int64_t nj = 0;
  for (int s = 0; s < R; ++s) {
    std::fill(m.ll_cursor.begin(), m.ll_cursor.end(), 0);
    // A source that wrote its rows into this output itself leaves only their source info.
    const bool direct = m.is_local(s) && (m.ll_hdr[static_cast<size_t>(s)]->flags & internal::kLlDirect);
    for_each_row(s, [&](int le, int64_t t, const uint8_t* src, const float* sc) {
      const int64_t dst = static_cast<int64_t>(le) * static_cast<int64_t>(slots_per_expert(m)) +
                          base[le * R + s] + m.ll_cursor[static_cast<size_t>(le)]++;
      if (direct) {
        m.ll_out_src[2 * dst] = s;
        m.ll_out_src[2 * dst + 1] = static_cast<int32_t>(t);
        return;
      }
      m.jobs[static_cast<size_t>(nj++)] = {src, sc, static_cast<int32_t>(dst), s, static_cast<int32_t>(t)};
    });
  }
  return nj;
}

}  // namespace

Status EpGroup::ll_dispatch_send(const DispatchInput& in) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  if (!m.opt.low_latency_mode)
    return failed_precondition("ep: the group was created without low_latency_mode");
  if (m.ll_state == LlState::kSent)
    return failed_precondition(
        "ep ll_dispatch_send: the previous low-latency dispatch was not received yet (call "
        "ll_dispatch_recv)");
  if (m.ll_state == LlState::kCombineSent)
    return failed_precondition(
        "ep ll_dispatch_send: the previous low-latency combine is still open (call ll_combine_recv)");
  Timer total;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  const uint32_t seq = ++m.ll_seq;
  const int p = static_cast<int>(seq % 2);
  Status local = validate_send(m, in);
  m.ll_tokens = local.ok() ? in.x.dim(0) : 0;
  m.ll_hidden = local.ok() ? in.x.dim(1) : 1;
  m.ll_format = in.format;
  CallHeader h;
  h.op = static_cast<uint8_t>(Op::kLlDispatch);
  h.format = static_cast<uint8_t>(in.format);
  h.seq = seq;
  h.num_tokens = static_cast<int32_t>(m.ll_tokens);
  h.hidden = static_cast<int32_t>(m.ll_hidden);
  h.topk = m.opt.topk;
  h.num_experts = m.opt.num_experts;
  internal::set_error(&h, local);
  Timer copy;
  // The header and ids first: the higher ranks of this node place their rows after this one's.
  internal::RankCtrl* c = m.ctrl(m.rank);
  if (local.ok() && m.ll_tokens > 0)
    std::memcpy(m.at(m.rank, m.blk.s_idx[p]), in.topk_idx, static_cast<size_t>(m.ll_tokens * m.opt.topk) * 4);
  std::memcpy(m.at(m.rank, m.blk.llheader[p]), &h, sizeof(h));
  internal::store_word(&c->ll_routed, seq);  // polled by the higher ranks, never waited on
  if (local.ok()) {
    number_tokens(m, in);
    h.flags = send_tokens(m, in, h, p);
    reinterpret_cast<CallHeader*>(m.at(m.rank, m.blk.llheader[p]))->flags = h.flags;
  }
  m.ll_waiter.reset(m.opt.timeout_ms, m.opt.spin_us);
  for (size_t si = 0; si < m.remote_ranks.size(); ++si)
    MPI_Irecv(m.ll_in + si * m.ll_in_stride, static_cast<int>(m.ll_in_stride), MPI_BYTE, m.remote_ranks[si],
              m.tag(9, seq), m.comm,
              m.ll_waiter.add_request(m.remote_ranks[si], "its low-latency dispatch message"));
  pack_dispatch_messages(m, h, p);
  m.times.copy_s = copy.elapsed_s();
  for (size_t di = 0; di < m.remote_ranks.size(); ++di) {
    const uint8_t* msg = m.ll_pack + di * m.ll_pack_stride;
    const uint64_t bytes = dispatch_msg_bytes(m, msg);
    MPI_Isend(
        msg, static_cast<int>(bytes), MPI_BYTE, m.remote_ranks[di], m.tag(9, seq), m.comm,
        m.ll_waiter.add_request(m.remote_ranks[di], "delivery of this rank's low-latency dispatch message"));
    m.bytes_moved += bytes;
  }
  internal::publish_word(&c->ll_sent, seq, &c->sleepers);
  m.ll_state = LlState::kSent;
  m.times.total_s = total.elapsed_s();
  return {};  // a local error travels in the header: ll_dispatch_recv reports it on every rank
}

Status EpGroup::ll_dispatch_recv(LowLatencyOutput* out) {
  Impl& m = *impl_;
  TRY(m.check_usable());
  if (m.ll_state != LlState::kSent)
    return failed_precondition("ep ll_dispatch_recv: no low-latency dispatch was sent");
  Timer total;
  m.times = PhaseTimes{};
  m.bytes_moved = 0;
  const int p = static_cast<int>(m.ll_seq % 2);
  Timer wait;
  TRY(wait_ll(m, false));
  m.times.wait_s = wait.elapsed_s();
  for (int r = 0; r < m.R; ++r) {
    const uint8_t* h = m.is_local(r)
                           ? m.at(r, m.blk.llheader[p])
                           : m.ll_in + static_cast<size_t>(
                                           std::lower_bound(m.remote_ranks.begin(), m.remote_ranks.end(), r) -
                                           m.remote_ranks.begin()) *
                                           m.ll_in_stride;
    m.ll_hdr[static_cast<size_t>(r)] = reinterpret_cast<const CallHeader*>(h);
  }
  const CallHeader& mine = *m.ll_hdr[static_cast<size_t>(m.rank)];
  if (Status s = m.check_headers(mine, m.ll_hdr); !s.ok()) {
    m.ll_state = LlState::kIdle;
    return s;
  }
  Timer copy;
  m.ll_out = m.at(m.rank, m.blk.ll_x[p]);
  m.ll_out_scales = reinterpret_cast<float*>(m.at(m.rank, m.blk.ll_sc[p]));
  const int64_t nj = plan_receive(m, p);
  const uint64_t row = ll_row(m);
  const int64_t S = ll_S(m);
  default_pool().parallel_for(nj, 16, [&](int64_t j0, int64_t j1, int) {
    uint8_t* dsts[64];
    for (int64_t j = j0; j < j1;) {
      // The jobs of one source row (its experts on this rank) are consecutive: the row is read
      // once and written to each slot with streaming stores (the slots are written whole, so
      // reading them in first, as cached stores do, would double the traffic).
      const uint8_t* src = m.jobs[static_cast<size_t>(j)].src;
      int n = 0;
      for (; j + n < j1 && n < 64 && m.jobs[static_cast<size_t>(j + n)].src == src; ++n) {
        const internal::CopyJob& job = m.jobs[static_cast<size_t>(j + n)];
        dsts[n] = m.ll_out + static_cast<uint64_t>(job.dst_row) * row;
        if (S) std::memcpy(m.ll_out_scales + job.dst_row * S, job.src_scales, static_cast<size_t>(S) * 4);
        m.ll_out_src[2 * job.dst_row] = job.src_rank;
        m.ll_out_src[2 * job.dst_row + 1] = job.src_token;
      }
      internal::copy_row_stream_multi(dsts, n, src, row);
      j += n;
    }
    internal::stream_fence();  // the rows are the caller's (and other pool threads') once this returns
  });
  m.times.copy_s = copy.elapsed_s();
  m.bytes_moved += static_cast<uint64_t>(nj) * (row + static_cast<uint64_t>(S) * 4);
  const int64_t slots = static_cast<int64_t>(slots_per_expert(m));
  const DType xt = m.ll_format == WireFormat::kF32    ? DType::kF32
                   : m.ll_format == WireFormat::kBF16 ? DType::kBF16
                                                      : DType::kU8;
  *out = LowLatencyOutput{};
  out->x = Tensor::contiguous(xt, {m.L, slots, m.ll_hidden}, m.ll_out);
  if (S) out->x_scales = Tensor::contiguous(DType::kF32, {m.L, slots, S}, m.ll_out_scales);
  out->src_info = Tensor::contiguous(DType::kI32, {m.L, slots, 2}, m.ll_out_src);
  out->count = std::span<const int32_t>(m.ll_total);
  m.ll_state = LlState::kReceived;
  m.times.total_s = total.elapsed_s();
  return {};
}

}  // namespace fathom::ep
