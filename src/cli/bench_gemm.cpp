// `fathom bench gemm`: matmul speed against this machine's limits measured in the same run.
// Decode shapes (small m) are memory-bound: reported as weight GB/s over the measured read
// bandwidth. Prefill shapes (m = 512) are compute-bound: GFLOP/s over the measured peak of the
// arithmetic the path uses (vdpbf16ps for bf16/fp8, VNNI int8 for q8_0/q4_0, fp32 FMA otherwise).
// Every shape cycles its weights through copies larger than the caches, as a model's layers are
// read from memory: an expert at the ~48 tokens of a 512-token prefill ran 1.8x slower from
// memory than cache-resident before its prefetch was spread over the tile products.
//
// --ceiling adds, per shape, a single-thread run on a cache-resident slice of the weight timed in
// thread CPU time, next to the peak loop timed the same way: what the kernel sustains when memory
// is not the limit, robust to other load on the machine (wall-clock figures are not).
//
// --weight-offset N starts every weight N bytes past a cache line, as a mapped safetensors
// checkpoint's tensors sit when its header length is not a multiple of 64 (base/mmap.h).
//
// --ab alternates ab::variant() 0 and 1 batch by batch (base/ab.h: a guarded candidate change) and
// reports each variant's GB/s from its own batches, for the memory run and the ceiling run.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "base/ab.h"
#include "base/check.h"
#include "base/mmap.h"
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
  std::string rotate = "1G";
  int64_t weight_offset = 0;
  bool ceiling = false;
  bool ab = false;
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

// One weight (possibly several copies for cache rotation) in the requested dtype, the copies one
// after another in one arena of transparent huge pages, as the model's --no-mmap weights lie
// (`bench moe` with 4 KiB pages against huge ones, in one process: 1.04-1.08x; docs/PERFORMANCE.md).
struct BenchWeight {
  Buffer data;
  std::vector<std::vector<float>> scale;
  std::vector<WeightView> views;
};

BenchWeight make_weight(DType dtype, int64_t n, int64_t k, int copies, uint64_t seed, int64_t offset) {
  BenchWeight w;
  const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(n * k));
  const uint64_t row_bytes = dtype_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<float> f(static_cast<size_t>(k));
  const uint64_t stride = (bytes + static_cast<uint64_t>(offset) + 63) / 64 * 64;
  w.data = Buffer::allocate_huge(stride * static_cast<uint64_t>(copies));
  for (int c = 0; c < copies; ++c) {
    w.scale.emplace_back();
    uint8_t* base = w.data.data() + stride * static_cast<uint64_t>(c) + offset;
    if (dtype == DType::kF8E4M3) {  // random codes (no NaN); the bytes are what matters for speed
      // (every copy its own bytes: byte-identical copies read faster than memory on these VMs, 1.02
      // of the bandwidth against 0.86 for [1408 x 2048] at m = 1; eight codes per draw)
      Rng rng(seed + static_cast<uint64_t>(c));
      for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t v = rng.next_u64();
        for (uint64_t j = i; j < std::min<uint64_t>(bytes, i + 8); ++j, v >>= 8) {
          const auto b = static_cast<uint8_t>(v);
          base[j] = (b & 0x7f) == 0x7f ? 0x3f : b;
        }
      }
      w.scale.back().assign(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)), 0.01f);
    } else {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < k; ++j) {
          f[static_cast<size_t>(j)] = counter_uniform(seed + static_cast<uint64_t>(c),
                                                      static_cast<uint64_t>(r), static_cast<uint64_t>(j)) *
                                      0.05f;
        }
        CHECK_OK(from_f32(dtype, f.data(), base + static_cast<uint64_t>(r) * row_bytes, k));
      }
    }
    w.views.push_back(
        WeightView{dtype, n, k, base, w.scale.back().empty() ? nullptr : w.scale.back().data()});
  }
  return w;
}

double thread_cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Best batch (each ~1/20 of the budget) of seconds per call, cycling through the weight copies.
// `cpu` times the calling thread's CPU time instead of the wall clock (single-thread pools only).
// With `ab` (two entries) the measured batches alternate ab::variant() 0 and 1, and ab[v] gets
// variant v's mean seconds per call over its batches (at least one batch of each).
double time_calls(const BenchWeight& w, const float* x, int64_t m, float* y, double budget_s,
                  ThreadPool& pool, bool cpu, double* ab = nullptr) {
  const size_t copies = w.views.size();
  for (int v = 0; v < (ab != nullptr ? 2 : 1); ++v) {  // warm-up: scratch, page faults
    if (ab != nullptr) ab::set_variant(v);
    matmul(w.views[0], x, m, y, pool);
  }
  auto now = [cpu] { return cpu ? thread_cpu_s() : static_cast<double>(now_ns()) * 1e-9; };
  double best = 1e30, spent[2] = {0, 0};
  int64_t batch = 1, done = 0, calls[2] = {0, 0}, measured = 0;
  const double start = now();
  while (now() - start < budget_s || done == 0 || (ab != nullptr && measured < 2)) {
    const int v = ab != nullptr ? static_cast<int>(measured % 2) : 0;
    if (ab != nullptr) ab::set_variant(v);
    const double t0 = now();
    for (int64_t i = 0; i < batch; ++i) matmul(w.views[static_cast<size_t>(i) % copies], x, m, y, pool);
    const double s = now() - t0;
    if (s < budget_s / 20 && batch < (int64_t{1} << 20)) {
      batch *= 2;
      continue;
    }
    best = std::min(best, s / static_cast<double>(batch));
    done += batch;
    spent[v] += s;
    calls[v] += batch;
    ++measured;
  }
  if (ab != nullptr) {
    ab::set_variant(0);
    for (int v = 0; v < 2; ++v) ab[v] = spent[v] / static_cast<double>(calls[v]);
  }
  return best;
}

// --ab's record: each variant's GB/s for `gb` GB per call at t[v] seconds per call, and 1 over 0.
nlohmann::json ab_record(double gb, const double* t) {
  return {{"variant0_gbs", gb / t[0]}, {"variant1_gbs", gb / t[1]}, {"ratio", t[0] / t[1]}};
}

// The per-thread peak of an arithmetic in GOP per CPU-second (median of 5 short runs).
double cpu_peak(const std::string& arith) {
  double (*loop)(uint64_t) = nullptr;
  const SimdLevel l = simd_level();
  if (arith == "bf16") loop = internal::peak_bf16_avx512bf16;
  if (arith == "amx_bf16") loop = internal::peak_amx_bf16;
  if (arith == "int8") loop = l >= SimdLevel::kAvx512 ? internal::peak_int8_avx512 : internal::peak_int8_avx2;
  if (arith == "f32") loop = l >= SimdLevel::kAvx512 ? internal::peak_f32_avx512 : internal::peak_f32_avx2;
  if (loop == nullptr || l < SimdLevel::kAvx2) return 0;
  std::vector<double> r;
  for (int i = 0; i < 5; ++i) {
    const double t0 = thread_cpu_s();
    const double ops = loop(1 << 20);
    r.push_back(ops / (thread_cpu_s() - t0) * 1e-9);
  }
  std::sort(r.begin(), r.end());
  return r[2];
}

struct Limits {
  MemoryBandwidth bw;
  PeakCompute peak;
  std::string arith;
  double peak_ops = 0, cpu_peak_ops = 0;
};

// Runs one shape; returns its JSON record and prints a table row unless `json`.
nlohmann::json run_shape(const Shape& s, DType dtype, const GemmOptions& o, uint64_t rotate,
                         const Limits& lim, uint64_t seed) {
  ThreadPool& pool = default_pool();
  const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(s.n * s.k));
  // as many copies as cover `rotate` (at least one): a cap on the count (64 until 2026-12-06) left
  // small weights' rotation inside a large last-level cache ([1408 x 2048] fp8: 185 MB against
  // 480 MiB of L3 on the model-167 Xeon VMs)
  const uint64_t b1 = std::max<uint64_t>(bytes, 1);
  const int copies = static_cast<int>(std::clamp<uint64_t>((rotate + b1 - 1) / b1, 1, 1 << 20));
  std::vector<float> x(static_cast<size_t>(s.m * s.k)), y(static_cast<size_t>(s.m * s.n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = counter_uniform(99, 0, i);
  double sec = 0, ab[2] = {0, 0}, ab_ceiling[2] = {0, 0};
  {
    const BenchWeight w = make_weight(dtype, s.n, s.k, copies, seed, o.weight_offset);
    sec = time_calls(w, x.data(), s.m, y.data(), o.seconds, pool, false, o.ab ? ab : nullptr);
  }
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  const double gbs = static_cast<double>(bytes) / sec * 1e-9, gflops = flops / sec * 1e-9;
  nlohmann::json r = {{"shape", s.name},
                      {"dtype", dtype_name(dtype)},
                      {"m", s.m},
                      {"n", s.n},
                      {"k", s.k},
                      {"seconds_per_call", sec},
                      {"weight_bytes", bytes},
                      {"weight_copies", copies},
                      {"weight_offset", o.weight_offset},
                      {"flops", flops},
                      {"gbs", gbs},
                      {"gflops", gflops},
                      {"bandwidth_fraction", gbs / lim.bw.read_gbs},
                      {"peak_fraction", lim.peak_ops > 0 ? gflops / lim.peak_ops : 0.0}};
  if (o.ab) r["ab"] = ab_record(static_cast<double>(bytes) * 1e-9, ab);
  double c_gbs = 0, c_frac = 0;
  if (o.ceiling) {
    // small m: a ~256 KiB slice (at least one 64-row panel) so only the kernel's own speed counts;
    // large m: the whole weight (compute-bound anyway, and the activation preparation amortised)
    auto one = ThreadPool::create(1);
    const uint64_t row_bytes = bytes / static_cast<uint64_t>(s.n);
    const int64_t slice = static_cast<int64_t>((uint64_t{256} << 10) / std::max<uint64_t>(row_bytes, 1));
    const int64_t n = s.m <= 16 ? std::clamp<int64_t>(slice, 64, s.n) : s.n;
    const BenchWeight w = make_weight(dtype, n, s.k, 1, seed + 1000, o.weight_offset);
    const double cs =
        time_calls(w, x.data(), s.m, y.data(), o.seconds / 2, *one, true, o.ab ? ab_ceiling : nullptr);
    const double c_gb = static_cast<double>(dtype_bytes(dtype, static_cast<uint64_t>(n * s.k))) * 1e-9;
    c_gbs = c_gb / cs;
    if (o.ab) r["ab_ceiling"] = ab_record(c_gb, ab_ceiling);
    const double c_gflops = 2.0 * static_cast<double>(s.m * n * s.k) / cs * 1e-9;
    c_frac = lim.cpu_peak_ops > 0 ? c_gflops / lim.cpu_peak_ops : 0;
    r["ceiling_gbs_per_thread"] = c_gbs;
    r["ceiling_gflops_per_thread"] = c_gflops;
    r["ceiling_peak_fraction"] = c_frac;
  }
  if (!o.json) {
    std::printf("%-22s %-7s %4lld %6lld %6lld %10.1f %7.1f %8.1f %7.3f %7.3f", s.name.c_str(),
                std::string(dtype_name(dtype)).c_str(), static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k), sec * 1e6, gbs, gflops,
                gbs / lim.bw.read_gbs, lim.peak_ops > 0 ? gflops / lim.peak_ops : 0.0);
    if (o.ceiling) std::printf(" %8.1f %7.3f", c_gbs, c_frac);
    if (o.ab) {
      const nlohmann::json& a = r["ab"];
      std::printf("   A/B: variant 0 %.2f GB/s, 1 %.2f GB/s, 1 over 0 = %.4f",
                  a["variant0_gbs"].get<double>(), a["variant1_gbs"].get<double>(), a["ratio"].get<double>());
      if (o.ceiling) std::printf("; ceiling 1 over 0 = %.4f", r["ab_ceiling"]["ratio"].get<double>());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return r;
}

Result<std::vector<Shape>> shapes_from(const GemmOptions& o, DType dtype) {
  std::vector<Shape> shapes;
  if (o.m || o.n || o.k) {
    if (!o.n || !o.k) return invalid_argument("--n and --k are both needed for a single shape");
    shapes.push_back({"custom", o.m.value_or(1), *o.n, *o.k});
  } else {
    shapes = default_shapes();
  }
  for (const auto& s : shapes) {
    if (s.m < 1 || s.n < 1 || s.k < 1) return invalid_argument("--m, --n and --k must be positive");
    TRY(check_block_multiple(dtype, static_cast<uint64_t>(s.k), "--k"));
  }
  return shapes;
}

int run_gemm(int argc, char** argv) {
  GemmOptions o;
  Args args(argv[0], "Measure matmul (fused dequantisation) against the measured bandwidth and peak.");
  args.option("--dtype", &o.dtype, "weight type: bf16|fp8|q8_0|q4_0|f16|f32", "TYPE");
  args.option("--m", &o.m, "activation rows (default: the V2-Lite/V3 shapes at m=1 and m=512)");
  args.option("--n", &o.n, "output features (weight rows)");
  args.option("--k", &o.k, "input features (weight cols)");
  args.option("--seconds", &o.seconds, "time budget per shape");
  args.option("--rotate", &o.rotate, "total bytes of weight copies cycled through (defeats the caches)",
              "SIZE");
  args.option("--weight-offset", &o.weight_offset,
              "start each weight this many bytes past a cache line (0-63; a mapped checkpoint's tensors may)",
              "N");
  args.flag("--ceiling", &o.ceiling, "also measure one thread on a cache-resident slice in CPU time");
  args.flag("--ab", &o.ab,
            "alternate ab::variant() 0 and 1 batch by batch and report each one's GB/s (for measuring a "
            "guarded code change in one process)");
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
  if (o.weight_offset < 0 || o.weight_offset >= static_cast<int64_t>(kCacheLine)) {
    return fail(args.command(),
                invalid_argument("--weight-offset {}: must be 0-{}", o.weight_offset, kCacheLine - 1));
  }
  auto shapes = shapes_from(o, *dtype);
  if (!shapes.ok()) return fail(args.command(), shapes.status());

  ThreadPool& pool = default_pool();
  std::fprintf(stderr, "measuring memory bandwidth and peak compute (%d threads)...\n", pool.size());
  Limits lim;
  lim.bw = measure_memory_bandwidth(pool);
  lim.peak = measure_peak_compute(pool);
  lim.peak_ops = lim.peak.for_weights(*dtype, &lim.arith);
  if (o.ceiling) lim.cpu_peak_ops = cpu_peak(lim.arith);
  if (!o.json) {
    std::printf("threads %d, simd %s, read %.1f GB/s, peak %s %.1f GOP/s", pool.size(),
                std::string(simd_level_name(simd_level())).c_str(), lim.bw.read_gbs, lim.arith.c_str(),
                lim.peak_ops);
    if (o.ceiling) std::printf(", per-thread CPU-time peak %.1f GOP/s", lim.cpu_peak_ops);
    std::printf("\n%-22s %-7s %4s %6s %6s %10s %7s %8s %7s %7s%s\n", "shape", "dtype", "m", "n", "k",
                "us/call", "GB/s", "GFLOP/s", "bw_frac", "pk_frac", o.ceiling ? " ceil_GB/s ceil_pk" : "");
  }
  nlohmann::json results = nlohmann::json::array();
  uint64_t seed = 1;
  for (const auto& s : *shapes) results.push_back(run_shape(s, *dtype, o, *rotate, lim, seed++));
  if (o.json) {
    nlohmann::json j = {{"threads", pool.size()},
                        {"simd_level", simd_level_name(simd_level())},
                        {"dtype", dtype_name(*dtype)},
                        {"arithmetic", lim.arith},
                        {"read_gbs", lim.bw.read_gbs},
                        {"bf16_gflops", lim.peak.bf16_gflops},
                        {"amx_bf16_gflops", lim.peak.amx_bf16_gflops},
                        {"int8_gops", lim.peak.int8_gops},
                        {"f32_gflops", lim.peak.f32_gflops},
                        {"peak_gops_used", lim.peak_ops},
                        {"cpu_peak_gops_per_thread", lim.cpu_peak_ops},
                        {"results", results}};
    print_json_line(j.dump());
  }
  return 0;
}

}  // namespace

FATHOM_BENCH("gemm", "matmul with fused dequantisation vs measured bandwidth and peak", run_gemm);

}  // namespace fathom::cli
