// `fathom bench <name> [options]`: dispatches to the registered benchmarks.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/bench.h"

namespace fathom::cli {
namespace {

std::vector<CommandInfo>& bench_registry() {
  static std::vector<CommandInfo> r;
  return r;
}

int run_bench(int argc, char** argv) {
  auto list = [] {
    std::printf("usage: fathom bench <name> [options]     fathom bench <name> --help\n\nbenchmarks:\n");
    for (const auto& b : benches()) std::printf("  %-12s %s\n", b.name, b.summary);
  };
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    list();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& b : benches()) {
    if (b.name == std::string(argv[1])) {
      std::string name = std::string("fathom bench ") + b.name;
      argv[1] = name.data();
      return b.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "fathom bench: unknown benchmark '%s'\n", argv[1]);
  list();
  return 2;
}

}  // namespace

BenchRegistrar::BenchRegistrar(CommandInfo info) {
  auto& r = bench_registry();
  r.push_back(info);
  std::sort(r.begin(), r.end(), [](const CommandInfo& a, const CommandInfo& b) {
    return std::string_view(a.name) < std::string_view(b.name);
  });
}

const std::vector<CommandInfo>& benches() { return bench_registry(); }

FATHOM_COMMAND("bench", "Run a benchmark (measures this machine's limits in the same run)", run_bench);

}  // namespace fathom::cli
