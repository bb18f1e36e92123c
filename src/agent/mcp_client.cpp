// McpClient implementation: one reader thread for stdout (JSON-RPC), one for stderr (logs), a
// pending-request table keyed by id. See mcp_client.h for the contract.
#include "agent/mcp_client.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "agent/process.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {

const std::vector<std::string>& mcp_supported_versions() {
  static const std::vector<std::string> v = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};
  return v;
}

std::string McpToolResult::text() const {
  std::string out;
  for (const auto& block : content) {
    if (!out.empty()) out += "\n";
    const std::string type = block.value("type", "");
    if (type == "text") {
      out += block.value("text", "");
    } else if (type == "image" || type == "audio") {
      out += fmt::format("[{} {} , {} base64 chars]", type, block.value("mimeType", "?"),
                         block.value("data", "").size());
    } else if (type == "resource") {
      const json r = block.value("resource", json::object());
      out += r.contains("text") ? r.value("text", "") : fmt::format("[resource {}]", r.value("uri", "?"));
    } else if (type == "resource_link") {
      out += fmt::format("[resource link {} {}]", block.value("name", ""), block.value("uri", ""));
    } else {
      out += block.dump();
    }
  }
  if (content.empty() && !structured.is_null()) out = structured.dump();
  return out;
}

namespace {

struct Pending {
  std::optional<Result<json>> result;
  bool want_raw = false;  // keep the response line (McpClient::request's raw)
  std::string raw;
  ProgressFn on_progress;
  std::condition_variable cv;
  bool progressed = false;
};

std::string excerpt(std::string_view s, size_t n = 200) {
  if (s.size() <= n) return std::string(s);
  return std::string(s.substr(0, n)) + fmt::format("... ({} bytes)", s.size());
}

}  // namespace

struct McpClient::Impl {
  McpClientOptions options;
  std::unique_ptr<ChildProcess> proc;
  std::mutex mu;        // pending, dead, next_id, stderr tail
  std::mutex write_mu;  // one writer on stdin at a time
  std::map<int64_t, std::shared_ptr<Pending>> pending;
  int64_t next_id = 1;
  bool dead = false;
  std::string dead_reason;
  std::string stderr_tail;
  bool stderr_eof = false;            // stderr_loop has read to the end (under mu)
  std::condition_variable stderr_cv;  // signals stderr_eof
  std::thread reader, err_reader;
  std::string version;
  json server_info = json::object();
  std::string instructions;

  Status send(const json& msg) {
    std::string line = msg.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard<std::mutex> lock(write_mu);
    if (proc->stdin_fd() < 0) return unavailable("plugin '{}': stdin closed", options.name);
    Status s = write_all(proc->stdin_fd(), line.data(), line.size(), "plugin stdin");
    if (!s.ok()) return unavailable("plugin '{}' is not reading its input ({})", options.name, s.message());
    return {};
  }

  void fail_all(const std::string& reason) {
    std::map<int64_t, std::shared_ptr<Pending>> old;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (dead) return;
      dead = true;
      dead_reason = reason;
      old.swap(pending);
      for (auto& [id, p] : old) {
        p->result = unavailable("{}", reason);
        p->cv.notify_all();
      }
    }
    if (options.on_exit) options.on_exit(reason);
  }

  void protocol_error(const std::string& what) {
    log_warn("plugin '{}': {}; stopping it", options.name, what);
    proc->kill_tree(SIGKILL);
    fail_all(fmt::format("plugin '{}' broke the protocol: {}", options.name, what));
  }

  void reply(const json& id, json result) {
    (void)send({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
  }
  void reply_error(const json& id, int code, const std::string& message) {
    (void)send({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
  }

  void handle_server_request(const json& msg) {
    const std::string method = msg["method"];
    if (method == "ping") return reply(msg["id"], json::object());
    if (method == "roots/list") {
      json roots = json::array();
      for (const auto& r : options.roots) roots.push_back({{"uri", "file://" + r}, {"name", r}});
      return reply(msg["id"], {{"roots", roots}});
    }
    reply_error(msg["id"], -32601, "method not supported by the fathom agent: " + method);
  }

  void handle_notification(const json& msg) {
    const std::string method = msg["method"];
    const json params = msg.value("params", json::object());
    if (method == "notifications/tools/list_changed") {
      log_info("plugin '{}': tool list changed", options.name);
      if (options.on_tools_changed) options.on_tools_changed();
    } else if (method == "notifications/progress") {
      const json token = params.value("progressToken", json());
      if (!token.is_number_integer()) return;
      std::shared_ptr<Pending> p;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = pending.find(token.get<int64_t>());
        if (it == pending.end()) return;
        p = it->second;
        p->progressed = true;
        p->cv.notify_all();
      }
      if (p->on_progress) {
        const double progress = params.value("progress", 0.0);
        const double total =
            params.contains("total") && params["total"].is_number() ? params["total"].get<double>() : 0.0;
        p->on_progress(progress, total, params.value("message", ""));
      }
    } else if (method == "notifications/message") {
      log_debug("plugin '{}' log: {}", options.name, params.dump());
    }  // other notifications (resources, prompts) are not used by the agent
  }

  void handle_response(const json& msg, std::string_view line) {
    const json& id = msg["id"];
    if (!id.is_number_integer())
      return protocol_error("response with an id we never sent: " + excerpt(id.dump()));
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(id.get<int64_t>());
    if (it == pending.end()) return;  // a late answer to a cancelled or timed-out request
    auto p = it->second;
    pending.erase(it);
    if (msg.contains("error")) {
      const json& e = msg["error"];
      std::string text = e.is_object() ? e.value("message", e.dump()) : e.dump();
      int code = e.is_object() ? e.value("code", 0) : 0;
      p->result = Status(StatusCode::kFailedPrecondition,
                         fmt::format("plugin '{}' returned JSON-RPC error {}: {}", options.name, code, text));
    } else {
      p->result = msg["result"];
      if (p->want_raw) p->raw = std::string(line);
    }
    p->cv.notify_all();
  }

  void handle_line(std::string_view line) {
    try {
      handle_line_unchecked(line);
    } catch (const std::exception& e) {  // a field of the wrong type
      protocol_error(std::string("malformed message (") + e.what() + "): " + excerpt(line));
    }
  }

  void handle_line_unchecked(std::string_view line) {
    if (line.empty() || line == "\r") return;
    if (Status st = check_json_nesting(line, "stdout line"); !st.ok())
      return protocol_error(st.message() + ": " + excerpt(line));
    json msg = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (msg.is_discarded()) return protocol_error("stdout line is not JSON: " + excerpt(line));
    if (msg.is_array()) return protocol_error("JSON-RPC batches are not part of MCP 2025-11-25");
    if (!msg.is_object() || msg.value("jsonrpc", "") != "2.0")
      return protocol_error("message is not JSON-RPC 2.0: " + excerpt(line));
    const bool has_method = msg.contains("method") && msg["method"].is_string();
    const bool has_id = msg.contains("id") && !msg["id"].is_null();
    if (has_method && has_id) return handle_server_request(msg);
    if (has_method) return handle_notification(msg);
    if (has_id && (msg.contains("result") || msg.contains("error"))) return handle_response(msg, line);
    protocol_error("message is neither request, notification nor response: " + excerpt(line));
  }

  void read_loop() {
    std::string buf;
    char chunk[65536];
    for (;;) {
      ssize_t n = ::read(proc->stdout_fd(), chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      const size_t scanned = buf.size();  // only the new bytes can hold a newline
      buf.append(chunk, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl, from = scanned; (nl = buf.find('\n', from)) != std::string::npos;
           start = from = nl + 1) {
        handle_line(std::string_view(buf).substr(start, nl - start));
        std::lock_guard<std::mutex> lock(mu);
        if (dead) return;
      }
      buf.erase(0, start);
      if (buf.size() > options.max_message_bytes) {
        return protocol_error(fmt::format("a message exceeded the {} byte limit", options.max_message_bytes));
      }
    }
    proc->wait(2000);
    std::string tail;
    {
      // A plugin that exited has closed its stderr too, but the stderr thread may not have read
      // its last lines yet (a crash message written just before exit): wait for it, briefly, since
      // a process it started could still hold the pipe open.
      std::unique_lock<std::mutex> lock(mu);
      if (proc->exited()) stderr_cv.wait_for(lock, std::chrono::seconds(1), [&] { return stderr_eof; });
      tail = stderr_tail;
    }
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
    fail_all(fmt::format("plugin '{}' {}{}", options.name,
                         proc->exited() ? proc->describe_exit() : "closed its output",
                         tail.empty() ? "" : "; its last stderr: " + tail));
  }

  void stderr_line(const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stderr_tail += line + "\n";
      if (stderr_tail.size() > 4096) stderr_tail.erase(0, stderr_tail.size() - 4096);
    }
    if (options.on_stderr)
      options.on_stderr(line);
    else
      log_debug("plugin '{}' stderr: {}", options.name, line);
  }

  void stderr_loop() {
    std::string buf;
    char chunk[8192];
    for (;;) {
      ssize_t n = ::read(proc->stderr_fd(), chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
        stderr_line(buf.substr(start, nl - start));
      buf.erase(0, start);
      if (buf.size() > 65536) buf.erase(0, buf.size() - 4096);  // a log line without end: keep the tail
    }
    if (!buf.empty()) stderr_line(buf);  // the last line, without its newline
    {
      std::lock_guard<std::mutex> lock(mu);
      stderr_eof = true;
    }
    stderr_cv.notify_all();
  }
};

McpClient::McpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

McpClient::~McpClient() {
  {
    std::lock_guard<std::mutex> lock(impl_->write_mu);
    impl_->proc->close_stdin();
  }
  if (!impl_->proc->wait(300)) {
    impl_->proc->kill_tree(SIGTERM);
    if (!impl_->proc->wait(500)) impl_->proc->kill_tree(SIGKILL);
  }
  impl_->proc->kill_tree(SIGKILL);  // anything left in the group
  if (impl_->reader.joinable()) impl_->reader.join();
  if (impl_->err_reader.joinable()) impl_->err_reader.join();
  impl_->fail_all("plugin stopped");
}

Result<std::unique_ptr<McpClient>> McpClient::start(const std::vector<std::string>& argv,
                                                    const std::vector<std::string>& env,
                                                    const std::string& cwd, McpClientOptions options) {
  ::signal(SIGPIPE, SIG_IGN);  // a dead plugin must give EPIPE, not kill the agent
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  SpawnOptions so{.argv = argv, .env = env, .cwd = cwd};
  auto proc = ChildProcess::spawn(so);
  if (!proc.ok()) return proc.status().with_context(fmt::format("plugin '{}'", impl->options.name));
  impl->proc = std::move(*proc);
  Impl* raw = impl.get();
  impl->reader = std::thread([raw] { raw->read_loop(); });
  impl->err_reader = std::thread([raw] { raw->stderr_loop(); });
  auto client = std::unique_ptr<McpClient>(new McpClient(std::move(impl)));

  json params = {{"protocolVersion", kMcpProtocolVersion},
                 {"capabilities", {{"roots", {{"listChanged", false}}}}},
                 {"clientInfo", {{"name", "fathom-agent"}, {"version", "0.1.0"}}}};
  auto init = client->request("initialize", params, client->impl_->options.init_timeout_ms);
  if (!init.ok()) return init.status().with_context("initialize");
  const json& r = *init;
  if (!r.is_object() || !r.contains("protocolVersion") || !r["protocolVersion"].is_string())
    return corrupt("plugin '{}': initialize result has no protocolVersion: {}", raw->options.name,
                   excerpt(r.dump()));
  const std::string version = r["protocolVersion"];
  const auto& supported = mcp_supported_versions();
  if (std::find(supported.begin(), supported.end(), version) == supported.end())
    return unimplemented("plugin '{}' speaks MCP {}, the agent supports {}", raw->options.name, version,
                         fmt::join(supported, ", "));
  raw->version = version;
  raw->server_info = r.value("serverInfo", json::object());
  raw->instructions = r.value("instructions", "");
  if (!r.value("capabilities", json::object()).contains("tools"))
    log_warn("plugin '{}' does not declare the tools capability", raw->options.name);
  TRY(client->notify("notifications/initialized", json::object()));
  return client;
}

Result<json> McpClient::request(const std::string& method, json params, int timeout_ms,
                                const ProgressFn& on_progress, const std::atomic<bool>* cancel,
                                std::string* raw) {
  auto p = std::make_shared<Pending>();
  p->on_progress = on_progress;
  p->want_raw = raw != nullptr;
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->dead) return unavailable("{}", impl_->dead_reason);
    id = impl_->next_id++;
    impl_->pending[id] = p;
  }
  if (on_progress) {
    if (!params.is_object()) params = json::object();
    params["_meta"]["progressToken"] = id;
  }
  json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  if (!params.is_null()) msg["params"] = std::move(params);
  if (Status s = impl_->send(msg); !s.ok()) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->pending.erase(id);
    return s;
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms);
  const auto hard_deadline = start + std::chrono::milliseconds(static_cast<int64_t>(timeout_ms) * 10);
  std::unique_lock<std::mutex> lock(impl_->mu);
  std::string give_up;
  while (!p->result) {
    const auto wake = clock::now() + std::chrono::milliseconds(cancel ? 50 : 1000);
    p->cv.wait_until(lock, timeout_ms > 0 ? std::min(wake, deadline) : wake);
    if (p->result) break;
    if (p->progressed && timeout_ms > 0) {  // progress resets the timeout, up to 10x in total
      p->progressed = false;
      deadline = std::min(hard_deadline, clock::now() + std::chrono::milliseconds(timeout_ms));
    }
    if (cancel && cancel->load())
      give_up = "cancelled by the agent";
    else if (timeout_ms > 0 && clock::now() >= deadline)
      give_up = fmt::format("timed out after {} ms", timeout_ms);
    if (!give_up.empty()) break;
  }
  if (p->result) {
    if (raw != nullptr) *raw = std::move(p->raw);
    return std::move(*p->result);
  }
  impl_->pending.erase(id);
  lock.unlock();
  (void)notify("notifications/cancelled", {{"requestId", id}, {"reason", give_up}});
  const std::string what = fmt::format("plugin '{}': {} {}", impl_->options.name, method, give_up);
  return give_up.starts_with("cancelled") ? Status(StatusCode::kCancelled, what)
                                          : Status(StatusCode::kTimeout, what);
}

Status McpClient::notify(const std::string& method, json params) {
  json msg = {{"jsonrpc", "2.0"}, {"method", method}};
  if (!params.is_null()) msg["params"] = std::move(params);
  return impl_->send(msg);
}

Result<std::vector<McpTool>> McpClient::list_tools(int timeout_ms) {
  std::vector<McpTool> tools;
  json cursor;
  for (int page = 0; page < 1000; ++page) {
    json params = json::object();
    if (!cursor.is_null()) params["cursor"] = cursor;
    std::string raw;
    json r = TRY(request("tools/list", params, timeout_ms, {}, nullptr, &raw));
    if (!r.is_object() || !r.contains("tools") || !r["tools"].is_array())
      return corrupt("plugin '{}': tools/list result has no 'tools' array", impl_->options.name);
    // The same line with its key order kept, for the input schemas (`r` is sorted).
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw, nullptr, false);
    const nlohmann::ordered_json* ordered_tools =
        ordered.is_object() && ordered.contains("result") && ordered["result"].contains("tools") &&
                ordered["result"]["tools"].is_array() &&
                ordered["result"]["tools"].size() == r["tools"].size()
            ? &ordered["result"]["tools"]
            : nullptr;
    for (size_t i = 0; i < r["tools"].size(); ++i) {
      const json& t = r["tools"][i];
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
        return corrupt("plugin '{}': tools/list entry without a name: {}", impl_->options.name,
                       excerpt(t.dump()));
      McpTool tool{.name = t["name"]};
      if (t.contains("description") && t["description"].is_string()) tool.description = t["description"];
      if (t.contains("inputSchema") && t["inputSchema"].is_object()) {
        const nlohmann::ordered_json* o = ordered_tools != nullptr ? &(*ordered_tools)[i] : nullptr;
        if (o != nullptr && o->is_object() && o->contains("inputSchema")) {
          tool.input_schema = (*o)["inputSchema"];
        } else {
          tool.input_schema = t["inputSchema"];
        }
      }
      tools.push_back(std::move(tool));
    }
    if (!r.contains("nextCursor") || r["nextCursor"].is_null()) return tools;
    if (r["nextCursor"] == cursor)
      return corrupt("plugin '{}': tools/list repeats cursor {}", impl_->options.name, cursor.dump());
    cursor = r["nextCursor"];
  }
  return corrupt("plugin '{}': tools/list did not end after 1000 pages", impl_->options.name);
}

Result<McpToolResult> McpClient::call_tool(const std::string& name, const json& arguments, int timeout_ms,
                                           const ProgressFn& on_progress, const std::atomic<bool>* cancel) {
  json r =
      TRY(request("tools/call", {{"name", name}, {"arguments", arguments}}, timeout_ms, on_progress, cancel));
  if (!r.is_object()) return corrupt("plugin '{}': tools/call result is not an object", impl_->options.name);
  McpToolResult out;
  if (r.contains("content") && r["content"].is_array()) out.content = r["content"];
  out.is_error = r.value("isError", false);
  if (r.contains("structuredContent")) out.structured = r["structuredContent"];
  return out;
}

Status McpClient::ping(int timeout_ms) {
  TRY(request("ping", json(), timeout_ms));
  return {};
}

bool McpClient::alive() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->dead;
}
pid_t McpClient::pid() const {
  return impl_->proc->pid();
}
const std::string& McpClient::protocol_version() const {
  return impl_->version;
}
const json& McpClient::server_info() const {
  return impl_->server_info;
}
const std::string& McpClient::instructions() const {
  return impl_->instructions;
}
std::string McpClient::stderr_tail() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stderr_tail;
}
void McpClient::kill(const std::string& reason) {
  impl_->proc->kill_tree(SIGKILL);
  impl_->fail_all(reason);
}

}  // namespace fathom::agent
