// Helpers for the agent end-to-end tests: a scripted OpenAI-compatible endpoint (a TEST DOUBLE:
// a real HTTP server on 127.0.0.1 that replays fixed assistant messages and records requests),
// running the fathom binary, temporary workspaces, and paths of the npm test peers.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fathom::agent::test {

using json = nlohmann::json;

// An assistant message with tool calls: {{"files__read_file", R"({"path":"a"})"}, ...}.
json tool_calls_message(const std::vector<std::pair<std::string, std::string>>& calls,
                        const std::string& text = "");
json text_message(const std::string& text);

class ScriptedEndpoint {
 public:
  enum class Mode { kSse, kPlainJson };
  // Each step sees the request and returns the assistant message to send. After the script
  // ends, every request gets text_message("script finished").
  using Step = std::function<json(const json& request)>;
  explicit ScriptedEndpoint(std::vector<Step> script, Mode mode = Mode::kSse);
  ~ScriptedEndpoint();
  std::string url() const;  // http://127.0.0.1:PORT/v1
  int port() const { return port_; }
  std::vector<json> requests();

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<Step> script_;
  std::vector<json> requests_;
  Mode mode_;
};

// A step that always returns the same message.
ScriptedEndpoint::Step reply(json message);

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs build/bin/fathom with args (and extra "K=V" env), killing it after timeout_s.
RunResult run_fathom(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                     int timeout_s = 120, const std::string& wrapper = "");

std::string fathom_bin();
std::string source_dir();
std::string npm_server(
    const std::string& name);  // .../node_modules/@modelcontextprotocol/<name>/dist/index.js
// A fresh directory under /tmp, removed when the test binary exits.
std::string make_temp_dir(const std::string& tag);
std::vector<std::string>* made_dirs();
void write_text(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);
// The tool messages of a recorded request, in order.
std::vector<std::string> tool_messages(const json& request);
std::vector<json> read_jsonl(const std::string& path);

}  // namespace fathom::agent::test
