// `fathom chat`: a terminal chat client for any OpenAI-compatible endpoint (ours by default);
// replies stream as they are generated. /reset clears the conversation, /exit quits.
#include <httplib.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli/args.h"
#include "cli/command.h"

namespace fathom::cli {
namespace {

using nlohmann::json;

struct ChatOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string model = "default";
  std::string api_key;
  std::string system;
  double temperature = 0.7;
  int64_t max_tokens = 512;
};

// Streams one reply; returns the assistant text.
Result<std::string> ask(httplib::Client& cli, const ChatOptions& o, const json& messages) {
  json body = {{"model", o.model}, {"messages", messages}, {"stream", true}, {"temperature", o.temperature},
               {"max_tokens", o.max_tokens}};
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  std::string reply, buffer, error_body;
  int status = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = headers;
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        buffer.append(data, n);
        size_t nl;
        while ((nl = buffer.find("\n\n")) != std::string::npos) {
          std::string event = buffer.substr(0, nl);
          buffer.erase(0, nl + 2);
          if (event.rfind("data: ", 0) != 0) continue;
          const std::string payload = event.substr(6);
          if (payload == "[DONE]") return true;
          json j = json::parse(payload, nullptr, false);
          if (j.is_discarded()) continue;
          if (j.contains("error")) {
            error_body = j["error"].value("message", payload);
            return false;
          }
          if (!j.contains("choices") || j["choices"].empty()) continue;
          const json& d = j["choices"][0]["delta"];
          if (d.contains("content") && d["content"].is_string()) {
            const std::string piece = d["content"].get<std::string>();
            reply += piece;
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
          }
          if (d.contains("tool_calls")) {
            for (const auto& tc : d["tool_calls"]) {
              if (tc.contains("function") && tc["function"].contains("name")) {
                std::printf("\n[tool call: %s ", tc["function"]["name"].get<std::string>().c_str());
              }
              if (tc.contains("function") && tc["function"].contains("arguments")) {
                std::printf("%s", tc["function"]["arguments"].get<std::string>().c_str());
              }
            }
          }
        }
        return true;
      };
  auto res = cli.send(req);
  if (!res) return unavailable("cannot reach {}: {}", o.url, httplib::to_string(res.error()));
  status = res->status;
  if (status != 200) {
    const std::string raw = res->body.empty() ? buffer : res->body;  // the receiver may have taken it
    json j = json::parse(raw, nullptr, false);
    const std::string msg = !j.is_discarded() && j.contains("error") ? j["error"].value("message", raw) : raw;
    return unavailable("HTTP {}: {}", status, msg);
  }
  if (!error_body.empty()) return internal_error("{}", error_body);
  std::printf("\n");
  return reply;
}

int run_chat(int argc, char** argv) {
  ChatOptions o;
  Args args(argv[0], "Chat in the terminal with an OpenAI-compatible server (fathom serve by default).\n"
                     "Type a message and Enter; /reset starts over, /exit (or Ctrl-D) quits.");
  args.option("--url", &o.url, "server base URL", "URL");
  args.option("--model", &o.model, "model name", "NAME");
  args.option("--api-key", &o.api_key, "API key (or FATHOM_API_KEY)", "KEY");
  args.option("--system", &o.system, "system prompt", "TEXT");
  args.option("--temperature", &o.temperature, "sampling temperature");
  args.option("--max-tokens", &o.max_tokens, "longest reply");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (o.api_key.empty()) {
    if (const char* k = std::getenv("FATHOM_API_KEY")) o.api_key = k;
  }
  httplib::Client cli(o.url);
  cli.set_read_timeout(600, 0);
  if (!cli.is_valid()) return fail(args.command(), invalid_argument("'{}' is not a valid URL", o.url));
  const bool tty = isatty(STDIN_FILENO);
  json messages = json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  std::string line;
  while (true) {
    if (tty) std::printf("> "), std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = json::array();
      if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto reply = ask(cli, o, messages);
    if (!reply.ok()) {
      messages.erase(messages.end() - 1);
      std::fprintf(stderr, "fathom chat: %s\n", reply.status().message().c_str());
      if (!tty) return 1;
      continue;
    }
    messages.push_back({{"role", "assistant"}, {"content", *reply}});
  }
  return 0;
}

}  // namespace

FATHOM_COMMAND("chat", "Chat in the terminal with an OpenAI-compatible server", run_chat);

}  // namespace fathom::cli
