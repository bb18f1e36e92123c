// The whole-model training forward/backward (train.h): embedding, decoder layers, final norm,
// lm_head, cross-entropy, and the depth-1 MTP module of DeepSeek-V3 with its weighted loss.
//
// MTP, as the runtime (model/forward.cpp, model/reference.cpp) computes it: for position t of a
// sequence (t < S - 1), h'_t = eh_proj([enorm(embed(tokens[t + 1])); hnorm(h_t)]) with h_t the main
// model's final-normed hidden state, one decoder layer (positions 0..S-2), the MTP head norm and
// the shared lm_head; it predicts targets[t + 1] (the token two ahead of tokens[t]).
#include <algorithm>

#include "base/check.h"
#include "train/train_impl.h"

namespace fathom::train {
namespace {

Status check_batch(const ModelConfig& c, SeqShape shape, std::span<const int32_t> tokens,
                   std::span<const int32_t> targets) {
  if (shape.n_seq < 1 || shape.seq_len < 1) {
    return invalid_argument("train: batch shape {} x {} must be positive", shape.n_seq, shape.seq_len);
  }
  if (shape.seq_len > c.max_position_embeddings) {
    return invalid_argument("train: seq_len {} exceeds max_position_embeddings {}", shape.seq_len,
                            c.max_position_embeddings);
  }
  if (static_cast<int64_t>(tokens.size()) != shape.tokens() || targets.size() != tokens.size()) {
    return invalid_argument("train: batch of {} x {} needs {} tokens and targets, got {} and {}", shape.n_seq,
                            shape.seq_len, shape.tokens(), tokens.size(), targets.size());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return out_of_range("train: token {} at index {} is outside the vocabulary [0, {})", tokens[i], i,
                          c.vocab_size);
    }
    if (targets[i] < -1 || targets[i] >= c.vocab_size) {
      return out_of_range("train: target {} at index {} is outside [-1, {})", targets[i], i, c.vocab_size);
    }
  }
  return ok_status();
}

}  // namespace

template <class T>
double head_forward(const T* w, const T* h, std::span<const int32_t> targets, int64_t hidden, int64_t vocab,
                    bool all_rows, HeadRows<T>& r) {
  const int64_t n = static_cast<int64_t>(targets.size());
  r.rows.clear();
  r.targets.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (!all_rows && targets[static_cast<size_t>(i)] < 0) continue;
    r.rows.push_back(i);
    r.targets.push_back(targets[static_cast<size_t>(i)]);
  }
  const int64_t k = static_cast<int64_t>(r.rows.size());
  r.h.resize(static_cast<size_t>(k * hidden));
  for (int64_t j = 0; j < k; ++j)
    std::copy_n(h + r.rows[static_cast<size_t>(j)] * hidden, hidden, r.h.data() + j * hidden);
  r.logits.resize(static_cast<size_t>(k * vocab));
  if (k == 0) return 0.0;
  linear_forward(r.h.data(), w, k, hidden, vocab, r.logits.data());
  return cross_entropy_forward_backward<T>(r.logits.data(), k, vocab, r.targets, 1.0, nullptr);
}

template <class T>
void head_backward_input(const T* w, HeadRows<T>& r, int64_t n, int64_t hidden, int64_t vocab, double scale,
                         T* dh) {
  const int64_t k = static_cast<int64_t>(r.rows.size());
  std::fill(dh, dh + n * hidden, T(0));
  r.dlogits.resize(static_cast<size_t>(k * vocab));
  r.dh.resize(static_cast<size_t>(k * hidden));
  if (k == 0) return;
  cross_entropy_forward_backward<T>(r.logits.data(), k, vocab, r.targets, scale, r.dlogits.data());
  linear_backward_input(r.dlogits.data(), w, k, hidden, vocab, r.dh.data(), false);
  for (int64_t j = 0; j < k; ++j)
    std::copy_n(r.dh.data() + j * hidden, hidden, dh + r.rows[static_cast<size_t>(j)] * hidden);
}

template <class T>
void head_backward_weight(const HeadRows<T>& r, int64_t hidden, int64_t vocab, T* dw) {
  const int64_t k = static_cast<int64_t>(r.rows.size());
  if (k > 0) linear_backward_weight(r.dlogits.data(), r.h.data(), k, hidden, vocab, dw);
}

template <class T>
double mtp_forward(const ModelParams<T>& params, const TrainOptions& options, ModelContext<T>& ctx) {
  const ParamLayout& layout = *params.layout;
  const ModelConfig& c = layout.config;
  const LayerParams<T>& L = params.layers.back();
  const int64_t hd = c.hidden_size, S = ctx.shape.seq_len, V = c.vocab_size;
  ctx.mtp_shape = {ctx.shape.n_seq, S - 1};
  const int64_t nm = ctx.mtp_shape.tokens();
  ctx.mtp_tokens.clear();
  ctx.mtp_targets.clear();
  ctx.mtp_hin.resize(static_cast<size_t>(nm * hd));
  for (int64_t s = 0; s < ctx.shape.n_seq; ++s) {
    for (int64_t t = 0; t + 1 < S; ++t) {
      ctx.mtp_tokens.push_back(ctx.tokens[static_cast<size_t>(s * S + t + 1)]);
      ctx.mtp_targets.push_back(ctx.targets[static_cast<size_t>(s * S + t + 1)]);
      std::copy_n(ctx.h.data() + (s * S + t) * hd, hd, ctx.mtp_hin.data() + (s * (S - 1) + t) * hd);
    }
  }
  ctx.mtp_emb.resize(static_cast<size_t>(nm * hd));
  embedding_forward(params.embed, hd, std::span<const int32_t>(ctx.mtp_tokens), ctx.mtp_emb.data());
  // cat = [enorm(emb) | hnorm(h)] built from two normed halves.
  ctx.mtp_dtmp.resize(static_cast<size_t>(nm * hd));
  ctx.mtp_cat.resize(static_cast<size_t>(nm * 2 * hd));
  rmsnorm_forward(ctx.mtp_emb.data(), L.enorm, nm, hd, c.rms_norm_eps, ctx.mtp_dtmp.data(), ctx.enorm);
  for (int64_t t = 0; t < nm; ++t)
    std::copy_n(ctx.mtp_dtmp.data() + t * hd, hd, ctx.mtp_cat.data() + t * 2 * hd);
  rmsnorm_forward(ctx.mtp_hin.data(), L.hnorm, nm, hd, c.rms_norm_eps, ctx.mtp_dtmp.data(), ctx.hnorm);
  for (int64_t t = 0; t < nm; ++t)
    std::copy_n(ctx.mtp_dtmp.data() + t * hd, hd, ctx.mtp_cat.data() + t * 2 * hd + hd);
  ctx.mtp_x.resize(static_cast<size_t>(nm * hd));
  linear_forward(ctx.mtp_cat.data(), L.eh_proj, nm, 2 * hd, hd, ctx.mtp_x.data());
  block_forward(layout, L, c.num_hidden_layers, ctx.mtp_shape, options, ctx.mtp_x.data(), ctx.mtp_block);
  ctx.mtp_h.resize(static_cast<size_t>(nm * hd));
  rmsnorm_forward(ctx.mtp_x.data(), L.head_norm, nm, hd, c.rms_norm_eps, ctx.mtp_h.data(), ctx.head_norm);
  return head_forward(params.head, ctx.mtp_h.data(), std::span<const int32_t>(ctx.mtp_targets), hd, V,
                      options.all_logits, ctx.mtp_head);
}

// Adds the MTP module's gradients: its weights into g, its hidden-state input into ctx.dh.
template <class T>
void mtp_backward(const ModelParams<T>& params, ModelContext<T>& ctx, double loss_scale, ModelParams<T>& g) {
  const double scale = loss_scale * ctx.options.mtp_weight;  // the MTP cross-entropy's weight
  const ParamLayout& layout = *params.layout;
  const ModelConfig& c = layout.config;
  const LayerParams<T>& L = params.layers.back();
  LayerParams<T>& GL = g.layers.back();
  const int64_t hd = c.hidden_size, S = ctx.shape.seq_len, V = c.vocab_size, nm = ctx.mtp_shape.tokens();
  ctx.mtp_dtmp.resize(static_cast<size_t>(nm * hd));
  head_backward_input(params.head, ctx.mtp_head, nm, hd, V, scale, ctx.mtp_dtmp.data());
  head_backward_weight(ctx.mtp_head, hd, V, g.head);
  ctx.mtp_dx.resize(static_cast<size_t>(nm * hd));
  rmsnorm_backward_input(ctx.head_norm, L.head_norm, ctx.mtp_dtmp.data(), ctx.mtp_dx.data(), false);
  rmsnorm_backward_weight(ctx.head_norm, ctx.mtp_dtmp.data(), GL.head_norm);
  block_backward_input(layout, L, loss_scale, ctx.mtp_dx.data(), ctx.mtp_block);
  block_backward_weight(layout, ctx.mtp_block, GL);
  ctx.mtp_dcat.resize(static_cast<size_t>(nm * 2 * hd));
  linear_backward_input(ctx.mtp_dx.data(), L.eh_proj, nm, 2 * hd, hd, ctx.mtp_dcat.data(), false);
  linear_backward_weight(ctx.mtp_dx.data(), ctx.mtp_cat.data(), nm, 2 * hd, hd, GL.eh_proj);
  // Split dcat into the two normed halves; back through enorm into the embedding, hnorm into h.
  for (int half = 0; half < 2; ++half) {
    for (int64_t t = 0; t < nm; ++t) {
      std::copy_n(ctx.mtp_dcat.data() + t * 2 * hd + half * hd, hd, ctx.mtp_dtmp.data() + t * hd);
    }
    RmsNormContext<T>& nctx = half == 0 ? ctx.enorm : ctx.hnorm;
    rmsnorm_backward_input(nctx, half == 0 ? L.enorm : L.hnorm, ctx.mtp_dtmp.data(), ctx.mtp_dx.data(),
                           false);
    rmsnorm_backward_weight(nctx, ctx.mtp_dtmp.data(), half == 0 ? GL.enorm : GL.hnorm);
    if (half == 0) {
      embedding_backward_weight(ctx.mtp_dx.data(), hd, std::span<const int32_t>(ctx.mtp_tokens), g.embed);
      continue;
    }
    for (int64_t s = 0; s < ctx.shape.n_seq; ++s) {
      for (int64_t t = 0; t + 1 < S; ++t) {
        const T* src = ctx.mtp_dx.data() + (s * (S - 1) + t) * hd;
        T* dst = ctx.dh.data() + (s * S + t) * hd;
        for (int64_t d = 0; d < hd; ++d) dst[d] += src[d];
      }
    }
  }
}

template <class T>
void ModelContextDeleter<T>::operator()(ModelContext<T>* ctx) const {
  delete ctx;
}

template <class T>
ModelContextPtr<T> make_model_context() {
  return ModelContextPtr<T>(new ModelContext<T>());
}

template <class T>
Result<StepLoss> model_forward(const ModelParams<T>& params, SeqShape shape, std::span<const int32_t> tokens,
                               std::span<const int32_t> targets, const TrainOptions& options,
                               ModelContext<T>& ctx) {
  const ParamLayout& layout = *params.layout;
  const ModelConfig& c = layout.config;
  TRY(check_batch(c, shape, tokens, targets));
  const int64_t n = shape.tokens(), hd = c.hidden_size, V = c.vocab_size;
  ctx.has_forward = false;
  ctx.shape = shape;
  ctx.options = options;
  ctx.tokens.assign(tokens.begin(), tokens.end());
  ctx.targets.assign(targets.begin(), targets.end());
  ctx.x.resize(static_cast<size_t>(n * hd));
  embedding_forward(params.embed, hd, tokens, ctx.x.data());
  ctx.blocks.resize(static_cast<size_t>(c.num_hidden_layers));
  StepLoss loss;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    BlockContext<T>& b = ctx.blocks[static_cast<size_t>(l)];
    block_forward(layout, params.layers[static_cast<size_t>(l)], l, shape, options, ctx.x.data(), b);
    if (b.moe) loss.balance += b.moe_ctx.balance_loss;
  }
  ctx.h.resize(ctx.x.size());
  rmsnorm_forward(ctx.x.data(), params.final_norm, n, hd, c.rms_norm_eps, ctx.h.data(), ctx.final_norm);
  loss.ce = head_forward(params.head, ctx.h.data(), targets, hd, V, options.all_logits, ctx.head);
  for (int32_t t : targets) loss.n_targets += t >= 0;
  ctx.mtp = layout.mtp && shape.seq_len > 1;
  if (ctx.mtp) {
    loss.mtp_ce = mtp_forward(params, options, ctx);
    if (ctx.mtp_block.moe) loss.balance += ctx.mtp_block.moe_ctx.balance_loss;
  }
  loss.total = loss.ce + (ctx.mtp ? options.mtp_weight * loss.mtp_ce : 0.0) + loss.balance;
  ctx.loss = loss;
  ctx.has_forward = true;
  return loss;
}

template <class T>
void model_backward(const ModelParams<T>& params, ModelContext<T>& ctx, double loss_scale,
                    ModelParams<T>& grads) {
  CHECK_MSG(ctx.has_forward, "model_backward without a forward");
  CHECK(grads.layout == params.layout);
  const ParamLayout& layout = *params.layout;
  const ModelConfig& c = layout.config;
  const int64_t n = ctx.shape.tokens(), hd = c.hidden_size, V = c.vocab_size;
  ctx.dh.resize(static_cast<size_t>(n * hd));
  head_backward_input(params.head, ctx.head, n, hd, V, loss_scale, ctx.dh.data());
  head_backward_weight(ctx.head, hd, V, grads.head);
  if (ctx.mtp) mtp_backward(params, ctx, loss_scale, grads);
  ctx.dx.resize(ctx.dh.size());
  rmsnorm_backward_input(ctx.final_norm, params.final_norm, ctx.dh.data(), ctx.dx.data(), false);
  rmsnorm_backward_weight(ctx.final_norm, ctx.dh.data(), grads.final_norm);
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) {
    BlockContext<T>& b = ctx.blocks[static_cast<size_t>(l)];
    block_backward_input(layout, params.layers[static_cast<size_t>(l)], loss_scale, ctx.dx.data(), b);
    block_backward_weight(layout, b, grads.layers[static_cast<size_t>(l)]);
  }
  embedding_backward_weight(ctx.dx.data(), hd, std::span<const int32_t>(ctx.tokens), grads.embed);
}

template <class T>
std::vector<std::vector<int64_t>> model_expert_loads(const ModelContext<T>& ctx) {
  std::vector<std::vector<int64_t>> out;
  for (const BlockContext<T>& b : ctx.blocks) out.push_back(b.moe ? b.moe_ctx.load : std::vector<int64_t>{});
  if (ctx.mtp) out.push_back(ctx.mtp_block.moe ? ctx.mtp_block.moe_ctx.load : std::vector<int64_t>{});
  return out;
}

template <class T>
std::span<const T> model_logits(const ModelContext<T>& ctx) {
  return ctx.head.logits;
}

template <class T>
std::span<const T> model_mtp_logits(const ModelContext<T>& ctx) {
  return ctx.mtp ? std::span<const T>(ctx.mtp_head.logits) : std::span<const T>();
}

template <class T>
std::span<const int32_t> model_routing(const ModelContext<T>& ctx, int64_t layer) {
  const BlockContext<T>* b = nullptr;
  if (layer < static_cast<int64_t>(ctx.blocks.size())) {
    b = &ctx.blocks[static_cast<size_t>(layer)];
  } else if (ctx.mtp && layer == static_cast<int64_t>(ctx.blocks.size())) {
    b = &ctx.mtp_block;
  }
  if (b == nullptr || !b->moe) return {};
  return b->moe_ctx.ids;
}

template <class T>
void model_update_router_bias(ModelParams<T>& params, const ModelContext<T>& ctx,
                              const TrainOptions& options) {
  const auto loads = model_expert_loads(ctx);
  for (size_t l = 0; l < loads.size() && l < params.layers.size(); ++l) {
    LayerParams<T>& L = params.layers[l];
    if (L.router_bias != nullptr && !loads[l].empty())
      moe_update_bias(L.router_bias, loads[l], options.bias_update_speed);
  }
}

#define FATHOM_MODEL_INSTANTIATE(T)                                                                     \
  template double head_forward<T>(const T*, const T*, std::span<const int32_t>, int64_t, int64_t, bool,   \
                                  HeadRows<T>&);                                                        \
  template void head_backward_input<T>(const T*, HeadRows<T>&, int64_t, int64_t, int64_t, double, T*);   \
  template void head_backward_weight<T>(const HeadRows<T>&, int64_t, int64_t, T*);                      \
  template double mtp_forward<T>(const ModelParams<T>&, const TrainOptions&, ModelContext<T>&);         \
  template void mtp_backward<T>(const ModelParams<T>&, ModelContext<T>&, double, ModelParams<T>&);      \
  template struct ModelContextDeleter<T>;                                                               \
  template ModelContextPtr<T> make_model_context<T>();                                                  \
  template Result<StepLoss> model_forward<T>(const ModelParams<T>&, SeqShape, std::span<const int32_t>, \
                                             std::span<const int32_t>, const TrainOptions&,             \
                                             ModelContext<T>&);                                         \
  template void model_backward<T>(const ModelParams<T>&, ModelContext<T>&, double, ModelParams<T>&);    \
  template std::vector<std::vector<int64_t>> model_expert_loads<T>(const ModelContext<T>&);             \
  template std::span<const T> model_logits<T>(const ModelContext<T>&);                                  \
  template std::span<const T> model_mtp_logits<T>(const ModelContext<T>&);                              \
  template std::span<const int32_t> model_routing<T>(const ModelContext<T>&, int64_t);                  \
  template void model_update_router_bias<T>(ModelParams<T>&, const ModelContext<T>&, const TrainOptions&);
FATHOM_MODEL_INSTANTIATE(float)
FATHOM_MODEL_INSTANTIATE(double)
#undef FATHOM_MODEL_INSTANTIATE

}  // namespace fathom::train
