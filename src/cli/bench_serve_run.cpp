// The load generator of `fathom bench serve` (see bench_serve.h): client threads against an
// in-process Engine, latency statistics, the decode-step roofline and the prefix-cache case.
// It does not speak HTTP and does not measure the machine (bench_serve.cpp does).
#include "cli/bench_serve.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "base/rng.h"
#include "base/timer.h"

namespace fathom::cli {

void StepLog::add(const EngineStepReport& r) {
  std::lock_guard lock(mu_);
  steps_.push_back(r);
  ++total_;
}

std::vector<EngineStepReport> StepLog::take() {
  std::lock_guard lock(mu_);
  std::vector<EngineStepReport> out;
  out.swap(steps_);
  return out;
}

int64_t StepLog::total() const {
  std::lock_guard lock(mu_);
  return total_;
}

DecodeRoofline decode_roofline(const std::vector<EngineStepReport>& steps, const Roof& roof) {
  DecodeRoofline d;
  for (const EngineStepReport& s : steps) {
    if (s.n_decode_tokens == 0) continue;
    if (s.n_prefill_tokens > 0) {
      ++d.mixed_steps;
      continue;
    }
    const double weight = s.forward.weight_bytes + s.mtp.weight_bytes;
    const double kv = s.forward.kv_bytes + s.mtp.kv_bytes;
    const double linear = s.forward.linear_flops + s.mtp.linear_flops;
    const double attention = s.forward.attention_flops + s.mtp.attention_flops;
    const double mem_s = (weight + kv) / (roof.bandwidth_gbs * 1e9);
    const double compute_s =
        linear / (roof.linear_peak_gflops * 1e9) + attention / (roof.attention_peak_gflops * 1e9);
    ++d.steps;
    d.tokens += s.n_decode_tokens;
    const int v = s.ab_variant == 1 ? 1 : 0;
    d.ab_seconds[v] += s.step_seconds;
    d.ab_tokens[v] += s.n_decode_tokens;
    d.step_seconds += s.step_seconds;
    d.forward_seconds += s.forward_seconds + s.mtp_seconds;
    d.weight_bytes += weight;
    d.kv_bytes += kv;
    d.linear_flops += linear;
    d.attention_flops += attention;
    d.experts_read += s.forward.experts_read;  // the main model's MoE layers only
    d.memory_seconds += mem_s;
    d.compute_seconds += compute_s;
    d.roofline_seconds += std::max(mem_s, compute_s);
    if (compute_s > mem_s) ++d.compute_bound_steps;
  }
  return d;
}

LatencySummary summarize(std::vector<double> v) {
  LatencySummary s;
  s.n = static_cast<int64_t>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = pct(0.5);
  s.p90 = pct(0.9);
  s.p99 = pct(0.99);
  s.max = v.back();
  return s;
}

namespace {

std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

// Submits one request to the in-process engine and reads its stream to the end.
Result<RequestRecord> run_request(Engine& engine, std::vector<int32_t> prompt, int64_t max_tokens,
                                  const Timer& clock, const OnTokens& on_tokens) {
  GenerationRequest req;
  req.prompt = std::move(prompt);
  req.sampling.temperature = 0;  // greedy: no sampling noise in the timings
  req.max_tokens = max_tokens;
  req.ignore_eos = true;  // every request generates exactly max_tokens
  RequestRecord rec;
  rec.n_prompt = static_cast<int64_t>(req.prompt.size());
  rec.submit_s = clock.elapsed_s();
  auto stream = TRY(engine.submit(std::move(req)));
  double last_s = 0;
  while (true) {
    std::optional<GenerationEvent> ev = stream->next(1000);
    if (!ev) continue;  // still waiting (a long prefill on a slow model)
    const double now = clock.elapsed_s();
    const int64_t n = static_cast<int64_t>(ev->tokens.size());
    if (n > 0) {
      if (rec.first_s < 0) {
        rec.first_s = now;
        for (int64_t i = 1; i < n; ++i) rec.itl.push_back(0);  // tokens delivered together
      } else {
        for (int64_t i = 0; i < n; ++i) rec.itl.push_back((now - last_s) / static_cast<double>(n));
      }
      last_s = now;
      rec.n_out += n;
      on_tokens(n);
    }
    if (ev->finish != FinishReason::kNone) {
      rec.end_s = now;
      rec.cached = ev->usage.cached_tokens;
      if (ev->finish == FinishReason::kError) return ev->error.with_context("request failed");
      if (ev->finish != FinishReason::kLength) {
        return internal_error("request ended with finish reason '{}' after {} of {} tokens",
                              finish_reason_name(ev->finish), rec.n_out, max_tokens);
      }
      return rec;
    }
  }
}

// Waits until the engine has published a state with nothing running or queued; every step it
// ran has then been reported (on_step runs before publish).
void wait_idle(const EngineProbe& probe) {
  if (probe.engine == nullptr) return;
  while (true) {
    const EngineMetrics m = probe.engine->metrics();
    if (m.running == 0 && m.waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

LevelResult summarize_level(int concurrency, const std::vector<std::vector<RequestRecord>>& records) {
  LevelResult out;
  out.concurrency = concurrency;
  std::vector<double> ttft, itl, tpot, e2e;
  double first_submit = 1e300, last_end = 0;
  for (const auto& client : records) {
    for (const RequestRecord& r : client) {
      ++out.requests;
      out.output_tokens += r.n_out;
      out.prompt_tokens += r.n_prompt;
      out.cached_prompt_tokens += r.cached;
      first_submit = std::min(first_submit, r.submit_s);
      last_end = std::max(last_end, r.end_s);
      ttft.push_back(r.first_s - r.submit_s);
      e2e.push_back(r.end_s - r.submit_s);
      if (r.n_out > 1) tpot.push_back((r.end_s - r.first_s) / static_cast<double>(r.n_out - 1));
      itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    }
  }
  out.seconds = last_end - first_submit;
  out.ttft = summarize(std::move(ttft));
  out.itl = summarize(std::move(itl));
  out.tpot = summarize(std::move(tpot));
  out.e2e = summarize(std::move(e2e));
  return out;
}

}  // namespace

RequestRunner engine_runner(Engine& engine) {
  return [&engine](std::vector<int32_t> prompt, int64_t max_tokens, const Timer& clock,
                   const OnTokens& on_tokens) {
    return run_request(engine, std::move(prompt), max_tokens, clock, on_tokens);
  };
}

Result<LevelResult> run_level(const RequestRunner& run, const EngineProbe& probe, const Roof& roof,
                              const LoadParams& p, const OnTokens& on_tokens) {
  wait_idle(probe);
  if (probe.log != nullptr) (void)probe.log->take();
  Timer clock;
  std::vector<std::vector<RequestRecord>> records(static_cast<size_t>(p.concurrency));
  std::vector<Status> errors(static_cast<size_t>(p.concurrency));
  std::vector<std::thread> clients;
  for (int c = 0; c < p.concurrency; ++c) {
    clients.emplace_back([&, c] {
      Rng rng(p.seed * 1000003 + static_cast<uint64_t>(p.concurrency) * 1009 + static_cast<uint64_t>(c));
      for (int64_t r = 0; r < p.requests_per_client; ++r) {
        auto rec = run(random_tokens(rng, p.prompt_tokens, p.vocab), p.gen_tokens, clock, on_tokens);
        if (!rec.ok()) {
          errors[static_cast<size_t>(c)] = rec.status();
          return;
        }
        records[static_cast<size_t>(c)].push_back(std::move(*rec));
      }
    });
  }
  for (auto& t : clients) t.join();
  wait_idle(probe);
  std::vector<EngineStepReport> steps;
  if (probe.log != nullptr) steps = probe.log->take();
  for (const Status& st : errors) {
    if (!st.ok()) return st.with_context(fmt::format("concurrency {}", p.concurrency));
  }
  LevelResult out = summarize_level(p.concurrency, records);
  out.decode = decode_roofline(steps, roof);
  out.steps = std::move(steps);
  return out;
}

namespace {

double median(std::vector<double> v) {
  return summarize(std::move(v)).p50;
}

}  // namespace

Result<PrefixResult> run_prefix_case(const RequestRunner& run, const EngineProbe& probe,
                                     const PrefixParams& p, const OnTokens& on_tokens) {
  const int64_t vocab = p.vocab;
  PrefixResult out;
  out.prefix_tokens = p.prefix_tokens;
  out.suffix_tokens = p.suffix_tokens;
  // Full pages inside the prefix are what the cache can serve (the page holding the boundary
  // mixes prefix and suffix tokens, so it differs between the two prompts).
  const int64_t expect_cached = p.prefix_tokens / p.page_tokens * p.page_tokens;
  std::vector<double> uncached, cached;
  Rng rng(p.seed);
  for (int i = 0; i < p.repeats; ++i) {
    const std::vector<int32_t> prefix = random_tokens(rng, p.prefix_tokens, vocab);
    std::vector<int32_t> a = prefix, b = prefix;
    const std::vector<int32_t> sa = random_tokens(rng, p.suffix_tokens, vocab);
    std::vector<int32_t> sb = random_tokens(rng, p.suffix_tokens, vocab);
    if (sb[0] == sa[0])
      sb[0] = static_cast<int32_t>((sb[0] + 1) % vocab);  // suffixes differ from their first token
    a.insert(a.end(), sa.begin(), sa.end());
    b.insert(b.end(), sb.begin(), sb.end());
    wait_idle(probe);
    Timer clock;
    const RequestRecord ra = TRY(run(a, 1, clock, on_tokens));
    if (ra.cached != 0) {
      return internal_error(
          "prefix case: the 'uncached' prompt found {} tokens in the cache (a random prefix cached before?)",
          ra.cached);
    }
    wait_idle(probe);
    const RequestRecord rb = TRY(run(b, 1, clock, on_tokens));
    if (rb.cached < expect_cached) {
      return internal_error(
          "prefix case: only {} of the {} prefix tokens came from the prefix cache (is it too small "
          "or disabled?)",
          rb.cached, expect_cached);
    }
    out.cached_tokens = rb.cached;
    uncached.push_back(ra.first_s - ra.submit_s);
    cached.push_back(rb.first_s - rb.submit_s);
  }
  out.uncached_ttft_s = median(std::move(uncached));
  out.cached_ttft_s = median(std::move(cached));
  return out;
}

}  // namespace fathom::cli
