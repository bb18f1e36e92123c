// Internal: the contexts the layer pairs of train.h save activations in, and the layer functions
// the blocks compose (MLA, SwiGLU, MoE). Shapes are named at each member; n = tokens of the
// micro-batch. Vectors are resized on first use and reused (no allocation once shapes settle).
#pragma once

#include <vector>

#include "train/train.h"

namespace fathom::train {

template <class T>
struct SwigluContext {
  int64_t m = 0, hidden = 0, inter = 0;
  std::vector<T> x;       // [m, hidden] input
  std::vector<T> g, u;    // [m, inter] gate and up projections
  std::vector<T> h;       // [m, inter] silu(g) * u
  std::vector<T> dy;      // [m, hidden] saved by B for W
  std::vector<T> dg, du;  // [m, inter] saved by B for W
};

// y[m, hidden] = (silu(x.Wg^T) * x.Wu^T) . Wd^T
template <class T>
void swiglu_forward(const T* x, const T* wg, const T* wu, const T* wd, int64_t m, int64_t hidden,
                    int64_t inter, T* y, SwigluContext<T>& ctx);
template <class T>
void swiglu_backward_input(SwigluContext<T>& ctx, const T* wg, const T* wu, const T* wd, const T* dy, T* dx,
                           bool accumulate);
template <class T>
void swiglu_backward_weight(const SwigluContext<T>& ctx, T* dwg, T* dwu, T* dwd);

template <class T>
struct MlaContext {
  SeqShape shape;
  bool round_latent_bf16 = false;  // TrainOptions::round_latent_bf16
  int64_t rope_len = 0;
  std::vector<T> cos, sin;  // [rope_len, rope/2]
  std::vector<T> x;         // [n, hidden] normed input
  std::vector<T> qa, qan;   // [n, q_lora] q_a output, after q_a_layernorm
  RmsNormContext<T> qa_norm;
  std::vector<T> q;   // [n, H, nope + rope] with RoPE applied to the rope part
  std::vector<T> kv;  // [n, kv_lora + rope] kv_a output (pre-norm latent | pre-RoPE k_pe)
  RmsNormContext<T> kv_norm;
  std::vector<T> lat;  // [n, kv_lora] kv_a_layernorm(latent)
  std::vector<T> kpe;  // [n, rope] RoPE'd shared key
  std::vector<T> kvb;  // [n, H, nope + v] kv_b output: k_nope | v per head
  std::vector<T> p;    // [n_seq, H, S, S] softmax probabilities (upper triangle 0)
  std::vector<T> att;  // [n, H, v] attention output (o_proj input)
  // Saved by B for W.
  std::vector<T> dout;        // [n, hidden]
  std::vector<T> dkvb;        // [n, H, nope + v]
  std::vector<T> dq;          // [n, H, nope + rope] w.r.t. the q projection output
  std::vector<T> dqan;        // [n, q_lora] w.r.t. q_a_layernorm output
  std::vector<T> dqa;         // [n, q_lora] w.r.t. q_a output
  std::vector<T> dlat;        // [n, kv_lora] w.r.t. kv_a_layernorm output
  std::vector<T> dkv;         // [n, kv_lora + rope] w.r.t. kv_a output
  std::vector<T> dkpe_heads;  // [H, n, rope] per-head dk_pe before the sum over heads
  std::vector<T> ds;          // [threads, S, S] attention-backward scratch (dP)
  std::vector<T> scratch;     // [n, H, v] datt, then [n, kv_lora]
};

// y[n, hidden] = MLA(x) in the naive form (causal within each sequence).
template <class T>
void mla_forward(const ModelConfig& c, const LayerParams<T>& p, SeqShape shape, const T* x, T* y,
                 MlaContext<T>& ctx);
template <class T>
void mla_backward_input(const ModelConfig& c, const LayerParams<T>& p, const T* dy, T* dx,
                        MlaContext<T>& ctx);
template <class T>
void mla_backward_weight(const ModelConfig& c, const MlaContext<T>& ctx, LayerParams<T>& g);

template <class T>
struct MoeContext {
  SeqShape shape;
  int64_t n = 0, n_experts = 0, top_k = 0, hidden = 0;
  std::vector<T> x;                         // [n, hidden] normed input
  std::vector<T> scores;                    // [n, E] sigmoid(router logits)
  std::vector<int32_t> ids;                 // [n, K] routed experts (selected with the bias)
  std::vector<T> weights;                   // [n, K] gate weights (from scores, without the bias)
  std::vector<std::vector<int64_t>> slots;  // per expert: the (t * K + k) routed to it
  std::vector<SwigluContext<T>> experts;    // [E]
  std::vector<std::vector<T>> expert_out;   // per expert [n_e, hidden]
  std::vector<T> gathered;                  // [n, hidden] scratch
  SwigluContext<T> shared;
  std::vector<int64_t> load;  // [E] tokens routed to each expert
  std::vector<T> balance_f;   // [n_seq, E] f_i of the balance loss
  double balance_alpha = 0;
  double balance_loss = 0;   // mean over sequences
  std::vector<T> dlogits;    // [n, E] saved by B for W
  std::vector<T> dweights;   // [n, K] scratch: d(gate weight)
  std::vector<T> expert_dx;  // [n_e, hidden] scratch
};

template <class T>
void moe_forward(const ModelConfig& c, const LayerParams<T>& p, SeqShape shape, double balance_alpha,
                 const T* x, T* y, MoeContext<T>& ctx);
// The balance loss's gradient enters scaled by loss_scale.
template <class T>
void moe_backward_input(const ModelConfig& c, const LayerParams<T>& p, const T* dy, double loss_scale, T* dx,
                        MoeContext<T>& ctx);
template <class T>
void moe_backward_weight(const ModelConfig& c, const MoeContext<T>& ctx, LayerParams<T>& g);

// The routing rule of DeepSeek's Gate: selection on scores + bias (group-limited for noaux_tc /
// group_limited_greedy), ids in descending biased-score order (stable). scores/bias: [E].
void moe_select(const ModelConfig& c, const double* scores, const double* bias, int32_t* ids);

template <class T>
struct BlockContext {
  SeqShape shape;
  int64_t layer = 0;
  bool moe = false;
  std::vector<T> xn, y;              // [n, hidden]
  std::vector<T> dxn;                // [n, hidden]
  std::vector<T> dxn_attn, dxn_ffn;  // saved by B for the norms' W
  RmsNormContext<T> attn_norm, ffn_norm;
  MlaContext<T> mla;
  SwigluContext<T> mlp;
  MoeContext<T> moe_ctx;
};

// The lm_head and its cross-entropy over the rows that have a target (all rows with
// TrainOptions::all_logits): rows without one contribute nothing to the loss or any gradient.
template <class T>
struct HeadRows {
  std::vector<int64_t> rows;       // the rows computed, ascending
  std::vector<int32_t> targets;    // their targets (-1 for unscored rows with all_logits)
  std::vector<T> h;                // [k, hidden] their final hidden states
  std::vector<T> logits, dlogits;  // [k, vocab]
  std::vector<T> dh;               // [k, hidden]
};
// Gathers the rows of h [n, hidden], computes their logits and returns the mean cross-entropy
// over the scored ones.
template <class T>
double head_forward(const T* w, const T* h, std::span<const int32_t> targets, int64_t hidden, int64_t vocab,
                    bool all_rows, HeadRows<T>& r);
// dlogits (scaled by `scale` / number of scored rows) and the hidden-state gradient into
// dh [n, hidden] (overwritten; zero on rows not computed).
template <class T>
void head_backward_input(const T* w, HeadRows<T>& r, int64_t n, int64_t hidden, int64_t vocab, double scale,
                         T* dh);
// Adds the lm_head's weight gradient (after head_backward_input).
template <class T>
void head_backward_weight(const HeadRows<T>& r, int64_t hidden, int64_t vocab, T* dw);

template <class T>
struct ModelContext {
  SeqShape shape;
  TrainOptions options;
  std::vector<int32_t> tokens, targets;
  std::vector<T> x;                     // [n, hidden] residual stream
  std::vector<BlockContext<T>> blocks;  // main layers
  RmsNormContext<T> final_norm;
  std::vector<T> h;                // [n, hidden] final normed hidden
  HeadRows<T> head;                // lm_head over the scored rows
  std::vector<T> dx, dh;           // [n, hidden]
  // MTP module (depth 1): positions 0..S-2 of each sequence.
  bool mtp = false;
  SeqShape mtp_shape;
  std::vector<int32_t> mtp_tokens, mtp_targets;  // tokens[t + 1], targets[t + 1]
  std::vector<T> mtp_emb, mtp_hin;               // [nm, hidden]
  RmsNormContext<T> enorm, hnorm, head_norm;
  std::vector<T> mtp_cat;       // [nm, 2 * hidden]
  std::vector<T> mtp_x, mtp_h;  // [nm, hidden]
  BlockContext<T> mtp_block;
  HeadRows<T> mtp_head;                    // the shared lm_head over the MTP's scored rows
  std::vector<T> mtp_dx, mtp_dcat, mtp_dtmp;
  StepLoss loss;
  bool has_forward = false;
};

// The depth-1 MTP module (model.cpp), for callers that run the model in pieces (pipeline stages).
// Forward: needs ctx.shape, tokens, targets and h (the final-normed hidden state); returns the MTP
// cross-entropy. Backward: both halves at once; weight gradients into g (the MTP layer, head and
// embedding), the hidden-state gradient added into ctx.dh.
template <class T>
double mtp_forward(const ModelParams<T>& params, const TrainOptions& options, ModelContext<T>& ctx);
template <class T>
void mtp_backward(const ModelParams<T>& params, ModelContext<T>& ctx, double loss_scale, ModelParams<T>& g);

}  // namespace fathom::train
