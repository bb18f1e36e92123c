// Engine: continuous batching of generation requests over one Model and its paged KV cache.
//
// One engine thread owns the model and the cache. Each step it runs, in a single forward call,
// the next token of every running sequence (two with an MTP draft to verify) plus a budget of
// chunked-prefill tokens, so long prompts never stall running streams; then samples, checks stop
// conditions and pushes events to each request's stream. Other threads only submit requests and
// read their streams.
//
//  - Prefix caching: a new request attaches the longest run of cached full pages of its prompt
//    (KvCache::attach_prefix, keyed by the page hashes) and prefills only the rest.
//  - Preemption: when pages run out for running sequences, the newest one gives its pages back
//    and is re-queued (its prompt plus what it generated is recomputed later; nothing is lost).
//  - Speculative decoding with the checkpoint's MTP module: the MTP layer drafts one token
//    (greedy); the next step verifies it causally with the main model (s_q = 2). Sampling is
//    exact: the first token is drawn from the target distribution and the draft is kept only if
//    it equals that draw, so outputs have the target's distribution at any temperature.
//  - Storage tier (options.kv_store): published pages are written through to a storage server;
//    a new request whose prefix is not all in memory first reads the rest from the store
//    (asynchronously: it waits, others run) and imports it instead of recomputing it. Store
//    failures only cost recomputation (kv_tier.h).
//  - Cancellation: a cancelled request's pages are freed at the next step.
//
// Thread safety: submit(), metrics() and RequestStream are safe from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/json_constraint.h"
#include "engine/tool_name_constraint.h"
#include "engine/kv_tier.h"
#include "engine/sampler.h"
#include "kvcache/kvcache.h"
#include "model/model.h"

namespace fathom {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

// How a call's name is picked among two or more offered tools (GenerationRequest::tool_names).
enum class ToolNameSelection {
  // Token by token, each step masked to the tokens that keep the name a prefix of an offered one
  // (a greedy walk: the first tokens decide before the model has seen the rest of any name).
  kTokens,
  // Each offered tool's call head — "NAME\n```json\n{\"KEY", KEY its first parameter, as the
  // tokenizer spells the call — is scored by its tokens' log-probabilities, and the best is taken,
  // or one drawn from the scores' softmax at temperature > 0, as SGLang's `select` chooses among
  // options. The score is the name's log-probability plus GenerationRequest::tool_head_weight times
  // that of the rest of the head: the arguments' first key is part of the head, and weighs more,
  // because a model that has not learned a new tool's name still knows which parameters a request
  // needs. One extra forward call over every head per call.
  kWhole,
};

// GenerationRequest::tool_head_weight by default (`fathom serve --tool-head-weight`; docs/engine.md,
// "Choosing among the offered names": the five-stage default model right on 90.4% of 2800 held-out
// requests against 86.4% with weight 1, the head's plain joint log-probability).
inline constexpr double kDefaultToolHeadWeight = 10;
// GenerationRequest::tool_head_weight's rule: finite and >= 0 (kInvalidArgument naming it otherwise).
Status check_tool_head_weight(double weight);

std::string_view tool_name_selection_name(ToolNameSelection s);
Result<ToolNameSelection> parse_tool_name_selection(std::string_view s);
std::string_view finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<std::string> stop;      // stop strings (not included in the output)
  std::vector<int32_t> stop_tokens;   // besides EOS
  bool ignore_eos = false;
  bool json_object = false;           // constrain the output to one JSON object
  // With json_object: the object follows this schema too (response_format json_schema; json_schema.h).
  std::shared_ptr<const JsonSchema> json_schema;
  // The offered tools' names: when non-empty, a name the model writes after <｜tool▁sep｜> must be
  // one of them (engine/tool_name_constraint.h).
  std::vector<std::string> tool_names;
  // Parallel to tool_names (or empty): each tool's argument keys (ToolArgsSchema::from_json_schema);
  // a call's arguments are one JSON object whose keys, when the schema has any, are constrained.
  std::vector<ToolArgsSchema> tool_schemas;
  ToolNameSelection tool_name_selection = ToolNameSelection::kTokens;
  // kWhole: a head's score is log p(name) + tool_head_weight * log p(fence and first key | name).
  // 1: the head's joint log-probability; 0: the name alone. Finite, >= 0. Where the rest of every
  // head is near certain (a model that follows the tool's schema once it has named the tool), the
  // choice and, at temperature > 0, its distribution are the name's.
  double tool_head_weight = kDefaultToolHeadWeight;
  // The reply starts inside the arguments of a call to this tool (one of tool_names), after the
  // fence, which the prompt holds: tool_choice naming a function. Empty: it does not.
  std::string tool_args_of;
  // The reply starts with a call's name (one of tool_names): the prompt ends with <｜tool▁sep｜>.
  bool tool_name_first = false;
  // Special tokens whose text is kept in the output (the tool-call markers, so the server can
  // parse calls); every other special token is dropped from the text.
  std::vector<int32_t> keep_special_tokens;
  // Test hook: emit these tokens (then EOS) instead of sampling; the model still runs every step.
  std::vector<int32_t> forced_output;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// One update of a request, in order; the last one has finish != kNone.
struct GenerationEvent {
  std::string text;                  // new text (complete UTF-8)
  std::vector<int32_t> tokens;       // the tokens behind it
  std::vector<SampleResult> logprobs;  // per token when requested
  FinishReason finish = FinishReason::kNone;
  Status error;                      // with kError
  Usage usage;                       // with the last event
  double first_token_seconds = -1;   // set once, on the event that carries the first token
};

// A request's event queue. The engine pushes; one reader pops.
class RequestStream {
 public:
  // Waits up to timeout_ms for the next event; nullopt on timeout.
  std::optional<GenerationEvent> next(int timeout_ms);
  // Asks the engine to stop this request; its pages are freed at the next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  void push(GenerationEvent e);  // engine side

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
};

// What one engine step ran, for benchmarks (EngineOptions::on_step). Called on the engine thread
// after the step's forward calls and sampling; the observer must be quick and must not call back
// into the engine.
struct EngineStepReport {
  int64_t n_seqs = 0;            // sequences in the forward call
  int64_t n_decode_tokens = 0;   // new tokens of decoding sequences (2 with a draft to verify)
  int64_t n_prefill_tokens = 0;  // prompt (or recompute) tokens of prefilling sequences
  double forward_seconds = 0;    // Model::forward
  double mtp_seconds = 0;        // Model::mtp_forward (drafting), 0 without speculation
  double step_seconds = 0;       // the whole step: scheduling, forward calls, sampling, streaming
  ForwardStats forward;          // bytes and FLOPs of Model::forward
  ForwardStats mtp;              // of Model::mtp_forward
  int ab_variant = 0;            // base/ab.h variant the step ran with
};

struct EngineOptions {
  int max_running = 32;              // sequences decoding at once
  int64_t prefill_chunk = 512;       // prefill tokens per step (chunked prefill budget)
  // Prefill tokens per step when no sequence is decoding (no stream's inter-token latency is at
  // stake): larger chunks read the weights, above all a MoE model's experts, fewer times per
  // prompt. 0: prefill_chunk. Clamped to the model's max_batch_tokens.
  int64_t prefill_chunk_idle = 2048;
  int max_waiting = 256;             // queued requests before submit() answers kResourceExhausted
  uint64_t kv_cache_bytes = uint64_t{1} << 30;
  MlaKvDType kv_dtype = MlaKvDType::kBF16;
  bool prefix_cache = true;
  bool speculative = true;           // use the MTP module when the checkpoint has one
  // With speculative: draft only while drafting pays. The engine times steady steps with drafts
  // and without, per batch size (1, 2-3, 4-7, ... sequences), in tokens per second, keeps the
  // faster way and tries the other for a few steps at doubling intervals. Without drafts
  // the MTP step only writes its layer's cache entries (Model::mtp_forward with null logits), so
  // drafts resume at full acceptance. Off:
  // every decoding sequence drafts every step (the measurement and the tests of drafting).
  bool speculative_adaptive = false;
  // KV-cache storage tier (kv_tier.h): kv_store.server "HOST:PORT" writes full pages through to
  // a storage server and reads a prompt's stored prefix back before admission; empty: off.
  KvTierOptions kv_store;
  std::function<void(const EngineStepReport&)> on_step;  // optional per-step observer
  // Set base/ab.h's variant to 0 and 1 on alternate steps (a measurement harness: `bench serve --ab`).
  bool ab_alternate = false;
};

// A fixed-bucket latency histogram (Prometheus semantics: cumulative buckets, sum, count).
struct Histogram {
  std::vector<double> bounds;    // upper bounds in seconds, ascending
  std::vector<int64_t> counts;   // per bucket (not cumulative), plus one for +Inf
  double sum = 0;
  int64_t count = 0;
  static Histogram latency();    // 1 ms .. 60 s
  void observe(double v);
};

struct EngineMetrics {
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0, preemptions = 0;
  int64_t spec_drafted = 0, spec_accepted = 0;
  // Decode steps after which the decoding sequences drafted / did not (with speculation; what
  // EngineOptions::speculative_adaptive chose).
  int64_t spec_steps_drafting = 0, spec_steps_plain = 0;
  // Call names picked among two or more tools by whole-name scoring, and those that fell back to
  // token-by-token selection (no slots or pages for the scoring forks).
  int64_t tool_names_scored = 0, tool_names_unscored = 0;
  int64_t steps = 0;
  KvCacheStats kv;
  bool kv_store = false;  // a storage tier is configured
  KvTierStats store;
  Histogram ttft = Histogram::latency();  // submit -> first token
  Histogram itl = Histogram::latency();   // between tokens of a stream
};

// The ModelOptions::max_batch_tokens an engine with these options fills at most: the larger of its
// prefill chunks plus two tokens (one and a draft) per decoding sequence. Size the model with it.
int64_t engine_batch_tokens(const EngineOptions& options);

class Engine {
 public:
  // The model must outlive the engine. Starts the engine thread.
  static Result<std::unique_ptr<Engine>> create(Model& model, const EngineOptions& options);
  ~Engine();  // stops the thread; pending requests finish with kCancelled

  // Queues a request. kResourceExhausted when the queue is full; kOutOfRange when the prompt
  // cannot fit the context; kInvalidArgument for bad parameters.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Counters, gauges and latency histograms since start.
  EngineMetrics metrics();
  const EngineOptions& options() const;
  Model& model();

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
