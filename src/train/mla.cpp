// MLA forward/backward in the naive form (train_impl.h): q through the LoRA path (q_a_proj,
// q_a_layernorm, q_b_proj) or q_proj; kv_a_proj_with_mqa -> latent | k_pe; kv_a_layernorm on the
// latent; interleaved RoPE/YaRN on the rope dims of q and k_pe (shared by all heads); kv_b_proj ->
// per-head k_nope | v; causal softmax attention with DeepSeek's softmax scale; o_proj.
// Attention keeps the full probability matrix (O(S^2) per head): training sequences here are
// short; a flash-style recompute is a later optimisation. (sequence, head) pairs run in parallel,
// each as a few GEMMs on the head's strided slices (OpenBLAS, blas.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "tensor/convert.h"
#include "train/blas.h"
#include "train/train_impl.h"

namespace fathom::train {
namespace {

struct Dims {
  int64_t n, S, hd, H, nope, rd, qk, kvl, vd, qr, kvw, kvbw;
  explicit Dims(const ModelConfig& c, SeqShape s)
      : n(s.tokens()),
        S(s.seq_len),
        hd(c.hidden_size),
        H(c.num_attention_heads),
        nope(c.qk_nope_head_dim),
        rd(c.qk_rope_head_dim),
        qk(nope + rd),
        kvl(c.kv_lora_rank),
        vd(c.v_head_dim),
        qr(c.q_lora_rank),
        kvw(kvl + rd),
        kvbw(nope + vd) {}
};

template <class T>
void ensure_rope(const ModelConfig& c, int64_t len, MlaContext<T>& ctx) {
  if (ctx.rope_len >= len) return;
  const RopeParams rp = rope_params(c);
  const std::vector<double> inv = rope_inv_freq(rp);
  const double cs = rope_cos_sin_scale(rp);
  const int64_t half = rp.dim / 2;
  ctx.cos.resize(static_cast<size_t>(len * half));
  ctx.sin.resize(ctx.cos.size());
  for (int64_t pos = 0; pos < len; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * inv[static_cast<size_t>(i)];
      ctx.cos[static_cast<size_t>(pos * half + i)] = static_cast<T>(std::cos(a) * cs);
      ctx.sin[static_cast<size_t>(pos * half + i)] = static_cast<T>(std::sin(a) * cs);
    }
  }
  ctx.rope_len = len;
}

// Rotates interleaved pairs of x[0..dim) by the angles of `pos`; inverse rotates by -angle
// (the transpose: the backward of a rotation).
template <class T>
void rope(const MlaContext<T>& ctx, int64_t dim, int64_t pos, bool inverse, T* x) {
  const int64_t half = dim / 2;
  const T* cs = ctx.cos.data() + pos * half;
  const T* sn = ctx.sin.data() + pos * half;
  for (int64_t i = 0; i < half; ++i) {
    const T c = cs[i], s = inverse ? -sn[i] : sn[i];
    const T x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// Causal attention of one (sequence, head) as GEMMs on the head's strided slices (blas.h, one
// thread per task): scores = scale * (q_nope . k_nope^T + q_pe . k_pe^T), p = causal softmax
// (row i over j <= i; the rest 0), att = p . v.
template <class T>
void attention_forward_head(const Dims& d, double scale, int64_t s, int64_t h, MlaContext<T>& ctx) {
  const int64_t S = d.S;
  T* P = ctx.p.data() + (s * d.H + h) * S * S;
  const T* q = ctx.q.data() + (s * S * d.H + h) * d.qk;  // [S, qk], ld H * qk
  const T* k = ctx.kvb.data() + (s * S * d.H + h) * d.kvbw;  // [S, nope | v], ld H * kvbw
  const T* kpe = ctx.kpe.data() + s * S * d.rd;                // [S, rd]
  const T sc = static_cast<T>(scale);
  blas_gemm<T>(false, true, S, S, d.nope, sc, q, d.H * d.qk, k, d.H * d.kvbw, T(0), P, S);
  blas_gemm<T>(false, true, S, S, d.rd, sc, q + d.nope, d.H * d.qk, kpe, d.rd, T(1), P, S);
  for (int64_t i = 0; i < S; ++i) {
    T* pr = P + i * S;
    const T mx = *std::max_element(pr, pr + i + 1);
    T sum = 0;
    if constexpr (std::is_same_v<T, float>) {  // the runtime's vectorised exp (~2e-7 relative)
      for (int64_t j = 0; j <= i; ++j) pr[j] -= mx;
      exp_f32(pr, pr, i + 1);
      for (int64_t j = 0; j <= i; ++j) sum += pr[j];
    } else {
      for (int64_t j = 0; j <= i; ++j) sum += pr[j] = std::exp(pr[j] - mx);
    }
    const T inv = T(1) / sum;
    for (int64_t j = 0; j <= i; ++j) pr[j] *= inv;
    std::fill(pr + i + 1, pr + S, T(0));
  }
  T* o = ctx.att.data() + (s * S * d.H + h) * d.vd;
  blas_gemm<T>(false, false, S, d.vd, S, T(1), P, S, k + d.nope, d.H * d.kvbw, T(0), o, d.H * d.vd);
}

// Every (sequence, head) is an independent task on the pool (disjoint outputs).
template <class T>
void attention_forward(const Dims& d, double scale, MlaContext<T>& ctx) {
  const int64_t S = d.S;
  ctx.p.resize(static_cast<size_t>(ctx.shape.n_seq * d.H * S * S));
  ctx.att.resize(static_cast<size_t>(d.n * d.H * d.vd));
  default_pool().run(ctx.shape.n_seq * d.H, [&](int64_t task, int) {
    attention_forward_head(d, scale, task / d.H, task % d.H, ctx);
  });
}

// One (sequence, head) of the backward from datt (ctx.scratch [n, H, v]), as GEMMs:
//   dP = datt . v^T;  dv += P^T . datt;  dS = P * (dP - rowsum(P * dP)) * scale;
//   dq_nope += dS . k_nope;  dq_pe += dS . k_pe;  dk_nope += dS^T . q_nope;
//   this head's dk_pe share = dS^T . q_pe into ctx.dkpe_heads [H, n, rope] (k_pe is shared by the
//   heads: summed afterwards in head order, so the result does not depend on the thread count).
// dP: [S, S] per-thread scratch.
template <class T>
void attention_backward_head(const Dims& d, double scale, int64_t s, int64_t h, T* dP, MlaContext<T>& ctx) {
  const int64_t S = d.S;
  const T* P = ctx.p.data() + (s * d.H + h) * S * S;
  const int64_t base = s * S * d.H + h;
  const T* da = ctx.scratch.data() + base * d.vd;  // ld H * vd
  const T* q = ctx.q.data() + base * d.qk;         // ld H * qk
  const T* k = ctx.kvb.data() + base * d.kvbw;     // ld H * kvbw
  const T* kpe = ctx.kpe.data() + s * S * d.rd;    // ld rd
  T* dq = ctx.dq.data() + base * d.qk;
  T* dk = ctx.dkvb.data() + base * d.kvbw;
  T* dkpe = ctx.dkpe_heads.data() + (h * d.n + s * S) * d.rd;
  const int64_t ldq = d.H * d.qk, ldk = d.H * d.kvbw, lda = d.H * d.vd;
  blas_gemm<T>(false, true, S, S, d.vd, T(1), da, lda, k + d.nope, ldk, T(0), dP, S);
  blas_gemm<T>(true, false, S, d.vd, S, T(1), P, S, da, lda, T(1), dk + d.nope, ldk);
  const T sc = static_cast<T>(scale);
  for (int64_t i = 0; i < S; ++i) {
    const T* pr = P + i * S;
    T* dr = dP + i * S;
    T sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += pr[j] * dr[j];
    for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - sum) * sc;
    std::fill(dr + i + 1, dr + S, T(0));
  }
  blas_gemm<T>(false, false, S, d.nope, S, T(1), dP, S, k, ldk, T(1), dq, ldq);
  blas_gemm<T>(false, false, S, d.rd, S, T(1), dP, S, kpe, d.rd, T(1), dq + d.nope, ldq);
  blas_gemm<T>(true, false, S, d.nope, S, T(1), dP, S, q, ldq, T(1), dk, ldk);
  blas_gemm<T>(true, false, S, d.rd, S, T(1), dP, S, q + d.nope, ldq, T(1), dkpe, d.rd);
}

template <class T>
void attention_backward(const Dims& d, double scale, MlaContext<T>& ctx) {
  ctx.dkpe_heads.assign(static_cast<size_t>(d.H * d.n * d.rd), T(0));
  ctx.ds.resize(static_cast<size_t>(default_pool().size() * d.S * d.S));
  default_pool().run(ctx.shape.n_seq * d.H, [&](int64_t task, int thread) {
    attention_backward_head(d, scale, task / d.H, task % d.H, ctx.ds.data() + thread * d.S * d.S, ctx);
  });
  for (int64_t t = 0; t < d.n; ++t) {
    T* dkpe = ctx.dkv.data() + t * d.kvw + d.kvl;
    for (int64_t h = 0; h < d.H; ++h) {
      const T* src = ctx.dkpe_heads.data() + (h * d.n + t) * d.rd;
      for (int64_t e = 0; e < d.rd; ++e) dkpe[e] += src[e];
    }
  }
}

float round_bf16(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

}  // namespace

template <class T>
void mla_forward(const ModelConfig& c, const LayerParams<T>& p, SeqShape shape, const T* x, T* y,
                 MlaContext<T>& ctx) {
  const Dims d(c, shape);
  ctx.shape = shape;
  ensure_rope(c, d.S, ctx);
  ctx.x.assign(x, x + d.n * d.hd);
  ctx.q.resize(static_cast<size_t>(d.n * d.H * d.qk));
  if (d.qr > 0) {
    ctx.qa.resize(static_cast<size_t>(d.n * d.qr));
    ctx.qan.resize(ctx.qa.size());
    linear_forward(x, p.q_a, d.n, d.hd, d.qr, ctx.qa.data());
    rmsnorm_forward(ctx.qa.data(), p.q_a_norm, d.n, d.qr, c.rms_norm_eps, ctx.qan.data(), ctx.qa_norm);
    linear_forward(ctx.qan.data(), p.q_b, d.n, d.qr, d.H * d.qk, ctx.q.data());
  } else {
    linear_forward(x, p.q, d.n, d.hd, d.H * d.qk, ctx.q.data());
  }
  ctx.kv.resize(static_cast<size_t>(d.n * d.kvw));
  linear_forward(x, p.kv_a, d.n, d.hd, d.kvw, ctx.kv.data());
  ctx.lat.resize(static_cast<size_t>(d.n * d.kvl));
  ctx.kpe.resize(static_cast<size_t>(d.n * d.rd));
  for (int64_t t = 0; t < d.n; ++t) {
    std::copy_n(ctx.kv.data() + t * d.kvw, d.kvl, ctx.lat.data() + t * d.kvl);
    std::copy_n(ctx.kv.data() + t * d.kvw + d.kvl, d.rd, ctx.kpe.data() + t * d.rd);
    const int64_t pos = t % d.S;
    rope(ctx, d.rd, pos, false, ctx.kpe.data() + t * d.rd);
    for (int64_t h = 0; h < d.H; ++h)
      rope(ctx, d.rd, pos, false, ctx.q.data() + (t * d.H + h) * d.qk + d.nope);
  }
  rmsnorm_forward(ctx.lat.data(), p.kv_a_norm, d.n, d.kvl, c.rms_norm_eps, ctx.lat.data(), ctx.kv_norm);
  if (ctx.round_latent_bf16) {
    for (T& v : ctx.lat) v = static_cast<T>(round_bf16(static_cast<float>(v)));
    for (T& v : ctx.kpe) v = static_cast<T>(round_bf16(static_cast<float>(v)));
  }
  ctx.kvb.resize(static_cast<size_t>(d.n * d.H * d.kvbw));
  linear_forward(ctx.lat.data(), p.kv_b, d.n, d.kvl, d.H * d.kvbw, ctx.kvb.data());
  attention_forward(d, c.softmax_scale(), ctx);
  linear_forward(ctx.att.data(), p.o, d.n, d.H * d.vd, d.hd, y);
}

template <class T>
void mla_backward_input(const ModelConfig& c, const LayerParams<T>& p, const T* dy, T* dx,
                        MlaContext<T>& ctx) {
  const Dims d(c, ctx.shape);
  ctx.dout.assign(dy, dy + d.n * d.hd);
  ctx.scratch.resize(static_cast<size_t>(d.n * d.H * d.vd));
  linear_backward_input(dy, p.o, d.n, d.H * d.vd, d.hd, ctx.scratch.data(), false);  // datt
  ctx.dq.assign(static_cast<size_t>(d.n * d.H * d.qk), T(0));
  ctx.dkvb.assign(static_cast<size_t>(d.n * d.H * d.kvbw), T(0));
  ctx.dkv.assign(static_cast<size_t>(d.n * d.kvw), T(0));
  attention_backward(d, c.softmax_scale(), ctx);
  // RoPE is a rotation: its backward rotates the gradient back.
  for (int64_t t = 0; t < d.n; ++t) {
    const int64_t pos = t % d.S;
    rope(ctx, d.rd, pos, true, ctx.dkv.data() + t * d.kvw + d.kvl);
    for (int64_t h = 0; h < d.H; ++h)
      rope(ctx, d.rd, pos, true, ctx.dq.data() + (t * d.H + h) * d.qk + d.nope);
  }
  ctx.dlat.resize(static_cast<size_t>(d.n * d.kvl));
  linear_backward_input(ctx.dkvb.data(), p.kv_b, d.n, d.kvl, d.H * d.kvbw, ctx.dlat.data(), false);
  ctx.scratch.resize(static_cast<size_t>(d.n * d.kvl));
  rmsnorm_backward_input(ctx.kv_norm, p.kv_a_norm, ctx.dlat.data(), ctx.scratch.data(), false);
  for (int64_t t = 0; t < d.n; ++t)
    std::copy_n(ctx.scratch.data() + t * d.kvl, d.kvl, ctx.dkv.data() + t * d.kvw);
  linear_backward_input(ctx.dkv.data(), p.kv_a, d.n, d.hd, d.kvw, dx, false);
  if (d.qr > 0) {
    ctx.dqan.resize(static_cast<size_t>(d.n * d.qr));
    ctx.dqa.resize(ctx.dqan.size());
    linear_backward_input(ctx.dq.data(), p.q_b, d.n, d.qr, d.H * d.qk, ctx.dqan.data(), false);
    rmsnorm_backward_input(ctx.qa_norm, p.q_a_norm, ctx.dqan.data(), ctx.dqa.data(), false);
    linear_backward_input(ctx.dqa.data(), p.q_a, d.n, d.hd, d.qr, dx, true);
  } else {
    linear_backward_input(ctx.dq.data(), p.q, d.n, d.hd, d.H * d.qk, dx, true);
  }
}

template <class T>
void mla_backward_weight(const ModelConfig& c, const MlaContext<T>& ctx, LayerParams<T>& g) {
  const Dims d(c, ctx.shape);
  linear_backward_weight(ctx.dout.data(), ctx.att.data(), d.n, d.H * d.vd, d.hd, g.o);
  linear_backward_weight(ctx.dkvb.data(), ctx.lat.data(), d.n, d.kvl, d.H * d.kvbw, g.kv_b);
  rmsnorm_backward_weight(ctx.kv_norm, ctx.dlat.data(), g.kv_a_norm);
  linear_backward_weight(ctx.dkv.data(), ctx.x.data(), d.n, d.hd, d.kvw, g.kv_a);
  if (d.qr > 0) {
    linear_backward_weight(ctx.dq.data(), ctx.qan.data(), d.n, d.qr, d.H * d.qk, g.q_b);
    rmsnorm_backward_weight(ctx.qa_norm, ctx.dqan.data(), g.q_a_norm);
    linear_backward_weight(ctx.dqa.data(), ctx.x.data(), d.n, d.hd, d.qr, g.q_a);
  } else {
    linear_backward_weight(ctx.dq.data(), ctx.x.data(), d.n, d.hd, d.H * d.qk, g.q);
  }
}

#define FATHOM_MLA_INSTANTIATE(T)                                                                 \
  template void mla_forward<T>(const ModelConfig&, const LayerParams<T>&, SeqShape, const T*, T*, \
                               MlaContext<T>&);                                                   \
  template void mla_backward_input<T>(const ModelConfig&, const LayerParams<T>&, const T*, T*,    \
                                      MlaContext<T>&);                                            \
  template void mla_backward_weight<T>(const ModelConfig&, const MlaContext<T>&, LayerParams<T>&);
FATHOM_MLA_INSTANTIATE(float)
FATHOM_MLA_INSTANTIATE(double)
#undef FATHOM_MLA_INSTANTIATE

}  // namespace fathom::train
