// `fathom bench decode`: prefill and single-stream decode speed of a model against this
// machine's measured memory bandwidth and peak arithmetic, in the same run.
//   decode roofline fraction  = (weight + KV bytes per token / read bandwidth) / time per token
//   prefill roofline fraction = (FLOPs / peak of the arithmetic the weights use) / prefill time
// The machine is measured next to the work, not minutes away from it: the read bandwidth is
// sampled between decode steps (every --probe-every tokens; each window of tokens is held against
// the mean of the two samples around it), and the peak right before and right after the prefill.
// A shared VM's bandwidth moves by 2x within minutes (22-72 GB/s here), so a reading taken before
// loading a 16 GB checkpoint says little about the seconds the decode ran in.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "base/progress.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/ops.h"
#include "kernels/roofline.h"
#include "model/model.h"
#include "model/weights.h"

namespace fathom::cli {
namespace {

int run_bench_decode(int argc, char** argv) {
  std::string model_path, kv = "bf16";
  int64_t prompt_tokens = 512, gen_tokens = 64, seed = 1, probe_every = 8, prefill_chunk = 512;
  bool json_out = false;
  Args args(argv[0], "Prefill and decode speed of a model, as fractions of this machine's measured roofline.");
  args.usage("--model PATH [--prompt-tokens N] [--gen-tokens N] [--json]");
  args.option("--model", &model_path, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--prompt-tokens", &prompt_tokens, "prompt length (random token ids)");
  args.option("--gen-tokens", &gen_tokens, "tokens to decode (greedy)");
  args.option("--prefill-chunk", &prefill_chunk,
              "prompt tokens per forward call (as fathom serve's --prefill-chunk)");
  args.option("--kv-dtype", &kv, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--seed", &seed, "seed of the random prompt");
  args.option("--probe-every", &probe_every,
              "sample the read bandwidth every N decode tokens (0: only before and after the run)");
  args.flag("--json", &json_out, "print one JSON object with raw figures and ratios");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (prompt_tokens < 1 || gen_tokens < 1) return fail(args.command(), invalid_argument("token counts must be positive"));
  if (probe_every < 0) return fail(args.command(), invalid_argument("--probe-every must be >= 0"));
  if (prefill_chunk < 1) return fail(args.command(), invalid_argument("--prefill-chunk must be >= 1"));
  auto kv_dtype = parse_mla_kv_dtype(kv);
  if (!kv_dtype.ok()) return fail(args.command(), kv_dtype.status());
  ThreadPool& pool = default_pool();
  const MemoryBandwidth bw_before = measure_memory_bandwidth(pool);
  const PeakCompute peak = measure_peak_compute(pool);
  ModelOptions mo;
  mo.max_batch_tokens = std::min(prompt_tokens, prefill_chunk);
  auto loaded = Model::load(model_path, mo);
  if (!loaded.ok()) return fail(args.command(), loaded.status());
  Model& model = **loaded;
  const ModelConfig& c = model.config();
  if (prompt_tokens + gen_tokens > model.max_context()) {
    return fail(args.command(), out_of_range("{} + {} tokens exceed the context limit {}", prompt_tokens, gen_tokens, model.max_context()));
  }
  KvCacheOptions ko = model.kv_cache_options(*kv_dtype, 0, 1);
  ko.capacity_bytes = static_cast<uint64_t>(((prompt_tokens + gen_tokens) / ko.format.page_tokens + 2) *
                                            ko.format.page_bytes() * ko.n_layers);
  auto cache_r = KvCache::create(ko);
  if (!cache_r.ok()) return fail(args.command(), cache_r.status());
  KvCache& cache = **cache_r;
  Rng rng(static_cast<uint64_t>(seed));
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (auto& t : prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(model.tokenizer().vocab_size())));
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  auto run = [&](SeqId seq, int64_t pos, std::span<const int32_t> toks) -> Result<ForwardResult> {
    TRY(cache.append(seq, toks));
    const SeqBatch b{seq, pos, static_cast<int64_t>(toks.size()), false};
    return model.forward(std::span<const SeqBatch>(&b, 1), toks, cache, logits.data());
  };
  // Warm-up: touch every weight once (page faults are not what we measure).
  {
    auto seq = cache.add_sequence();
    if (!seq.ok()) return fail(args.command(), seq.status());
    auto r = run(*seq, 0, std::span<const int32_t>(prompt).subspan(0, std::min<size_t>(prompt.size(), 64)));
    if (!r.ok()) return fail(args.command(), r.status());
    (void)cache.free_sequence(*seq);
  }
  auto seq_r = cache.add_sequence();
  if (!seq_r.ok()) return fail(args.command(), seq_r.status());
  const SeqId seq = *seq_r;
  ProgressBar bar({"bench decode", static_cast<uint64_t>(prompt_tokens + gen_tokens), ProgressUnit::kTokens});
  double prefill_flops = 0, prefill_bytes = 0;
  const PeakCompute peak_pre = measure_peak_compute(pool, 0.1);
  Timer tp;
  for (int64_t p = 0; p < prompt_tokens; p += mo.max_batch_tokens) {
    const int64_t n = std::min(mo.max_batch_tokens, prompt_tokens - p);
    auto r = run(seq, p, std::span<const int32_t>(prompt).subspan(static_cast<size_t>(p), static_cast<size_t>(n)));
    if (!r.ok()) return fail(args.command(), r.status());
    prefill_flops += r->stats.linear_flops + r->stats.attention_flops;
    prefill_bytes += r->stats.weight_bytes;
    bar.add(static_cast<uint64_t>(n));
  }
  const double prefill_s = tp.elapsed_s();
  const PeakCompute peak_post = measure_peak_compute(pool, 0.1);
  double decode_bytes = 0, decode_flops = 0, decode_s = 0;
  // Windows of probe_every tokens between bandwidth samples: roofline seconds of each window at the
  // mean bandwidth of the samples around it.
  std::vector<double> samples;
  double roofline_s = 0, window_bytes = 0;
  std::optional<BandwidthProbe> probe;
  if (probe_every > 0) {
    probe.emplace(pool);
    samples.push_back(probe->read_gbs());
  }
  int32_t tok = static_cast<int32_t>(argmax(logits.data(), static_cast<int64_t>(logits.size())));
  for (int64_t i = 0; i < gen_tokens; ++i) {
    Timer one;
    auto r = run(seq, prompt_tokens + i, std::span<const int32_t>(&tok, 1));
    if (!r.ok()) return fail(args.command(), r.status());
    decode_s += one.elapsed_s();
    decode_bytes += r->stats.weight_bytes + r->stats.kv_bytes;
    window_bytes += r->stats.weight_bytes + r->stats.kv_bytes;
    decode_flops += r->stats.linear_flops + r->stats.attention_flops;
    tok = static_cast<int32_t>(argmax(logits.data(), static_cast<int64_t>(logits.size())));
    bar.add(1);
    if (probe && ((i + 1) % probe_every == 0 || i + 1 == gen_tokens)) {
      samples.push_back(probe->read_gbs());
      roofline_s += window_bytes / ((samples[samples.size() - 2] + samples.back()) / 2 * 1e9);
      window_bytes = 0;
    }
  }
  bar.finish();
  probe.reset();
  // The full measurement again after the run (reported; the roofline without probes is the higher
  // of the two, so that a low reading cannot inflate the fraction).
  const MemoryBandwidth bw_after = measure_memory_bandwidth(pool);
  const MemoryBandwidth& bw_outer = bw_after.read_gbs > bw_before.read_gbs ? bw_after : bw_before;
  const double bw_gbs = probe_every > 0 ? decode_bytes / roofline_s * 1e-9 : bw_outer.read_gbs;
  const double bytes_per_token = decode_bytes / static_cast<double>(gen_tokens);
  const double s_per_token = decode_s / static_cast<double>(gen_tokens);
  const double decode_fraction = (bytes_per_token / (bw_gbs * 1e9)) / s_per_token;
  std::string arith;
  const DType wdt = model.weights().layers.back().o.dtype;
  const double peak_start = peak.for_weights(wdt, &arith), peak_before = peak_pre.for_weights(wdt, &arith),
               peak_after = peak_post.for_weights(wdt, &arith);
  const double peak_g = (peak_before + peak_after) / 2;
  const double prefill_fraction = (prefill_flops / (peak_g * 1e9)) / prefill_s;
  if (json_out) {
    nlohmann::json j = {
        {"model", model_path},
        {"weights_dtype", dtype_name(wdt)},
        {"kv_dtype", kv},
        {"threads", pool.size()},
        {"prompt_tokens", prompt_tokens},
        {"prefill_chunk", mo.max_batch_tokens},
        {"gen_tokens", gen_tokens},
        {"prefill_seconds", prefill_s},
        {"prefill_tokens_per_s", static_cast<double>(prompt_tokens) / prefill_s},
        {"prefill_flops", prefill_flops},
        {"prefill_weight_bytes", prefill_bytes},
        {"decode_seconds", decode_s},
        {"decode_tokens_per_s", static_cast<double>(gen_tokens) / decode_s},
        {"decode_bytes_per_token", bytes_per_token},
        {"decode_flops_per_token", decode_flops / static_cast<double>(gen_tokens)},
        {"bandwidth_gbs", bw_gbs},
        {"bandwidth_samples_gbs", samples},
        {"bandwidth_before_gbs", bw_before.read_gbs},
        {"bandwidth_after_gbs", bw_after.read_gbs},
        {"decode_roofline_fraction_outer", (bytes_per_token / (bw_outer.read_gbs * 1e9)) / s_per_token},
        {"peak_arithmetic", arith},
        {"peak_gflops", peak_g},
        {"peak_before_prefill_gflops", peak_before},
        {"peak_after_prefill_gflops", peak_after},
        {"peak_at_start_gflops", peak_start},
        {"peak_bf16_gflops", peak.bf16_gflops},
        {"peak_amx_bf16_gflops", peak.amx_bf16_gflops},
        {"peak_int8_gops", peak.int8_gops},
        {"peak_f32_gflops", peak.f32_gflops},
        {"decode_roofline_fraction", decode_fraction},
        {"prefill_roofline_fraction", prefill_fraction},
        {"checkpoint_bytes", model.checkpoint_bytes()},
        {"repacked_bytes", model.repacked_bytes()}};
    print_json_line(j.dump());
    return 0;
  }
  if (probe_every > 0) {
    const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
    std::printf("machine: read %.1f GB/s during the decode (%zu samples, %.1f-%.1f; %.1f before loading, %.1f "
                "after the run), %s peak %.0f around the prefill (%.0f at start) (%d threads)\n",
                bw_gbs, samples.size(), *lo, *hi, bw_before.read_gbs, bw_after.read_gbs, arith.c_str(), peak_g,
                peak_start, pool.size());
  } else {
    std::printf("machine: read %.1f GB/s (the higher of %.1f before and %.1f after the run), %s peak %.0f "
                "around the prefill (%.0f at start) (%d threads)\n",
                bw_gbs, bw_before.read_gbs, bw_after.read_gbs, arith.c_str(), peak_g, peak_start, pool.size());
  }
  std::printf("prefill: %lld tokens in %.2f s = %.1f tokens/s, %.1f GFLOP/s = %.0f%% of the %s peak\n",
              static_cast<long long>(prompt_tokens), prefill_s, static_cast<double>(prompt_tokens) / prefill_s,
              prefill_flops / prefill_s * 1e-9, prefill_fraction * 100, arith.c_str());
  std::printf("decode:  %lld tokens in %.2f s = %.2f tokens/s, %s read per token = %.1f GB/s = %.0f%% of bandwidth\n",
              static_cast<long long>(gen_tokens), decode_s, static_cast<double>(gen_tokens) / decode_s,
              format_bytes(static_cast<uint64_t>(bytes_per_token)).c_str(), bytes_per_token / s_per_token * 1e-9,
              decode_fraction * 100);
  return 0;
}

}  // namespace

FATHOM_BENCH("decode", "Prefill and decode speed of a model vs the measured roofline", run_bench_decode);

}  // namespace fathom::cli
