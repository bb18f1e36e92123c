// fathom: one binary, many subcommands (see `fathom --help`). main stays tiny: it looks the
// command up in the registry and runs it.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/command.h"

namespace {

void print_help() {
  std::printf(
      "fathom: DeepSeek-V3-architecture models on CPUs, from checkpoint to agent.\n\n"
      "usage: fathom <command> [options]     fathom <command> --help\n\ncommands:\n");
  for (const auto& c : fathom::cli::commands()) std::printf("  %-12s %s\n", c.name, c.summary);
  std::printf("\nEnvironment: FATHOM_THREADS, FATHOM_SIMD, FATHOM_LOG, FATHOM_NO_PROGRESS.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    if (argc >= 3 && std::strcmp(argv[1], "help") == 0) {
      for (const auto& c : fathom::cli::commands()) {
        if (c.name == std::string(argv[2])) {
          std::string name = std::string("fathom ") + c.name;
          char help[] = "--help";
          char* sub_argv[] = {name.data(), help, nullptr};
          return c.run(2, sub_argv);
        }
      }
    }
    print_help();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("fathom %s\n", FATHOM_VERSION);
    return 0;
  }
  for (const auto& c : fathom::cli::commands()) {
    if (c.name == std::string(argv[1])) {
      std::string name = std::string("fathom ") + c.name;
      argv[1] = name.data();
      return c.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "fathom: unknown command '%s' (see fathom --help)\n", argv[1]);
  return 2;
}
