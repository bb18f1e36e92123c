// `fathom bench mla`: the MLA decode kernel over a paged latent cache (kvcache/) at serving shapes,
// against this machine's roofline measured in the same run: memory bandwidth (read sweep) and
// peak BF16 dot-product rate of the arithmetic the kernel uses (AMX tiles where MlaDecoder runs on
// them, else vdpbf16ps; kernels/roofline.h). roofline_fraction = max(bytes / bandwidth,
// flops / peak) / time. The cache spans several layers whose total exceeds the last-level cache
// and calls rotate over them, so every call streams its pages from memory. Also reports the KV
// bytes per token per layer against a standard multi-head cache of the same model.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "base/ab.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/mla_decode.h"
#include "kernels/roofline.h"
#include "kvcache/kvcache.h"
#include "tensor/tensor.h"

namespace fathom::cli {
namespace {

struct MlaBenchOptions {
  int64_t batch = 32;
  int64_t seqlen = 4096;
  int heads = 16;
  int s_q = 1;
  bool causal = false;
  std::string kv_dtype = "bf16";
  int d_latent = 512;
  int d_rope = 64;
  int qk_nope = 128;  // for the multi-head comparison and the softmax scale
  int v_head = 128;
  int layers = 0;  // 0: enough for --working-set
  std::string working_set = "600M";
  double seconds = 3;
  std::string roofline_bytes = "1G";
  bool no_check = false;
  bool cpu_time = false;  // time by process CPU time / threads (a shared, oversubscribed machine)
  bool ab = false;        // alternate base/ab.h's variant every rotation over the layers
  bool json = false;
};

struct Setup {
  std::unique_ptr<KvCache> cache;
  std::vector<SeqId> seqs;
  std::vector<int32_t> block_table, seqlens;
  int64_t max_pages = 0;
  std::vector<float> q, out, lse;
};

// Appends seqlen random tokens per sequence and writes N(0, 1) latents in every layer.
Status fill_cache(const MlaBenchOptions& o, Setup& s, uint64_t seed) {
  KvCache& c = *s.cache;
  const int D = c.format().d_qk();
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(o.seqlen));
  std::vector<float> values(static_cast<size_t>(o.seqlen) * D);
  ProgressBar bar({.label = "filling the cache",
                   .total = static_cast<uint64_t>(o.batch * c.n_layers()),
                   .unit = ProgressUnit::kItems});
  for (int64_t b = 0; b < o.batch; ++b) {
    const SeqId id = TRY(c.add_sequence());
    s.seqs.push_back(id);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(129280));
    TRY(c.append(id, tokens));
    for (int l = 0; l < c.n_layers(); ++l) {
      for (auto& v : values) v = rng.uniform_f(-2.0f, 2.0f);
      TRY(c.write(id, l, 0, values));
      bar.add(1);
    }
  }
  bar.finish();
  return {};
}

Result<Setup> build_setup(const MlaBenchOptions& o, const MlaKvFormat& f) {
  if (o.batch < 1 || o.seqlen < 1 || o.heads < 1 || o.s_q < 1) {
    return invalid_argument("--batch, --seqlen, --heads and --s-q must be positive");
  }
  const uint64_t ws = TRY(parse_size(o.working_set, "--working-set"));
  const int64_t pages_per_seq = (o.seqlen + f.page_tokens - 1) / f.page_tokens;
  const int64_t layer_bytes = o.batch * pages_per_seq * f.page_bytes();
  const int layers =
      o.layers > 0 ? o.layers : static_cast<int>(std::max<int64_t>(2, (ws + layer_bytes - 1) / layer_bytes));
  Setup s;
  s.cache = TRY(KvCache::create({.n_layers = layers,
                                 .format = f,
                                 .model_fingerprint = kv_model_fingerprint("bench mla", ""),
                                 .capacity_bytes = static_cast<uint64_t>(layer_bytes * layers),
                                 .max_sequences = static_cast<int>(o.batch),
                                 .max_tokens_per_sequence = o.seqlen}));
  TRY(fill_cache(o, s, 1234));
  s.max_pages = pages_per_seq;
  s.block_table.resize(static_cast<size_t>(o.batch * pages_per_seq));
  s.seqlens.resize(static_cast<size_t>(o.batch));
  TRY(s.cache->fill_batch(s.seqs, pages_per_seq, s.block_table.data(), s.seqlens.data()));
  const int64_t rows = o.batch * o.s_q * o.heads;
  Rng rng(99);
  s.q.resize(static_cast<size_t>(rows * f.d_qk()));
  for (auto& x : s.q) x = static_cast<float>(rng.normal());
  s.out.resize(static_cast<size_t>(rows * f.d_latent));
  s.lse.resize(static_cast<size_t>(rows));
  return s;
}

MlaDecodeParams layer_params(const MlaBenchOptions& o, Setup& s, int layer) {
  return {.q = s.q.data(),
          .batch = o.batch,
          .s_q = o.s_q,
          .heads = o.heads,
          .d_qk = o.d_latent + o.d_rope,
          .cache = s.cache->layer_view(layer),
          .block_table = s.block_table.data(),
          .max_pages = s.max_pages,
          .cache_seqlens = s.seqlens.data(),
          .softmax_scale = 1.0f / std::sqrt(static_cast<float>(o.qk_nope + o.d_rope)),
          .causal = o.causal,
          .out = s.out.data(),
          .lse = s.lse.data()};
}

// Sequence 0 of the last call against the scalar reference; returns the largest |difference|.
Result<double> check_first_sequence(const MlaBenchOptions& o, Setup& s, int layer) {
  MlaDecodeParams p = layer_params(o, s, layer);
  p.batch = 1;
  std::vector<float> out(static_cast<size_t>(o.s_q * o.heads * o.d_latent)),
      lse(static_cast<size_t>(o.s_q * o.heads));
  p.out = out.data();
  p.lse = lse.data();
  TRY(mla_decode_reference(p));
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(double{out[i]} - s.out[i]));
  for (size_t i = 0; i < lse.size(); ++i) worst = std::max(worst, std::fabs(double{lse[i]} - s.lse[i]));
  return worst;
}

struct Work {
  double bytes = 0, flops = 0;
};

Work count_work(const MlaBenchOptions& o, const MlaKvFormat& f) {
  Work w;
  for (int64_t b = 0; b < o.batch; ++b) {
    w.bytes += static_cast<double>(o.seqlen) * static_cast<double>(f.token_bytes());
    for (int i = 0; i < o.s_q; ++i) {
      const int64_t keys = o.causal ? std::max<int64_t>(0, o.seqlen - o.s_q + i + 1) : o.seqlen;
      w.flops += 2.0 * static_cast<double>(keys) * o.heads * (f.d_qk() + f.d_latent);
    }
  }
  const double rows = static_cast<double>(o.batch * o.s_q * o.heads);
  w.bytes += rows * 4 * (f.d_qk() + f.d_latent + 1);  // q in, out and lse out
  return w;
}

struct Timing {
  std::vector<double> seconds;        // per call
  std::vector<double> ab_seconds[2];  // --ab: per call, by variant
  double cpu_utilization = 0;         // process CPU time / (wall time x threads) over the timed calls
  double check_err = -1;
};

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Calls rotate over the layers so each one streams its pages from memory.
Result<Timing> time_calls(const MlaBenchOptions& o, Setup& s, MlaDecoder& decoder, int threads) {
  const int layers = s.cache->n_layers();
  for (int l = 0; l < layers; ++l) TRY(decoder.decode(layer_params(o, s, l)));  // warm-up
  Timing t;
  const double cpu0 = process_cpu_seconds();
  Timer total;
  for (int64_t i = 0; total.elapsed_s() < o.seconds || i < 2 * layers; ++i) {
    // --ab: the variant changes with each full rotation, so both see every layer equally often
    const int variant = static_cast<int>((i / layers) % 2);
    if (o.ab) ab::set_variant(variant);
    Timer call;
    const double cpu_call = process_cpu_seconds();
    TRY(decoder.decode(layer_params(o, s, static_cast<int>(i % layers))));
    t.seconds.push_back(o.cpu_time ? (process_cpu_seconds() - cpu_call) / threads : call.elapsed_s());
    if (o.ab) t.ab_seconds[variant].push_back(t.seconds.back());
  }
  if (o.ab) ab::set_variant(0);
  t.cpu_utilization = (process_cpu_seconds() - cpu0) / (total.elapsed_s() * threads);
  if (!o.no_check) {
    const int last = static_cast<int>((t.seconds.size() - 1) % static_cast<size_t>(layers));
    t.check_err = TRY(check_first_sequence(o, s, last));
  }
  return t;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Report {
  double median = 0, best = 0, t_mem = 0, t_compute = 0;
  int64_t mha_bytes = 0, working_set = 0;
};

struct Peak {
  double gflops = 0;         // the arithmetic the kernel uses
  double vector_gflops = 0;  // vdpbf16ps (or f32 FMA) either way
  bool amx = false;
};

void print_report(const MlaBenchOptions& o, const MlaKvFormat& f, const Setup& s, const Work& w,
                  const MemoryBandwidth& bw, const Peak& pk, const Timing& t, const Report& r, int threads) {
  const double peak = pk.gflops;
  const double bound = std::max(r.t_mem, r.t_compute);
  const char* bound_name = r.t_compute >= r.t_mem ? "compute" : "memory";
  if (o.json) {
    nlohmann::json j = {
        {"bench", "mla"},
        {"batch", o.batch},
        {"seqlen", o.seqlen},
        {"heads", o.heads},
        {"s_q", o.s_q},
        {"causal", o.causal},
        {"kv_dtype", mla_kv_dtype_name(f.dtype)},
        {"d_latent", f.d_latent},
        {"d_rope", f.d_rope},
        {"layers", s.cache->n_layers()},
        {"working_set_bytes", r.working_set},
        {"threads", threads},
        {"simd_level", simd_level_name(simd_level())},
        {"calls", t.seconds.size()},
        {"seconds", r.median},
        {"seconds_best", r.best},
        {"bytes", w.bytes},
        {"flops", w.flops},
        {"gbs", w.bytes / r.median * 1e-9},
        {"gflops", w.flops / r.median * 1e-9},
        {"bandwidth_gbs", bw.read_gbs},
        {"peak_gflops", peak},
        {"peak_kind", pk.amx ? "amx_bf16" : "vector"},
        {"vector_peak_gflops", pk.vector_gflops},
        {"memory_roofline_fraction", r.t_mem / r.median},
        {"bound", bound_name},
        {"roofline_fraction", bound / r.median},
        {"roofline_fraction_best", bound / r.best},
        {"cpu_utilization", t.cpu_utilization},
        {"kv_bytes_per_token_per_layer", f.token_bytes()},
        {"mha_bytes_per_token_per_layer", r.mha_bytes},
        {"kv_compression", static_cast<double>(r.mha_bytes) / static_cast<double>(f.token_bytes())},
        {"check_max_abs_diff", t.check_err}};
    if (o.ab) {
      const double m0 = median_of(t.ab_seconds[0]), m1 = median_of(t.ab_seconds[1]);
      j["ab"] = {{"variant0_seconds", m0},
                 {"variant1_seconds", m1},
                 {"variant0_calls", t.ab_seconds[0].size()},
                 {"variant1_calls", t.ab_seconds[1].size()},
                 {"ratio", m1 > 0 ? m0 / m1 : 0}};
    }
    print_json_line(j.dump());
    return;
  }
  std::printf(
      "mla decode: batch %lld, seqlen %lld, heads %d, s_q %d%s, kv %s (%d+%d), %d layers = %s, %d threads, "
      "%s\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.seqlen), o.heads, o.s_q,
      o.causal ? " causal" : "", std::string(mla_kv_dtype_name(f.dtype)).c_str(), f.d_latent, f.d_rope,
      s.cache->n_layers(), format_bytes(static_cast<uint64_t>(r.working_set)).c_str(), threads,
      std::string(simd_level_name(simd_level())).c_str());
  std::printf("time:     %.3f ms per call (median of %zu), best %.3f ms; cpu utilization %.2f\n",
              r.median * 1e3, t.seconds.size(), r.best * 1e3, t.cpu_utilization);
  std::printf("achieved: %.1f GB/s, %.1f GFLOP/s\n", w.bytes / r.median * 1e-9, w.flops / r.median * 1e-9);
  std::printf(
      "machine:  read %.1f GB/s, bf16 peak %.1f GFLOP/s (%s; vector %.1f) -> %s-bound, roofline fraction %.2f "
      "(best %.2f), of bandwidth %.2f\n",
      bw.read_gbs, peak, pk.amx ? "AMX tiles" : "vector", pk.vector_gflops, bound_name, bound / r.median,
      bound / r.best, r.t_mem / r.median);
  std::printf("kv cache: %lld B per token per layer vs %lld B for multi-head attention (%.1fx smaller)\n",
              static_cast<long long>(f.token_bytes()), static_cast<long long>(r.mha_bytes),
              static_cast<double>(r.mha_bytes) / static_cast<double>(f.token_bytes()));
  if (t.check_err >= 0)
    std::printf("check:    sequence 0 vs scalar reference: max |diff| %.2g\n", t.check_err);
  if (o.ab) {
    const double m0 = median_of(t.ab_seconds[0]), m1 = median_of(t.ab_seconds[1]);
    std::printf(
        "A/B:      variant 0 %.3f ms per call (median of %zu), variant 1 %.3f ms (%zu), 0 over 1 = %.4f\n",
        m0 * 1e3, t.ab_seconds[0].size(), m1 * 1e3, t.ab_seconds[1].size(), m1 > 0 ? m0 / m1 : 0.0);
  }
}

// The BF16 dot-product peak timed by process CPU time: every pool thread runs the roofline loop
// of this SIMD level for about `seconds` of CPU. Comparable with --cpu-time call times.
double cpu_time_peak_gflops(ThreadPool& pool, double seconds, bool amx) {
  const SimdLevel level = simd_level();
  double (*loop)(uint64_t) = amx                             ? internal::peak_amx_bf16
                             : level >= SimdLevel::kAvx512Bf16 ? internal::peak_bf16_avx512bf16
                             : level >= SimdLevel::kAvx512   ? internal::peak_f32_avx512
                             : level >= SimdLevel::kAvx2     ? internal::peak_f32_avx2
                                                             : nullptr;
  if (loop == nullptr) return 0;
  uint64_t iters = 1 << 16;
  for (double c0 = process_cpu_seconds(); loop(iters) > 0 && process_cpu_seconds() - c0 < 0.02;) iters *= 2;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> ops(static_cast<size_t>(pool.size()));
    const double c0 = process_cpu_seconds();
    pool.run(pool.size(), [&](int64_t task, int) {
      double n = 0;
      for (double start = process_cpu_seconds(); process_cpu_seconds() - start < seconds / pool.size();)
        n += loop(iters);
      ops[static_cast<size_t>(task)] = n;
    });
    double total = 0;
    for (double x : ops) total += x;
    best = std::max(best, total / ((process_cpu_seconds() - c0) / pool.size()) * 1e-9);
  }
  return best;
}

// Read bandwidth timed by process CPU time: every pool thread sweeps its slice of a buffer.
double cpu_time_read_gbs(ThreadPool& pool, uint64_t bytes) {
  const uint64_t per = bytes / static_cast<uint64_t>(pool.size()) / 4096 * 4096;
  Buffer buf = Buffer::allocate(per * static_cast<uint64_t>(pool.size()));  // zeroed: touched once
  const SimdLevel level = simd_level();
  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double c0 = process_cpu_seconds();
    pool.run(pool.size(), [&](int64_t task, int) {
      const uint8_t* p = buf.data() + static_cast<uint64_t>(task) * per;
      sink[static_cast<size_t>(task)] = level >= SimdLevel::kAvx512 ? internal::read_sweep_avx512(p, per)
                                        : level >= SimdLevel::kAvx2 ? internal::read_sweep_avx2(p, per)
                                                                    : p[per - 1];
    });
    best =
        std::max(best, static_cast<double>(buf.size()) / ((process_cpu_seconds() - c0) / pool.size()) * 1e-9);
  }
  return best;
}

Status run(const MlaBenchOptions& o) {
  const MlaKvDType dtype = TRY(parse_mla_kv_dtype(o.kv_dtype));
  const MlaKvFormat f{.d_latent = o.d_latent, .d_rope = o.d_rope, .dtype = dtype, .page_tokens = 64};
  TRY(f.validate());
  const uint64_t roofline_bytes = TRY(parse_size(o.roofline_bytes, "--roofline-bytes"));
  ThreadPool& pool = default_pool();
  // The machine first (its buffers are freed before the cache is built), the peak again after.
  MemoryBandwidth bw = measure_memory_bandwidth(pool, roofline_bytes);
  if (o.cpu_time) bw.read_gbs = cpu_time_read_gbs(pool, roofline_bytes);
  // The peak of the arithmetic the kernel runs: AMX tiles where it uses them, else vdpbf16ps (or
  // the f32 FMA of the lower levels); the vector peak is reported beside it either way.
  const bool amx = mla_decode_uses_amx(f);
  double vector_peak = 0;
  auto measure_peak = [&] {
    if (o.cpu_time) {
      vector_peak = std::max(vector_peak, cpu_time_peak_gflops(pool, 0.3, false));
      return amx ? cpu_time_peak_gflops(pool, 0.3, true) : vector_peak;
    }
    const PeakCompute pc = measure_peak_compute(pool);
    vector_peak = std::max(vector_peak, pc.bf16_gflops);
    return amx ? pc.amx_bf16_gflops : pc.bf16_gflops;
  };
  double peak = measure_peak();
  Setup s = TRY(build_setup(o, f));
  auto decoder = TRY(
      MlaDecoder::create({.format = f, .max_batch = o.batch, .max_rows = o.s_q * o.heads, .pool = &pool}));
  const Timing t = TRY(time_calls(o, s, *decoder, pool.size()));
  peak = std::max(peak, measure_peak());
  std::vector<double> sorted = t.seconds;
  std::sort(sorted.begin(), sorted.end());
  const Work w = count_work(o, f);
  Report r{.median = sorted[sorted.size() / 2],
           .best = sorted.front(),
           .t_mem = w.bytes / (bw.read_gbs * 1e9),
           .t_compute = peak > 0 ? w.flops / (peak * 1e9) : 0,  // no peak loop at the scalar level
           .mha_bytes = int64_t{o.heads} * (o.qk_nope + o.d_rope + o.v_head) * 2,
           .working_set = s.cache->n_layers() * o.batch * s.max_pages * f.page_bytes()};
  print_report(o, f, s, w, bw, {peak, vector_peak, amx}, t, r, pool.size());
  return {};
}

int run_mla(int argc, char** argv) {
  MlaBenchOptions o;
  Args args(argv[0], "MLA decode over the paged latent cache against the measured roofline.");
  args.option("--batch", &o.batch, "sequences per call");
  args.option("--seqlen", &o.seqlen, "cached tokens per sequence");
  args.option("--heads", &o.heads, "attention heads (rows per sequence and query token)");
  args.option("--s-q", &o.s_q, "query tokens per sequence (speculative verification > 1)");
  args.flag("--causal", &o.causal, "causal mask for s_q > 1, aligned to the end");
  args.option("--kv-dtype", &o.kv_dtype, "cache dtype: bf16|fp8", "DTYPE");
  args.option("--d-latent", &o.d_latent, "kv_lora_rank");
  args.option("--d-rope", &o.d_rope, "qk_rope_head_dim");
  args.option("--qk-nope", &o.qk_nope, "qk_nope_head_dim (softmax scale, multi-head comparison)");
  args.option("--v-head", &o.v_head, "v_head_dim (multi-head comparison)");
  args.option("--layers", &o.layers, "layers of cache to rotate over (0: enough for --working-set)");
  args.option("--working-set", &o.working_set, "smallest cache size to rotate over (> last-level cache)",
              "SIZE");
  args.option("--seconds", &o.seconds, "time to spend in timed calls");
  args.option("--roofline-bytes", &o.roofline_bytes, "buffer for the bandwidth measurement", "SIZE");
  args.flag("--no-check", &o.no_check, "skip comparing sequence 0 with the scalar reference");
  args.flag("--cpu-time", &o.cpu_time,
            "time calls and the peak by process CPU time / threads (for a shared machine; bandwidth stays "
            "wall-clock)");
  args.flag("--ab", &o.ab,
            "alternate base/ab.h's variant 0/1 with each rotation over the layers and report each one's "
            "median call time (measuring a change in one process; docs/DEVELOPING.md)");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status st = run(o); !st.ok()) return fail(args.command(), st);
  return 0;
}

}  // namespace

FATHOM_BENCH("mla", "MLA decode over the paged latent cache vs the measured roofline", run_mla);

}  // namespace fathom::cli
