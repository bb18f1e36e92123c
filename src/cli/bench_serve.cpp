// `fathom bench serve`: serving throughput and latency of the engine at several concurrencies,
// the roofline of its batched decode steps, and the prefix cache's effect on time-to-first-token
// — against this machine's bandwidth and peak arithmetic measured in the same run.
// The engine runs in-process (the HTTP server's overhead is excluded), or with --url a running
// server is measured through HTTP (bench_serve_http.cpp); the load generator is in
// bench_serve_run.cpp. This file: options, machine measurement, engine set-up, output.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "base/fs.h"
#include "base/progress.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/bench_serve.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "kernels/roofline.h"
#include "model/model.h"
#include "model/weights.h"

namespace fathom::cli {
namespace {

struct BenchServeOptions {
  std::string model;
  std::string concurrency = "1,8,16,32";
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 64;
  int64_t requests_per_client = 1;
  int64_t prefix_tokens = 4096;
  int64_t prefix_repeats = 1;
  int64_t prefill_chunk = 512;
  int64_t prefill_chunk_idle = EngineOptions{}.prefill_chunk_idle;
  std::string kv_dtype = "bf16";
  std::optional<double> kv_cache_gb;
  bool speculative = false;
  std::string url, api_key, served_model = "default";
  int64_t seed = 1;
  bool json = false;
  bool ab = false;
  std::vector<int64_t> levels;  // parsed --concurrency
};

constexpr int64_t kMaxConcurrency = 256;

Status validate(BenchServeOptions& o) {
  if (o.model.empty())
    return invalid_argument("--model is required (a Hugging Face directory or a GGUF file)");
  o.levels = TRY(parse_int_list(o.concurrency, "--concurrency"));
  if (o.levels.empty()) return invalid_argument("--concurrency: give at least one level, e.g. 1,8,16,32");
  for (int64_t c : o.levels) {
    if (c < 1 || c > kMaxConcurrency) {
      return invalid_argument("--concurrency: {} is outside 1..{}", c, kMaxConcurrency);
    }
  }
  if (o.prompt_tokens < 1) return invalid_argument("--prompt-tokens {} must be at least 1", o.prompt_tokens);
  if (o.gen_tokens < 1) return invalid_argument("--gen-tokens {} must be at least 1", o.gen_tokens);
  if (o.requests_per_client < 1)
    return invalid_argument("--requests-per-client {} must be at least 1", o.requests_per_client);
  if (o.prefix_tokens < 0)
    return invalid_argument("--prefix-tokens {} must be 0 (skip) or more", o.prefix_tokens);
  if (o.prefix_repeats < 1 || o.prefix_repeats > 100) {
    return invalid_argument("--prefix-repeats {} is outside 1..100", o.prefix_repeats);
  }
  if (o.prefill_chunk < 1) return invalid_argument("--prefill-chunk {} must be at least 1", o.prefill_chunk);
  if (o.prefill_chunk_idle < 0)
    return invalid_argument("--prefill-chunk-idle {} must be 0 (off) or positive", o.prefill_chunk_idle);
  if (o.kv_cache_gb && !(*o.kv_cache_gb > 0)) return invalid_argument("--kv-cache-gb must be positive");
  if (o.url.empty() && (!o.api_key.empty() || o.served_model != "default")) {
    return invalid_argument("--api-key and --served-model apply to a server: give its --url");
  }
  if (!o.url.empty() && o.ab) {
    return invalid_argument("--ab alternates the in-process engine's steps: it does not apply with --url");
  }
  if (!o.url.empty() && o.url.rfind("http://", 0) != 0 && o.url.rfind("https://", 0) != 0) {
    return invalid_argument("--url '{}' must start with http:// or https://", o.url);
  }
  return {};
}

Status check_context(const BenchServeOptions& o, const Model& model) {
  const int64_t ctx = model.max_context();
  if (o.prompt_tokens + o.gen_tokens > ctx) {
    return out_of_range("--prompt-tokens {} + --gen-tokens {} exceed the model's context of {} tokens",
                        o.prompt_tokens, o.gen_tokens, ctx);
  }
  if (o.prefix_tokens > 0 && o.prefix_tokens + o.prompt_tokens + 1 > ctx) {
    return out_of_range(
        "--prefix-tokens {} + --prompt-tokens {} exceed the model's context of {} tokens (use a "
        "shorter prefix, or --prefix-tokens 0 to skip the prefix case)",
        o.prefix_tokens, o.prompt_tokens, ctx);
  }
  return {};
}

// Enough pages for the largest level and for two prefix prompts at once, with headroom.
uint64_t kv_bytes_for(const BenchServeOptions& o, const Model& model, MlaKvDType dtype) {
  const KvCacheOptions ko = model.kv_cache_options(dtype, 0, 1);
  const int64_t pt = ko.format.page_tokens;
  const int64_t max_c = *std::max_element(o.levels.begin(), o.levels.end());
  const int64_t level_pages = max_c * ((o.prompt_tokens + o.gen_tokens + 2 + pt - 1) / pt + 1);
  const int64_t prefix_pages =
      o.prefix_tokens > 0 ? 2 * ((o.prefix_tokens + o.prompt_tokens + 2 + pt - 1) / pt + 1) : 0;
  const int64_t pages = std::max(level_pages, prefix_pages) + max_c + 8;
  const double bytes =
      static_cast<double>(pages) * static_cast<double>(ko.format.page_bytes()) * ko.n_layers * 1.25;
  return static_cast<uint64_t>(bytes);
}

int64_t moe_layers(const ModelConfig& c) {
  return c.n_routed_experts > 0 ? std::max<int64_t>(c.num_hidden_layers - c.first_k_dense_replace, 0) : 0;
}

nlohmann::json latency_json(const LatencySummary& s) {
  return {{"n", s.n},           {"mean", s.mean * 1e3}, {"p50", s.p50 * 1e3},
          {"p90", s.p90 * 1e3}, {"p99", s.p99 * 1e3},   {"max", s.max * 1e3}};
}

nlohmann::json decode_json(const DecodeRoofline& d, int64_t n_moe) {
  const double steps = std::max<double>(static_cast<double>(d.steps), 1);
  return {{"steps", d.steps},
          {"mixed_steps", d.mixed_steps},
          {"tokens", d.tokens},
          {"batch_mean", static_cast<double>(d.tokens) / steps},
          {"seconds", d.step_seconds},
          {"forward_seconds", d.forward_seconds},
          {"tokens_per_s", d.step_seconds > 0 ? static_cast<double>(d.tokens) / d.step_seconds : 0},
          {"weight_bytes", d.weight_bytes},
          {"kv_bytes", d.kv_bytes},
          {"linear_flops", d.linear_flops},
          {"attention_flops", d.attention_flops},
          {"experts_per_moe_layer", n_moe > 0 ? d.experts_read / steps / static_cast<double>(n_moe) : 0},
          {"memory_seconds", d.memory_seconds},
          {"compute_seconds", d.compute_seconds},
          {"roofline_seconds", d.roofline_seconds},
          {"compute_bound_steps", d.compute_bound_steps},
          {"achieved_gbs", d.step_seconds > 0 ? (d.weight_bytes + d.kv_bytes) / d.step_seconds * 1e-9 : 0},
          {"achieved_gflops",
           d.step_seconds > 0 ? (d.linear_flops + d.attention_flops) / d.step_seconds * 1e-9 : 0},
          {"roofline_fraction", d.fraction()},
          {"ab",
           {{"variant0_seconds", d.ab_seconds[0]},
            {"variant0_tokens", d.ab_tokens[0]},
            {"variant1_seconds", d.ab_seconds[1]},
            {"variant1_tokens", d.ab_tokens[1]},
            {"variant0_over_variant1", d.ab_ratio()}}}};
}

nlohmann::json level_json(const LevelResult& r, int64_t n_moe) {
  return {{"concurrency", r.concurrency},
          {"bandwidth_gbs", r.bandwidth_gbs()},
          {"bandwidth_before_gbs", r.bandwidth_before_gbs},
          {"bandwidth_after_gbs", r.bandwidth_after_gbs},
          {"requests", r.requests},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_prompt_tokens", r.cached_prompt_tokens},
          {"output_tokens", r.output_tokens},
          {"seconds", r.seconds},
          {"output_tokens_per_s", r.seconds > 0 ? static_cast<double>(r.output_tokens) / r.seconds : 0},
          {"ttft_ms", latency_json(r.ttft)},
          {"itl_ms", latency_json(r.itl)},
          {"tpot_ms", latency_json(r.tpot)},
          {"e2e_ms", latency_json(r.e2e)},
          {"decode", decode_json(r.decode, n_moe)},
          {"decode_outer", decode_json(r.decode_outer, n_moe)}};
}

void print_table(const std::vector<LevelResult>& levels, int64_t n_moe, bool roofline) {
  std::printf("%5s %5s %10s %17s %17s", "conc", "reqs", "out tok/s", "TTFT p50/p99 ms", "ITL p50/p99 ms");
  if (roofline) {
    std::printf(" %6s %6s %8s %10s %11s %8s %6s %9s %6s", "steps", "batch", "experts", "MB/step", "GFLOP/step",
                "bound", "GB/s", "roofline", "outer");
  }
  std::printf("\n");
  for (const LevelResult& r : levels) {
    std::printf("%5d %5lld %10.1f %8.1f/%-8.1f %8.2f/%-8.2f", r.concurrency,
                static_cast<long long>(r.requests),
                r.seconds > 0 ? static_cast<double>(r.output_tokens) / r.seconds : 0, r.ttft.p50 * 1e3,
                r.ttft.p99 * 1e3, r.itl.p50 * 1e3, r.itl.p99 * 1e3);
    if (roofline) {
      const DecodeRoofline& d = r.decode;
      const double steps = std::max<double>(static_cast<double>(d.steps), 1);
      std::printf(" %6lld %6.1f %8.1f %10.1f %11.3f %8s %6.1f %8.0f%% %5.0f%%", static_cast<long long>(d.steps),
                  static_cast<double>(d.tokens) / steps,
                  n_moe > 0 ? d.experts_read / steps / static_cast<double>(n_moe) : 0,
                  (d.weight_bytes + d.kv_bytes) / steps * 1e-6,
                  (d.linear_flops + d.attention_flops) / steps * 1e-9,
                  d.compute_seconds > d.memory_seconds ? "compute" : "memory",
                  r.bandwidth_gbs(), d.fraction() * 100,
                  r.decode_outer.fraction() * 100);
    }
    std::printf("\n");
  }
  for (const LevelResult& r : levels) {
    const DecodeRoofline& d = r.decode;
    if (!roofline || d.ab_tokens[1] == 0) continue;
    std::printf("A/B at %d clients: variant 0 %.2f ms/token (%lld tokens), variant 1 %.2f ms/token (%lld tokens), "
                "0 over 1 = %.4f\n",
                r.concurrency, d.ab_seconds_per_token(0) * 1e3, static_cast<long long>(d.ab_tokens[0]),
                d.ab_seconds_per_token(1) * 1e3, static_cast<long long>(d.ab_tokens[1]), d.ab_ratio());
  }
}

// What the levels run against: the in-process engine (with the machine measured for the
// roofline) or a server at --url.
struct Setup {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  StepLog log;
  RequestRunner run;
  EngineProbe probe;
  int64_t vocab = 0;
  ModelConfig config;
  // In-process only.
  MemoryBandwidth bw;  // the higher of bw_before and bw_after: the outer roofline's
  MemoryBandwidth bw_before, bw_after;
  std::unique_ptr<BandwidthProbe> bw_probe;  // read before and after each level
  PeakCompute peak;
  Roof roof;
  std::string arith;
  DType weights = DType::kF32;
};

Status start_engine(const BenchServeOptions& o, Setup& s) {
  const int64_t max_c = *std::max_element(o.levels.begin(), o.levels.end());
  const MlaKvDType kv = TRY(parse_mla_kv_dtype(o.kv_dtype));
  EngineOptions eo;
  eo.max_running = static_cast<int>(max_c);
  eo.prefill_chunk = o.prefill_chunk;
  eo.prefill_chunk_idle = o.prefill_chunk_idle;
  eo.max_waiting = static_cast<int>(max_c) + 8;
  eo.kv_dtype = kv;
  ModelOptions mo;
  mo.max_sequences = max_c + 1;
  mo.max_batch_tokens = engine_batch_tokens(eo);
  s.model = TRY(Model::load(o.model, mo));
  TRY(check_context(o, *s.model));
  eo.kv_cache_bytes = o.kv_cache_gb ? static_cast<uint64_t>(*o.kv_cache_gb * double(uint64_t{1} << 30))
                                    : kv_bytes_for(o, *s.model, kv);
  eo.prefix_cache = true;
  eo.speculative = o.speculative;
  eo.ab_alternate = o.ab;
  StepLog* log = &s.log;
  eo.on_step = [log](const EngineStepReport& r) { log->add(r); };
  s.engine = TRY(Engine::create(*s.model, eo));
  s.run = engine_runner(*s.engine);
  s.probe = {s.engine.get(), &s.log};
  s.config = s.model->config();
  s.vocab = s.config.vocab_size;
  ThreadPool& pool = default_pool();
  s.bw = s.bw_before = measure_memory_bandwidth(pool);
  s.bw_probe = std::make_unique<BandwidthProbe>(pool);
  s.peak = measure_peak_compute(pool);
  s.weights = s.model->weights().layers.back().o.dtype;
  s.roof = {.bandwidth_gbs = s.bw.read_gbs,
            .linear_peak_gflops = s.peak.for_weights(s.weights, &s.arith),
            .attention_peak_gflops = s.peak.bf16_gflops};
  return {};
}

// --url: only the checkpoint's config is read (for the vocabulary the prompts are drawn from).
Status connect_server(const BenchServeOptions& o, Setup& s) {
  if (is_directory(o.model)) {
    s.config = TRY(load_hf_config(o.model + "/config.json"));
  } else {
    auto gguf = TRY(GgufFile::open(o.model));
    s.config = TRY(model_config_from_gguf(*gguf));
  }
  s.vocab = s.config.vocab_size;
  s.run = TRY(http_runner({.url = o.url, .api_key = o.api_key, .model = o.served_model}));
  return {};
}

// One short request pages the weights in (page faults are not what we measure).
Status warm_up(const BenchServeOptions& o, Setup& s) {
  LoadParams p{.concurrency = 1,
               .requests_per_client = 1,
               .prompt_tokens = std::min<int64_t>(o.prompt_tokens, 64),
               .gen_tokens = 2,
               .seed = static_cast<uint64_t>(o.seed) + 99,
               .vocab = s.vocab};
  TRY(run_level(s.run, s.probe, s.roof, p, [](int64_t) {}));
  return {};
}

struct Results {
  std::vector<LevelResult> levels;
  std::optional<PrefixResult> prefix;
};

Status run_all(const BenchServeOptions& o, Setup& s, Results& out) {
  uint64_t total = o.prefix_tokens > 0 ? static_cast<uint64_t>(2 * o.prefix_repeats) : 0;
  for (int64_t lv : o.levels) total += static_cast<uint64_t>(lv * o.requests_per_client * o.gen_tokens);
  ProgressBar bar({"bench serve", total, ProgressUnit::kTokens});
  const OnTokens tick = [&bar](int64_t n) { bar.add(static_cast<uint64_t>(n)); };
  for (int64_t lv : o.levels) {
    LoadParams p{.concurrency = static_cast<int>(lv),
                 .requests_per_client = o.requests_per_client,
                 .prompt_tokens = o.prompt_tokens,
                 .gen_tokens = o.gen_tokens,
                 .seed = static_cast<uint64_t>(o.seed),
                 .vocab = s.vocab};
    // The machine's bandwidth drifts 2-3x over minutes on a shared VM: each level is measured
    // against readings taken right around it (the engine is idle then).
    const double before = s.bw_probe ? s.bw_probe->read_gbs() : 0;
    LevelResult level = TRY(run_level(s.run, s.probe, s.roof, p, tick));
    if (s.bw_probe) {
      level.bandwidth_before_gbs = before;
      level.bandwidth_after_gbs = s.bw_probe->read_gbs();
      Roof roof = s.roof;
      roof.bandwidth_gbs = level.bandwidth_gbs();
      level.decode = decode_roofline(level.steps, roof);
    }
    out.levels.push_back(std::move(level));
  }
  if (o.prefix_tokens > 0) {
    PrefixParams pp{.prefix_tokens = o.prefix_tokens,
                    .suffix_tokens = o.prompt_tokens,
                    .repeats = static_cast<int>(o.prefix_repeats),
                    // A server keeps its cache between runs: fresh prefixes each run there.
                    .seed = static_cast<uint64_t>(o.seed) + 7 + (s.engine ? 0 : now_ns()),
                    .vocab = s.vocab,
                    .page_tokens = 64};  // KvCache pages of every model (Model::kv_cache_options)
    out.prefix = TRY(run_prefix_case(s.run, s.probe, pp, tick));
  }
  bar.finish();
  return {};
}

nlohmann::json result_json(const BenchServeOptions& o, const Setup& s, const Results& r) {
  const bool local = s.engine != nullptr;
  const int64_t n_moe = moe_layers(s.config);
  nlohmann::json lv = nlohmann::json::array();
  for (const LevelResult& l : r.levels) {
    nlohmann::json j = level_json(l, n_moe);
    if (!local) {
      for (const char* k : {"decode", "decode_outer", "bandwidth_gbs", "bandwidth_before_gbs", "bandwidth_after_gbs"})
        j[k] = nullptr;
    }
    lv.push_back(std::move(j));
  }
  nlohmann::json j = {{"model", o.model},
                      {"mode", local ? "in-process" : "http"},
                      {"http", local ? "excluded (in-process engine)" : "included (" + o.url + ")"},
                      {"prompt_tokens", o.prompt_tokens},
                      {"gen_tokens", o.gen_tokens},
                      {"requests_per_client", o.requests_per_client},
                      {"moe_layers", n_moe},
                      {"routed_experts", s.config.n_routed_experts},
                      {"experts_per_token", s.config.num_experts_per_tok},
                      {"levels", lv}};
  if (local) {
    j.update({{"weights_dtype", dtype_name(s.weights)},
              {"kv_dtype", o.kv_dtype},
              {"threads", default_pool().size()},
              {"prefill_chunk", o.prefill_chunk},
              {"prefill_chunk_idle", o.prefill_chunk_idle},
              {"speculative", o.speculative && s.model->has_mtp()},
              {"bandwidth_gbs", s.bw.read_gbs},
              {"bandwidth_before_gbs", s.bw_before.read_gbs},
              {"bandwidth_after_gbs", s.bw_after.read_gbs},
              {"peak_arithmetic", s.arith},
              {"peak_gflops", s.roof.linear_peak_gflops},
              {"peak_bf16_gflops", s.peak.bf16_gflops},
              {"peak_amx_bf16_gflops", s.peak.amx_bf16_gflops},
              {"peak_int8_gops", s.peak.int8_gops},
              {"peak_f32_gflops", s.peak.f32_gflops}});
  }
  if (r.prefix) {
    const PrefixResult& p = *r.prefix;
    j["prefix"] = {{"prefix_tokens", p.prefix_tokens},
                   {"suffix_tokens", p.suffix_tokens},
                   {"cached_tokens", p.cached_tokens},
                   {"repeats", o.prefix_repeats},
                   {"uncached_ttft_ms", p.uncached_ttft_s * 1e3},
                   {"cached_ttft_ms", p.cached_ttft_s * 1e3},
                   {"speedup", p.speedup()}};
  }
  return j;
}

void print_results(const BenchServeOptions& o, const Setup& s, const Results& r) {
  if (s.engine != nullptr) {
    std::printf(
        "machine: read %.1f GB/s (the higher of %.1f before and %.1f after the run: the outer roofline; each "
        "level's roofline uses the mean of readings right before and after it), peak bf16 %.0f GFLOP/s, "
        "amx bf16 %.0f GFLOP/s, int8 %.0f GOP/s, f32 %.0f GFLOP/s (%d threads)\n",
        s.bw.read_gbs, s.bw_before.read_gbs, s.bw_after.read_gbs, s.peak.bf16_gflops, s.peak.amx_bf16_gflops,
        s.peak.int8_gops, s.peak.f32_gflops, default_pool().size());
    std::printf(
        "model: %s (%s weights, linears vs the %s peak), prompt %lld + %lld output tokens per request, "
        "in-process engine (HTTP excluded)\n",
        o.model.c_str(), std::string(dtype_name(s.weights)).c_str(), s.arith.c_str(),
        static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.gen_tokens));
  } else {
    std::printf(
        "server: %s (model '%s'), prompt %lld + %lld output tokens per request, through HTTP/SSE "
        "(no step roofline)\n",
        o.url.c_str(), o.served_model.c_str(), static_cast<long long>(o.prompt_tokens),
        static_cast<long long>(o.gen_tokens));
  }
  print_table(r.levels, moe_layers(s.config), s.engine != nullptr);
  if (r.prefix) {
    const PrefixResult& p = *r.prefix;
    std::printf(
        "prefix cache: %lld-token prefix + %lld: TTFT uncached %.1f ms, cached %.1f ms (%lld tokens from the "
        "cache) = %.1fx\n",
        static_cast<long long>(p.prefix_tokens), static_cast<long long>(p.suffix_tokens),
        p.uncached_ttft_s * 1e3, p.cached_ttft_s * 1e3, static_cast<long long>(p.cached_tokens), p.speedup());
  }
}

void add_options(Args& args, BenchServeOptions& o) {
  args.usage(
      "--model PATH [--concurrency 1,8,16,32] [--prompt-tokens N] [--gen-tokens N] [--prefix-tokens N] "
      "[--url URL] [--ab] [--json]");
  args.option("--model", &o.model, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--concurrency", &o.concurrency, "comma-separated levels: clients sending requests at once",
              "LIST");
  args.option("--prompt-tokens", &o.prompt_tokens, "prompt length of each request (random token ids)");
  args.option("--gen-tokens", &o.gen_tokens, "output tokens of each request (greedy, EOS ignored)");
  args.option("--requests-per-client", &o.requests_per_client, "requests each client sends back to back");
  args.option("--prefix-tokens", &o.prefix_tokens, "cached prefix of the prefix-cache case (0 skips it)");
  args.option("--prefix-repeats", &o.prefix_repeats, "uncached/cached pairs in the prefix case (medians)");
  args.option("--prefill-chunk", &o.prefill_chunk, "prefill tokens per engine step (chunked prefill)");
  args.option("--prefill-chunk-idle", &o.prefill_chunk_idle,
              "prefill tokens per step while no stream is decoding (0: --prefill-chunk)");
  args.option("--kv-dtype", &o.kv_dtype, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--kv-cache-gb", &o.kv_cache_gb, "KV cache size (default: sized for the workload)", "G");
  args.flag("--speculative", &o.speculative, "draft with the checkpoint's MTP module (off: random weights)");
  args.option("--url", &o.url, "measure a running server instead (streamed /v1/completions)", "URL");
  args.option("--api-key", &o.api_key, "with --url: Bearer token", "KEY");
  args.option("--served-model", &o.served_model, "with --url: the model name to request", "NAME");
  args.option("--seed", &o.seed, "seed of the random prompts");
  args.flag("--json", &o.json, "also print one JSON object with raw figures and ratios (last line)");
  args.flag("--ab", &o.ab,
            "alternate base/ab.h's variant 0/1 every engine step and report each one's decode time per "
            "token (measuring a change in one process; docs/DEVELOPING.md)");
  args.epilog(
      "Without --url the engine runs in-process: HTTP overhead is excluded. Roofline per pure decode\n"
      "step: max(bytes / bandwidth, FLOPs / peak) over the step's time, bytes = dense and attention\n"
      "weights once + each routed expert the batch selected once + KV pages read; bandwidth = the mean\n"
      "of readings right before and after the level ('outer': the higher of the readings before and\n"
      "after the whole run). With --url, --model names the checkpoint the server serves (only its\n"
      "config is read) and the engine options (--prefill-chunk, --kv-*, --speculative) are the\n"
      "server's.");
}

int run_bench_serve(int argc, char** argv) {
  BenchServeOptions o;
  Args args(argv[0],
            "Serving throughput, latency and decode-step roofline of the engine at several concurrencies.");
  add_options(args, o);
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status st = validate(o); !st.ok()) return fail(args.command(), st);
  if (auto kv = parse_mla_kv_dtype(o.kv_dtype); !kv.ok()) return fail(args.command(), kv.status());
  Setup s;
  if (Status st = o.url.empty() ? start_engine(o, s) : connect_server(o, s); !st.ok()) {
    return fail(args.command(), st);
  }
  if (Status st = warm_up(o, s); !st.ok()) return fail(args.command(), st.with_context("warm-up"));
  Results r;
  if (Status st = run_all(o, s, r); !st.ok()) return fail(args.command(), st);
  if (s.engine != nullptr) {
    // The bandwidth again after the levels: on a shared VM it drifts 2-3x over minutes, and a low
    // reading at the start would inflate the fractions. The higher reading is the roofline.
    s.bw_after = measure_memory_bandwidth(default_pool());
    if (s.bw_after.read_gbs > s.bw.read_gbs) {
      s.bw = s.bw_after;
      s.roof.bandwidth_gbs = s.bw.read_gbs;
    }
    for (LevelResult& level : r.levels) level.decode_outer = decode_roofline(level.steps, s.roof);
  }
  print_results(o, s, r);
  if (o.json) print_json_line(result_json(o, s, r).dump());  // the last stdout line
  return 0;
}

}  // namespace

FATHOM_BENCH("serve", "Serving throughput, TTFT/ITL and decode-step roofline vs the measured machine",
             run_bench_serve);

}  // namespace fathom::cli
