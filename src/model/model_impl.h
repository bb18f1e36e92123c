// Internal: Model::Impl, shared by the files that implement the forward pass.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/mla_decode.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "model/weights.h"

namespace fathom {

// Whether a layer's attention may run with bf16 operands (AMX prefill tiles, absorbed suffixes):
// its linears already round their activations to bf16 (BF16 and FP8 weights; docs/model.md).
inline bool attention_in_bf16(const LayerWeights& L) {
  return L.o.dtype == DType::kBF16 || L.o.dtype == DType::kF8E4M3;
}

// Activations and scratch of one forward call, sized once at load from ModelOptions.
struct Scratch {
  std::vector<float> x, xn, q_a, q, kv, attn_v, ffn_a, ffn_b, router_logits, gate_w;
  std::vector<int32_t> gate_ids;
  std::vector<int64_t> positions;
  // absorbed (decode) form, gathered over the decode-form tokens
  std::vector<float> dq, dq_abs, d_olat, d_lse, d_out;
  std::vector<int32_t> block_tables, seqlens;
  // naive (prefill) form, one key block at a time
  std::vector<float> lat, k_nope, v, att_m, att_l, att_acc, att_out;
  std::vector<float> sel;  // selected rows for the head
  std::vector<WeightView> head_views;  // per_head_matmul's per-head slices (reused, no per-call allocation)
};

// Expert parallelism (moe_ep.cpp): the EP groups, buffers and local-expert workspaces.
struct EpMoe;
struct EpMoeDeleter {
  void operator()(EpMoe* p) const;
};
using EpMoePtr = std::unique_ptr<EpMoe, EpMoeDeleter>;
// Initialises MPI and checks that the world has exactly ep_size processes; returns this rank.
Result<int> ep_world_rank(int ep_size);
// Collective over MPI_COMM_WORLD: every rank fails when any rank's `local` is an error.
Status ep_agree(const Status& local);
// Collective: creates the EP groups (normal and low-latency) for a loaded config.
Result<EpMoePtr> ep_moe_create(const ModelConfig& c, const ModelOptions& o);

struct Model::Impl {
  // Counts what a forward call reads and computes (for the roofline in benchmarks).
  ForwardStats stats;
  Status per_head_matmul(const WeightView& w, int64_t rows, const float* x, int64_t x_head, int64_t x_stride,
                         int64_t m, float* y, int64_t y_head, int64_t y_stride);
  // One read of w and its FLOPs for m rows, into stats.
  void count_linear(const WeightView& w, int64_t m) {
    stats.weight_bytes += static_cast<double>(dtype_bytes(w.dtype, static_cast<uint64_t>(w.rows * w.cols)));
    stats.linear_flops += 2.0 * static_cast<double>(w.rows) * static_cast<double>(w.cols) * static_cast<double>(m);
  }
  void mm(const WeightView& w, const float* x, int64_t m, float* y, const MatmulOptions& o = {}) {
    count_linear(w, m);
    matmul(w, x, m, y, default_pool(), o);
  }

  ModelOptions options;
  std::unique_ptr<ModelWeights> w;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelFingerprint fingerprint{};
  std::unique_ptr<RopeTable> rope;
  float softmax_scale = 0;
  int64_t max_context = 0;
  MoeGateParams gate;
  MoeExpertsParams experts_params;
  std::unique_ptr<MoeWorkspace> moe_ws;
  std::map<int, std::unique_ptr<MlaDecoder>> decoders;  // by KV dtype
  Scratch s;
  int64_t key_block = 1024;

  Result<MlaDecoder*> decoder_for(const MlaKvFormat& format);
  Status check_batch(std::span<const SeqBatch> batch, size_t n_tokens, const KvCache& cache, bool mtp) const;
  void embed(std::span<const int32_t> tokens, float* out) const;
  Status layer_forward(int64_t layer, std::span<const SeqBatch> batch, int64_t n_tokens, KvCache& cache);
  Status attention(int64_t layer, std::span<const SeqBatch> batch, int64_t n_tokens, KvCache& cache);
  // The layer's cache entries alone (attention norm, kv_a, its norm, RoPE, the write): what
  // layer_forward writes into the cache, bit for bit, without the attention and the FFN.
  Status write_kv(int64_t layer, std::span<const SeqBatch> batch, int64_t n_tokens, KvCache& cache);
  void project_kv(const LayerWeights& L, int64_t n_tokens);  // s.xn -> s.kv (normed latent, rotated key)
  Status write_kv_rows(int64_t layer, std::span<const SeqBatch> batch, KvCache& cache);  // s.kv -> cache
  void attn_norm(const LayerWeights& L, int64_t n_tokens);  // s.x -> s.xn (the attention's input norm)
  Status attention_absorbed(const LayerWeights& L, int64_t layer, std::span<const SeqBatch> batch,
                            std::span<const int64_t> rows, KvCache& cache);
  Status attention_naive(const LayerWeights& L, int64_t layer, const SeqBatch& b, int64_t row0, KvCache& cache);
  Status ffn(const LayerWeights& L, int64_t n_tokens);
  Status ffn_ep(const LayerWeights& L, int64_t n_tokens);  // moe_ep.cpp
  EpMoePtr ep;                                               // null unless ep_size > 1
  void count_experts(const LayerWeights& L, int64_t n_tokens);
  std::vector<int32_t> expert_used;
  RoutingTrace* trace = nullptr;
  int64_t current_layer = 0;
  void trace_routing(int64_t n_tokens);
  int64_t select_rows(std::span<const SeqBatch> batch, const float* src, float* dst) const;
};

}  // namespace fathom
