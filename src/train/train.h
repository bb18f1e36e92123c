// Training path of a DeepSeek-V3 model: fp32 master parameters in one slab, and `<layer>_forward`
// / `<layer>_backward_*` pairs for every layer (embedding, RMSNorm, linear, MLA, dense SwiGLU,
// DeepSeekMoE, final norm + lm_head + cross-entropy, the MTP module), composed into a whole-model
// forward/backward. Every layer function is a template over the element type and instantiated for
// float (training) and double (the finite-difference checks in the tests).
//
// Conventions (docs/train.md):
//  - Activations are row-major [tokens, features]; a micro-batch is n_seq sequences of seq_len
//    tokens each (positions 0..seq_len-1 in every sequence), tokens laid out sequence-major.
//  - Linear weights are [out, in] as Hugging Face stores them; y = x . W^T.
//  - Forward saves what backward needs in a *Context owned by the caller (sized on first use,
//    reused by later micro-batches of the same shape).
//  - Backward is split the way DualPipe / zero-bubble schedules need it: `*_backward_input`
//    (B: the gradient w.r.t. the layer input, leaving the weight-gradient work pending in the
//    context) and `*_backward_weight` (W: accumulates += into a gradient slab of the same layout
//    as the parameters). W may run any time after B, before the context is reused.
//  - Gradients accumulate (+=) into the gradient slab, so micro-batches sum; losses are means over
//    the micro-batch's target tokens scaled by the caller's `loss_scale` (1/n_micro for averaging).
//
// Not here (next steps of issue 11): optimizer, trainer command, data, checkpoint I/O, pipeline
// stages. Thread safety: a context belongs to one thread; GEMMs fan out on the default pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/model_config.h"
#include "model/names.h"

namespace fathom::train {

// ---- Parameters -------------------------------------------------------------------------------

// One tensor of the slab, named as in a Hugging Face checkpoint.
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the slab
  int64_t size = 0;
  int64_t layer = -1;  // -1: embedding / final norm / head; >= num_hidden_layers: MTP
  LayerWeight weight = LayerWeight::kAttnNorm;
  int64_t expert = -1;
  WeightRole role = WeightRole::kLinear;
  // false for e_score_correction_bias: updated by the balancing rule, never by gradients.
  bool trainable = true;
};

struct ParamLayout {
  ModelConfig config;
  bool mtp = false;  // one MTP module (num_nextn_predict_layers must be >= 1 in the config)
  std::vector<ParamInfo> params;
  int64_t total = 0;  // elements
  const ParamInfo* find(std::string_view name) const;
};

// Checks what training needs beyond ModelConfig::validate (sigmoid scoring, one MTP module at
// most) and lays every weight out in one slab. The MTP module shares embed_tokens and lm_head
// with the main model (its own copies are not parameters).
Result<ParamLayout> make_param_layout(const ModelConfig& config, bool with_mtp);

// The part of a layout one pipeline stage holds: layers [layer_begin, layer_end) (indices of the
// full model; the MTP layer is num_hidden_layers), plus the embedding and/or the final norm and
// lm_head. Offsets are re-packed so the stage's slab is contiguous; names stay the full model's.
struct StageParamsSpec {
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  bool embedding = false;
  bool head = false;  // final norm + lm_head
};
Result<ParamLayout> stage_param_layout(const ParamLayout& full, const StageParamsSpec& spec);

template <class T>
struct LayerParams {
  bool moe = false;
  T *attn_norm = nullptr, *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr, *q = nullptr;
  T *kv_a = nullptr, *kv_a_norm = nullptr, *kv_b = nullptr, *o = nullptr, *ffn_norm = nullptr;
  T *mlp_gate = nullptr, *mlp_up = nullptr, *mlp_down = nullptr;                   // dense layers
  T *router = nullptr, *router_bias = nullptr;                                     // MoE layers
  std::vector<T*> exp_gate, exp_up, exp_down;                                      // [n_routed]
  T *sh_gate = nullptr, *sh_up = nullptr, *sh_down = nullptr;                      // shared experts (merged)
  T *enorm = nullptr, *hnorm = nullptr, *eh_proj = nullptr, *head_norm = nullptr;  // MTP only
};

// A slab of parameters (or of their gradients: same layout) with named views into it. A stage's
// slab (stage_param_layout) binds only the views of what it holds; the others stay nullptr.
template <class T>
struct ModelParams {
  const ParamLayout* layout = nullptr;
  std::vector<T> data;  // the slab, layout->total elements
  T *embed = nullptr, *final_norm = nullptr, *head = nullptr;
  std::vector<LayerParams<T>> layers;  // main layers, then the MTP layer

  ModelParams() = default;
  ModelParams(const ModelParams&) = delete;
  ModelParams& operator=(const ModelParams&) = delete;
  ModelParams(ModelParams&&) = default;  // the slab's storage moves, views stay valid
  ModelParams& operator=(ModelParams&&) = default;
  T* at(const ParamInfo& p) { return data.data() + p.offset; }
  const T* at(const ParamInfo& p) const { return data.data() + p.offset; }
};

// A zeroed slab for `layout` (which must outlive it).
template <class T>
ModelParams<T> make_params(const ParamLayout& layout);
// Random initialisation, deterministic for a seed: projections U(-a, a) with a = sqrt(3/fan_in)
// (scaled by init_scale), embeddings U(-1, 1) (a tied embedding, which is also the head: like a
// projection), norms 1, routing bias 0.
// prev_token_heads > 0 builds that many previous-token heads into decoder layer 0 (see
// params.cpp and docs/train.md): a head that attends to position i - 1 from step 0, the first
// half of the induction circuit a model needs to copy from its context.
template <class T>
void init_params(ModelParams<T>& params, uint64_t seed, double init_scale = 1.0, int prev_token_heads = 0);
// The rest of the induction circuit on top of init_params(..., prev_token_heads >= 1): head 0 of
// layer 1 finds the earlier position whose previous token is the current token and copies its
// token into the output head; every other residual branch starts at zero (params.cpp,
// docs/train.md). check_induction_shape() says whether a config can hold it.
Status check_induction_shape(const ModelConfig& config);
template <class T>
void seed_induction_circuit(ModelParams<T>& params, uint64_t seed);

// Reads every parameter from a Hugging Face checkpoint (f32/bf16/f16 tensors; errors name the
// tensor whose shape or dtype does not fit). `path` is a directory or .safetensors file.
Status load_params_hf(ModelParams<float>& params, const std::string& path);

// ---- Layer building blocks ---------------------------------------------------------------------

// The micro-batch shape every layer sees.
struct SeqShape {
  int64_t n_seq = 1;
  int64_t seq_len = 1;
  int64_t tokens() const { return n_seq * seq_len; }
};

// y[m, out] = x[m, in] . W[out, in]^T. float runs the runtime's fp32 matmul kernel.
template <class T>
void linear_forward(const T* x, const T* w, int64_t m, int64_t in, int64_t out, T* y);
// B: dx[m, in] (+)= dy[m, out] . W[out, in]
template <class T>
void linear_backward_input(const T* dy, const T* w, int64_t m, int64_t in, int64_t out, T* dx,
                           bool accumulate);
// W: dW[out, in] += dy[m, out]^T . x[m, in]
template <class T>
void linear_backward_weight(const T* dy, const T* x, int64_t m, int64_t in, int64_t out, T* dw);

// Embedding lookup x[t] = table[tokens[t]]; backward (W only) scatters dx rows into dtable.
template <class T>
void embedding_forward(const T* table, int64_t dim, std::span<const int32_t> tokens, T* x);
template <class T>
void embedding_backward_weight(const T* dx, int64_t dim, std::span<const int32_t> tokens, T* dtable);

template <class T>
struct RmsNormContext {
  int64_t n = 0, dim = 0;
  std::vector<T> xhat;  // [n, dim] x / rms
  std::vector<T> rinv;  // [n] 1 / rms
};
// y = x / sqrt(mean(x^2) + eps) * g over rows of `dim`; y may alias x.
template <class T>
void rmsnorm_forward(const T* x, const T* g, int64_t n, int64_t dim, double eps, T* y,
                     RmsNormContext<T>& ctx);
// B: dx = rinv * (dy*g - xhat * mean(dy*g*xhat)); dx (+)= when accumulate.
template <class T>
void rmsnorm_backward_input(const RmsNormContext<T>& ctx, const T* g, const T* dy, T* dx, bool accumulate);
// W: dg += sum over rows of dy * xhat.
template <class T>
void rmsnorm_backward_weight(const RmsNormContext<T>& ctx, const T* dy, T* dg);

// Mean cross-entropy over targets >= 0 (targets < 0 are ignored); returns the mean loss and, when
// dlogits is non-null, writes dlogits = loss_scale * (softmax - onehot) / n_valid (0 for ignored
// rows). Targets must lie in [-1, vocab) (CHECKed; validate data first).
template <class T>
double cross_entropy_forward_backward(const T* logits, int64_t n, int64_t vocab,
                                      std::span<const int32_t> targets, double loss_scale, T* dlogits);

// ---- Decoder blocks ----------------------------------------------------------------------------

struct TrainOptions {
  double mtp_weight = 0.3;          // lambda of the MTP loss (DeepSeek-V3: 0.3, later 0.1)
  double balance_alpha = 1e-4;      // sequence-wise balance loss weight (V3: 0.0001)
  double bias_update_speed = 1e-3;  // gamma of the aux-loss-free bias update (V3: 0.001)
  // Round each token's normalised latent and RoPE'd k_pe to bf16 in the forward, as the serving
  // KV cache stores them (so training sees the cache's numerics; the backward passes gradients
  // straight through the rounding). Also what makes the forward comparable to the runtime's.
  bool round_latent_bf16 = false;
  // Compute the logits of rows without a target too (model_logits / model_mtp_logits then cover
  // every row, for comparisons with the runtime). Off in training: the lm_head runs over the
  // scored rows only (loss masks leave most chat rows without a target), the same loss and
  // gradients for a fraction of the largest matrix product.
  bool all_logits = false;
};

template <class T>
struct BlockContext;  // train_impl.h: per-layer saved activations and pending weight-gradients

// One decoder layer in place on x [tokens, hidden]: x += MLA(norm(x)); x += FFN(norm(x)).
// `layer_index` selects dense / MoE from the config; MoE routing statistics land in the context.
template <class T>
void block_forward(const ParamLayout& layout, const LayerParams<T>& p, int64_t layer_index, SeqShape shape,
                   const TrainOptions& options, T* x, BlockContext<T>& ctx);
// B: dx [tokens, hidden] in place (gradient w.r.t. the block output in, w.r.t. its input out);
// the MoE balance loss, part of the objective, enters scaled by loss_scale.
template <class T>
void block_backward_input(const ParamLayout& layout, const LayerParams<T>& p, double loss_scale, T* dx,
                          BlockContext<T>& ctx);
// W: every weight gradient of the block, accumulated into g.
template <class T>
void block_backward_weight(const ParamLayout& layout, BlockContext<T>& ctx, LayerParams<T>& g);

// Auxiliary-loss-free balancing (DeepSeek-V3 section 2.1.2): after a step, each routed expert's
// bias moves by `speed` toward balance: +speed if its load is below the mean, -speed if above.
template <class T>
void moe_update_bias(T* bias, std::span<const int64_t> expert_load, double speed);

// ---- Whole model -------------------------------------------------------------------------------

struct StepLoss {
  double total = 0;    // ce + mtp_weight * mtp_ce + balance (what backward differentiates)
  double ce = 0;       // main next-token cross-entropy (mean over targets)
  double mtp_ce = 0;   // MTP cross-entropy (position t predicts target t + 1)
  double balance = 0;  // sum over MoE layers of the sequence-wise balance loss
  int64_t n_targets = 0;
};

template <class T>
struct ModelContext;  // train_impl.h
template <class T>
struct ModelContextDeleter {
  void operator()(ModelContext<T>* ctx) const;
};
// Activations of one micro-batch in flight (a pipeline stage keeps one per micro-batch).
template <class T>
using ModelContextPtr = std::unique_ptr<ModelContext<T>, ModelContextDeleter<T>>;

template <class T>
ModelContextPtr<T> make_model_context();
// Per-layer routed-expert loads of the last forward (tokens per expert), for moe_update_bias.
template <class T>
std::vector<std::vector<int64_t>> model_expert_loads(const ModelContext<T>& ctx);
// The last forward's main logits [tokens, vocab] and MTP logits [n_seq * (seq_len - 1), vocab]
// (with TrainOptions::all_logits; otherwise the rows that have a target, in order).
template <class T>
std::span<const T> model_logits(const ModelContext<T>& ctx);
template <class T>
std::span<const T> model_mtp_logits(const ModelContext<T>& ctx);
// Routed experts of the last forward: (layer, token) -> top-k ids; token = seq * seq_len + pos.
template <class T>
std::span<const int32_t> model_routing(const ModelContext<T>& ctx, int64_t layer);

// tokens and targets: [n_seq, seq_len]; targets[t] is the token after tokens[t] (-1: no target).
// Errors (before any work) name a token or target outside the vocabulary or a shape mismatch.
template <class T>
Result<StepLoss> model_forward(const ModelParams<T>& params, SeqShape shape, std::span<const int32_t> tokens,
                               std::span<const int32_t> targets, const TrainOptions& options,
                               ModelContext<T>& ctx);
// Backward of the last forward (both halves, layer by layer), gradients of loss_scale * total
// accumulated into `grads`.
template <class T>
void model_backward(const ModelParams<T>& params, ModelContext<T>& ctx, double loss_scale,
                    ModelParams<T>& grads);

// The aux-loss-free bias update of every MoE layer from the last forward's loads.
template <class T>
void model_update_router_bias(ModelParams<T>& params, const ModelContext<T>& ctx,
                              const TrainOptions& options);

}  // namespace fathom::train
