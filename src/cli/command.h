// Subcommand registry: each cmd_<name>.cpp registers itself with FATHOM_COMMAND, so adding a
// command touches no other file. main() dispatches on the first argument.
//
//   int run_inspect(int argc, char** argv);   // argv[0] is "fathom inspect"
//   FATHOM_COMMAND("inspect", "Show a checkpoint's tensors and config", run_inspect);
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace fathom::cli {

using CommandFn = int (*)(int argc, char** argv);

struct CommandInfo {
  const char* name;
  const char* summary;
  CommandFn run;
};

struct CommandRegistrar {
  explicit CommandRegistrar(CommandInfo info);
};

const std::vector<CommandInfo>& commands();  // sorted by name

// A command made of subcommands (`fathom corpus render ...`): prints `usage` for no argument (exit
// 2) or --help/-h (exit 0), else runs the named one with argv[0] = "fathom <command> <sub>"; an
// unknown name prints the usage to stderr and returns 2.
using Subcommand = std::pair<std::string_view, CommandFn>;
int run_subcommands(int argc, char** argv, const char* usage, std::initializer_list<Subcommand> subs);

// Prints "fathom <command>: error: <message>" to stderr and returns the exit code 1.
int fail(std::string_view command, const Status& status);

}  // namespace fathom::cli

#define FATHOM_CLI_CONCAT2(a, b) a##b
#define FATHOM_CLI_CONCAT(a, b) FATHOM_CLI_CONCAT2(a, b)
#define FATHOM_COMMAND(name, summary, fn)                                                   \
  static ::fathom::cli::CommandRegistrar FATHOM_CLI_CONCAT(fathom_command_, __LINE__)( \
      ::fathom::cli::CommandInfo{name, summary, fn})
