// One decoder layer (train.h): x += MLA(attn_norm(x)); x += FFN(ffn_norm(x)), the FFN dense
// SwiGLU or DeepSeekMoE by the config's layer schedule (the MTP layer is MoE when the model is).
#include <algorithm>

#include "train/train_impl.h"

namespace fathom::train {

template <class T>
void block_forward(const ParamLayout& layout, const LayerParams<T>& p, int64_t layer_index, SeqShape shape,
                   const TrainOptions& options, T* x, BlockContext<T>& ctx) {
  const ModelConfig& c = layout.config;
  const int64_t n = shape.tokens(), hd = c.hidden_size;
  ctx.shape = shape;
  ctx.layer = layer_index;
  ctx.moe = p.moe;
  ctx.xn.resize(static_cast<size_t>(n * hd));
  ctx.y.resize(ctx.xn.size());
  rmsnorm_forward(x, p.attn_norm, n, hd, c.rms_norm_eps, ctx.xn.data(), ctx.attn_norm);
  ctx.mla.round_latent_bf16 = options.round_latent_bf16;
  mla_forward(c, p, shape, ctx.xn.data(), ctx.y.data(), ctx.mla);
  for (int64_t i = 0; i < n * hd; ++i) x[i] += ctx.y[static_cast<size_t>(i)];
  rmsnorm_forward(x, p.ffn_norm, n, hd, c.rms_norm_eps, ctx.xn.data(), ctx.ffn_norm);
  if (p.moe) {
    moe_forward(c, p, shape, options.balance_alpha, ctx.xn.data(), ctx.y.data(), ctx.moe_ctx);
  } else {
    swiglu_forward(ctx.xn.data(), p.mlp_gate, p.mlp_up, p.mlp_down, n, hd, c.intermediate_size, ctx.y.data(),
                   ctx.mlp);
  }
  for (int64_t i = 0; i < n * hd; ++i) x[i] += ctx.y[static_cast<size_t>(i)];
}

template <class T>
void block_backward_input(const ParamLayout& layout, const LayerParams<T>& p, double loss_scale, T* dx,
                          BlockContext<T>& ctx) {
  const ModelConfig& c = layout.config;
  const int64_t n = ctx.shape.tokens(), hd = c.hidden_size;
  ctx.dxn_ffn.resize(static_cast<size_t>(n * hd));
  ctx.dxn_attn.resize(ctx.dxn_ffn.size());
  ctx.dxn.resize(ctx.dxn_ffn.size());
  // Residual: dx flows through unchanged and gains each branch's input gradient.
  if (ctx.moe) {
    moe_backward_input(c, p, dx, loss_scale, ctx.dxn_ffn.data(), ctx.moe_ctx);
  } else {
    swiglu_backward_input(ctx.mlp, p.mlp_gate, p.mlp_up, p.mlp_down, dx, ctx.dxn_ffn.data(), false);
  }
  rmsnorm_backward_input(ctx.ffn_norm, p.ffn_norm, ctx.dxn_ffn.data(), dx, true);
  mla_backward_input(c, p, dx, ctx.dxn_attn.data(), ctx.mla);
  rmsnorm_backward_input(ctx.attn_norm, p.attn_norm, ctx.dxn_attn.data(), dx, true);
}

template <class T>
void block_backward_weight(const ParamLayout& layout, BlockContext<T>& ctx, LayerParams<T>& g) {
  const ModelConfig& c = layout.config;
  if (ctx.moe) {
    moe_backward_weight(c, ctx.moe_ctx, g);
  } else {
    swiglu_backward_weight(ctx.mlp, g.mlp_gate, g.mlp_up, g.mlp_down);
  }
  rmsnorm_backward_weight(ctx.ffn_norm, ctx.dxn_ffn.data(), g.ffn_norm);
  mla_backward_weight(c, ctx.mla, g);
  rmsnorm_backward_weight(ctx.attn_norm, ctx.dxn_attn.data(), g.attn_norm);
}

#define FATHOM_BLOCK_INSTANTIATE(T)                                                            \
  template void block_forward<T>(const ParamLayout&, const LayerParams<T>&, int64_t, SeqShape, \
                                 const TrainOptions&, T*, BlockContext<T>&);                   \
  template void block_backward_input<T>(const ParamLayout&, const LayerParams<T>&, double, T*, \
                                        BlockContext<T>&);                                     \
  template void block_backward_weight<T>(const ParamLayout&, BlockContext<T>&, LayerParams<T>&);
FATHOM_BLOCK_INSTANTIATE(float)
FATHOM_BLOCK_INSTANTIATE(double)
#undef FATHOM_BLOCK_INSTANTIATE

}  // namespace fathom::train
