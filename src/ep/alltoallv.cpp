// AlltoallvBaseline: the plain way to move MoE tokens, used as the benchmark baseline and the
// tests' oracle. Dispatch packs each token once per destination rank (encoding it to the wire
// format), exchanges counts with MPI_Alltoall, moves rows and metadata with MPI_Alltoallv and, in
// low-latency layout, unpacks into [L, R*T] slots. Combine packs the expert outputs back,
// MPI_Alltoallv's them and reduces at the owner. Orders and arithmetic are the ones EpGroup
// documents (ranks ascending for normal combine, top-k ascending with weights for low latency),
// so results must match EpGroup bit for bit. Blocking MPI, no timeouts: not for production.
#include <algorithm>
#include <cstring>

#include "base/thread_pool.h"
#include "ep/codec.h"
#include "ep/ep.h"
#include "ep/shm.h"

namespace fathom::ep {

struct AlltoallvBaseline::Impl {
  EpOptions opt;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, R = 0, L = 0, K = 0;
  int64_t T = 0, cap = 0;
  Placement placement;
  Layout layout;
  internal::PrivateRegion mem;
  uint8_t *send_x = nullptr, *recv_x = nullptr, *ll_x = nullptr, *comb_send = nullptr, *comb_recv = nullptr;
  float *send_sc = nullptr, *recv_sc = nullptr, *ll_sc = nullptr;
  int32_t *send_meta = nullptr, *recv_meta = nullptr, *ll_src = nullptr;  // meta: [rows, 1 + K] (src, ids)
  float *send_w = nullptr, *recv_w = nullptr;
  int32_t *out_src = nullptr, *out_idx = nullptr;
  std::vector<int> scount, sdispl, rcount, rdispl, bs, bd, br, brd;  // rows, then byte versions
  std::vector<int> pc, pd, qc, qd;                                   // low-latency combine counts
  std::vector<int32_t> expert_count, ll_total, pair_index, src_rank, base, per;
  int64_t n_recv = 0, tokens = 0, hidden = 0;
  WireFormat f = WireFormat::kBF16;
  const int32_t* topk = nullptr;

  void bytes_of(const std::vector<int>& c, const std::vector<int>& d, uint64_t unit, std::vector<int>& oc,
                std::vector<int>& od) {
    for (int r = 0; r < R; ++r) oc[r] = static_cast<int>(c[r] * unit), od[r] = static_cast<int>(d[r] * unit);
  }
  void alltoallv(const void* s, void* d, uint64_t unit, bool reverse) {
    const auto& c = reverse ? rcount : scount;
    const auto& cd = reverse ? rdispl : sdispl;
    const auto& rc = reverse ? scount : rcount;
    const auto& rd = reverse ? sdispl : rdispl;
    bytes_of(c, cd, unit, bs, bd);
    bytes_of(rc, rd, unit, br, brd);
    MPI_Alltoallv(s, bs.data(), bd.data(), MPI_BYTE, d, br.data(), brd.data(), MPI_BYTE, comm);
  }
  Status dispatch_common(const DispatchInput& in);
};

AlltoallvBaseline::AlltoallvBaseline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AlltoallvBaseline::~AlltoallvBaseline() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
}

Result<std::unique_ptr<AlltoallvBaseline>> AlltoallvBaseline::create(MPI_Comm comm, const EpOptions& o) {
  auto m = std::make_unique<Impl>();
  m->opt = o;
  MPI_Comm_dup(comm, &m->comm);
  MPI_Comm_rank(m->comm, &m->rank);
  MPI_Comm_size(m->comm, &m->R);
  if (o.num_experts % m->R != 0)
    return invalid_argument("alltoallv: {} experts over {} ranks", o.num_experts, m->R);
  m->L = o.num_experts / m->R;
  m->K = o.topk;
  m->T = o.max_tokens_per_rank;
  m->cap = o.max_recv_tokens > 0 ? o.max_recv_tokens : m->T * m->R;
  m->placement = Placement{o.num_experts, m->R, std::vector<int>(static_cast<size_t>(m->R), 0)};
  m->layout = Layout::sized(m->placement, m->T);
  const uint64_t row = wire_row_bytes(WireFormat::kF32, o.hidden),
                 S = static_cast<uint64_t>(fp8_scale_cols(o.hidden));
  const uint64_t send_rows = static_cast<uint64_t>(m->T) * static_cast<uint64_t>(m->R);
  const uint64_t recv_rows = static_cast<uint64_t>(m->cap), ll_rows = static_cast<uint64_t>(m->L) * send_rows;
  const uint64_t pairs = static_cast<uint64_t>(m->T) * static_cast<uint64_t>(m->K);
  const uint64_t meta = static_cast<uint64_t>(1 + m->K) * 4, K4 = static_cast<uint64_t>(m->K) * 4;
  if (std::max(send_rows, recv_rows) * row >= (uint64_t{1} << 31))
    return invalid_argument("alltoallv: buffers over 2 GiB exceed MPI_Alltoallv's int byte counts");
  struct Part {
    void** p;
    uint64_t bytes;
  } parts[] = {{reinterpret_cast<void**>(&m->send_x), send_rows * row},
               {reinterpret_cast<void**>(&m->recv_x), recv_rows * row},
               {reinterpret_cast<void**>(&m->ll_x), ll_rows * row},
               {reinterpret_cast<void**>(&m->comb_send),
                std::max(recv_rows, pairs * static_cast<uint64_t>(m->R)) * row},
               {reinterpret_cast<void**>(&m->comb_recv), std::max(send_rows, pairs) * row},
               {reinterpret_cast<void**>(&m->send_sc), send_rows * S * 4},
               {reinterpret_cast<void**>(&m->recv_sc), recv_rows * S * 4},
               {reinterpret_cast<void**>(&m->ll_sc), ll_rows * S * 4},
               {reinterpret_cast<void**>(&m->send_meta), send_rows * meta},
               {reinterpret_cast<void**>(&m->recv_meta), recv_rows * meta},
               {reinterpret_cast<void**>(&m->ll_src), ll_rows * 8},
               {reinterpret_cast<void**>(&m->send_w), send_rows * K4},
               {reinterpret_cast<void**>(&m->recv_w), recv_rows * K4},
               {reinterpret_cast<void**>(&m->out_src), recv_rows * 4},
               {reinterpret_cast<void**>(&m->out_idx), recv_rows * K4}};
  uint64_t total = 0;
  for (auto& p : parts) total += (p.bytes + 4095) / 4096 * 4096;
  m->mem = TRY(internal::PrivateRegion::allocate(total, "alltoallv baseline"));
  uint64_t off = 0;
  for (auto& p : parts) {
    *p.p = m->mem.data() + off;
    off += (p.bytes + 4095) / 4096 * 4096;
  }
  const size_t R = static_cast<size_t>(m->R);
  for (auto* v : {&m->scount, &m->sdispl, &m->rcount, &m->rdispl, &m->bs, &m->bd, &m->br, &m->brd, &m->pc,
                  &m->pd, &m->qc, &m->qd})
    v->assign(R, 0);
  m->expert_count.assign(static_cast<size_t>(m->L) * R, 0);
  m->base.assign(static_cast<size_t>(m->L) * R, 0);
  m->per.assign(static_cast<size_t>(m->L) * R, 0);
  m->ll_total.assign(static_cast<size_t>(m->L), 0);
  m->pair_index.assign(static_cast<size_t>(pairs), -1);
  m->src_rank.assign(static_cast<size_t>(recv_rows), 0);
  return std::unique_ptr<AlltoallvBaseline>(new AlltoallvBaseline(std::move(m)));
}

// Pack (token once per destination rank, encoded), counts exchange, MPI_Alltoallv of everything.
Status AlltoallvBaseline::Impl::dispatch_common(const DispatchInput& in) {
  tokens = in.x.dim(0), hidden = in.x.dim(1), f = in.format, topk = in.topk_idx;
  if (tokens > T || hidden > opt.hidden)
    return out_of_range("alltoallv: input {} exceeds the sizes", in.x.shape_string());
  TRY(compute_layout(placement, in.topk_idx, tokens, K, &layout));
  const uint64_t row = wire_row_bytes(f, hidden);
  const int64_t S = f == WireFormat::kFP8 ? fp8_scale_cols(hidden) : 0;
  for (int r = 0, acc = 0; r < R; ++r)
    scount[r] = layout.tokens_per_rank[r], sdispl[r] = acc, acc += scount[r];
  const bool bf16 = in.x.dtype == DType::kBF16;
  default_pool().parallel_for(tokens, 16, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int r = 0; r < R; ++r) {
        if (!layout.token_in_rank[static_cast<size_t>(t * R + r)]) continue;
        const int64_t i = sdispl[r] + layout.slot_in_rank[static_cast<size_t>(t * R + r)];
        internal::encode_row(in.x.row_ptr(t), bf16, f, hidden, send_x + static_cast<uint64_t>(i) * row,
                             send_sc + i * S);
        int32_t* meta = send_meta + i * (1 + K);
        meta[0] = static_cast<int32_t>(t);
        for (int k = 0; k < K; ++k) {
          const int32_t e = in.topk_idx[t * K + k];
          meta[1 + k] = e >= 0 && e / L == r ? e % L : -1;
          send_w[i * K + k] = in.topk_weights ? in.topk_weights[t * K + k] : 0.0f;
        }
      }
  });
  MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, comm);
  n_recv = 0;
  for (int r = 0; r < R; ++r) rdispl[r] = static_cast<int>(n_recv), n_recv += rcount[r];
  if (n_recv > cap) return resource_exhausted("alltoallv: {} rows exceed the capacity {}", n_recv, cap);
  alltoallv(send_x, recv_x, row, false);
  if (S) alltoallv(send_sc, recv_sc, static_cast<uint64_t>(S) * 4, false);
  alltoallv(send_meta, recv_meta, static_cast<uint64_t>(1 + K) * 4, false);
  alltoallv(send_w, recv_w, static_cast<uint64_t>(K) * 4, false);
  for (int s = 0; s < R; ++s)
    for (int j = 0; j < rcount[s]; ++j) src_rank[static_cast<size_t>(rdispl[s] + j)] = s;
  return {};
}

Status AlltoallvBaseline::dispatch(const DispatchInput& in, DispatchOutput* out) {
  Impl& m = *impl_;
  TRY(m.dispatch_common(in));
  // Normal layout: rows by source rank, then token, which is MPI_Alltoallv's receive order, so
  // rows land in place; only the metadata is split into ids and source tokens.
  const int64_t n = m.n_recv, S = m.f == WireFormat::kFP8 ? fp8_scale_cols(m.hidden) : 0;
  int32_t* src = m.out_src;
  int32_t* idx = m.out_idx;
  for (int64_t i = 0; i < n; ++i) {
    src[i] = m.recv_meta[i * (1 + m.K)];
    for (int k = 0; k < m.K; ++k) idx[i * m.K + k] = m.recv_meta[i * (1 + m.K) + 1 + k];
  }
  const DType xt = m.f == WireFormat::kF32    ? DType::kF32
                   : m.f == WireFormat::kBF16 ? DType::kBF16
                                              : DType::kU8;
  *out = DispatchOutput{};
  out->x = Tensor::contiguous(xt, {n, m.hidden}, m.recv_x);
  if (S) out->x_scales = Tensor::contiguous(DType::kF32, {n, S}, m.recv_sc);
  out->topk_idx = Tensor::contiguous(DType::kI32, {n, m.K}, idx);
  out->topk_weights = Tensor::contiguous(DType::kF32, {n, m.K}, m.recv_w);
  out->src_token = Tensor::contiguous(DType::kI32, {n}, src);
  return {};
}

Status AlltoallvBaseline::dispatch_ll(const DispatchInput& in, LowLatencyOutput* out) {
  Impl& m = *impl_;
  TRY(m.dispatch_common(in));
  const uint64_t row = wire_row_bytes(m.f, m.hidden), slots = static_cast<uint64_t>(m.R * m.T);
  const int64_t S = m.f == WireFormat::kFP8 ? fp8_scale_cols(m.hidden) : 0;
  const int K = m.K, L = m.L, R = m.R;
  std::fill(m.expert_count.begin(), m.expert_count.end(), 0);
  for (int64_t i = 0; i < m.n_recv; ++i)
    for (int k = 0; k < K; ++k) {
      const int32_t le = m.recv_meta[i * (1 + K) + 1 + k];
      if (le >= 0) m.expert_count[static_cast<size_t>(le * R + m.src_rank[static_cast<size_t>(i)])]++;
    }
  for (int le = 0; le < L; ++le) {
    int32_t acc = 0;
    for (int s = 0; s < R; ++s)
      std::swap(acc, m.expert_count[static_cast<size_t>(le * R + s)]),
          acc += m.expert_count[static_cast<size_t>(le * R + s)];
    m.ll_total[static_cast<size_t>(le)] = acc;
  }
  // expert_count now holds bases; unpack (rows by source, then token: ascending i)
  for (int64_t i = 0; i < m.n_recv; ++i)
    for (int k = 0; k < K; ++k) {
      const int32_t le = m.recv_meta[i * (1 + K) + 1 + k];
      if (le < 0) continue;
      const int s = m.src_rank[static_cast<size_t>(i)];
      const uint64_t dst = static_cast<uint64_t>(le) * slots +
                           static_cast<uint64_t>(m.expert_count[static_cast<size_t>(le * R + s)]++);
      std::memcpy(m.ll_x + dst * row, m.recv_x + static_cast<uint64_t>(i) * row, row);
      if (S)
        std::memcpy(m.ll_sc + dst * static_cast<uint64_t>(S), m.recv_sc + i * S, static_cast<size_t>(S) * 4);
      m.ll_src[2 * dst] = s;
      m.ll_src[2 * dst + 1] = m.recv_meta[i * (1 + K)];
    }
  const DType xt = m.f == WireFormat::kF32    ? DType::kF32
                   : m.f == WireFormat::kBF16 ? DType::kBF16
                                              : DType::kU8;
  *out = LowLatencyOutput{};
  out->x = Tensor::contiguous(xt, {L, static_cast<int64_t>(slots), m.hidden}, m.ll_x);
  if (S) out->x_scales = Tensor::contiguous(DType::kF32, {L, static_cast<int64_t>(slots), S}, m.ll_sc);
  out->src_info = Tensor::contiguous(DType::kI32, {L, static_cast<int64_t>(slots), 2}, m.ll_src);
  out->count = std::span<const int32_t>(m.ll_total);
  return {};
}

Status AlltoallvBaseline::combine(const Tensor& expert_out, Tensor out) {
  Impl& m = *impl_;
  const WireFormat f = m.opt.combine_format;
  const int64_t H = expert_out.cols();
  const uint64_t row = wire_row_bytes(f, H);
  const bool bf16 = expert_out.dtype == DType::kBF16;
  default_pool().parallel_for(m.n_recv, 32, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      internal::encode_row(expert_out.row_ptr(i), bf16, f, H, m.comb_send + static_cast<uint64_t>(i) * row,
                           nullptr);
  });
  m.alltoallv(m.comb_send, m.comb_recv, row, true);
  const int R = m.R;
  float* o = out.ptr<float>();
  default_pool().parallel_for(m.tokens, 16, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = o + t * H;
      std::fill(acc, acc + H, 0.0f);
      for (int r = 0; r < R; ++r) {
        if (!m.layout.token_in_rank[static_cast<size_t>(t * R + r)]) continue;
        const int64_t i = m.sdispl[r] + m.layout.slot_in_rank[static_cast<size_t>(t * R + r)];
        internal::accumulate_row(acc, m.comb_recv + static_cast<uint64_t>(i) * row, f, H);
      }
    }
  });
  return {};
}

Status AlltoallvBaseline::combine_ll(const Tensor& expert_out, const float* topk_weights, Tensor out) {
  Impl& m = *impl_;
  const WireFormat f = m.opt.combine_format;
  const int64_t H = expert_out.cols();
  const uint64_t row = wire_row_bytes(f, H), slots = static_cast<uint64_t>(m.R * m.T),
                 src_row = expert_out.row_bytes();
  const int K = m.K, L = m.L, R = m.R;
  const bool bf16 = expert_out.dtype == DType::kBF16;
  // Pack: per source rank, per received token, its local (token, expert) rows in ascending k.
  std::vector<int32_t>& base = m.base;
  std::vector<int32_t>& per = m.per;
  std::fill(per.begin(), per.end(), 0);
  for (int64_t i = 0; i < m.n_recv; ++i)
    for (int k = 0; k < K; ++k) {
      const int32_t le = m.recv_meta[i * (1 + K) + 1 + k];
      if (le >= 0) per[static_cast<size_t>(le * R + m.src_rank[static_cast<size_t>(i)])]++;
    }
  for (int le = 0; le < L; ++le) {
    int32_t acc = 0;
    for (int s = 0; s < R; ++s)
      base[static_cast<size_t>(le * R + s)] = acc, acc += per[static_cast<size_t>(le * R + s)];
  }
  std::fill(per.begin(), per.end(), 0);
  int64_t n = 0;
  for (int s = 0; s < R; ++s) {
    m.pd[s] = static_cast<int>(n);
    for (int j = 0; j < m.rcount[s]; ++j) {
      const int64_t i = m.rdispl[s] + j;
      for (int k = 0; k < K; ++k) {
        const int32_t le = m.recv_meta[i * (1 + K) + 1 + k];
        if (le < 0) continue;
        const size_t ls = static_cast<size_t>(le * R + s);
        const uint64_t at = static_cast<uint64_t>(le) * slots + static_cast<uint64_t>(base[ls] + per[ls]++);
        internal::encode_row(static_cast<const uint8_t*>(expert_out.data) + at * src_row, bf16, f, H,
                             m.comb_send + static_cast<uint64_t>(n) * row, nullptr);
        ++n;
      }
    }
    m.pc[s] = static_cast<int>(n) - m.pd[s];
  }
  // Where each of my (token, k) pairs comes back: per destination rank, tokens ascending, k ascending.
  std::fill(m.qc.begin(), m.qc.end(), 0);
  for (int64_t t = 0; t < m.tokens; ++t)
    for (int k = 0; k < K; ++k) {
      const int32_t e = m.topk[t * K + k];
      if (e >= 0) m.pair_index[static_cast<size_t>(t * K + k)] = m.qc[e / L]++;
    }
  for (int r = 0, acc = 0; r < R; ++r) m.qd[r] = acc, acc += m.qc[r];
  for (int r = 0; r < R; ++r) {
    m.bs[r] = static_cast<int>(m.pc[r] * row), m.bd[r] = static_cast<int>(m.pd[r] * row);
    m.br[r] = static_cast<int>(m.qc[r] * row), m.brd[r] = static_cast<int>(m.qd[r] * row);
  }
  MPI_Alltoallv(m.comb_send, m.bs.data(), m.bd.data(), MPI_BYTE, m.comb_recv, m.br.data(), m.brd.data(),
                MPI_BYTE, m.comm);
  float* o = out.ptr<float>();
  default_pool().parallel_for(m.tokens, 8, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = o + t * H;
      std::fill(acc, acc + H, 0.0f);
      for (int k = 0; k < K; ++k) {
        const int32_t e = m.topk[t * K + k];
        if (e < 0) continue;
        const int64_t i = m.qd[e / L] + m.pair_index[static_cast<size_t>(t * K + k)];
        internal::axpy_row(acc, topk_weights[t * K + k], m.comb_recv + static_cast<uint64_t>(i) * row, f, H);
      }
    }
  });
  return {};
}

}  // namespace fathom::ep
