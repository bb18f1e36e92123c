// `fathom bench roofline`: this machine's memory bandwidth and peak arithmetic rates, the
// denominators every other benchmark divides by.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "base/progress.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/roofline.h"

namespace fathom::cli {
namespace {

int run_roofline(int argc, char** argv) {
  bool json = false;
  std::string size = "1G";
  Args args(argv[0], "Measure memory bandwidth (read, copy, triad) and peak BF16/int8/f32 rates.");
  args.option("--bytes", &size, "buffer size swept (larger than the last-level cache)", "SIZE");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto bytes = parse_size(size, "--bytes");
  if (!bytes.ok()) return fail(args.command(), bytes.status());
  ThreadPool& pool = default_pool();
  const MemoryBandwidth bw = measure_memory_bandwidth(pool, *bytes);
  const PeakCompute peak = measure_peak_compute(pool);
  if (json) {
    nlohmann::json j = {{"threads", pool.size()},
                        {"simd_level", simd_level_name(peak.level)},
                        {"bytes", bw.bytes},
                        {"read_gbs", bw.read_gbs},
                        {"copy_gbs", bw.copy_gbs},
                        {"triad_gbs", bw.triad_gbs},
                        {"bf16_gflops", peak.bf16_gflops},
                        {"amx_bf16_gflops", peak.amx_bf16_gflops},
                        {"int8_gops", peak.int8_gops},
                        {"f32_gflops", peak.f32_gflops}};
    print_json_line(j.dump());
    return 0;
  }
  std::printf("threads %d, simd %s, buffer %s\n", pool.size(), std::string(simd_level_name(peak.level)).c_str(),
              format_bytes(bw.bytes).c_str());
  std::printf("memory: read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s\n", bw.read_gbs, bw.copy_gbs, bw.triad_gbs);
  std::printf("peak:   bf16 %.1f GFLOP/s, int8 %.1f GOP/s, f32 %.1f GFLOP/s\n", peak.bf16_gflops, peak.int8_gops,
              peak.f32_gflops);
  if (peak.amx_bf16_gflops > 0) std::printf("        amx bf16 %.1f GFLOP/s (tiles)\n", peak.amx_bf16_gflops);
  return 0;
}

}  // namespace

FATHOM_BENCH("roofline", "Memory bandwidth and peak arithmetic of this machine", run_roofline);

}  // namespace fathom::cli
