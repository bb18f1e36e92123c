// The command registry.
#include "cli/command.h"

#include <algorithm>
#include <cstdio>

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

int fail(std::string_view command, const Status& status) {
  std::fflush(stdout);
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(command.size()), command.data(),
               status.to_string().c_str());
  return 1;
}

}  // namespace fathom::cli
