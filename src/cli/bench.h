// `fathom bench <name>` registry: each bench_<name>.cpp registers itself with FATHOM_BENCH.
// Every benchmark measures the machine's limits in the same run (kernels/roofline.h) and
// reports achieved/limit ratios next to the raw figures; with --json the last stdout line is
// one JSON object.
#pragma once

#include <vector>

#include "cli/command.h"

namespace fathom::cli {

struct BenchRegistrar {
  explicit BenchRegistrar(CommandInfo info);
};
const std::vector<CommandInfo>& benches();

}  // namespace fathom::cli

#define FATHOM_BENCH(name, summary, fn)                                                   \
  static ::fathom::cli::BenchRegistrar FATHOM_CLI_CONCAT(fathom_bench_, __LINE__)( \
      ::fathom::cli::CommandInfo{name, summary, fn})
