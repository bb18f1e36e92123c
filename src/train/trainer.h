// The trainer of `fathom train`: token data (fathom-tokens-v1), the sampler, AdamW with warmup +
// cosine and global clipping, checkpoints, the log / loss curve, and export of the trained weights
// through the `fathom synth` writers. How one step's gradients are computed is behind
// `StepComputer`, so the single-process path (LocalStepComputer) and a pipelined runner plug into
// the same loop. Not here: the pipeline executor (src/pipeline/), the tokenizer and corpus.
//
// Determinism: for a seed, the data order, the initial weights and every update are fixed, and
// every reduction runs in a fixed order, so the same run twice gives bit-identical losses and a
// resumed run continues bit-identically (tests check both). Thread safety: one Trainer per thread;
// the GEMMs and the optimizer fan out on the default pool.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "train/train.h"

namespace fathom::train {

// ---- Data: DIR/meta.json, train.bin, val.bin (little-endian uint32), tokenizer files ------------

struct TokenMeta {
  int64_t vocab_size = 0;
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  int64_t n_train_tokens = 0;
  int64_t n_val_tokens = 0;
  bool loss_mask = false;  // "loss_mask": "uint8": train.mask / val.mask say which tokens are scored
};

// The validated token corpus: meta.json matches the files, sizes are whole uint32s, every id is
// below vocab_size, and every split starts with bos_id. Errors name the file and the rule.
struct TokenData {
  std::string dir;
  TokenMeta meta;
  std::vector<int32_t> train, val;    // token ids
  std::vector<uint8_t> train_mask, val_mask;  // empty, or one byte per token: 1 = a target
  std::vector<int64_t> train_starts;  // bos positions whose seq_len + 1 tokens fit
  std::vector<int64_t> val_starts;
  uint64_t hash = 0;  // XXH3 of both splits (checkpoints record it)
  // train.bin tokens no sequence covers: the part of each document past its first seq_len + 1
  // tokens (a sequence starts only at a document start), and the longest document's length.
  int64_t train_unreached = 0;
  int64_t longest_train_doc = 0;
};
// `seq_len`: sequences start at a document start and need seq_len + 1 tokens before the split ends.
Result<TokenData> load_token_data(const std::string& dir, int64_t seq_len);
// Warns (log) when 1% or more of train.bin is out of every sequence's reach at this seq_len.
void warn_unreached(const TokenData& d, int64_t seq_len);

// Micro-batch input: [n_seq, seq_len] tokens and next-token targets.
struct Batch {
  SeqShape shape;
  std::vector<int32_t> tokens, targets;
};

// Draws training sequences: document starts in a shuffled order per epoch (seeded), each
// sequence running seq_len + 1 tokens across following documents. The position (epoch, cursor)
// is all the state, so it is checkpointed and resumed exactly.
class Sampler {
 public:
  Sampler(const TokenData& data, int64_t seq_len, uint64_t seed);
  void next(int64_t n_seq, Batch& out);  // fills out (sized once)
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  void seek(int64_t epoch, int64_t cursor);  // cursor < number of starts

 private:
  void shuffle();
  const TokenData& data_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t epoch_ = 0, cursor_ = 0;
  std::vector<int64_t> order_;
};
// The fixed validation set: n_batches micro-batches of n_seq sequences from evenly spaced val
// document starts (wrapping when there are fewer).
std::vector<Batch> validation_batches(const TokenData& data, int64_t seq_len, int64_t n_seq,
                                      int64_t n_batches);
// Fills b.tokens / b.targets for sequence i from tokens[start .. start + seq_len]; with a mask (one
// byte per token), a target whose byte is 0 becomes -1 (not scored).
void fill_sequence(std::span<const int32_t> tokens, int64_t start, int64_t seq_len, int64_t i, Batch& b,
                   std::span<const uint8_t> mask = {});

// ---- Optimizer -----------------------------------------------------------------------------------

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;  // DeepSeek-V3's
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// AdamW (decoupled weight decay, torch.optim.AdamW's formula, as pipeline/adamw.cpp) over a
// parameter slab. Skips trainable = false tensors (the routing bias); no decay on norms and
// biases. Elementwise, so the result does not depend on the thread count.
class AdamW {
 public:
  AdamW(const ParamLayout& layout, AdamWOptions options);
  void step(double lr, std::span<float> params, std::span<const float> grads);
  int64_t t() const { return t_; }
  std::span<float> m() { return m_; }
  std::span<float> v() { return v_; }
  std::span<const float> m() const { return m_; }
  std::span<const float> v() const { return v_; }
  void set_t(int64_t t) { t_ = t; }

 private:
  struct Range {
    int64_t begin, end;
    bool decay;
  };
  AdamWOptions o_;
  std::vector<Range> ranges_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

// Global L2 norm of the trainable gradients (float64, fixed-order reduction); scales them to
// max_norm when above it (max_norm <= 0: no clipping). Returns the norm before clipping.
double clip_grad_norm(const ParamLayout& layout, std::span<float> grads, double max_norm);

struct LrSchedule {
  double lr = 3e-3, min_lr = 3e-4;
  int64_t warmup = 100, steps = 1000;
  // Linear warmup over `warmup` steps to lr, then cosine decay to min_lr at `steps`.
  double at(int64_t step) const;
};

// ---- How one step's gradients are computed ------------------------------------------------------

struct StepResult {
  StepLoss loss;  // means over the step's micro-batches
  // Routed-expert loads summed over the micro-batches, per layer (empty for dense layers).
  std::vector<std::vector<int64_t>> expert_loads;
};

class StepComputer {
 public:
  virtual ~StepComputer() = default;
  // Adds to `grads` (zeroed by the caller) the gradient of the mean total loss over the
  // micro-batches; loads for the router-bias update go to the result.
  virtual Result<StepResult> compute(const ModelParams<float>& params, std::span<const Batch> micro,
                                     ModelParams<float>& grads) = 0;
  virtual Result<StepLoss> evaluate(const ModelParams<float>& params, const Batch& batch) = 0;
};

// One process: model_forward / model_backward per micro-batch, one context reused.
std::unique_ptr<StepComputer> make_local_step_computer(const TrainOptions& options);

// Model FLOPs of one forward of a micro-batch: 2 per active weight per token (routed experts at
// K/E, lm_head and the MTP head included) plus causal attention's QK^T and PV.
double model_forward_flops(const ParamLayout& layout, SeqShape shape);

// ---- The training run -----------------------------------------------------------------------------

struct TrainerOptions {
  std::string data_dir;
  std::string out_dir;
  int64_t steps = 1000;
  int64_t seq_len = 128;
  int64_t batch = 8;          // sequences per micro-batch
  int64_t micro_batches = 1;  // gradient accumulation
  LrSchedule schedule;
  AdamWOptions adamw;
  double clip = 1.0;
  uint64_t seed = 0;
  bool mtp = false;
  TrainOptions model;        // MTP weight, balance alpha, bias update speed
  int64_t eval_every = 100;  // 0: only at the end
  int64_t eval_batches = 4;
  int64_t save_every = 500;  // 0: only at the end / on interruption
  bool resume = false;
  // A Hugging Face checkpoint (directory or .safetensors) whose weights replace the random
  // initialisation of a new run; the optimizer starts fresh. Ignored on --resume.
  std::string init_from;
  // Heads of decoder layer 0 built as previous-token heads at initialisation (init_params);
  // 0: a plain random initialisation. Ignored on --resume and with init_from.
  int prev_token_heads = 0;
  // The whole induction circuit built in at initialisation (seed_induction_circuit; implies one
  // previous-token head). Ignored on --resume and with init_from.
  bool induction_heads = false;
  // The GEMMs in bf16 where AMX runs them (gemm.h, GemmPrecision::kBf16); fp32 master weights,
  // optimizer and every other op either way. Part of the run's identity: a resume keeps it.
  bool bf16_gemms = false;
  double time_budget_s = 0;  // 0: none; else stop cleanly (and checkpoint) when spent
  double peak_gflops = 0;    // for MFU in the log (0: not reported)
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;  // set by a signal handler: checkpoint and stop
};

struct TrainSummary {
  int64_t step = 0;  // steps done in total (including before a resume)
  int64_t params = 0;  // parameters in the slab (MTP included)
  double last_loss = 0, first_loss = 0, val_loss = -1;
  std::vector<double> losses;  // this invocation's step losses (total)
  double tokens_per_s = 0, mfu = 0, seconds = 0;
  bool interrupted = false;
  std::string checkpoint;
};

// Trains `config` on the data; writes RUN_DIR/{checkpoint.bin, run.json, log.jsonl, loss.svg}.
Result<TrainSummary> train_model(const ModelConfig& config, const TrainerOptions& options,
                                 StepComputer* computer = nullptr);

// ---- Checkpoints (docs/train.md) -----------------------------------------------------------------

struct CheckpointState {
  int64_t step = 0;
  int64_t epoch = 0, cursor = 0;  // sampler position
  int64_t tokens = 0;             // trained so far
  double elapsed_s = 0;
  uint64_t data_hash = 0;
  nlohmann::json run;  // the options that must match on resume
};
// Atomic (tmp + fsync + rename). Layout: magic, version, JSON header, params, m, v, XXH3 trailer.
Status save_checkpoint(const std::string& path, const CheckpointState& state, const ParamLayout& layout,
                       std::span<const float> params, const AdamW& adam);
// Verifies size, trailer hash, magic, version and that the header's config and tensor table
// match `layout` before filling anything; errors name the file and the field.
Result<CheckpointState> load_checkpoint(const std::string& path, const ParamLayout& layout,
                                        std::span<float> params, AdamW& adam);

// ---- Export (`fathom export`) -----------------------------------------------------------------------

struct ExportOptions {
  std::string run_dir;         // holds checkpoint.bin and run.json (config, data dir)
  std::string out;             // directory (hf) or .gguf file
  std::string dtype = "bf16";  // hf: bf16 | fp8 | f32; gguf: bf16 | f16 | f32 | q8_0
  std::string format = "hf";   // hf | gguf
  std::string tokenizer_dir;   // default: the run's data dir
};
struct ExportResult {
  ModelConfig config;
  std::vector<std::string> files;
  uint64_t bytes = 0;
};
Result<ExportResult> export_model(const ExportOptions& options);

}  // namespace fathom::train
