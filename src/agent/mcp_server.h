// McpServer: the server side of MCP 2025-11-25 over stdio, used by the built-in plugins
// (`fathom mcp shell|files|sqlite|build`) so they work in any MCP client, Fathom's or another.
// Internal to the agent component.
//
// Handles initialize (version negotiation: the client's version when supported, else ours),
// notifications/initialized, ping, tools/list (paginated when page_size > 0; the cursor is an
// opaque offset), tools/call (arguments validated against the tool's inputSchema; failures are
// tool results with isError, as the spec asks), notifications/cancelled (the call's cancel flag
// is set), progress for calls that carry _meta.progressToken, and notifications/tools/list_changed
// when set_tools() replaces the list. Parse errors, invalid requests and unknown methods get
// JSON-RPC errors; the server never exits on bad input. Calls run on their own threads, so ping
// and cancellation are answered while a tool works.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fathom::agent {

struct ToolContext {
  const std::atomic<bool>* cancelled = nullptr;  // set by notifications/cancelled or shutdown
  // Sends notifications/progress when the client asked for progress; a no-op otherwise.
  std::function<void(double progress, double total, const std::string& message)> progress;
};

struct ToolOutput {
  std::string text;
  bool is_error = false;
  nlohmann::json structured;  // optional structuredContent
};

struct ServerTool {
  std::string name;
  std::string description;
  // Ordered: tools/list sends the properties in the order they are declared here, which is the
  // order a model sees them in (and the first one starts the call head a server may score).
  nlohmann::ordered_json input_schema;
  std::function<ToolOutput(const nlohmann::json& args, ToolContext& ctx)> run;
};

struct McpServerOptions {
  std::string name = "fathom";
  std::string version = "0.1.0";
  std::string instructions;
  int page_size = 0;  // tools per tools/list page; 0: all in one
};

class McpServer {
 public:
  McpServer(std::vector<ServerTool> tools, McpServerOptions options);
  ~McpServer();
  // Replaces the tool list and notifies the client (tools/list_changed). Thread-safe.
  void set_tools(std::vector<ServerTool> tools);
  // Serves stdin/stdout until stdin closes; returns the exit code.
  int serve();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

ToolOutput tool_error(std::string text);

}  // namespace fathom::agent
