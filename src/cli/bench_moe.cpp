// `fathom bench moe`: the grouped expert SwiGLU (moe_experts) on DeepSeek-V2-Lite- or V3-shaped
// experts with random routing, against the bandwidth and peak measured in the same run. Decode
// (1 token: top_k experts' weights streamed once) is memory-bound; prefill (512 tokens spread
// over all experts) is compute-bound.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "base/ab.h"
#include "base/check.h"
#include "base/rng.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/moe.h"
#include "kernels/roofline.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace fathom::cli {
namespace {

struct MoeBenchOptions {
  std::string dtype = "fp8";
  std::string preset = "v2-lite";
  int64_t experts = 0;  // 0: the preset's (64 for V2-Lite; 16 of V3's 256 to fit in memory)
  std::string tokens = "1,512";
  double seconds = 0.5;
  bool json = false;
  bool ab = false;
};

// Every expert matrix one after another (64-byte aligned) in one arena of transparent huge pages,
// as the model's --no-mmap weights lie: with each matrix in its own 4 KiB-page allocation instead,
// `bench moe --ab` read 1.04-1.08x slower at 1-32 tokens (docs/PERFORMANCE.md).
uint64_t line_round(uint64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

struct Storage {
  Buffer arena;
  uint64_t used = 0;
  std::vector<std::vector<float>> scale;
};

WeightView make(Storage& st, DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
  const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(rows * cols));
  CHECK(st.used + bytes <= st.arena.size());
  uint8_t* p = st.arena.data() + st.used;
  st.used += line_round(bytes);
  st.scale.emplace_back();
  Rng rng(seed);
  if (dtype == DType::kF8E4M3) {
    for (uint64_t i = 0; i < bytes; ++i) {
      const auto b = static_cast<uint8_t>(rng.next_u64());
      p[i] = (b & 0x7f) == 0x7f ? 0x3f : b;
    }
    st.scale.back().assign(static_cast<size_t>(((rows + 127) / 128) * ((cols + 127) / 128)), 0.01f);
  } else {
    std::vector<float> row(static_cast<size_t>(cols));
    const uint64_t row_bytes = dtype_bytes(dtype, static_cast<uint64_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& v : row) v = static_cast<float>(rng.normal()) * 0.02f;
      CHECK_OK(from_f32(dtype, row.data(), p + static_cast<uint64_t>(r) * row_bytes, cols));
    }
  }
  return WeightView{dtype, rows, cols, p, st.scale.back().empty() ? nullptr : st.scale.back().data()};
}

struct Limits {
  MemoryBandwidth bw;
  double peak_ops = 0;
  PeakCompute peak;
};

// Distinct random experts per token, fresh every call (so decode keeps touching new experts).
void route(Rng& rng, const MoeExpertsParams& p, int64_t T, std::vector<int32_t>& ids) {
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < p.top_k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(p.n_experts)));
        dup = false;
        for (int i = 0; i < j; ++i) dup |= ids[static_cast<size_t>(t * p.top_k + i)] == e;
      } while (dup);
      ids[static_cast<size_t>(t * p.top_k + j)] = e;
    }
  }
}

// Times moe_experts over T tokens for about `seconds`; returns the JSON record.
nlohmann::json run_tokens(const MoeExpertsParams& p, std::span<const ExpertWeights> experts, DType dtype,
                          int64_t T, double seconds, MoeWorkspace& ws, const Limits& lim, bool print,
                          bool ab) {
  ThreadPool& pool = default_pool();
  Rng rng(static_cast<uint64_t>(T) * 7 + 1);
  std::vector<float> x(static_cast<size_t>(T * p.hidden)), y(x.size()),
      w(static_cast<size_t>(T * p.top_k), 0.1f);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  std::vector<int32_t> ids(static_cast<size_t>(T * p.top_k));
  std::vector<uint8_t> used(static_cast<size_t>(p.n_experts));
  route(rng, p, T, ids);
  moe_experts(p, experts, x.data(), T, ids.data(), w.data(), y.data(), false, ws, pool);  // warm-up
  const uint64_t expert_bytes = 3 * dtype_bytes(dtype, static_cast<uint64_t>(p.inter * p.hidden));
  double busy[2] = {0, 0}, bytes[2] = {0, 0};  // by call parity: the variants under --ab
  int64_t calls = 0;
  Timer total;
  while (total.elapsed_s() < seconds || calls < 3) {
    route(rng, p, T, ids);
    std::fill(used.begin(), used.end(), 0);
    for (int32_t e : ids) used[static_cast<size_t>(e)] = 1;
    const int v = static_cast<int>(calls % 2);
    bytes[v] +=
        static_cast<double>(std::count(used.begin(), used.end(), 1)) * static_cast<double>(expert_bytes);
    if (ab) ab::set_variant(v);
    Timer t;
    moe_experts(p, experts, x.data(), T, ids.data(), w.data(), y.data(), false, ws, pool);
    busy[v] += t.elapsed_s();
    ++calls;
  }
  if (ab) ab::set_variant(0);
  const double all_busy = busy[0] + busy[1], all_bytes = bytes[0] + bytes[1];
  const double sec = all_busy / static_cast<double>(calls);
  const double flops = 2.0 * 3.0 * static_cast<double>(T * p.top_k) * static_cast<double>(p.inter * p.hidden);
  const double gbs = all_bytes / all_busy * 1e-9, gflops = flops / sec * 1e-9;
  const double pk = lim.peak_ops > 0 ? gflops / lim.peak_ops : 0.0;
  // --ab: each variant's weight bytes over its own time (the routing differs call by call)
  const double g0 = busy[0] > 0 ? bytes[0] / busy[0] * 1e-9 : 0.0,
               g1 = busy[1] > 0 ? bytes[1] / busy[1] * 1e-9 : 0.0;
  if (print) {
    std::printf("%7lld %10.3f %10.1f %8.1f %8.3f %9.1f %8.3f", static_cast<long long>(T), sec * 1e3,
                static_cast<double>(T) / sec, gbs, gbs / lim.bw.read_gbs, gflops, pk);
    if (ab)
      std::printf("   A/B: variant 0 %.2f GB/s, 1 %.2f GB/s, 1 over 0 = %.4f", g0, g1,
                  g0 > 0 ? g1 / g0 : 0.0);
    std::printf("\n");
    std::fflush(stdout);
  }
  nlohmann::json j = {{"tokens", T},        {"seconds_per_call", sec},
                      {"calls", calls},     {"weight_bytes_per_call", all_bytes / static_cast<double>(calls)},
                      {"flops", flops},     {"gbs", gbs},
                      {"gflops", gflops},   {"bandwidth_fraction", gbs / lim.bw.read_gbs},
                      {"peak_fraction", pk}};
  if (ab) j["ab"] = {{"variant0_gbs", g0}, {"variant1_gbs", g1}, {"ratio", g0 > 0 ? g1 / g0 : 0.0}};
  return j;
}

Result<MoeExpertsParams> preset_params(const MoeBenchOptions& o) {
  if (o.preset == "v2-lite")
    return MoeExpertsParams{
        .n_experts = o.experts ? o.experts : 64, .hidden = 2048, .inter = 1408, .top_k = 6};
  if (o.preset == "v3")
    return MoeExpertsParams{
        .n_experts = o.experts ? o.experts : 16, .hidden = 7168, .inter = 2048, .top_k = 8};
  return invalid_argument("--preset {}: expected v2-lite or v3", o.preset);
}

int run_moe(int argc, char** argv) {
  MoeBenchOptions o;
  Args args(argv[0], "Measure the grouped expert SwiGLU against the measured bandwidth and peak.");
  args.option("--dtype", &o.dtype, "expert weight type: fp8|bf16|q8_0|q4_0|f16|f32", "TYPE");
  args.option("--preset", &o.preset, "expert shapes: v2-lite (2048/1408, top-6) or v3 (7168/2048, top-8)",
              "NAME");
  args.option("--experts", &o.experts, "routed experts allocated (0: 64 for v2-lite, 16 for v3)");
  args.option("--tokens", &o.tokens, "comma-separated token counts to run", "LIST");
  args.option("--seconds", &o.seconds, "time budget per token count");
  args.flag("--json", &o.json, "print one JSON object");
  args.flag("--ab", &o.ab,
            "alternate ab::variant() 0 and 1 call by call and report each one's GB/s (for measuring a "
            "guarded code change in one process)");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto dtype = parse_dtype(o.dtype);
  if (!dtype.ok()) return fail(args.command(), dtype.status());
  if (!matmul_supports(*dtype))
    return fail(args.command(), invalid_argument("--dtype {} is not supported", o.dtype));
  auto tokens = parse_int_list(o.tokens, "--tokens");
  if (!tokens.ok()) return fail(args.command(), tokens.status());
  auto pp = preset_params(o);
  if (!pp.ok()) return fail(args.command(), pp.status());
  const MoeExpertsParams p = *pp;
  if (p.n_experts < p.top_k)
    return fail(args.command(), invalid_argument("--experts must be at least top_k = {}", p.top_k));
  int64_t max_tokens = 1;
  for (int64_t t : *tokens) {
    if (t < 1) return fail(args.command(), invalid_argument("--tokens: counts must be positive"));
    max_tokens = std::max(max_tokens, t);
  }
  std::fprintf(stderr, "allocating %lld experts...\n", static_cast<long long>(p.n_experts));
  Storage st;
  const auto matrix_bytes = [&](int64_t rows, int64_t cols) {
    return line_round(dtype_bytes(*dtype, static_cast<uint64_t>(rows * cols)));
  };
  st.arena = Buffer::allocate_huge(
      static_cast<size_t>(static_cast<uint64_t>(p.n_experts) *
                          (2 * matrix_bytes(p.inter, p.hidden) + matrix_bytes(p.hidden, p.inter))));
  std::vector<ExpertWeights> experts;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const uint64_t s = static_cast<uint64_t>(e) * 3;
    experts.push_back({make(st, *dtype, p.inter, p.hidden, s), make(st, *dtype, p.inter, p.hidden, s + 1),
                       make(st, *dtype, p.hidden, p.inter, s + 2)});
  }
  if (auto v = validate_experts(p, experts); !v.ok()) return fail(args.command(), v);
  auto ws = MoeWorkspace::create(p, max_tokens);
  if (!ws.ok()) return fail(args.command(), ws.status());

  ThreadPool& pool = default_pool();
  std::fprintf(stderr, "measuring memory bandwidth and peak compute (%d threads)...\n", pool.size());
  Limits lim;
  lim.bw = measure_memory_bandwidth(pool);
  lim.peak = measure_peak_compute(pool);
  std::string arith;
  lim.peak_ops = lim.peak.for_weights(*dtype, &arith);
  if (!o.json) {
    std::printf("threads %d, %s experts %lld x [%lld, %lld] %s, read %.1f GB/s, peak %.1f GOP/s\n",
                pool.size(), o.preset.c_str(), static_cast<long long>(p.n_experts),
                static_cast<long long>(p.inter), static_cast<long long>(p.hidden),
                std::string(dtype_name(*dtype)).c_str(), lim.bw.read_gbs, lim.peak_ops);
    std::printf("%7s %10s %10s %8s %8s %9s %8s\n", "tokens", "ms/call", "tokens/s", "GB/s", "bw_frac",
                "GFLOP/s", "pk_frac");
  }
  nlohmann::json results = nlohmann::json::array();
  for (int64_t T : *tokens)
    results.push_back(run_tokens(p, experts, *dtype, T, o.seconds, **ws, lim, !o.json, o.ab));
  if (o.json) {
    nlohmann::json j = {{"threads", pool.size()},
                        {"preset", o.preset},
                        {"dtype", dtype_name(*dtype)},
                        {"experts", p.n_experts},
                        {"read_gbs", lim.bw.read_gbs},
                        {"peak_gops_used", lim.peak_ops},
                        {"bf16_gflops", lim.peak.bf16_gflops},
                        {"amx_bf16_gflops", lim.peak.amx_bf16_gflops},
                        {"int8_gops", lim.peak.int8_gops},
                        {"f32_gflops", lim.peak.f32_gflops},
                        {"results", results}};
    print_json_line(j.dump());
  }
  return 0;
}

}  // namespace

FATHOM_BENCH("moe", "grouped expert SwiGLU vs measured bandwidth and peak", run_moe);

}  // namespace fathom::cli
