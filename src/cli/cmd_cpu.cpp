// `fathom cpu`: what this machine's CPU offers and which kernel paths Fathom will use.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "base/cpu.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/command.h"
#include "kernels/matmul.h"

namespace fathom::cli {
namespace {

int run_cpu(int argc, char** argv) {
  bool json = false;
  Args args(argv[0], "Show CPU features, the SIMD level kernels use and the thread count.");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  const CpuFeatures& f = cpu_features();
  if (json) {
    nlohmann::json j = {{"vendor", f.vendor},
                        {"brand", f.brand},
                        {"features", f.to_string()},
                        {"simd_supported", simd_level_name(simd_level_supported())},
                        {"simd_level", simd_level_name(simd_level())},
                        {"threads", default_thread_count()},
                        {"amx", f.amx_tile},
                        {"amx_matmul", amx_bf16_usable()},
                        {"fp8_f16", matmul_fp8_f16_active()}};
    print_json_line(j.dump());
    return 0;
  }
  std::printf("cpu:        %s %s\n", f.vendor.c_str(), f.brand.c_str());
  std::printf("features:   %s\n", f.to_string().c_str());
  std::printf("simd level: %s (supported: %s)\n", std::string(simd_level_name(simd_level())).c_str(),
              std::string(simd_level_name(simd_level_supported())).c_str());
  std::printf("amx tiles:  %s\n",
              amx_bf16_usable()
                  ? "used by matmul (bf16 weights from 2 rows, fp8 from 4, or 5 with the fp16 kernel) and "
                    "MLA decode; FATHOM_AMX=0 turns them off"
              : f.amx_tile ? "present but not usable (tile state not granted, or FATHOM_AMX=0)"
                           : "absent");
  std::printf("fp8 fp16:   %s\n",
              matmul_fp8_f16_active()
                  ? "fp8 weights at 2-7 rows in fp16 arithmetic; FATHOM_FP8_F16=0 turns it off"
              : f.avx512_fp16 ? "off (FATHOM_FP8_F16=0, or a capped SIMD level)"
                              : "absent (no AVX-512 FP16)");
  std::printf("threads:    %d\n", default_thread_count());
  return 0;
}

}  // namespace

FATHOM_COMMAND("cpu", "Show CPU features and the kernel paths in use", run_cpu);

}  // namespace fathom::cli
