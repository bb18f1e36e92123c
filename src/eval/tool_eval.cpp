// The tool-use evaluation: held-out OpenAI requests to an OpenAI-compatible endpoint, each reply
// scored by its first tool call (right name, arguments that parse as a JSON object). The HTTP
// client is the agent's (retries, SSE or JSON); requests go one at a time so a server's
// --test-outputs hook sees them in order. Not a judge of argument values: only their syntax.
#include <nlohmann/json.hpp>

#include <fstream>

#include "agent/chat_client.h"
#include "base/timer.h"
#include "eval/eval.h"

namespace fathom::eval {

// Ordered: requests go out with their keys in the order the set holds them (tool parameters as
// declared), which a server may show the model.
using json = nlohmann::ordered_json;

std::string_view outcome_name(ToolOutcome o) {
  switch (o) {
    case ToolOutcome::kCorrect:
      return "correct";
    case ToolOutcome::kBadArgs:
      return "bad_arguments";
    case ToolOutcome::kWrongTool:
      return "wrong_tool";
    case ToolOutcome::kNoToolCall:
      return "no_tool_call";
  }
  return "?";
}

Result<std::vector<HeldoutRequest>> read_heldout(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("{}: cannot open the held-out set", path);
  std::vector<HeldoutRequest> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("{}:{}: not a JSON object", path, n);
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
      return invalid_argument("{}:{}: \"messages\" must be a non-empty array", path, n);
    if (!j.contains("tools") || !j["tools"].is_array() || j["tools"].empty())
      return invalid_argument("{}:{}: \"tools\" must be a non-empty array", path, n);
    if (!j.contains("expected_tool") || !j["expected_tool"].is_string() ||
        j["expected_tool"].get<std::string>().empty())
      return invalid_argument("{}:{}: \"expected_tool\" must be a tool name", path, n);
    out.push_back({j["messages"], j["tools"], j["expected_tool"].get<std::string>()});
  }
  if (out.empty()) return invalid_argument("{}: the held-out set is empty", path);
  return out;
}

ToolOutcome score_tool_reply(const json& message, std::string_view expected_tool, std::string* detail) {
  const json* calls =
      message.is_object() && message.contains("tool_calls") ? &message["tool_calls"] : nullptr;
  if (!calls || !calls->is_array() || calls->empty()) {
    const json content = message.is_object() ? message.value("content", json()) : json();
    *detail = "no tool call; content: " + (content.is_string() ? content.get<std::string>() : content.dump());
    return ToolOutcome::kNoToolCall;
  }
  const json& fn = (*calls)[0].is_object() ? (*calls)[0].value("function", json::object()) : json::object();
  const std::string name =
      fn.is_object() && fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
  if (name != expected_tool) {
    *detail = fmt::format("called '{}' instead of '{}'", name, expected_tool);
    return ToolOutcome::kWrongTool;
  }
  const json args_text = fn.is_object() ? fn.value("arguments", json()) : json();
  const json args =
      args_text.is_string() ? json::parse(args_text.get<std::string>(), nullptr, false) : json();
  if (!args.is_object()) {
    *detail = "arguments are not a JSON object: " +
              (args_text.is_string() ? args_text.get<std::string>() : args_text.dump());
    return ToolOutcome::kBadArgs;
  }
  detail->clear();
  return ToolOutcome::kCorrect;
}

namespace {

std::string last_user_text(const json& messages) {
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    if (it->is_object() && it->value("role", "") == "user" && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
  }
  return "";
}

void count(ToolOutcome o, bool any_call, ToolEvalResult* r) {
  ++r->n;
  if (any_call) ++r->n_any_call;
  switch (o) {
    case ToolOutcome::kCorrect:
      ++r->n_correct;
      break;
    case ToolOutcome::kBadArgs:
      ++r->n_bad_args;
      break;
    case ToolOutcome::kWrongTool:
      ++r->n_wrong_tool;
      break;
    case ToolOutcome::kNoToolCall:
      ++r->n_no_call;
      break;
  }
}

}  // namespace

Result<ToolEvalResult> evaluate_tools(std::span<const HeldoutRequest> requests, const ToolEvalParams& p) {
  if (p.url.empty()) return invalid_argument("--url is required (e.g. http://127.0.0.1:8000/v1)");
  auto client = TRY(agent::ChatClient::create({.endpoint = p.url,
                                               .model = p.model,
                                               .api_key = p.api_key,
                                               .stream = false,
                                               .timeout_s = p.timeout_s,
                                               .temperature = 0.0,
                                               .max_tokens = p.max_tokens}));
  ToolEvalResult r;
  Timer t;
  for (size_t i = 0; i < requests.size(); ++i) {
    const HeldoutRequest& q = requests[i];
    auto reply = client->complete(q.messages, q.tools, [](const std::string&) {});
    std::string detail;
    ToolOutcome o;
    bool any_call = false;
    if (!reply.ok()) {
      ++r.n_errors;
      o = ToolOutcome::kNoToolCall;
      detail = "request failed: " + reply.status().message();
    } else {
      o = score_tool_reply(reply->message, q.expected_tool, &detail);
      any_call = o != ToolOutcome::kNoToolCall;
    }
    count(o, any_call, &r);
    if (o != ToolOutcome::kCorrect && r.examples.size() < p.examples_max) {
      r.examples.push_back({{"index", i},
                            {"request", last_user_text(q.messages)},
                            {"expected_tool", q.expected_tool},
                            {"outcome", outcome_name(o)},
                            {"detail", detail}});
    }
  }
  r.seconds = t.elapsed_s();
  return r;
}

}  // namespace fathom::eval
