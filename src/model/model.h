// Model: a DeepSeek-V3 / V2 / V2-Lite model on the CPU, loaded from a Hugging Face directory
// (BF16, F32 or DeepSeek's FP8 with 128x128 block scales) or a GGUF file (deepseek2, MLA or
// legacy flavour; F32/F16/BF16/Q8_0), weights memory-mapped in their stored precision.
//
// The forward pass follows DeepSeek's inference/model.py: embedding; per layer RMSNorm, MLA
// (q LoRA or q_proj; kv_a -> latent 512 | rope 64; kv_a_layernorm on the latent; interleaved
// YaRN RoPE; softmax scale 1/sqrt(qk_nope + qk_rope) * mscale^2), dense MLP or DeepSeekMoE
// (sigmoid/softmax, bias-corrected group-limited top-k, normalisation, routed scaling, shared
// experts), final RMSNorm, lm_head. MLA runs in two forms over the same paged latent cache:
//  - prefill (more than kAbsorbThreshold new tokens of a sequence): the naive form — cached
//    latents decompressed through kv_b into per-head K/V, tiled attention with online softmax;
//  - decode (a few new tokens: one, or a speculative draft): the absorbed form — W_UK folded into
//    the query, FlashMLA-style attention over the 576-wide latent cache, W_UV applied after.
// Every linear layer of a step runs once over all new tokens of every sequence in the batch, so
// each weight (each routed expert the batch uses) is read once per step.
//
// Thread safety: one thread drives a Model (the engine thread); kernels fan out on the pool.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/model_config.h"
#include "kernels/rope.h"
#include "kvcache/kvcache.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

struct ModelWeights;

// The rotary parameters of a configuration: RoPE, or YaRN from its rope_scaling (the runtime's
// tables and the trainer's use the same).
RopeParams rope_params(const ModelConfig& c);

struct ModelOptions {
  int64_t max_batch_tokens = 2048;  // new tokens per forward call (all sequences)
  int64_t max_sequences = 64;       // sequences per forward call
  int64_t max_context = 0;          // 0: min(max_position_embeddings, 32768)
  bool load_mtp = true;
  bool progress = true;
  // Expert parallelism (`--ep N` under `mpirun -np N`; docs/model.md). With ep_size > 1, load()
  // initialises MPI, requires a world of exactly ep_size processes (an error on every rank
  // otherwise, before any weight is resolved), sets ep_rank to the world rank and holds only the
  // routed experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) (ep_size must divide E).
  // forward()/mtp_forward() become collective: every rank calls them with the same batch; each
  // rank routes a disjoint slice of the tokens through ep/ dispatch/combine and the MoE layer's
  // output rows are all-gathered, so every rank ends with bit-identical hidden states and logits.
  int ep_rank = 0;
  int ep_size = 1;
  std::string ep_dispatch_format = "f32";  // rows on the wire to the experts: f32 (exact), bf16, fp8
  std::string ep_combine_format = "f32";   // expert outputs back: f32 (exact) or bf16
  // Slices of at most this many tokens per rank (decode) use ep's low-latency mode; larger ones
  // (prefill) the normal mode. 0: normal mode always.
  int64_t ep_low_latency_tokens = 32;
  int64_t ep_timeout_ms = 60000;  // every ep wait fails after this long, naming the stalled peer
  // true: every (token, expert) pair travels as its own row and the owner adds the expert outputs
  // in moe_experts' order, so f32 wire formats give results bit-identical to one process. false:
  // DeepEP's granularity (one row per token and destination rank, per-rank partial sums): fewer
  // bytes, results equal to one process only up to float rounding.
  bool ep_exact = true;
};

// One sequence's part of a forward call. Its new tokens must already be appended to the cache
// (KvCache::append); positions [pos, pos + n_new) are computed and written into every layer.
struct SeqBatch {
  SeqId seq = -1;
  int64_t pos = 0;     // position of the first new token (= tokens already in the cache)
  int64_t n_new = 0;
  bool all_logits = false;  // logits for every new token (speculative verify) or only the last
};

// What one forward call read and computed: the denominators of a roofline.
struct ForwardStats {
  double weight_bytes = 0;    // weights read (each routed expert the batch used counted once)
  double linear_flops = 0;    // 2 * rows * cols * tokens over every linear layer
  double attention_flops = 0; // QK^T and PV (both forms)
  double kv_bytes = 0;        // latent cache bytes read by attention
  double experts_read = 0;    // distinct routed experts used, summed over MoE layers
};

struct ForwardResult {
  int64_t n_logit_rows = 0;  // rows written to logits: sum over seqs of (all_logits ? n_new : 1)
  ForwardStats stats;
};

// Test hook: the experts each token was routed to, by (layer, position). Comparing two numerics
// paths of a random-weight MoE model is ill-posed when a near-tie in the router flips (tiny
// rounding differences pick another expert); recording one run's routing and replaying it in the
// other makes every other difference measurable at a tight tolerance. Replay recomputes the gate
// weights of the replayed experts from the run's own scores.
struct RoutingTrace {
  bool replay = false;
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> ids;  // (layer, position) -> top-k ids
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const ModelOptions& options() const;
  int64_t max_context() const;
  // The identity of the weights and config for KV page hashes (kvcache.h).
  const ModelFingerprint& fingerprint() const;
  bool has_mtp() const;
  // Attention may round its operands to bf16 (BF16 and FP8 weights): prefill attention runs on
  // AMX tiles where the CPU has them, and short suffixes take the absorbed form.
  bool attention_in_bf16() const;
  uint64_t checkpoint_bytes() const;
  uint64_t repacked_bytes() const;
  const ModelWeights& weights() const;

  // The cache layout this model needs (layers = main + MTP layers).
  KvCacheOptions kv_cache_options(MlaKvDType dtype, uint64_t capacity_bytes, int max_sequences) const;

  // Runs the main model over the batch. `tokens` holds every sequence's new tokens concatenated
  // in batch order. Writes logits [n_logit_rows, vocab] and, when `hidden_all` is non-null, the
  // final normed hidden state of every new token [tokens.size(), hidden] (the MTP module's input).
  Result<ForwardResult> forward(std::span<const SeqBatch> batch, std::span<const int32_t> tokens, KvCache& cache,
                                float* logits, float* hidden_all = nullptr);

  // One MTP step (num_nextn_predict_layers >= 1): for each row, the main model's hidden state at
  // position p and the token at p + 1 -> logits for position p + 2. Row i belongs to batch[i]
  // (n_new tokens each; positions pos..), written into the MTP layer's cache slots. logits null:
  // only the cache slots are written, as the full step writes them (eh_proj and the layer's KV
  // projection; no attention, FFN or head; the result's row count is 0).
  Result<ForwardResult> mtp_forward(std::span<const SeqBatch> batch, std::span<const int32_t> next_tokens,
                                    const float* prev_hidden, KvCache& cache, float* logits);

  // Testing only: record (or replay) the routing of every MoE layer; nullptr turns it off.
  void set_routing_trace(RoutingTrace* trace);

  // Sequences up to this many new tokens use the absorbed (decode) form.
  static constexpr int64_t kAbsorbThreshold = 4;
  // Suffixes up to this many new tokens after at least as many cached ones use it too (BF16 and
  // FP8 models), as pieces of kAbsorbThreshold tokens, each causal up to its own last token,
  // while the pieces fit the absorbed scratch (absorbed_entries): below ~170 new tokens the absorbed form
  // costs fewer FLOPs than decompressing every cached key (at DeepSeek's widths), which is what a chat turn
  // after a long cached history would otherwise pay.
  static constexpr int64_t kAbsorbMaxSuffix = 64;
  // Entries the absorbed form's scratch holds per call: one per sequence, plus the spare ones a
  // suffix's pieces beyond its first take (at most one suffix of kAbsorbMaxSuffix tokens).
  static constexpr int64_t kAbsorbSpareEntries = kAbsorbMaxSuffix / kAbsorbThreshold;
  static int64_t absorbed_entries(int64_t max_sequences) { return max_sequences + kAbsorbSpareEntries; }

  struct Impl;

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<Model>> load_local(const std::string& path, const ModelOptions& options);
  std::unique_ptr<Impl> impl_;
};

// Convenience for tools and tests: the logits of every position of `tokens` in one sequence,
// run as a prefill (one chunk) or token by token (decode form), through a fresh cache.
enum class RunMode { kPrefill, kTokenByToken };
Result<std::vector<float>> run_sequence_logits(Model& model, std::span<const int32_t> tokens, RunMode mode,
                                               MlaKvDType kv_dtype = MlaKvDType::kBF16);

}  // namespace fathom
