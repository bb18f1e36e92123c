// Sampler: turns a row of logits into the next token, as OpenAI-compatible servers define the
// knobs (vLLM's order): repetition penalty (prompt + output tokens, HF style), presence and
// frequency penalties (output tokens), logit_bias, an optional allowed-token mask (constrained decoding),
// temperature, min-p, top-k, top-p, then a draw from a per-request RNG (seeded for reproducible
// results). temperature 0 means greedy (argmax, lowest id on ties). Log-probabilities are those
// of the model's distribution (log-softmax of the raw logits), as OpenAI's `logprobs` reports.
//
// Thread safety: a Sampler is one request's state; buffers are sized once for the vocabulary.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "base/rng.h"
#include "base/status.h"

namespace fathom {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  float repetition_penalty = 1.0f; // (0, 2]
  std::optional<uint64_t> seed;
  int32_t top_logprobs = 0;  // alternatives reported per token (0..20)
  bool logprobs = false;
  // OpenAI's logit_bias: added to a token's logit before sampling, after the penalties, each in
  // [-100, 100] (-100 in effect bans a token, 100 forces it). Log-probabilities stay the model's.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// logit_bias ids against the model's vocabulary (validate_sampling checks the values).
Status validate_logit_bias(const SamplingParams& p, int64_t vocab_size);

// log(sum(exp(logits[i]))) over n values, in double: the log-softmax normaliser (-inf for none).
double log_sum_exp(const float* logits, size_t n);

// An error naming the parameter and its valid range.
Status validate_sampling(const SamplingParams& p);

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0;                // of the chosen token (when logprobs)
  std::vector<TokenLogprob> top;    // top_logprobs alternatives, best first
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Notes tokens the penalties see: the prompt (repetition penalty only) and each generated token.
  void add_prompt(std::span<const int32_t> tokens);
  void add_generated(int32_t token);

  // Picks the next token from logits[vocab] (not modified). `allowed`, when given, is a bitmask
  // over the vocabulary (bit t set: token t may be chosen); if it allows nothing, kNotFound.
  Result<SampleResult> sample(const float* logits, const uint64_t* allowed = nullptr);
  // Picks one of several options (whole continuations) scored by their total log-probability
  // under the model: the best at temperature 0 (the first on ties), otherwise a draw from
  // softmax(scores / temperature) with this request's RNG. The token-level knobs (top-k/p,
  // min-p, penalties) do not apply to whole options. `scores` must not be empty.
  size_t choose(std::span<const double> scores);
  // What sample() would report had it drawn `token` from logits[vocab]: the token, and its
  // log-probability and top alternatives when the request asked for them.
  SampleResult report(const float* logits, int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  int32_t vocab_;
  Rng rng_;
  std::vector<int32_t> output_counts_;  // per token, in the generated text
  std::vector<uint8_t> in_prompt_;
  std::vector<int32_t> seen_;           // tokens with nonzero counts or in the prompt
  std::vector<float> work_;
  std::vector<int32_t> idx_;
  std::vector<int32_t> best_;
};

}  // namespace fathom
