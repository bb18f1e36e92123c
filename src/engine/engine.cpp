// Engine: request queue, scheduler (continuous batching, chunked prefill, prefix cache,
// preemption), MTP speculation and per-request streaming. See engine.h.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <thread>

#include "base/ab.h"
#include "base/log.h"
#include "base/timer.h"
#include "engine/kv_tier_link.h"
#include "engine/spec_controller.h"
#include "kernels/ops.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

std::string_view tool_name_selection_name(ToolNameSelection s) {
  switch (s) {
    case ToolNameSelection::kTokens:
      return "tokens";
    case ToolNameSelection::kWhole:
      return "whole";
  }
  return "";
}

Status check_tool_head_weight(double weight) {
  if (!std::isfinite(weight) || weight < 0) {
    return invalid_argument("the tool head weight {} must be finite and non-negative", weight);
  }
  return {};
}

int64_t engine_batch_tokens(const EngineOptions& options) {
  return std::max(options.prefill_chunk, options.prefill_chunk_idle) +
         2 * static_cast<int64_t>(options.max_running);
}

Result<ToolNameSelection> parse_tool_name_selection(std::string_view s) {
  for (ToolNameSelection v : {ToolNameSelection::kTokens, ToolNameSelection::kWhole}) {
    if (s == tool_name_selection_name(v)) return v;
  }
  return invalid_argument("tool name selection '{}' is not 'tokens' or 'whole'", s);
}

std::optional<GenerationEvent> RequestStream::next(int timeout_ms) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) return std::nullopt;
  GenerationEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void RequestStream::push(GenerationEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

namespace {

// Cache sequence slots kept for choose_tool_name's forks: a call among more offered tools is
// scored in several forward calls.
constexpr int kChoiceForks = 16;

// A call's head as ToolNameSelection::kWhole scores it: the tokens of "NAME\n```json\n{\"KEY",
// KEY the tool's first parameter (none without a schema: "...{"), as the tokenizer spells the
// call, cut before the token that runs past KEY; the first n_name of them spell the name through
// its "\n" and are what is emitted.
struct CallHead {
  std::vector<int32_t> tokens;
  size_t n_name = 0;
};

// Empty (select token by token) if any name does not spell that way.
std::vector<CallHead> spell_call_heads(const Tokenizer& tok, std::span<const std::string> names,
                                       std::span<const ToolArgsSchema> schemas) {
  std::vector<CallHead> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    std::string head = name + "\n" + std::string(ToolArgsMatcher::kFence) + "{";
    if (i < schemas.size() && !schemas[i].keys.empty()) head += "\"" + schemas[i].keys[0];
    auto ids = tok.encode(head + "\":");
    if (!ids.ok()) return {};
    CallHead h;
    std::string bytes;
    for (int32_t id : *ids) {
      const std::string b = tok.token_bytes(id).value_or("");
      if (bytes.size() + b.size() > head.size()) break;
      bytes += b;
      h.tokens.push_back(id);
      if (h.n_name == 0 && bytes.size() > name.size()) h.n_name = h.tokens.size();
    }
    if (h.n_name == 0 || bytes.compare(0, name.size(), name) != 0 || bytes[name.size()] != '\n') return {};
    out.push_back(std::move(h));
  }
  return out;
}

struct Seq {
  uint64_t id = 0;
  GenerationRequest req;
  std::shared_ptr<RequestStream> stream;
  SeqId cache_seq = -1;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // tokens whose KV is in the cache
  int64_t n_generated = 0;
  int64_t cached_tokens = 0;    // from the prefix cache, first admission
  bool admitted_once = false;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> detok;
  std::string held;             // text held back while it may start a stop string
  std::optional<int32_t> draft;
  JsonMatcher json;
  SchemaMatcher schema_json;  // response_format json_schema (req.json_schema set)
  ToolNameState tool_name;
  // ToolNameSelection::kWhole: each offered tool's call head (empty when the request selects
  // token by token or a name cannot be spelled that way).
  std::vector<CallHead> call_heads;
  Timer clock;                  // since submit
  double first_token_s = -1, last_token_s = 0;
  // this step
  int64_t feed_begin = 0, n_feed = 0, row0 = 0, logit_row = 0;
  bool sample_now = false;
  KvTierSeq store;  // storage tier state (with --kv-store)
};

// The next token starts a call's name that ToolNameSelection::kWhole chooses whole.
bool whole_name_next(const Seq& s) {
  return s.tool_name.active && s.tool_name.prefix.empty() && !s.call_heads.empty() &&
         s.req.forced_output.empty() && !s.req.json_object;
}

}  // namespace

struct Engine::Impl {
  Model* model = nullptr;
  EngineOptions options;
  int64_t ab_steps = 0;  // steps that ran a forward (options.ab_alternate switches on its parity)
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<KvTier> tier;      // with options.kv_store; destroyed before the cache
  std::unique_ptr<KvTierLink> link;
  std::unique_ptr<JsonVocab> json_vocab;
  std::unique_ptr<ToolNameVocab> tool_vocab;
  std::vector<uint64_t> tool_mask;
  std::vector<float> choice_logits;  // choose_tool_name's forward (grown on first use)
  std::vector<float> healed;  // one row's logits after JsonVocab::heal_string_close
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::deque<std::unique_ptr<Seq>> incoming;  // submitted, not yet seen by the engine thread
  std::deque<std::unique_ptr<Seq>> waiting;   // engine thread only
  std::list<std::unique_ptr<Seq>> running;    // admitted, in admission order
  uint64_t next_id = 1;
  EngineMetrics m;      // published copy, guarded by mu
  EngineMetrics stats;  // engine thread only; published at the end of each step
  // Buffers sized once.
  std::vector<float> logits, hidden, mtp_logits;
  std::vector<int32_t> batch_tokens, mtp_tokens;
  std::vector<uint64_t> mask;
  bool spec = false;
  SpecController spec_ctl;  // with options.speculative_adaptive

  void loop();
  bool step();
  void admit();
  bool make_room(int64_t pages, const Seq* requester);
  void preempt(Seq& s);
  void finish(Seq& s, FinishReason r, Status error = {});
  // Emits a sampled token; false when the sequence finished.
  bool emit(Seq& s, const SampleResult& r, GenerationEvent& ev);
  // ToolNameSelection::kWhole at the first token of a call's name (lg: that position's logits,
  // the sequence's cache written through it): scores every offered name whole — its first token
  // from lg, the rest from forward calls over forks of the sequence, which share its pages and are
  // freed here — picks one (Sampler::choose) and emits its tokens (*alive: emit's answer). False,
  // having emitted nothing, when it cannot (no sequence slots or pages for the forks): the caller
  // then samples token by token under the name mask.
  bool choose_tool_name(Seq& s, const float* lg, GenerationEvent& ev, bool* alive);
  void flush_event(Seq& s, GenerationEvent& ev);
  void fail_all(const Status& st);
  void publish() {
    std::lock_guard lock(mu);
    const int64_t queued = static_cast<int64_t>(waiting.size());
    m = stats;
    m.running = static_cast<int64_t>(running.size());
    m.waiting = queued;
    m.kv = cache->stats();
    m.kv_store = tier != nullptr;
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<Engine>> Engine::create(Model& model, const EngineOptions& options) {
  if (options.max_running < 1 || options.prefill_chunk < 1 || options.max_waiting < 0) {
    return invalid_argument("engine: max_running and prefill_chunk must be positive");
  }
  if (options.prefill_chunk_idle < 0) {
    return invalid_argument("engine: prefill_chunk_idle must be 0 (off) or positive, got {}",
                            options.prefill_chunk_idle);
  }
  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->options = options;
  impl->options.prefill_chunk = std::min(options.prefill_chunk, model.options().max_batch_tokens - 2 * options.max_running);
  if (impl->options.prefill_chunk < 1) {
    return invalid_argument("engine: the model's max_batch_tokens {} leaves no prefill budget beside {} decoding sequences",
                            model.options().max_batch_tokens, options.max_running);
  }
  impl->options.prefill_chunk_idle =
      std::clamp(options.prefill_chunk_idle, impl->options.prefill_chunk, model.options().max_batch_tokens);
  if (options.max_running > model.options().max_sequences) {
    return invalid_argument("engine: max_running {} exceeds the model's max_sequences {}", options.max_running,
                            model.options().max_sequences);
  }
  KvCacheOptions ko = model.kv_cache_options(options.kv_dtype, options.kv_cache_bytes,
                                             options.max_running + 1 + kChoiceForks);
  // Without speculation the MTP layer's cache would never be written, so no page would ever be
  // complete enough to publish (no prefix cache, no store tier): leave that layer out.
  if (!(options.speculative && model.has_mtp())) ko.n_layers = static_cast<int>(model.config().num_hidden_layers);
  impl->cache = TRY(KvCache::create(ko));
  if (!options.kv_store.server.empty()) {
    if (!options.prefix_cache) return invalid_argument("engine: the KV store tier needs the prefix cache on");
    impl->tier = TRY(KvTier::create(options.kv_store, impl->cache->export_blob_bytes()));
    impl->link = std::make_unique<KvTierLink>(*impl->tier, *impl->cache);
  }
  const int64_t V = model.config().vocab_size, H = model.config().hidden_size;
  const int64_t T = model.options().max_batch_tokens;
  impl->logits.resize(static_cast<size_t>(T * V));
  impl->hidden.resize(static_cast<size_t>(T * H));
  impl->mtp_logits.resize(static_cast<size_t>(options.max_running * V));
  impl->mask.resize(static_cast<size_t>((V + 63) / 64));
  impl->spec = options.speculative && model.has_mtp();
  impl->json_vocab = TRY(JsonVocab::create(model.tokenizer(), static_cast<int32_t>(V)));
  impl->tool_vocab = ToolNameVocab::create(model.tokenizer(), static_cast<int32_t>(V));
  impl->tool_mask.resize(impl->mask.size());
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const EngineOptions& Engine::options() const { return impl_->options; }
Model& Engine::model() { return *impl_->model; }

Result<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest request) {
  Impl& m = *impl_;
  TRY(validate_sampling(request.sampling));
  if (request.prompt.empty()) return invalid_argument("the prompt is empty");
  if (request.max_tokens < 1) return invalid_argument("max_tokens {} must be at least 1", request.max_tokens);
  const int64_t ctx = m.model->max_context();
  if (static_cast<int64_t>(request.prompt.size()) >= ctx) {
    return out_of_range("the prompt has {} tokens; this model's context is {} tokens", request.prompt.size(), ctx);
  }
  const int64_t V = m.model->config().vocab_size;
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= V) return invalid_argument("prompt token {} is outside the vocabulary", t);
  }
  TRY(validate_logit_bias(request.sampling, V));
  TRY(check_tool_head_weight(request.tool_head_weight));
  const int64_t page_tokens = m.cache->format().page_tokens;
  const int64_t need = (static_cast<int64_t>(request.prompt.size()) + 1 + page_tokens - 1) / page_tokens;
  if (need > m.cache->n_pages()) {
    return resource_exhausted("the prompt needs {} KV pages but the cache holds {} (raise --kv-cache-gb)", need,
                              m.cache->n_pages());
  }
  auto s = std::make_unique<Seq>();
  s->stream = std::make_shared<RequestStream>();
  s->tokens = request.prompt;
  s->n_prompt = static_cast<int64_t>(request.prompt.size());
  s->sampler = std::make_unique<Sampler>(request.sampling, static_cast<int32_t>(V));
  s->sampler->add_prompt(request.prompt);
  s->detok = std::make_unique<StreamDecoder>(m.model->tokenizer(), DecodeOptions{.skip_special = true});
  s->req = std::move(request);
  s->schema_json = SchemaMatcher(s->req.json_schema.get());
  if (!s->req.tool_args_of.empty() && !s->req.tool_names.empty())
    s->tool_name.start_args(s->req.tool_args_of, s->req.tool_names, s->req.tool_schemas);
  else if (s->req.tool_name_first && !s->req.tool_names.empty())
    s->tool_name.start_name();
  if (s->req.tool_name_selection != ToolNameSelection::kTokens && s->req.tool_names.size() >= 2) {
    s->call_heads = spell_call_heads(m.model->tokenizer(), s->req.tool_names, s->req.tool_schemas);
  }
  auto stream = s->stream;
  {
    std::lock_guard lock(m.mu);
    // m.m.waiting is the engine's last published queue length (its deque is engine-thread only).
    if (static_cast<int64_t>(m.incoming.size()) + m.m.waiting >= m.options.max_waiting) {
      return resource_exhausted("the request queue is full ({} waiting)", m.options.max_waiting);
    }
    s->id = m.next_id++;
    m.incoming.push_back(std::move(s));
  }
  m.cv.notify_all();
  return stream;
}

EngineMetrics Engine::metrics() {
  EngineMetrics out;
  {
    std::lock_guard lock(impl_->mu);
    out = impl_->m;
  }
  out.kv_store = impl_->tier != nullptr;
  if (impl_->tier) out.store = impl_->tier->stats();  // live: the writer runs while the engine idles
  return out;
}

Histogram Histogram::latency() {
  Histogram h;
  h.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

void Engine::Impl::loop() {
  while (true) {
    {
      std::unique_lock lock(mu);
      const auto work = [&] { return stopping || !incoming.empty() || !waiting.empty() || !running.empty(); };
      if (link && link->has_pending()) {  // idle with pages to write: keep feeding the tier
        if (!cv.wait_for(lock, std::chrono::milliseconds(5), work)) {
          lock.unlock();
          link->drain();
          continue;
        }
      } else {
        cv.wait(lock, work);
      }
      if (stopping) break;
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
    }
    step();
  }
  // Shut down: everything still pending ends as cancelled.
  std::deque<std::unique_ptr<Seq>> late;
  {
    std::lock_guard lock(mu);
    late.swap(incoming);
  }
  for (auto& s : running) finish(*s, FinishReason::kCancelled);
  for (auto& s : waiting) finish(*s, FinishReason::kCancelled);
  for (auto& s : late) finish(*s, FinishReason::kCancelled);
  if (link) link->shutdown();  // write what was published (bounded by the flush timeout)
}

void Engine::Impl::finish(Seq& s, FinishReason r, Status error) {
  GenerationEvent ev;
  if (r != FinishReason::kCancelled && r != FinishReason::kError) {
    std::string tail;
    s.detok->finish(&tail);
    ev.text = s.held + tail;  // no stop string matched: the held-back text is output after all
  }
  s.held.clear();
  ev.finish = r;
  ev.error = std::move(error);
  ev.usage = {s.n_prompt, s.n_generated, s.cached_tokens};
  if (link) {
    if (s.cache_seq >= 0) link->collect(s.store, s.tokens, s.n_computed);
    link->forget(s.store);
  }
  if (s.cache_seq >= 0) {
    (void)cache->free_sequence(s.cache_seq);
    s.cache_seq = -1;
  }
  s.stream->push(std::move(ev));
  if (r == FinishReason::kCancelled) ++stats.requests_cancelled;
  else if (r == FinishReason::kError) ++stats.requests_failed;
  else ++stats.requests_finished;
}

void Engine::Impl::preempt(Seq& s) {
  if (link) link->collect(s.store, s.tokens, s.n_computed);
  (void)cache->free_sequence(s.cache_seq);
  s.cache_seq = -1;
  s.n_computed = 0;
  s.n_feed = 0;
  s.draft.reset();
  ++stats.preemptions;
}

// Frees pages by preempting the newest running sequences until `pages` are available. False when
// the requester itself had to go (it was the newest).
bool Engine::Impl::make_room(int64_t pages, const Seq* requester) {
  while (cache->available_pages() < pages && !running.empty()) {
    auto victim = std::prev(running.end());
    const bool self = victim->get() == requester;
    preempt(**victim);
    waiting.push_front(std::move(*victim));
    running.erase(victim);
    if (self) return false;
  }
  return cache->available_pages() >= pages;
}

void Engine::Impl::admit() {
  // In order, except that a request whose prefix is still being read from the store is passed
  // over until the read is done.
  for (auto it = waiting.begin(); it != waiting.end() && static_cast<int>(running.size()) < options.max_running;) {
    Seq& s = **it;
    if (s.stream->cancelled()) {
      finish(s, FinishReason::kCancelled);
      it = waiting.erase(it);
      continue;
    }
    const std::span<const int32_t> prefix(s.tokens.data(), s.tokens.size() - 1);
    if (link && !link->ready(s.store, prefix)) {
      ++it;
      continue;
    }
    // Admit only if the first prefill chunk fits (pages for running decodes are kept aside).
    const int64_t first = std::min<int64_t>(options.prefill_chunk, static_cast<int64_t>(s.tokens.size()));
    const int64_t need = first / cache->format().page_tokens + 2 + static_cast<int64_t>(running.size());
    // (A cache smaller than that still admits a prompt that fits it, when it is all free.)
    if (cache->available_pages() < std::min(need, cache->n_pages())) break;
    auto seq = cache->add_sequence();
    if (!seq.ok()) break;
    s.cache_seq = *seq;
    if (options.prefix_cache) {
      auto hit = cache->attach_prefix(s.cache_seq, prefix);
      if (hit.ok()) {
        s.n_computed = *hit;
        if (link) link->attached(s.store, *hit);
        if (!s.admitted_once) s.cached_tokens = *hit;
      }
    }
    if (!s.admitted_once) {
      stats.prompt_tokens += s.n_prompt;
      stats.cached_prompt_tokens += s.cached_tokens;
    }
    s.admitted_once = true;
    running.push_back(std::move(*it));
    it = waiting.erase(it);
  }
}

void Engine::Impl::flush_event(Seq& s, GenerationEvent& ev) {
  if (ev.tokens.empty() && ev.text.empty()) return;
  s.stream->push(std::move(ev));
  ev = GenerationEvent{};
}

bool Engine::Impl::emit(Seq& s, const SampleResult& r, GenerationEvent& ev) {
  const Tokenizer& tok = model->tokenizer();
  const double now = s.clock.elapsed_s();
  if (s.first_token_s < 0) {
    s.first_token_s = now;
    ev.first_token_seconds = now;
    stats.ttft.observe(now);
  } else {
    stats.itl.observe(now - s.last_token_s);
  }
  s.last_token_s = now;
  s.tokens.push_back(r.token);
  ++s.n_generated;
  ++stats.generated_tokens;
  s.sampler->add_generated(r.token);
  ev.tokens.push_back(r.token);
  if (s.req.sampling.logprobs || s.req.sampling.top_logprobs > 0) ev.logprobs.push_back(r);
  const bool is_eos = r.token == tok.eos_id() && !s.req.ignore_eos;
  const bool is_stop_token =
      std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), r.token) != s.req.stop_tokens.end();
  if (is_eos || is_stop_token) {
    flush_event(s, ev);
    finish(s, FinishReason::kStop);
    return false;
  }
  if (s.req.json_object) {
    const std::string bytes = tok.token_bytes(r.token).value_or("");
    if (s.req.json_schema) {
      (void)s.schema_json.feed(bytes);
    } else {
      (void)s.json.feed(bytes);
    }
  }
  if (!s.req.tool_names.empty())
    s.tool_name.feed(r.token, tok.token_bytes(r.token).value_or(""), tok.chat_tokens().tool_sep,
                     s.req.tool_names, s.req.tool_schemas);
  std::string piece;
  if (std::find(s.req.keep_special_tokens.begin(), s.req.keep_special_tokens.end(), r.token) !=
      s.req.keep_special_tokens.end()) {
    s.detok->finish(&piece);  // complete text so far, then the marker itself
    piece += tok.token_bytes(r.token).value_or("");
  } else if (!s.detok->push(r.token, &piece).ok()) {
    piece.clear();
  }
  s.held += piece;
  // Stop strings: cut at the first match; otherwise hold back a tail that may start one.
  size_t cut = std::string::npos;
  for (const auto& stop : s.req.stop) {
    if (stop.empty()) continue;
    const size_t at = s.held.find(stop);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    ev.text += s.held.substr(0, cut);
    s.held.clear();
    flush_event(s, ev);
    finish(s, FinishReason::kStop);
    return false;
  }
  size_t keep = 0;
  for (const auto& stop : s.req.stop) {
    for (size_t k = std::min(stop.size() - 1, s.held.size()); k > keep; --k) {
      if (s.held.compare(s.held.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  ev.text += s.held.substr(0, s.held.size() - keep);
  s.held.erase(0, s.held.size() - keep);
  const int64_t ctx = model->max_context();
  if (s.n_generated >= s.req.max_tokens || static_cast<int64_t>(s.tokens.size()) >= ctx) {
    flush_event(s, ev);
    finish(s, FinishReason::kLength);
    return false;
  }
  return true;
}

bool Engine::Impl::choose_tool_name(Seq& s, const float* lg, GenerationEvent& ev, bool* alive) {
  const std::vector<CallHead>& heads = s.call_heads;
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  // Per tool, the log-probabilities of its name's tokens (through the "\n" that ends it) and of the
  // rest of its head (the fence and the first key), weighted into one score below.
  std::vector<double> name_lp(heads.size()), rest_lp(heads.size());
  const double lg_lse = log_sum_exp(lg, V);
  for (size_t i = 0; i < heads.size(); ++i) name_lp[i] = static_cast<double>(lg[heads[i].tokens[0]]) - lg_lse;
  // Per name, its later tokens as sample() would have reported them (log-probabilities when asked).
  std::vector<std::vector<SampleResult>> reported(heads.size());
  const int64_t T = model->options().max_batch_tokens;
  const int64_t ctx = model->max_context();
  const int max_forks = std::min<int>(kChoiceForks, static_cast<int>(model->options().max_sequences));
  const int64_t pos = s.n_computed;
  // A group of forks (as many as the slots and one forward call take), one per tool: its head's
  // tokens after the first are appended to the fork and scored in one forward call.
  std::vector<size_t> tools;  // per fork
  std::vector<SeqBatch> batch;
  std::vector<int32_t> feed;
  auto release = [&] {
    for (const SeqBatch& b : batch) (void)cache->free_sequence(b.seq);
    tools.clear();
    batch.clear();
    feed.clear();
  };
  // Scores the group and releases it; false: it could not be scored.
  auto run_group = [&]() -> bool {
    if (batch.empty()) return true;
    if (choice_logits.size() < feed.size() * V) choice_logits.resize(feed.size() * V);
    auto fr = model->forward(batch, feed, *cache, choice_logits.data(), nullptr);
    if (fr.ok()) {
      const float* r = choice_logits.data();
      for (size_t f = 0; f < batch.size(); ++f) {
        const CallHead& h = heads[tools[f]];
        for (size_t j = 1; j <= static_cast<size_t>(batch[f].n_new); ++j, r += V) {
          (j < h.n_name ? name_lp : rest_lp)[tools[f]] +=
              static_cast<double>(r[h.tokens[j]]) - log_sum_exp(r, V);
          if (j < h.n_name) reported[tools[f]].push_back(s.sampler->report(r, h.tokens[j]));
        }
      }
    } else {
      log_warn("scoring tool calls failed ({}); choosing token by token", fr.status().to_string());
    }
    release();
    return fr.ok();
  };
  for (size_t i = 0; i < heads.size(); ++i) {
    const std::vector<int32_t>& ids = heads[i].tokens;
    const int64_t n = static_cast<int64_t>(ids.size()) - 1;
    if (n > T || pos + n >= ctx) {
      release();
      return false;
    }
    if (n == 0) continue;  // one token: scored from lg alone
    if (static_cast<int>(batch.size()) == max_forks || static_cast<int64_t>(feed.size()) + n > T) {
      if (!run_group()) return false;
    }
    auto fork = cache->fork(s.cache_seq);
    if (!fork.ok()) {
      release();
      return false;
    }
    tools.push_back(i);
    batch.push_back(SeqBatch{*fork, pos, n, true});
    feed.insert(feed.end(), ids.begin(), ids.begin() + n);
    if (!cache->append(*fork, std::span<const int32_t>(ids.data(), static_cast<size_t>(n))).ok()) {
      release();  // no pages: score token by token instead
      return false;
    }
  }
  if (!run_group()) return false;
  std::vector<double> score(heads.size());
  for (size_t i = 0; i < heads.size(); ++i) score[i] = name_lp[i] + s.req.tool_head_weight * rest_lp[i];
  const size_t pick = s.sampler->choose(score);
  // Emit the name. The next step computes its tokens after the first again (a short prefill that
  // also gives the MTP layer their rows); forks cannot be kept for that.
  *alive = emit(s, s.sampler->report(lg, heads[pick].tokens[0]), ev);
  for (size_t j = 1; j < heads[pick].n_name && *alive; ++j) *alive = emit(s, reported[pick][j - 1], ev);
  return true;
}

void Engine::Impl::fail_all(const Status& st) {
  log_error("engine step failed: {}", st.to_string());
  for (auto& s : running) finish(*s, FinishReason::kError, st);
  running.clear();
}

bool Engine::Impl::step() {
  if (options.ab_alternate) ab::set_variant(static_cast<int>(ab_steps % 2));
  Timer step_clock;
  EngineStepReport report;
  report.ab_variant = ab::variant();
  // Cancelled requests give their pages back first.
  for (auto it = running.begin(); it != running.end();) {
    if ((*it)->stream->cancelled()) {
      finish(**it, FinishReason::kCancelled);
      it = running.erase(it);
    } else {
      ++it;
    }
  }
  admit();
  if (running.empty()) {
    publish();
    if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // store reads pending
    return false;
  }
  const int64_t T_max = model->options().max_batch_tokens;
  // Decoding sequences first: one token each, or two with a draft to verify.
  std::vector<Seq*> order;
  for (auto& s : running) order.push_back(s.get());
  int64_t budget = T_max;
  bool decoding = false;  // some sequence's next token is in this step
  std::vector<SeqBatch> batch;
  batch_tokens.clear();
  std::vector<Seq*> in_batch;
  for (Seq* s : order) {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    if (remaining != 1) continue;  // still prefilling
    if (s->draft && (s->n_generated + 2 > s->req.max_tokens ||
                     static_cast<int64_t>(s->tokens.size()) + 2 > model->max_context())) {
      s->draft.reset();
    }
    int64_t n = s->draft ? 2 : 1;
    auto pages = cache->pages_needed(s->cache_seq, n);
    if (!pages.ok()) continue;
    if (*pages > cache->available_pages() && s->draft) {
      s->draft.reset();
      n = 1;
      pages = cache->pages_needed(s->cache_seq, n);
    }
    if (*pages > cache->available_pages() && !make_room(*pages, s)) continue;
    if (s->cache_seq < 0) continue;  // it was preempted itself (cannot happen: kept)
    s->feed_begin = s->n_computed;
    s->n_feed = n;
    budget -= n;
    decoding = true;
  }
  // Prefill chunks within the remaining budget: prefill_chunk while streams are decoding (their
  // next token waits for this step), the larger prefill_chunk_idle when none is.
  int64_t prefill_budget = std::min(budget, decoding ? options.prefill_chunk : options.prefill_chunk_idle);
  for (Seq* s : order) {
    if (s->cache_seq < 0 || prefill_budget <= 0) continue;
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->n_computed;
    if (remaining <= 1) continue;  // decoding (handled above)
    int64_t n = std::min(prefill_budget, remaining);
    auto pages = cache->pages_needed(s->cache_seq, n);
    if (pages.ok() && *pages > cache->available_pages() && n > options.prefill_chunk) {
      n = options.prefill_chunk;  // an idle-size chunk that does not fit: the ordinary one may
      pages = cache->pages_needed(s->cache_seq, n);
    }
    if (!pages.ok() || *pages > cache->available_pages()) continue;
    s->feed_begin = s->n_computed;
    s->n_feed = n;
    prefill_budget -= n;
  }
  // Assemble the batch in running order.
  int64_t n_decoding = 0;  // sequences whose next token this step samples
  for (auto& up : running) {
    Seq* s = up.get();
    if (s->n_feed == 0 || s->cache_seq < 0) continue;
    std::vector<int32_t> feed(s->tokens.begin() + s->feed_begin, s->tokens.begin() + s->feed_begin + std::min<int64_t>(s->n_feed, static_cast<int64_t>(s->tokens.size()) - s->feed_begin));
    if (s->draft && s->n_feed == 2) feed.push_back(*s->draft);
    Status st = cache->append(s->cache_seq, feed);
    if (!st.ok()) {
      s->n_feed = 0;
      continue;
    }
    s->row0 = static_cast<int64_t>(batch_tokens.size());
    batch_tokens.insert(batch_tokens.end(), feed.begin(), feed.end());
    s->sample_now = s->feed_begin + static_cast<int64_t>(feed.size()) >= static_cast<int64_t>(s->tokens.size());
    batch.push_back(SeqBatch{s->cache_seq, s->feed_begin, static_cast<int64_t>(feed.size()), s->n_feed == 2 && s->draft.has_value()});
    const bool decoding = s->feed_begin + 1 == static_cast<int64_t>(s->tokens.size());
    (decoding ? report.n_decode_tokens : report.n_prefill_tokens) += static_cast<int64_t>(feed.size());
    n_decoding += decoding ? 1 : 0;
    in_batch.push_back(s);
  }
  if (batch.empty()) {
    // Nothing fits: wait for pages to free up (another request finishing) or for cancellation.
    publish();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return false;
  }
  Timer forward_clock;
  auto fr = model->forward(batch, batch_tokens, *cache, logits.data(), spec ? hidden.data() : nullptr);
  if (!fr.ok()) {
    fail_all(fr.status());
    return false;
  }
  report.forward_seconds = forward_clock.elapsed_s();
  report.forward = fr->stats;
  report.n_seqs = static_cast<int64_t>(batch.size());
  // Sample, verify drafts, emit; collect the MTP rows (positions whose next token is known).
  const int64_t V = model->config().vocab_size, H = model->config().hidden_size;
  const int32_t call_end = model->tokenizer().chat_tokens().tool_call_end;
  int64_t logit_row = 0;
  struct MtpRows {
    Seq* s;
    SeqBatch b;
    bool draft;  // the sequence decodes next step and wants a draft
  };
  std::vector<MtpRows> mtp;
  // Whether this step's decoding sequences draft their next token (SpecController), and what the
  // step did, for its measurement: decoding sequences that verified a draft, tokens they emitted.
  // A step where sequences only finish their prompts takes the current choice for their number
  // without advancing the controller (its probes count decode steps).
  int64_t n_sampling = 0;
  for (const Seq* q : in_batch) n_sampling += q->sample_now ? 1 : 0;
  const bool draft_next =
      spec && (!options.speculative_adaptive ||
               (n_decoding > 0 ? spec_ctl.want_drafts(n_decoding) : spec_ctl.preferred(n_sampling)));
  if (spec && n_decoding > 0) ++(draft_next ? stats.spec_steps_drafting : stats.spec_steps_plain);
  int64_t n_verified = 0, n_emitted = 0;
  for (size_t i = 0; i < in_batch.size(); ++i) {
    Seq* s = in_batch[i];
    const SeqBatch& b = batch[i];
    const int64_t rows = b.all_logits ? b.n_new : 1;
    const int64_t first_row = logit_row;
    logit_row += rows;
    const int64_t computed_before = s->n_computed;
    s->n_computed = b.pos + b.n_new;
    s->n_feed = 0;
    if (!s->sample_now) {  // a prefill chunk short of the end: its next tokens are the prompt's
      if (spec) mtp.push_back({s, SeqBatch{s->cache_seq, b.pos, b.n_new, false}, false});
      continue;
    }
    GenerationEvent ev;
    bool alive = true;
    int64_t final_rows = b.n_new;
    const bool had_draft = b.all_logits && s->draft.has_value();
    const int32_t draft = s->draft.value_or(-1);
    s->draft.reset();
    n_verified += had_draft ? 1 : 0;
    const int64_t generated_before = s->n_generated;
    bool chose = false;  // choose_tool_name emitted a whole name
    for (int64_t r = 0; r < rows && alive; ++r) {
      const float* lg = logits.data() + (first_row + (b.all_logits ? r : 0)) * V;
      const uint64_t* allowed = nullptr;
      if (s->req.json_object && s->req.json_schema) {
        json_vocab->mask(s->schema_json, mask.data());
        allowed = mask.data();
      } else if (s->req.json_object) {
        json_vocab->mask(s->json, mask.data());
        allowed = mask.data();
      }
      bool tool_constrained = false;
      bool heal_quote = false;  // inside a call's string argument: JsonVocab::heal_string_close
      if (s->tool_name.active) {
        tool_constrained = tool_vocab->mask(s->tool_name.prefix, s->req.tool_names, tool_mask.data());
      } else if (s->tool_name.args_active) {
        json_vocab->mask(s->tool_name.args, tool_mask.data());
        heal_quote = s->tool_name.args.in_string();
        // Never a dead end: should no token continue the arguments, the step is left free.
        tool_constrained = std::any_of(tool_mask.begin(), tool_mask.end(), [](uint64_t w) { return w != 0; });
      } else if (s->tool_name.end_pending && call_end != kNoToken && call_end < V) {
        std::fill(tool_mask.begin(), tool_mask.end(), 0);  // the call is complete: close it
        tool_mask[static_cast<size_t>(call_end) / 64] |= uint64_t{1} << (call_end % 64);
        tool_constrained = true;
      }
      if (tool_constrained) {
        if (allowed != nullptr) {
          for (size_t w = 0; w < tool_mask.size(); ++w) tool_mask[w] &= allowed[w];
        }
        allowed = tool_mask.data();
      }
      if (heal_quote && tool_constrained) {
        healed.assign(lg, lg + V);
        json_vocab->heal_string_close(allowed, healed.data());
        lg = healed.data();
      }
      if (tool_constrained && whole_name_next(*s) && r == rows - 1) {
        bool still = true;
        if (choose_tool_name(*s, lg, ev, &still)) {
          ++stats.tool_names_scored;
          alive = still;
          chose = true;
          break;
        }
        ++stats.tool_names_unscored;
      }
      Result<SampleResult> sr = SampleResult{};
      if (!s->req.forced_output.empty()) {
        const size_t k = static_cast<size_t>(s->n_generated);
        sr->token = k < s->req.forced_output.size() ? s->req.forced_output[k] : model->tokenizer().eos_id();
      } else {
        sr = s->sampler->sample(lg, allowed);
      }
      if (!sr.ok()) {
        flush_event(*s, ev);
        finish(*s, FinishReason::kError, sr.status());
        alive = false;
        break;
      }
      alive = emit(*s, *sr, ev);
      if (had_draft && r == 0) {
        ++stats.spec_drafted;
        if (sr->token == draft) {
          ++stats.spec_accepted;
          continue;  // the draft's row is valid: the bonus token comes from it
        }
        // Rejected: the draft's KV goes; the sampled token is the next input.
        if (alive) (void)cache->truncate(s->cache_seq, b.pos + 1);
        s->n_computed = b.pos + 1;
        final_rows = 1;
        break;
      }
    }
    n_emitted += s->n_generated - generated_before;
    if (!alive) continue;
    flush_event(*s, ev);
    // No draft after a chosen name (its tokens are still to compute) or before one to choose.
    if (spec) {
      mtp.push_back({s, SeqBatch{s->cache_seq, had_draft ? b.pos : computed_before, final_rows, false},
                     draft_next && !chose && !whole_name_next(*s)});
    }
  }
  // Draft the next token of every decoding sequence with the MTP layer (rows of finished
  // sequences are dropped; their pages are already gone).
  if (spec && !mtp.empty()) {
    std::vector<SeqBatch> mb;
    std::vector<float> mh;
    std::vector<Seq*> who;
    mtp_tokens.clear();
    for (const MtpRows& r : mtp) {
      if (r.s->cache_seq < 0) continue;
      mb.push_back(r.b);
      mtp_tokens.insert(mtp_tokens.end(), r.s->tokens.begin() + r.b.pos + 1, r.s->tokens.begin() + r.b.pos + 1 + r.b.n_new);
      mh.insert(mh.end(), hidden.begin() + r.s->row0 * H, hidden.begin() + (r.s->row0 + r.b.n_new) * H);
      who.push_back(r.draft ? r.s : nullptr);
    }
    if (!mb.empty()) {
      Timer mtp_clock;
      // Without drafts the MTP step only writes its layer's cache entries (no attention, FFN or head).
      const bool any_draft = std::any_of(who.begin(), who.end(), [](const Seq* q) { return q != nullptr; });
      auto mr =
          model->mtp_forward(mb, mtp_tokens, mh.data(), *cache, any_draft ? mtp_logits.data() : nullptr);
      report.mtp_seconds = mtp_clock.elapsed_s();
      if (mr.ok()) report.mtp = mr->stats;
      if (!mr.ok()) {
        log_warn("MTP draft failed ({}); continuing without speculation", mr.status().to_string());
        spec = false;
      } else {
        for (size_t i = 0; i < who.size() && any_draft; ++i) {
          if (who[i] == nullptr) continue;
          const float* lg = mtp_logits.data() + static_cast<int64_t>(i) * V;
          who[i]->draft = static_cast<int32_t>(argmax(lg, V));
        }
      }
    }
  }
  if (link) {  // write-through of the pages this step published
    for (auto& s : running) {
      if (s->cache_seq >= 0) link->collect(s->store, s->tokens, s->n_computed);
    }
    link->drain();
  }
  // Drop finished sequences.
  for (auto it = running.begin(); it != running.end();) {
    if ((*it)->cache_seq < 0) {
      it = running.erase(it);
    } else {
      ++it;
    }
  }
  ++stats.steps;
  report.step_seconds = step_clock.elapsed_s();
  // A steady decode step (no prompt tokens; every decoding sequence verified a draft and drafted
  // again, or none did either) measures its way for the controller.
  if (spec && options.speculative_adaptive && report.n_prefill_tokens == 0 && n_decoding > 0 &&
      n_emitted > 0 && report.step_seconds > 0) {
    if (draft_next ? n_verified == n_decoding : n_verified == 0) {
      spec_ctl.record(n_decoding, draft_next, static_cast<double>(n_emitted) / report.step_seconds);
    }
  }
  ++ab_steps;  // a step that ran a forward: the next one runs on the other variant
  if (options.on_step) options.on_step(report);  // before publish: a published step was reported
  publish();
  return true;
}

}  // namespace fathom
