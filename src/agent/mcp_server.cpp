// McpServer: JSON-RPC over stdin/stdout for the built-in plugins. See mcp_server.h.
#include "agent/mcp_server.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "agent/mcp_client.h"
#include "agent/schema.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace fathom::agent {

ToolOutput tool_error(std::string text) {
  return ToolOutput{.text = std::move(text), .is_error = true};
}

struct McpServer::Impl {
  McpServerOptions options;
  std::mutex mu;  // tools, calls, initialized
  std::vector<ServerTool> tools;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> calls;  // request id (dumped) -> cancel flag
  std::mutex out_mu;
  std::condition_variable idle;
  int running = 0;
  bool initialized = false;

  template <class Json = json>  // ordered_json for tools/list
  void send(const Json& msg) {
    std::string line = msg.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    std::lock_guard<std::mutex> lock(out_mu);
    (void)write_all(1, line.data(), line.size(), "stdout");
  }
  void reply(const json& id, json result) {
    send({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
  }
  void error(const json& id, int code, const std::string& message) {
    send({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
  }

  nlohmann::ordered_json tool_json(const ServerTool& t) {
    return {{"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema}};
  }

  void list_tools(const json& id, const json& params) {
    std::lock_guard<std::mutex> lock(mu);
    size_t start = 0;
    if (params.contains("cursor")) {
      const json& c = params["cursor"];
      auto parsed = c.is_string() ? parse_uint(c.get<std::string>(), "cursor")
                                  : Result<uint64_t>(invalid_argument("x"));
      if (!parsed.ok() || *parsed > tools.size()) return error(id, -32602, "invalid cursor " + c.dump());
      start = *parsed;
    }
    const size_t n = options.page_size > 0 ? static_cast<size_t>(options.page_size) : tools.size();
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = start; i < tools.size() && i < start + n; ++i) list.push_back(tool_json(tools[i]));
    nlohmann::ordered_json result = {{"tools", list}};
    if (start + n < tools.size()) result["nextCursor"] = std::to_string(start + n);
    send(nlohmann::ordered_json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
  }

  void call_tool(const json& id, const json& params) {
    if (!params.contains("name") || !params["name"].is_string())
      return error(id, -32602, "tools/call needs a string 'name'");
    const std::string name = params["name"];
    const json args = params.value("arguments", json::object());
    std::optional<ServerTool> tool;
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& t : tools)
        if (t.name == name) tool = t;
      if (!tool) return error(id, -32602, "unknown tool '" + name + "'");
      calls[id.dump()] = cancel;
      ++running;
    }
    json token = params.contains("_meta") && params["_meta"].is_object()
                     ? params["_meta"].value("progressToken", json())
                     : json();
    std::thread([this, id, args, tool = std::move(*tool), cancel, token]() mutable {
      ToolContext ctx{.cancelled = cancel.get()};
      ctx.progress = [this, token](double progress, double total, const std::string& message) {
        if (token.is_null()) return;
        json p = {{"progressToken", token}, {"progress", progress}};
        if (total > 0) p["total"] = total;
        if (!message.empty()) p["message"] = message;
        send({{"jsonrpc", "2.0"}, {"method", "notifications/progress"}, {"params", p}});
      };
      ToolOutput out;
      try {
        if (Status s = validate_json(tool.input_schema, args); !s.ok())
          out = tool_error("invalid arguments for " + tool.name + ": " + s.message());
        else
          out = tool.run(args, ctx);
      } catch (const std::exception& e) {
        out = tool_error(std::string("internal error: ") + e.what());
      }
      bool cancelled = cancel->load();
      if (!cancelled) {  // a cancelled request gets no response (MCP cancellation)
        json result = {{"content", json::array({{{"type", "text"}, {"text", out.text}}})},
                       {"isError", out.is_error}};
        if (!out.structured.is_null()) result["structuredContent"] = out.structured;
        reply(id, result);
      }
      std::lock_guard<std::mutex> lock(mu);
      calls.erase(id.dump());
      --running;
      idle.notify_all();
    }).detach();
  }

  // Never lets a malformed request take the server down: type errors become -32602 answers.
  void handle(const json& msg) {
    try {
      handle_unchecked(msg);
    } catch (const std::exception& e) {
      const json& id =
          msg.contains("id") && (msg["id"].is_string() || msg["id"].is_number_integer()) ? msg["id"] : json();
      error(id, -32602, std::string("invalid params: ") + e.what());
    }
  }

  void handle_unchecked(const json& msg) {
    const bool is_request = msg.contains("id") && !msg["id"].is_null();
    const json id = is_request ? msg["id"] : json();
    if (!msg.contains("method") || !msg["method"].is_string()) {
      if (msg.contains("result") || msg.contains("error")) return;  // answers to our (no) requests
      return error(id, -32600, "invalid request: no method");
    }
    if (is_request && !id.is_string() && !id.is_number_integer())
      return error(json(), -32600, "invalid request id");
    const std::string method = msg["method"];
    const json params = msg.value("params", json::object());
    if (!is_request) {
      if (method == "notifications/cancelled") {
        std::lock_guard<std::mutex> lock(mu);
        auto it = calls.find(params.value("requestId", json()).dump());
        if (it != calls.end()) it->second->store(true);
      } else if (method == "notifications/initialized") {
        std::lock_guard<std::mutex> lock(mu);
        initialized = true;
      }
      return;
    }
    if (method == "initialize") {
      std::string version = kMcpProtocolVersion;
      const std::string asked = params.value("protocolVersion", "");
      for (const auto& v : mcp_supported_versions())
        if (v == asked) version = asked;
      json result = {{"protocolVersion", version},
                     {"capabilities", {{"tools", {{"listChanged", true}}}}},
                     {"serverInfo", {{"name", options.name}, {"version", options.version}}}};
      if (!options.instructions.empty()) result["instructions"] = options.instructions;
      return reply(id, result);
    }
    if (method == "ping") return reply(id, json::object());
    if (method == "tools/list") return list_tools(id, params);
    if (method == "tools/call") return call_tool(id, params);
    error(id, -32601, "method not found: " + method);
  }
};

McpServer::McpServer(std::vector<ServerTool> tools, McpServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->tools = std::move(tools);
  impl_->options = std::move(options);
}

McpServer::~McpServer() = default;

void McpServer::set_tools(std::vector<ServerTool> tools) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->tools = std::move(tools);
  }
  impl_->send(json{{"jsonrpc", "2.0"}, {"method", "notifications/tools/list_changed"}});
}

int McpServer::serve() {
  std::string buf;
  char chunk[65536];
  constexpr size_t kMaxLine = 16u << 20;
  for (;;) {
    ssize_t n = ::read(0, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const size_t scanned = buf.size();  // only the new bytes can hold a newline
    buf.append(chunk, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl, from = scanned; (nl = buf.find('\n', from)) != std::string::npos; start = from = nl + 1) {
      std::string_view line = trim(std::string_view(buf).substr(start, nl - start));
      if (line.empty()) continue;
      const Status nesting = check_json_nesting(line, "the message");
      json msg = nesting.ok() ? json::parse(line, nullptr, false) : json(json::value_t::discarded);
      if (msg.is_discarded())
        impl_->error(json(), -32700, nesting.ok() ? "parse error: not JSON" : "parse error: " + nesting.message());
      else if (!msg.is_object() || msg.value("jsonrpc", "") != "2.0")
        impl_->error(json(), -32600, "invalid request: not JSON-RPC 2.0");
      else
        impl_->handle(msg);
    }
    buf.erase(0, start);
    if (buf.size() > kMaxLine) {
      impl_->error(json(), -32600, "invalid request: message larger than 16 MiB");
      buf.clear();
    }
  }
  // stdin closed: cancel what runs and give it a moment to finish.
  std::unique_lock<std::mutex> lock(impl_->mu);
  for (auto& [id, flag] : impl_->calls) flag->store(true);
  impl_->idle.wait_for(lock, std::chrono::seconds(2), [&] { return impl_->running == 0; });
  return 0;
}

}  // namespace fathom::agent
