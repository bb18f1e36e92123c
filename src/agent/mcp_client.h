// McpClient: the client side of the Model Context Protocol (revision 2025-11-25) over stdio:
// newline-delimited JSON-RPC 2.0 on the child's stdin/stdout, its stderr kept apart (logged and
// kept as a tail for error messages). Internal to the agent component.
//
// Covers: initialize / notifications/initialized with version negotiation, tools/list with
// pagination, tools/call (content arrays, isError), notifications/tools/list_changed, progress
// (notifications/progress, shown through a callback), notifications/cancelled when a call is given
// up (timeout or caller cancel), ping in both directions, per-call timeouts. Server-to-client
// requests other than ping and roots/list get "method not found".
//
// A peer that sends something that is not JSON-RPC, or one message larger than
// max_message_bytes, is treated as broken: it is killed and every pending call fails with an error
// naming the problem. Thread-safe: any number of threads may call request()/call_tool() at once.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

using json = nlohmann::json;

inline constexpr const char* kMcpProtocolVersion = "2025-11-25";
// Newest first; a server answering with any of these is accepted.
const std::vector<std::string>& mcp_supported_versions();

struct McpTool {
  std::string name;
  std::string description;
  // Ordered: the properties in the order the server declared them (a model sees them so).
  nlohmann::ordered_json input_schema = nlohmann::ordered_json::object();
};

struct McpToolResult {
  json content = json::array();  // MCP content blocks
  bool is_error = false;
  json structured;           // structuredContent when given
  std::string text() const;  // the blocks rendered as text for a model
};

struct McpClientOptions {
  std::string name = "plugin";  // for log lines and error messages
  int init_timeout_ms = 20000;
  size_t max_message_bytes = 16u << 20;                    // one JSON-RPC line from the server
  std::vector<std::string> roots;                          // answered to roots/list (file:// URIs)
  std::function<void()> on_tools_changed;                  // from the reader thread
  std::function<void(const std::string& line)> on_stderr;  // from the stderr thread
  std::function<void(const std::string& reason)> on_exit;  // once, when the peer goes away
};

// Called from the reader thread for each notifications/progress of a call.
using ProgressFn = std::function<void(double progress, double total, const std::string& message)>;

class McpClient {
 public:
  // Spawns argv (already wrapped in the sandbox by the caller when wanted) and performs the
  // handshake. env is the child's whole environment.
  static Result<std::unique_ptr<McpClient>> start(const std::vector<std::string>& argv,
                                                  const std::vector<std::string>& env, const std::string& cwd,
                                                  McpClientOptions options);
  ~McpClient();  // closes stdin, gives the child a moment, then kills it

  // One JSON-RPC request. timeout_ms <= 0: no timeout. cancel (optional) is polled; when it turns
  // true the request is cancelled with notifications/cancelled.
  // raw (optional): the response's line as received, for a caller that needs its key order.
  Result<json> request(const std::string& method, json params, int timeout_ms,
                       const ProgressFn& on_progress = {}, const std::atomic<bool>* cancel = nullptr,
                       std::string* raw = nullptr);
  Status notify(const std::string& method, json params);

  Result<std::vector<McpTool>> list_tools(int timeout_ms = 20000);
  Result<McpToolResult> call_tool(const std::string& name, const json& arguments, int timeout_ms,
                                  const ProgressFn& on_progress = {},
                                  const std::atomic<bool>* cancel = nullptr);
  Status ping(int timeout_ms = 5000);

  bool alive() const;
  pid_t pid() const;
  const std::string& protocol_version() const;
  const json& server_info() const;
  const std::string& instructions() const;
  std::string stderr_tail() const;
  // Kills the peer now; pending calls fail with `reason`.
  void kill(const std::string& reason);

  struct Impl;

 private:
  explicit McpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom::agent
