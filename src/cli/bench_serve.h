// `fathom bench serve` internals: drives an in-process Engine with N concurrent clients and
// turns what it saw into serving figures and a per-step roofline. Shared by bench_serve.cpp (the
// command: options, machine measurement, output) and bench_serve_run.cpp (the load generator).
//
// What is measured, per concurrency level N: N client threads each submit
// `requests_per_client` requests back to back (a closed loop, like vLLM's --max-concurrency), with
// random prompts of `prompt_tokens` ids and exactly `gen_tokens` greedy output tokens (EOS
// ignored). Client-side timestamps give time-to-first-token (submit -> first token event) and
// inter-token latency (gap between token events, split evenly over the tokens an event carries).
// The engine's per-step reports (EngineOptions::on_step) give the roofline of every pure decode
// step (no prefill tokens in it): bytes it must read (dense/attention weights once, each routed
// expert the batch selected once, the KV pages) over the measured bandwidth, FLOPs over the
// measured peak. HTTP is not involved: the server's overhead is excluded.
//
// With --url the same load goes through a running `fathom serve` (or any OpenAI-compatible server
// that takes token-id prompts and `ignore_eos`) as streamed /v1/completions requests
// (bench_serve_http.cpp): latency then includes HTTP and SSE, inter-token latency is measured
// between SSE chunks (a token that completes no UTF-8 text is delivered with the next one),
// output tokens come from the usage chunk, and there is no step roofline.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/timer.h"
#include "engine/engine.h"

namespace fathom::cli {

// Collects EngineStepReports from the engine thread.
class StepLog {
 public:
  void add(const EngineStepReport& r);
  std::vector<EngineStepReport> take();  // and clear
  int64_t total() const;                 // reports ever added

 private:
  mutable std::mutex mu_;
  std::vector<EngineStepReport> steps_;
  int64_t total_ = 0;
};

// The machine's limits the roofline divides by.
struct Roof {
  double bandwidth_gbs = 0;          // read bandwidth
  double linear_peak_gflops = 0;     // the arithmetic the weights use (bf16, int8 VNNI or f32)
  double attention_peak_gflops = 0;  // bf16 (the MLA decode kernel's arithmetic)
};

struct DecodeRoofline {
  int64_t steps = 0;        // pure decode steps (roofline counted)
  int64_t mixed_steps = 0;  // steps that also carried prefill tokens (not counted)
  int64_t tokens = 0;       // decode tokens in the pure steps
  double step_seconds = 0, forward_seconds = 0;
  double weight_bytes = 0, kv_bytes = 0, linear_flops = 0, attention_flops = 0;
  double experts_read = 0;  // distinct routed experts of the main model, summed over MoE layers and steps
  double memory_seconds = 0, compute_seconds = 0;  // sums of per-step bytes/bw and flops/peak
  double roofline_seconds = 0;                     // sum over steps of max(bytes/bw, flops/peak)
  int64_t compute_bound_steps = 0;
  // Per base/ab.h variant (bench serve --ab): pure decode steps' seconds and decode tokens.
  double ab_seconds[2] = {0, 0};
  int64_t ab_tokens[2] = {0, 0};
  double fraction() const { return step_seconds > 0 ? roofline_seconds / step_seconds : 0; }
  double ab_seconds_per_token(int v) const {
    return ab_tokens[v] > 0 ? ab_seconds[v] / static_cast<double>(ab_tokens[v]) : 0;
  }
  // Decode seconds per token of variant 0 over variant 1's (> 1: variant 1 is faster); 0 without both.
  double ab_ratio() const {
    const double s0 = ab_seconds_per_token(0), s1 = ab_seconds_per_token(1);
    return s0 > 0 && s1 > 0 ? s0 / s1 : 0;
  }
};

DecodeRoofline decode_roofline(const std::vector<EngineStepReport>& steps, const Roof& roof);

struct LatencySummary {
  int64_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // seconds
};
// Percentiles by linear interpolation between order statistics (numpy's default).
LatencySummary summarize(std::vector<double> samples);

// What a client saw of one request; times in seconds on the level's clock.
struct RequestRecord {
  double submit_s = 0, first_s = -1, end_s = 0;
  int64_t n_out = 0, n_prompt = 0, cached = 0;
  std::vector<double> itl;  // one sample per token (engine) or per chunk (HTTP) after the first
};

// Sends one greedy request (EOS ignored) and reads its stream to the end; calls on_tokens(k) as
// tokens arrive. An error for anything but finish_reason "length" with every token delivered.
using OnTokens = std::function<void(int64_t)>;
using RequestRunner = std::function<Result<RequestRecord>(std::vector<int32_t> prompt, int64_t max_tokens,
                                                          const Timer& clock, const OnTokens& on_tokens)>;
RequestRunner engine_runner(Engine& engine);

struct HttpTarget {
  std::string url;      // http://host:port
  std::string api_key;  // Bearer token, or empty
  std::string model = "default";
};
// Checks the server answers GET /v1/models with `model` among its names.
Result<RequestRunner> http_runner(const HttpTarget& target);

// The engine being measured, when in-process (steps reported and waited for); null over HTTP.
struct EngineProbe {
  Engine* engine = nullptr;
  StepLog* log = nullptr;
};

struct LoadParams {
  int concurrency = 1;
  int64_t requests_per_client = 1;
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 64;
  uint64_t seed = 1;
  int64_t vocab = 0;  // prompt ids are drawn from [0, vocab)
};

struct LevelResult {
  int concurrency = 0;
  int64_t requests = 0, output_tokens = 0, prompt_tokens = 0, cached_prompt_tokens = 0;
  double seconds = 0;  // first submit to last finish
  LatencySummary ttft, itl, tpot, e2e;
  // In-process only. `decode` divides by the mean of the read bandwidth measured right before and
  // right after this level; `decode_outer` by the run-wide higher of the readings before and after
  // all levels (the older, coarser measure).
  double bandwidth_before_gbs = 0, bandwidth_after_gbs = 0;
  double bandwidth_gbs() const { return (bandwidth_before_gbs + bandwidth_after_gbs) / 2; }  // `decode`'s
  DecodeRoofline decode, decode_outer;
  std::vector<EngineStepReport> steps;  // what `decode` was computed from
};

// Runs one concurrency level to completion.
Result<LevelResult> run_level(const RequestRunner& run, const EngineProbe& probe, const Roof& roof,
                              const LoadParams& p, const OnTokens& on_tokens);

struct PrefixParams {
  int64_t prefix_tokens = 4096;
  int64_t suffix_tokens = 128;
  int repeats = 1;  // uncached/cached pairs, each on a fresh prefix (medians)
  uint64_t seed = 7;
  int64_t vocab = 0;
  int64_t page_tokens = 64;
};

struct PrefixResult {
  int64_t prefix_tokens = 0, suffix_tokens = 0, cached_tokens = 0;
  double uncached_ttft_s = 0, cached_ttft_s = 0;  // medians
  double speedup() const { return cached_ttft_s > 0 ? uncached_ttft_s / cached_ttft_s : 0; }
};

// TTFT of prefix + suffix with nothing cached, then of the same prefix with another suffix of the
// same length once the prefix is cached. Fails if the cache did not serve the prefix.
Result<PrefixResult> run_prefix_case(const RequestRunner& run, const EngineProbe& probe,
                                     const PrefixParams& p, const OnTokens& on_tokens);

}  // namespace fathom::cli
