// Expert parallelism inside the model: the MoE layer of Model::Impl run through ep/ dispatch and
// combine across the ranks of `mpirun -np N fathom ... --ep N` (docs/model.md, "Expert
// parallelism"). Every rank holds the dense weights, attention and shared experts, and routed
// experts [rank * E / N, (rank + 1) * E / N) (contiguous, as ep::Placement and DeepEP).
//
// Per MoE layer, every rank has the same T token rows (same batch, same hidden states). Rank r
// takes the disjoint slice [T*r/N, T*(r+1)/N), dispatches it to the ranks holding the chosen
// experts (normal mode for prefill-sized slices, low-latency mode for decode-sized ones), runs its
// local experts over the rows it received, combines back, adds the weighted expert outputs, the
// shared experts and the residual for its slice, and all ranks all-gather the finished rows. So
// every expert matrix and every shared-expert row is computed once across the group, and every
// rank ends the layer with bit-identical hidden states (identical logits, identical sampling).
//
// Two granularities (ModelOptions::ep_exact):
// - exact (default): each (token, expert) pair travels as its own row (top-k 1, weight 1), so the
//   combine returns every expert output unsummed and the token's owner adds w * out into the
//   residual in ascending expert id, exactly as moe_experts does in one process: with f32 wire
//   formats the result is bit-identical to one process. Costs up to k / (ranks a token touches)
//   times DeepEP's dispatch rows and k rows per token back.
// - fast: DeepEP's granularity: each token once per destination rank with its local top-k, the
//   expert side sums its weighted outputs, combine sums the ranks. Rounding differs from one
//   process (the sum is grouped per rank); BF16 activations can amplify that to ~1e-3.
//
// Not here: attention is replicated (each rank runs it over all T tokens): `generate` and
// `logits` run one sequence; data-parallel attention across ranks belongs to the serving engine.
#include <algorithm>
#include <array>
#include <climits>
#include <cstring>

#include <mpi.h>

#include "base/log.h"
#include "ep/ep.h"
#include "model/model_impl.h"
#include "tensor/convert.h"

namespace fathom {

struct EpMoe {
  std::unique_ptr<ep::EpGroup> group;     // normal mode, slices up to max_slice tokens
  std::unique_ptr<ep::EpGroup> ll_group;  // low-latency mode, slices up to ll_cap tokens (or null)
  MPI_Comm comm = MPI_COMM_NULL;          // for the all-gather of finished rows
  int rank = 0, ranks = 1, local = 0;
  int64_t hidden = 0, top_k = 0, max_slice = 0, ll_cap = 0;
  bool exact = true;
  int64_t rows_per_token = 1;  // rows one token sends in exact mode: top_k; else 1
  ep::WireFormat dispatch_format = ep::WireFormat::kF32, combine_format = ep::WireFormat::kF32;
  MoeExpertsParams params;     // the local experts, top_k slots (normal mode)
  MoeExpertsParams ll_params;  // one expert, one slot (low-latency mode, expert-major rows)
  std::unique_ptr<MoeWorkspace> ws, ll_ws;
  ep::EpHandle handle;
  std::vector<float> recv_f32;  // received rows decoded to f32 (bf16/fp8 dispatch only)
  std::vector<float> out_f32;   // expert outputs when they do not go straight into the combine buffer
  std::vector<float> combined;  // [max_slice, hidden]
  std::vector<int32_t> ll_ids;  // [ranks * ll_cap * rows_per_token] zeros
  std::vector<float> ll_w;      // [ranks * ll_cap * rows_per_token] ones
  // Exact mode: the slice's (token, expert) pairs, per token in ascending expert id.
  std::vector<float> pair_x;      // [max_slice * top_k, hidden] the token's row, once per pair
  std::vector<int32_t> pair_ids;  // [max_slice * top_k] global expert id
  std::vector<float> pair_w;      // [max_slice * top_k] routing weight (applied by the owner)
  std::vector<float> pair_ones;   // [max_slice * top_k] 1.0 (what travels)
  std::vector<int32_t> pair_tok;  // [max_slice * top_k] token within the slice
  std::vector<float> pair_out;    // [max_slice * top_k, hidden] expert outputs, unweighted
  std::vector<int> counts, displs;

  ~EpMoe() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (comm != MPI_COMM_NULL && !fin) MPI_Comm_free(&comm);
  }
};

void EpMoeDeleter::operator()(EpMoe* p) const {
  delete p;
}

Result<int> ep_world_rank(int ep_size) {
  if (ep_size < 2)
    return invalid_argument("ep_world_rank: ep_size {} (expert parallelism needs 2+ ranks)", ep_size);
  TRY(ep::init_mpi());
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size == 1) {
    return failed_precondition(
        "--ep {} needs {} MPI processes, but this one is alone: run it as `mpirun -np {} fathom ...`",
        ep_size, ep_size, ep_size);
  }
  if (size != ep_size) {
    return failed_precondition("--ep {} but mpirun started {} processes: the MPI world size must equal --ep",
                               ep_size, size);
  }
  return rank;
}

Status ep_agree(const Status& local) {
  int failed_rank = local.ok() ? INT_MAX : 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!local.ok()) failed_rank = rank;
  int first = INT_MAX;
  MPI_Allreduce(&failed_rank, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!local.ok()) return local;
  if (first != INT_MAX)
    return unavailable("expert parallelism: rank {} failed to load the model (see its error)", first);
  return {};
}

namespace {

Result<std::unique_ptr<ep::EpGroup>> make_group(const ModelConfig& c, const ModelOptions& o,
                                                int64_t max_tokens, int topk, ep::WireFormat dispatch,
                                                ep::WireFormat combine, bool ll) {
  ep::EpOptions eo;
  eo.max_tokens_per_rank = max_tokens;
  eo.hidden = c.hidden_size;
  eo.topk = topk;
  eo.num_experts = static_cast<int>(c.n_routed_experts);
  eo.max_dispatch_format = dispatch;
  eo.combine_format = combine;
  eo.normal_mode = !ll;
  eo.low_latency_mode = ll;
  eo.timeout_ms = o.ep_timeout_ms;
  return ep::EpGroup::create(MPI_COMM_WORLD, eo);
}

}  // namespace

Result<EpMoePtr> ep_moe_create(const ModelConfig& c, const ModelOptions& o) {
  EpMoePtr e(new EpMoe);
  MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &e->ranks);
  e->dispatch_format = TRY(ep::parse_wire_format(o.ep_dispatch_format));
  e->combine_format = TRY(ep::parse_wire_format(o.ep_combine_format));
  if (e->combine_format == ep::WireFormat::kFP8)
    return invalid_argument("--ep-combine fp8: combine takes f32 or bf16");
  if (o.ep_low_latency_tokens < 0)
    return invalid_argument("ep_low_latency_tokens {} is negative", o.ep_low_latency_tokens);
  if (o.max_batch_tokens * c.hidden_size > INT_MAX) {
    return out_of_range("expert parallelism: max_batch_tokens {} x hidden {} exceeds one MPI message",
                        o.max_batch_tokens, c.hidden_size);
  }
  e->hidden = c.hidden_size;
  e->top_k = c.num_experts_per_tok;
  e->exact = o.ep_exact;
  e->rows_per_token = e->exact ? e->top_k : 1;
  const int wire_topk = static_cast<int>(e->exact ? 1 : e->top_k);
  e->local = static_cast<int>(c.n_routed_experts / e->ranks);
  e->max_slice = (o.max_batch_tokens + e->ranks - 1) / e->ranks;
  e->ll_cap = std::min(o.ep_low_latency_tokens, e->max_slice);
  const int64_t rpt = e->rows_per_token;
  e->group =
      TRY(make_group(c, o, e->max_slice * rpt, wire_topk, e->dispatch_format, e->combine_format, false));
  if (e->ll_cap > 0) {
    e->ll_group =
        TRY(make_group(c, o, e->ll_cap * rpt, wire_topk, e->dispatch_format, e->combine_format, true));
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &e->comm);
  const int64_t h = c.hidden_size, max_recv = e->ranks * e->max_slice * rpt;
  e->params = {.n_experts = e->local, .hidden = h, .inter = c.moe_intermediate_size, .top_k = wire_topk};
  e->ws = TRY(MoeWorkspace::create(e->params, max_recv));
  if (e->exact) {
    const size_t pairs = static_cast<size_t>(e->max_slice * e->top_k);
    e->pair_x.resize(pairs * static_cast<size_t>(h));
    e->pair_ids.resize(pairs);
    e->pair_w.resize(pairs);
    e->pair_ones.assign(pairs, 1.0f);
    e->pair_tok.resize(pairs);
    e->pair_out.resize(pairs * static_cast<size_t>(h));
  }
  e->handle = e->group->new_handle();
  const bool wide = e->dispatch_format == ep::WireFormat::kF32;
  if (!wide) e->recv_f32.resize(static_cast<size_t>(max_recv * h));
  if (e->combine_format != ep::WireFormat::kF32) e->out_f32.resize(static_cast<size_t>(max_recv * h));
  e->combined.resize(static_cast<size_t>(std::max<int64_t>(e->max_slice, 1) * h));
  if (e->ll_group) {
    const int64_t slots = e->ranks * e->ll_cap * rpt;
    e->ll_params = {.n_experts = 1, .hidden = h, .inter = c.moe_intermediate_size, .top_k = 1};
    e->ll_ws = TRY(MoeWorkspace::create(e->ll_params, slots));
    e->ll_ids.assign(static_cast<size_t>(slots), 0);
    e->ll_w.assign(static_cast<size_t>(slots), 1.0f);
    if (!wide && e->recv_f32.size() < static_cast<size_t>(slots * h))
      e->recv_f32.resize(static_cast<size_t>(slots * h));
    if (e->combine_format != ep::WireFormat::kF32 && e->out_f32.size() < static_cast<size_t>(slots * h)) {
      e->out_f32.resize(static_cast<size_t>(slots * h));
    }
  }
  e->counts.resize(static_cast<size_t>(e->ranks));
  e->displs.resize(static_cast<size_t>(e->ranks));
  log_debug("ep: rank {}/{} holds experts [{}, {}), slices up to {} tokens, low-latency up to {}, {}",
            e->rank, e->ranks, e->rank * e->local, (e->rank + 1) * e->local, e->max_slice, e->ll_cap,
            e->exact ? "exact" : "fast");
  return e;
}

namespace {

// Rows [row0, row0 + n) of a received tensor (f32, bf16, or e4m3 with scales) as f32 rows: the
// tensor's own memory for f32, else decoded into dst.
const float* rows_f32(const Tensor& x, const Tensor& scales, int64_t row0, int64_t n, int64_t h, float* dst) {
  if (x.dtype == DType::kF32) return x.ptr<float>() + row0 * h;
  if (x.dtype == DType::kBF16) {
    const uint16_t* src = x.ptr<uint16_t>() + row0 * h;
    for (int64_t i = 0; i < n * h; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    const int64_t s = ep::fp8_scale_cols(h);
    ep::per_token_cast_back(x.ptr<uint8_t>() + row0 * h, scales.ptr<float>() + row0 * s, n, h, dst);
  }
  return dst;
}

}  // namespace

// Normal mode: received rows [n_recv, hidden] with local top-k ids and weights; one moe_experts
// call over them (each local expert's matrices read once), straight into the combine buffer.
Status ep_moe_normal(EpMoe& e, std::span<const ExpertWeights> mine, const ep::DispatchInput& in,
                     float* combined) {
  ep::DispatchOutput out;
  TRY(e.group->dispatch(in, &e.handle, &out));
  const int64_t n_recv = e.handle.num_recv, h = e.hidden;
  const float* x = rows_f32(out.x, out.x_scales, 0, n_recv, h, e.recv_f32.data());
  const bool direct = e.combine_format == ep::WireFormat::kF32;
  Tensor cb = direct ? e.group->combine_buffer(e.handle, h)
                     : Tensor::contiguous(DType::kF32, {n_recv, h}, e.out_f32.data());
  moe_experts(e.params, mine, x, n_recv, out.topk_idx.ptr<int32_t>(), out.topk_weights.ptr<float>(),
              cb.ptr<float>(),
              /*accumulate=*/false, *e.ws);
  return e.group->combine(cb, e.handle, Tensor::contiguous(DType::kF32, {in.x.dim(0), h}, combined));
}

// Low-latency mode: rows arrive expert-major [local, ranks * cap, hidden]; each local expert runs
// over its count rows (weight 1); ll_combine applies the routing weights in f32.
Status ep_moe_low_latency(EpMoe& e, std::span<const ExpertWeights> mine, const ep::DispatchInput& in,
                          float* combined) {
  ep::LowLatencyOutput out;
  TRY(e.ll_group->ll_dispatch(in, &out));
  const int64_t slots = e.ranks * e.ll_cap * e.rows_per_token, h = e.hidden;
  const bool direct = e.combine_format == ep::WireFormat::kF32;
  Tensor cb = direct ? e.ll_group->ll_combine_buffer(h)
                     : Tensor::contiguous(DType::kF32, {e.local, slots, h}, e.out_f32.data());
  for (int j = 0; j < e.local; ++j) {
    const int64_t n = out.count[static_cast<size_t>(j)];
    if (n == 0) continue;
    const float* x = rows_f32(out.x, out.x_scales, j * slots, n, h, e.recv_f32.data());
    moe_experts(e.ll_params, mine.subspan(static_cast<size_t>(j), 1), x, n, e.ll_ids.data(), e.ll_w.data(),
                cb.ptr<float>() + j * slots * h, /*accumulate=*/false, *e.ll_ws);
  }
  return e.ll_group->ll_combine(cb, in.topk_weights,
                                Tensor::contiguous(DType::kF32, {in.x.dim(0), h}, combined));
}

// Exact mode: the slice's (token, expert) pairs, each token's in ascending expert id (the order
// moe_experts adds them in); returns how many.
int64_t make_pairs(EpMoe& e, const float* xn, const int32_t* ids, const float* w, int64_t n) {
  const int64_t k = e.top_k, h = e.hidden;
  int64_t np = 0;
  std::array<int, 64> order;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* it = ids + t * k;
    for (int j = 0; j < k; ++j) order[static_cast<size_t>(j)] = j;
    std::sort(order.begin(), order.begin() + k,
              [&](int a, int b) { return it[a] < it[b] || (it[a] == it[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      const int slot = order[static_cast<size_t>(j)];
      if (it[slot] < 0) continue;
      e.pair_ids[static_cast<size_t>(np)] = it[slot];
      e.pair_w[static_cast<size_t>(np)] = w[t * k + slot];
      e.pair_tok[static_cast<size_t>(np)] = static_cast<int32_t>(t);
      std::memcpy(e.pair_x.data() + np * h, xn + t * h, static_cast<size_t>(h) * 4);
      ++np;
    }
  }
  return np;
}

// The routed and shared experts of a MoE layer over s.xn, added into s.x, for T tokens whose
// routing (s.gate_ids, s.gate_w) every rank computed alike. Collective over the EP group.
Status Model::Impl::ffn_ep(const LayerWeights& L, int64_t T) {
  EpMoe& e = *ep;
  const ModelConfig& c = w->config;
  const int64_t h = e.hidden, k = e.top_k;
  const int64_t b = T * e.rank / e.ranks, n = T * (e.rank + 1) / e.ranks - b;
  const std::span<const ExpertWeights> mine = std::span<const ExpertWeights>(L.experts).subspan(
      static_cast<size_t>(e.rank * e.local), static_cast<size_t>(e.local));
  ep::DispatchInput in;
  in.format = e.dispatch_format;
  int64_t np = 0;
  float* routed = e.combined.data();
  if (e.exact) {
    np = make_pairs(e, s.xn.data() + b * h, s.gate_ids.data() + b * k, s.gate_w.data() + b * k, n);
    in.x = Tensor::contiguous(DType::kF32, {np, h}, e.pair_x.data());
    in.topk_idx = e.pair_ids.data();
    in.topk_weights = e.pair_ones.data();
    routed = e.pair_out.data();
  } else {
    in.x = Tensor::contiguous(DType::kF32, {n, h}, s.xn.data() + b * h);
    in.topk_idx = s.gate_ids.data() + b * k;
    in.topk_weights = s.gate_w.data() + b * k;
  }
  // Every rank decides alike from T: decode-sized slices take the low-latency path.
  const bool ll = e.ll_group != nullptr && (T + e.ranks - 1) / e.ranks <= e.ll_cap;
  Status st = ll ? ep_moe_low_latency(e, mine, in, routed) : ep_moe_normal(e, mine, in, routed);
  if (!st.ok())
    return st.with_context(ll ? "expert parallelism (low-latency mode)" : "expert parallelism (normal mode)");
  float* xs = s.x.data() + b * h;
  if (e.exact) {
    // x[t] += w * out, pair by pair in ascending expert id: moe_experts' own arithmetic.
    for (int64_t p = 0; p < np; ++p) {
      float* xt = xs + e.pair_tok[static_cast<size_t>(p)] * h;
      const float wp = e.pair_w[static_cast<size_t>(p)];
      const float* o = routed + p * h;
      for (int64_t i = 0; i < h; ++i) xt[i] += wp * o[i];
    }
  } else {
    for (int64_t i = 0; i < n * h; ++i) xs[i] += routed[i];
  }
  // Shared experts. matmul picks its kernel form (and so its rounding) by the row count, so exact
  // mode runs them over all T rows as one process does (replicated, like attention); only this
  // slice's rows are kept, the rest is overwritten by the all-gather. Fast mode: the slice only.
  const int64_t sh0 = e.exact ? 0 : b, shn = e.exact ? T : n;
  if (c.n_shared_experts > 0 && shn > 0) {
    const int64_t inter = L.sh_gate.rows;
    mm(L.sh_gate, s.xn.data() + sh0 * h, shn, s.ffn_a.data());
    mm(L.sh_up, s.xn.data() + sh0 * h, shn, s.ffn_b.data());
    silu_mul(s.ffn_a.data(), s.ffn_b.data(), s.ffn_a.data(), shn * inter);
    mm(L.sh_down, s.ffn_a.data(), shn, s.x.data() + sh0 * h, {.accumulate = true});
  }
  for (int r = 0; r < e.ranks; ++r) {
    const int64_t rb = T * r / e.ranks, re = T * (r + 1) / e.ranks;
    e.counts[static_cast<size_t>(r)] = static_cast<int>((re - rb) * h);
    e.displs[static_cast<size_t>(r)] = static_cast<int>(rb * h);
  }
  const int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, s.x.data(), e.counts.data(),
                                e.displs.data(), MPI_FLOAT, e.comm);
  if (rc != MPI_SUCCESS)
    return unavailable("expert parallelism: MPI_Allgatherv of the MoE output rows failed ({})", rc);
  return {};
}

}  // namespace fathom
