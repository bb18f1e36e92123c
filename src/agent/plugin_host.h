// PluginHost: starts, supervises and hot-swaps MCP plugins, and routes tool calls to them.
// Internal to the agent component; the agent loop uses it through agent.h.
//
// A plugin comes from a manifest file in the plugins directory (one TOML or JSON file each; see
// docs/agent.md for the fields) or from `--plugin "[NAME=]CMD ARGS"`. Each runs in the sandbox
// (sandbox.h) with its own profile. The directory is watched with inotify (and rescanned every
// few seconds as a fallback): a new manifest starts its plugin, a removed one stops it, an edited
// one restarts it; calls in flight on other plugins are not touched. A plugin that exits is
// restarted with exponential backoff (250 ms doubling to 30 s; reset after a minute of health);
// its in-flight calls fail with an error naming the exit, which the model sees.
//
// Tools reach the model as `<plugin>__<tool>` (characters outside [A-Za-z0-9_-] become '_', at
// most 64 characters), so two plugins' tools cannot collide. Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/mcp_client.h"
#include "agent/sandbox.h"
#include "base/status.h"

namespace fathom::agent {

struct PluginManifest {
  std::string name;
  std::string command;  // "fathom" means this executable
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::vector<std::string> env_passthrough;             // names copied from the agent's environment
  std::string install_dir;                              // read-only in the sandbox
  int64_t tool_timeout_ms = 0;                          // 0: the agent's default
  SandboxProfile sandbox;                               // workspace filled in by the host
  std::string permission_default;                       // allow | ask | deny for this plugin's tools
  std::map<std::string, std::string> permission_tools;  // tool -> allow|ask|deny
  std::string source;                                   // manifest path, or "--plugin"
  nlohmann::json to_json() const;
};

// Parses a manifest file (.toml or .json). ${workspace}, ${manifest_dir} and ${fathom} are
// substituted in command, args, env and paths.
Result<PluginManifest> load_manifest(const std::string& path, const std::string& workspace);
// "[NAME=]CMD ARGS" (shell-like quoting) -> a manifest allowed by default.
Result<PluginManifest> manifest_from_command_line(const std::string& spec, const std::string& workspace);

struct ToolEntry {
  std::string name;  // namespaced: <plugin>__<tool>
  std::string plugin;
  std::string tool;  // the plugin's own name for it
  std::string description;
  nlohmann::ordered_json input_schema;  // as the plugin declared it (key order kept)
  std::string permission;  // the plugin's default decision for this tool (allow|ask|deny)
};

struct PluginStatus {
  std::string name, state, last_error;
  int restarts = 0;
  size_t n_tools = 0;
};

struct PluginHostOptions {
  std::string workspace;
  std::string plugins_dir;  // empty: none
  SandboxProfile sandbox;   // defaults for every plugin (mode, limits)
  int64_t tool_timeout_ms = 120000;
  int64_t start_timeout_ms = 30000;
  std::function<void(const std::string&)> on_event;  // one-line notices for the user
};

class PluginHost {
 public:
  static Result<std::unique_ptr<PluginHost>> create(PluginHostOptions options,
                                                    std::vector<PluginManifest> plugins);
  ~PluginHost();

  std::vector<ToolEntry> tools() const;
  // Bumped whenever the set of tools changes (plugin started/stopped, tools/list_changed).
  uint64_t tools_version() const;
  Result<McpToolResult> call(const std::string& namespaced, const nlohmann::json& arguments,
                             int64_t timeout_ms, const ProgressFn& on_progress,
                             const std::atomic<bool>* cancel);
  std::vector<PluginStatus> status() const;
  // Runs one supervision step now (tests use it to avoid waiting for the background thread).
  void poll_now();

  struct Impl;

 private:
  explicit PluginHost(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

std::string namespaced_tool_name(const std::string& plugin, const std::string& tool);

// The OpenAI `tools` array a model is offered for these tools, as `fathom agent` sends it:
// {"type": "function", "function": {name, description (first 2000 bytes), parameters}} with each
// input schema's key order kept. `fathom agent tools --json` prints it too (the corpus generator
// trains the default model on exactly these definitions).
nlohmann::ordered_json openai_tool_specs(const std::vector<ToolEntry>& tools);

}  // namespace fathom::agent
