// `fathom bench gemm`: matmul speed against this machine's limits measured in the same run.
// Decode shapes (small m) are memory-bound: reported as weight GB/s over the measured read
// bandwidth, with the weights cycled through copies larger than the caches (as a model's layers
// are). Prefill shapes (m = 512) are compute-bound: GFLOP/s over the measured peak of the
// arithmetic the path uses (vdpbf16ps for bf16/fp8, VNNI int8 for q8_0/q4_0, fp32 FMA otherwise).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/rng.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/matmul.h"
#include "kernels/roofline.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace fathom::cli {
namespace {

struct GemmOptions {
  std::string dtype = "bf16";
  std::optional<int64_t> m, n, k;
  double seconds = 0.5;
  std::string rotate = "512M";
  bool json = false;
};

struct Shape {
  std::string name;
  int64_t m, n, k;
};

// DeepSeek-V2-Lite (hidden 2048, 16 heads, expert FFN 1408) and V3 (hidden 7168, 128 heads,
// q_lora 1536, expert FFN 2048) projections.
std::vector<Shape> default_shapes() {
  std::vector<Shape> s;
  for (int64_t m : {int64_t{1}, int64_t{512}}) {
    s.push_back({"v2lite.expert_gate_up", m, 1408, 2048});
    s.push_back({"v2lite.expert_down", m, 2048, 1408});
    s.push_back({"v2lite.q_proj", m, 3072, 2048});
    s.push_back({"v2lite.kv_a_proj", m, 576, 2048});
    s.push_back({"v3.q_b_proj", m, 24576, 1536});
    s.push_back({"v3.expert_gate_up", m, 2048, 7168});
    if (m == 1) s.push_back({"v3.o_proj", m, 7168, 16384});
  }
  return s;
}

// One weight (possibly several copies for cache rotation) in the requested dtype.
struct BenchWeight {
  std::vector<Buffer> data;
  std::vector<std::vector<float>> scale;
  std::vector<WeightView> views;
  uint64_t bytes_each = 0;
};

BenchWeight make_weight(DType dtype, int64_t n, int64_t k, int copies, uint64_t seed) {
  BenchWeight w;
  w.bytes_each = dtype_bytes(dtype, static_cast<uint64_t>(n * k));
  std::vector<float> f(static_cast<size_t>(k));
  for (int c = 0; c < copies; ++c) {
    w.data.push_back(Buffer::allocate(w.bytes_each));
    w.scale.emplace_back();
    uint8_t* base = w.data.back().data();
    if (dtype == DType::kF8E4M3) {
      // random e4m3 codes (no NaN) and scales: the bytes are what matters for speed
      Rng rng(seed + static_cast<uint64_t>(c));
      for (uint64_t i = 0; i < w.bytes_each; ++i) {
        uint8_t b = static_cast<uint8_t>(rng.next_u64());
        base[i] = (b & 0x7f) == 0x7f ? 0x3f : b;
      }
      w.scale.back().assign(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)), 0.01f);
    } else {
      const uint64_t row_bytes = dtype_bytes(dtype, static_cast<uint64_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < k; ++j)
          f[static_cast<size_t>(j)] = counter_uniform(seed + static_cast<uint64_t>(c),
                                                      static_cast<uint64_t>(r), static_cast<uint64_t>(j)) *
                                      0.05f;
        CHECK_OK(from_f32(dtype, f.data(), base + static_cast<uint64_t>(r) * row_bytes, k));
      }
    }
    w.views.push_back(
        WeightView{dtype, n, k, base, w.scale.back().empty() ? nullptr : w.scale.back().data()});
  }
  return w;
}

struct Measured {
  double seconds_per_call = 0;
  int64_t calls = 0;
};

// Best batch of calls (each batch ~1/5 of the budget), cycling through the weight copies.
Measured time_calls(const BenchWeight& w, const float* x, int64_t m, float* y, double budget_s) {
  ThreadPool& pool = default_pool();
  const size_t copies = w.views.size();
  matmul(w.views[0], x, m, y, pool);  // warm-up: scratch, page faults
  Measured best{1e30, 0};
  Timer total;
  int64_t batch = 1;
  while (total.elapsed_s() < budget_s || best.calls == 0) {
    Timer t;
    for (int64_t i = 0; i < batch; ++i) matmul(w.views[static_cast<size_t>(i) % copies], x, m, y, pool);
    const double s = t.elapsed_s();
    if (s < budget_s / 20 && batch < (int64_t{1} << 20)) {
      batch *= 2;
      continue;
    }
    best.seconds_per_call = std::min(best.seconds_per_call, s / static_cast<double>(batch));
    best.calls += batch;
  }
  return best;
}

double peak_for(DType dtype, const PeakCompute& peak, std::string* arith) {
  if (dtype == DType::kQ8_0 || dtype == DType::kQ4_0) {
    *arith = "int8";
    return peak.int8_gops;
  }
  if ((dtype == DType::kBF16 || dtype == DType::kF8E4M3) && peak.level >= SimdLevel::kAvx512Bf16) {
    *arith = "bf16";
    return peak.bf16_gflops;
  }
  *arith = "f32";
  return peak.f32_gflops;
}

int run_gemm(int argc, char** argv) {
  GemmOptions o;
  Args args(argv[0], "Measure matmul (fused dequantisation) against the measured bandwidth and peak.");
  args.option("--dtype", &o.dtype, "weight type: bf16|fp8|q8_0|q4_0|f16|f32", "TYPE");
  args.option("--m", &o.m, "activation rows (default: the V2-Lite/V3 shapes at m=1 and m=512)");
  args.option("--n", &o.n, "output features (weight rows)");
  args.option("--k", &o.k, "input features (weight cols)");
  args.option("--seconds", &o.seconds, "time budget per shape");
  args.option("--rotate", &o.rotate, "total bytes of weight copies cycled for small m (defeats the caches)",
              "SIZE");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto dtype = parse_dtype(o.dtype);
  if (!dtype.ok()) return fail(args.command(), dtype.status());
  if (!matmul_supports(*dtype)) {
    return fail(args.command(),
                invalid_argument("--dtype {}: matmul supports f32, f16, bf16, fp8, q8_0, q4_0", o.dtype));
  }
  auto rotate = parse_size(o.rotate, "--rotate");
  if (!rotate.ok()) return fail(args.command(), rotate.status());
  std::vector<Shape> shapes;
  if (o.m || o.n || o.k) {
    if (!o.n || !o.k)
      return fail(args.command(), invalid_argument("--n and --k are both needed for a single shape"));
    shapes.push_back({"custom", o.m.value_or(1), *o.n, *o.k});
  } else {
    shapes = default_shapes();
  }
  for (const auto& s : shapes) {
    if (s.m < 1 || s.n < 1 || s.k < 1)
      return fail(args.command(), invalid_argument("shape must be positive"));
    if (auto st = check_block_multiple(*dtype, static_cast<uint64_t>(s.k), "--k"); !st.ok())
      return fail(args.command(), st);
  }

  ThreadPool& pool = default_pool();
  std::fprintf(stderr, "measuring memory bandwidth and peak compute (%d threads)...\n", pool.size());
  const MemoryBandwidth bw = measure_memory_bandwidth(pool);
  const PeakCompute peak = measure_peak_compute(pool);
  std::string arith;
  const double peak_ops = peak_for(*dtype, peak, &arith);

  nlohmann::json results = nlohmann::json::array();
  if (!o.json) {
    std::printf("threads %d, simd %s, read %.1f GB/s, peak %s %.1f GOP/s\n", pool.size(),
                std::string(simd_level_name(simd_level())).c_str(), bw.read_gbs, arith.c_str(), peak_ops);
    std::printf("%-24s %-6s %5s %6s %6s %10s %9s %9s %8s %8s\n", "shape", "dtype", "m", "n", "k", "us/call",
                "GB/s", "GFLOP/s", "bw_frac", "peak_frac");
  }
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const uint64_t bytes = dtype_bytes(*dtype, static_cast<uint64_t>(s.n * s.k));
    const bool small_m = s.m <= 16;
    const int copies =
        small_m ? static_cast<int>(std::clamp<uint64_t>(*rotate / std::max<uint64_t>(bytes, 1), 1, 64)) : 1;
    BenchWeight w = make_weight(*dtype, s.n, s.k, copies, seed++);
    std::vector<float> x(static_cast<size_t>(s.m * s.k)), y(static_cast<size_t>(s.m * s.n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = counter_uniform(99, 0, i);
    const Measured t = time_calls(w, x.data(), s.m, y.data(), o.seconds);
    const double gbs = static_cast<double>(bytes) / t.seconds_per_call * 1e-9;
    const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const double gflops = flops / t.seconds_per_call * 1e-9;
    const double bw_frac = gbs / bw.read_gbs, peak_frac = peak_ops > 0 ? gflops / peak_ops : 0;
    results.push_back({{"shape", s.name},
                       {"dtype", dtype_name(*dtype)},
                       {"m", s.m},
                       {"n", s.n},
                       {"k", s.k},
                       {"seconds_per_call", t.seconds_per_call},
                       {"calls", t.calls},
                       {"weight_bytes", bytes},
                       {"weight_copies", copies},
                       {"flops", flops},
                       {"gbs", gbs},
                       {"gflops", gflops},
                       {"bandwidth_fraction", bw_frac},
                       {"peak_fraction", peak_frac}});
    if (!o.json) {
      std::printf("%-24s %-6s %5lld %6lld %6lld %10.1f %9.1f %9.1f %8.3f %8.3f\n", s.name.c_str(),
                  std::string(dtype_name(*dtype)).c_str(), static_cast<long long>(s.m),
                  static_cast<long long>(s.n), static_cast<long long>(s.k), t.seconds_per_call * 1e6, gbs,
                  gflops, bw_frac, peak_frac);
      std::fflush(stdout);
    }
  }
  if (o.json) {
    nlohmann::json j = {{"threads", pool.size()},      {"simd_level", simd_level_name(simd_level())},
                        {"dtype", dtype_name(*dtype)}, {"arithmetic", arith},
                        {"read_gbs", bw.read_gbs},     {"bf16_gflops", peak.bf16_gflops},
                        {"int8_gops", peak.int8_gops}, {"f32_gflops", peak.f32_gflops},
                        {"peak_gops_used", peak_ops},  {"results", results}};
    print_json_line(j.dump());
  }
  return 0;
}

}  // namespace

FATHOM_BENCH("gemm", "matmul with fused dequantisation vs measured bandwidth and peak", run_gemm);

}  // namespace fathom::cli
