// The command registry.
#include "cli/command.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace fathom::cli {
namespace {
std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(CommandInfo info) {
  auto& r = registry();
  r.push_back(info);
  std::sort(r.begin(), r.end(), [](const CommandInfo& a, const CommandInfo& b) {
    return std::string_view(a.name) < std::string_view(b.name);
  });
}

const std::vector<CommandInfo>& commands() { return registry(); }

int run_subcommands(int argc, char** argv, const char* usage, std::initializer_list<Subcommand> subs) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::printf("%s", usage);
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  for (const auto& [sub_name, run] : subs) {
    if (sub != sub_name) continue;
    std::string name = std::string(argv[0]) + " " + sub;
    argv[1] = name.data();
    return run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "%s: unknown subcommand '%s'\n%s", argv[0], sub.c_str(), usage);
  return 2;
}

int fail(std::string_view command, const Status& status) {
  std::fflush(stdout);
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(command.size()), command.data(),
               status.to_string().c_str());
  return 1;
}

}  // namespace fathom::cli
