// Helpers for the agent end-to-end tests. See e2e_util.h.
#include "e2e_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/command_runner.h"
#include "agent/process.h"
#include "base/strings.h"

namespace fathom::agent::test {

json tool_calls_message(const std::vector<std::pair<std::string, std::string>>& calls,
                        const std::string& text) {
  json tc = json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    tc.push_back({{"id", "call_" + std::to_string(i) + "_" + calls[i].first},
                  {"type", "function"},
                  {"function", {{"name", calls[i].first}, {"arguments", calls[i].second}}}});
  return {{"role", "assistant"}, {"content", text.empty() ? json() : json(text)}, {"tool_calls", tc}};
}

json text_message(const std::string& text) {
  return {{"role", "assistant"}, {"content", text}};
}

ScriptedEndpoint::Step reply(json message) {
  return [message](const json&) { return message; };
}

namespace {

// The message as an SSE stream: text in small pieces, each tool call's name then its arguments in
// two halves, the way real servers fragment them.
std::string to_sse(const json& m, int64_t prompt_tokens) {
  std::string out;
  auto chunk = [&](json delta, json finish = nullptr) {
    json c = {{"id", "chatcmpl-test"},
              {"object", "chat.completion.chunk"},
              {"model", "scripted"},
              {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
    out += "data: " + c.dump() + "\n\n";
  };
  chunk({{"role", "assistant"}});
  if (m.contains("content") && m["content"].is_string()) {
    const std::string t = m["content"];
    // Pieces of about 7 bytes, whole characters each (servers send deltas of whole characters).
    for (size_t i = 0, next; i < t.size(); i = next) {
      next = utf8_ceil(t, std::max(utf8_floor(t, i + 7), i + 1));
      chunk({{"content", t.substr(i, next - i)}});
    }
  }
  if (m.contains("tool_calls")) {
    for (size_t i = 0; i < m["tool_calls"].size(); ++i) {
      const json& tc = m["tool_calls"][i];
      const std::string args = tc["function"].value("arguments", "");
      const size_t half = utf8_floor(args, args.size() / 2);
      chunk({{"tool_calls",
              json::array({{{"index", i},
                            {"id", tc.value("id", "")},
                            {"type", "function"},
                            {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}}})}});
      chunk({{"tool_calls",
              json::array({{{"index", i}, {"function", {{"arguments", args.substr(0, half)}}}}})}});
      chunk(
          {{"tool_calls", json::array({{{"index", i}, {"function", {{"arguments", args.substr(half)}}}}})}});
    }
  }
  chunk(json::object(), m.contains("tool_calls") ? "tool_calls" : "stop");
  out += "data: " +
         json{{"id", "chatcmpl-test"},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", 10},
                {"total_tokens", prompt_tokens + 10}}}}
             .dump() +
         "\n\n";
  out += "data: [DONE]\n\n";
  return out;
}

}  // namespace

ScriptedEndpoint::ScriptedEndpoint(std::vector<Step> script, Mode mode)
    : script_(std::move(script)), mode_(mode) {
  server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    // Usage as a tokenizer would roughly count it: 4 characters of request per token.
    const int64_t prompt_tokens = static_cast<int64_t>(req.body.size() / 4);
    json message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(body);
      const size_t i = requests_.size() - 1;
      message = i < script_.size() ? script_[i](body) : text_message("script finished");
    }
    if (mode_ == Mode::kSse && body.value("stream", false)) {
      res.set_content(to_sse(message, prompt_tokens), "text/event-stream");
    } else {
      json full = {
          {"id", "chatcmpl-test"},
          {"object", "chat.completion"},
          {"model", "scripted"},
          {"choices",
           json::array({{{"index", 0},
                         {"message", message},
                         {"finish_reason", message.contains("tool_calls") ? "tool_calls" : "stop"}}})},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", 10},
            {"total_tokens", prompt_tokens + 10}}}};
      res.set_content(full.dump(), "application/json");
    }
  });
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

ScriptedEndpoint::~ScriptedEndpoint() {
  server_.stop();
  thread_.join();
}

std::string ScriptedEndpoint::url() const {
  return "http://127.0.0.1:" + std::to_string(port_) + "/v1";
}

std::vector<json> ScriptedEndpoint::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

std::vector<std::string>* made_dirs() {
  static auto* dirs = new std::vector<std::string>();  // read by the cleanup below at the very end
  return dirs;
}

namespace {
// The suite cleans up after itself: every make_temp_dir() is removed when the tests end.
class TempDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const auto& d : *made_dirs()) std::filesystem::remove_all(d, ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new TempDirCleanup);
}  // namespace

std::string fathom_bin() {
  const char* b = std::getenv("FATHOM_BIN");
  return b ? b : FATHOM_TEST_BIN;
}

std::string source_dir() {
  const char* s = std::getenv("FATHOM_SOURCE_DIR");
  return s ? s : FATHOM_TEST_SOURCE_DIR;
}

std::string npm_server(const std::string& name) {
  return source_dir() + "/tests/npm/agent/node_modules/@modelcontextprotocol/" + name + "/dist/index.js";
}

RunResult run_fathom(const std::vector<std::string>& args, const std::vector<std::string>& env, int timeout_s,
                     const std::string& wrapper) {
  CommandSpec spec;
  if (!wrapper.empty()) spec.argv.push_back(wrapper);
  spec.argv.push_back(fathom_bin());
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = environment_subset({"PATH", "HOME", "LANG"});
  spec.env.insert(spec.env.end(), env.begin(), env.end());
  spec.timeout_ms = int64_t{timeout_s} * 1000;
  spec.output_cap_bytes = 64 << 20;
  spec.sandbox.mode = "off";
  auto r = run_command(spec, nullptr, {});
  RunResult out;
  if (!r.ok()) {
    out.err = r.status().message();
    return out;
  }
  out.exit_code = r->timed_out ? -2 : r->exit_status;
  out.out = r->out;
  out.err = r->err;
  return out;
}

std::string make_temp_dir(const std::string& tag) {
  std::string tmpl = "/tmp/fathom-agent-" + tag + "-XXXXXX";
  char* d = ::mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  made_dirs()->push_back(tmpl);
  return tmpl;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> tool_messages(const json& request) {
  std::vector<std::string> out;
  for (const auto& m : request.value("messages", json::array()))
    if (m.value("role", "") == "tool") out.push_back(m.value("content", ""));
  return out;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

}  // namespace fathom::agent::test
