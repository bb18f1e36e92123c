// The built-in plugins, served as MCP servers by `fathom mcp <name>` (cli/cmd_mcp.cpp): each
// returns its tool list for an McpServer. Paths are confined to the workspace with openat2
// (RESOLVE_BENEATH), so `../` and symlinks cannot leave it even outside the sandbox.
// Internal to the agent component.
#pragma once

#include <string>
#include <vector>

#include "agent/mcp_server.h"
#include "agent/sandbox.h"

namespace fathom::agent {

struct ShellPluginOptions {
  std::string workspace = ".";
  int64_t timeout_ms = 120000;          // per call unless the call asks for less
  size_t output_cap_bytes = 64 * 1024;  // stdout + stderr per call
  int64_t cpu_seconds = 0;
  bool network = false;               // for the per-call sandbox outside a plugin sandbox
  std::vector<std::string> env_keep;  // environment variables passed to commands
};
std::vector<ServerTool> shell_tools(const ShellPluginOptions& options);

struct FilesPluginOptions {
  std::string workspace = ".";
  size_t max_read_bytes = 1 << 20;
  bool read_only = false;
};
Result<std::vector<ServerTool>> files_tools(const FilesPluginOptions& options);

struct SqlitePluginOptions {
  std::string workspace = ".";
  std::string database;       // inside the workspace unless absolute
  bool allow_writes = false;  // the manifest grants writes
  int64_t max_rows = 100;
  int64_t timeout_ms = 30000;
};
Result<std::vector<ServerTool>> sqlite_tools(const SqlitePluginOptions& options);

struct BuildCommand {
  std::string name, run, description;
  int64_t timeout_ms = 600000;
};
struct BuildPluginOptions {
  std::string workspace = ".";
  std::string config;                  // TOML with [[command]] tables; watched for changes
  std::vector<BuildCommand> commands;  // from --command NAME=CMD
  size_t output_cap_bytes = 64 * 1024;
};
// Commands from the config file (when given) followed by options.commands.
Result<std::vector<BuildCommand>> load_build_commands(const BuildPluginOptions& options);
std::vector<ServerTool> build_tools(const BuildPluginOptions& options,
                                    const std::vector<BuildCommand>& commands);

// `echo` (returns its text) and `sleep`: for benchmarks and protocol tests.
std::vector<ServerTool> echo_tools();

}  // namespace fathom::agent
