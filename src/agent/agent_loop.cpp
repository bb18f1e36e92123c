// The agent loop: model turns, parallel tool calls, limits, the context budget and the
// trajectory. See agent.h.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "agent/agent.h"
#include "agent/chat_client.h"
#include "agent/plugin_host.h"
#include "agent/policy.h"
#include "agent/sandbox.h"
#include "agent/tool_exec.h"
#include "agent/trajectory.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {

using json = nlohmann::json;

json AgentResult::to_json() const {
  return {{"status", status},
          {"final_text", final_text},
          {"steps", steps},
          {"tool_calls", tool_calls},
          {"tool_errors", tool_errors},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"context_truncations", context_truncations}};
}

struct Agent::Impl {
  AgentOptions options;
  std::unique_ptr<ChatClient> chat;
  std::unique_ptr<PluginHost> host;
  Policy policy;
  std::unique_ptr<AuditLog> audit;
  std::unique_ptr<Trajectory> trajectory;
  SandboxReport sandbox;
  json messages = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double chars_per_token = 3.5;  // calibrated from the server's usage

  void notice(const std::string& s) {
    if (options.on_notice) options.on_notice(s);
  }

  int64_t estimate_tokens(const nlohmann::ordered_json& tools) const {
    return static_cast<int64_t>(static_cast<double>(request_chars(tools)) / chars_per_token);
  }

  // Serialised size of the conversation and tools. Lossy (invalid UTF-8 becomes U+FFFD, as in the
  // request itself): text from plugins — an error quoting a malformed line, a stderr tail — is not
  // guaranteed to be UTF-8, and a strict dump would throw.
  size_t request_chars(const nlohmann::ordered_json& tools) const {
    constexpr auto kLossy = nlohmann::json::error_handler_t::replace;
    return messages.dump(-1, ' ', false, kLossy).size() + tools.dump(-1, ' ', false, kLossy).size();
  }

  // Keeps the conversation under the window: older tool outputs are cut to head and tail first,
  // then the oldest whole turns are dropped. Every decision is logged and recorded.
  void fit_context(const nlohmann::ordered_json& tools, int step, AgentResult& result) {
    const int64_t budget = options.context_tokens - options.reserve_tokens;
    if (estimate_tokens(tools) <= budget) return;
    size_t last_assistant = 0;
    for (size_t i = 0; i < messages.size(); ++i)
      if (messages[i].value("role", "") == "assistant") last_assistant = i;
    for (size_t i = 0; i < last_assistant && estimate_tokens(tools) > budget; ++i) {
      json& m = messages[i];
      if (m.value("role", "") != "tool" || !m["content"].is_string()) continue;
      std::string c = m["content"];
      if (c.size() <= 600) continue;
      const size_t head = utf8_floor(c, 200), tail = utf8_ceil(c, c.size() - 200);  // whole characters
      const size_t removed = tail - head;
      m["content"] = c.substr(0, head) +
                     fmt::format(
                         "\n[... {} characters of this older tool output were removed by fathom "
                         "to fit the context window ...]\n",
                         removed) +
                     c.substr(tail);
      result.context_truncations++;
      notice(fmt::format(
          "context: cut {} characters from an older tool result (message {}) to stay under {} tokens",
          removed, i, budget));
      if (trajectory)
        trajectory->write({{"type", "context"},
                           {"step", step},
                           {"action", "truncate_tool_output"},
                           {"message_index", i},
                           {"chars_removed", removed}});
    }
    // Then whole turns after the first user message: an assistant message and its tool results.
    size_t first_user = 0;
    while (first_user < messages.size() && messages[first_user].value("role", "") != "user") ++first_user;
    while (estimate_tokens(tools) > budget) {
      size_t start = first_user + 1;
      if (start >= messages.size() || start >= last_assistant) break;
      size_t end = start + 1;
      while (end < messages.size() && messages[end].value("role", "") == "tool") ++end;
      if (end > last_assistant) break;
      messages.erase(messages.begin() + static_cast<long>(start), messages.begin() + static_cast<long>(end));
      last_assistant -= end - start;
      result.context_truncations++;
      notice(
          fmt::format("context: dropped {} oldest message(s) to stay under {} tokens", end - start, budget));
      if (trajectory)
        trajectory->write(
            {{"type", "context"}, {"step", step}, {"action", "drop_messages"}, {"count", end - start}});
    }
    if (estimate_tokens(tools) > budget)
      log_warn("context: still about {} tokens after truncation (budget {}); sending anyway",
               estimate_tokens(tools), budget);
  }

  std::vector<ToolOutcome> run_tools(const json& calls, int step) {
    ToolExecContext ctx{.host = host.get(),
                        .policy = &policy,
                        .audit = audit.get(),
                        .yes = options.yes,
                        .confirm = options.confirm,
                        .on_notice = options.on_notice,
                        .timeout_ms = options.tool_timeout_ms,
                        .max_chars = options.tool_result_max_chars};
    std::vector<ToolOutcome> outcomes(calls.size());
    std::mutex confirm_mu;  // one question on the terminal at a time
    if (ctx.confirm) {
      auto inner = ctx.confirm;
      ctx.confirm = [inner, &confirm_mu](const std::string& q) {
        std::lock_guard<std::mutex> lock(confirm_mu);
        return inner(q);
      };
    }
    std::vector<std::thread> threads;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (trajectory)
        trajectory->write({{"type", "tool_call"},
                           {"step", step},
                           {"id", calls[i].value("id", "")},
                           {"name", calls[i]["function"].value("name", "")},
                           {"arguments", calls[i]["function"].value("arguments", json(""))}});
      threads.emplace_back([&, i] { outcomes[i] = execute_tool_call(ctx, calls[i]); });
    }
    for (auto& t : threads) t.join();
    for (const auto& o : outcomes)
      if (trajectory)
        trajectory->write({{"type", "tool_result"},
                           {"step", step},
                           {"id", o.id},
                           {"name", o.name},
                           {"decision", o.decision},
                           {"is_error", o.is_error},
                           {"content", o.text},
                           {"ms", o.ms}});
    return outcomes;
  }
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::create(AgentOptions options) {
  auto impl = std::make_unique<Impl>();
  char buf[4096];
  if (!::realpath(options.workspace.c_str(), buf))
    return errno_status(errno, "--workspace '" + options.workspace + "'");
  options.workspace = buf;
  if (!options.policy_path.empty()) impl->policy = TRY(Policy::load(options.policy_path));
  impl->audit = TRY(AuditLog::open(options.audit_path));
  if (!options.trajectory_path.empty()) impl->trajectory = TRY(Trajectory::open(options.trajectory_path));
  impl->chat = TRY(ChatClient::create(ChatClientOptions{.endpoint = options.endpoint,
                                                        .model = options.model,
                                                        .api_key = options.api_key,
                                                        .stream = options.stream,
                                                        .temperature = options.temperature}));
  SandboxProfile profile{.mode = options.sandbox_mode, .workspace = options.workspace};
  impl->sandbox = TRY(probe_sandbox(profile));
  std::vector<PluginManifest> plugins;
  for (const auto& spec : options.plugins) {
    PluginManifest m = TRY(manifest_from_command_line(spec, options.workspace));
    m.sandbox.mode = options.sandbox_mode;
    plugins.push_back(std::move(m));
  }
  PluginHostOptions ho{.workspace = options.workspace,
                       .plugins_dir = options.plugins_dir,
                       .sandbox = profile,
                       .tool_timeout_ms = options.tool_timeout_ms,
                       .on_event = options.on_notice};
  if (impl->trajectory) {
    json manifests = json::array();
    for (const auto& m : plugins) manifests.push_back(m.to_json());
    impl->trajectory->write({{"type", "meta"},
                             {"version", 1},
                             {"endpoint", options.endpoint},
                             {"model", options.model},
                             {"workspace", options.workspace},
                             {"plugins", options.plugins},
                             {"plugins_dir", options.plugins_dir},
                             {"sandbox", impl->sandbox.summary()}});
  }
  impl->host = TRY(PluginHost::create(ho, std::move(plugins)));
  for (const auto& s : impl->host->status())
    if (s.state != "running")
      impl->notice(fmt::format("plugin '{}' is {}: {}", s.name, s.state, s.last_error));
  const std::string system =
      !options.system_prompt.empty()
          ? options.system_prompt
          : fmt::format(
                "You are an agent working in the directory {}. Use the tools to act; tool "
                "results that start with 'Error:' explain what went wrong. When the task is "
                "done, answer without calling tools.",
                options.workspace);
  impl->messages.push_back({{"role", "system"}, {"content", system}});
  impl->options = std::move(options);
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

std::string Agent::sandbox_summary() const {
  return impl_->sandbox.summary();
}

std::vector<std::string> Agent::tool_names() const {
  std::vector<std::string> out;
  for (const auto& t : impl_->host->tools()) out.push_back(t.name);
  return out;
}

Result<AgentResult> Agent::run(const std::string& task) {
  Impl& s = *impl_;
  AgentResult result;
  Timer timer;
  s.messages.push_back({{"role", "user"}, {"content", task}});
  if (s.trajectory) s.trajectory->write({{"type", "user"}, {"content", task}});
  for (;;) {
    if (result.steps >= s.options.max_steps) {
      result.status = "step_limit";
      s.notice(fmt::format("stopping: step limit of {} model requests reached", s.options.max_steps));
      break;
    }
    if (s.options.max_seconds > 0 && timer.elapsed_s() > s.options.max_seconds) {
      result.status = "time_limit";
      s.notice(fmt::format("stopping: time limit of {} s reached", s.options.max_seconds));
      break;
    }
    const int step = ++result.steps;
    const nlohmann::ordered_json tools = openai_tool_specs(s.host->tools());
    s.fit_context(tools, step, result);
    if (s.trajectory)
      s.trajectory->write(
          {{"type", "model_request"}, {"step", step}, {"body", s.chat->request_body(s.messages, tools)}});
    const size_t request_chars = s.request_chars(tools);
    auto response = s.chat->complete(s.messages, tools, s.options.on_text);
    if (!response.ok()) {
      if (s.trajectory)
        s.trajectory->write(
            {{"type", "model_error"}, {"step", step}, {"error", response.status().message()}});
      return response.status();
    }
    if (s.trajectory)
      s.trajectory->write({{"type", "model_response"},
                           {"step", step},
                           {"message", response->message},
                           {"finish_reason", response->finish_reason},
                           {"usage", response->usage},
                           {"streamed", response->streamed},
                           {"ms", response->ms}});
    if (response->usage.is_object()) {
      const int64_t p = response->usage.value("prompt_tokens", int64_t{0});
      result.prompt_tokens += p;
      result.completion_tokens += response->usage.value("completion_tokens", int64_t{0});
      if (p > 0)
        s.chars_per_token = std::clamp(static_cast<double>(request_chars) / static_cast<double>(p), 1.0, 8.0);
    }
    json msg = response->message;
    if (!msg.is_object()) return corrupt("endpoint answer: the message is not an object");
    msg["role"] = "assistant";
    msg.erase("reasoning_content");  // DeepSeek asks clients not to send it back
    json calls =
        msg.contains("tool_calls") && msg["tool_calls"].is_array() ? msg["tool_calls"] : json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      if (!calls[i].is_object()) calls[i] = json::object();
      if (!calls[i].contains("id") || !calls[i]["id"].is_string() ||
          calls[i]["id"].get<std::string>().empty())
        calls[i]["id"] = fmt::format("call_{}_{}", step, i);
      calls[i]["type"] = "function";
      if (!calls[i].contains("function") || !calls[i]["function"].is_object())
        calls[i]["function"] = {{"name", ""}, {"arguments", ""}};
      if (!calls[i]["function"].contains("name") || !calls[i]["function"]["name"].is_string())
        calls[i]["function"]["name"] = "";
    }
    if (calls.empty()) {
      msg.erase("tool_calls");
      s.messages.push_back(msg);
      result.status = "final";
      result.final_text = msg.value("content", json("")).is_string() ? msg["content"].get<std::string>() : "";
      break;
    }
    msg["tool_calls"] = calls;
    s.messages.push_back(msg);
    for (const auto& o : s.run_tools(calls, step)) {
      result.tool_calls++;
      if (o.is_error) result.tool_errors++;
      s.messages.push_back({{"role", "tool"}, {"tool_call_id", o.id}, {"content", o.text}});
    }
    s.prompt_tokens = result.prompt_tokens;
    if (s.options.max_total_tokens > 0 &&
        s.prompt_tokens + result.completion_tokens + s.completion_tokens >= s.options.max_total_tokens) {
      result.status = "budget_limit";
      s.notice(fmt::format("stopping: token budget of {} reached", s.options.max_total_tokens));
      break;
    }
  }
  s.completion_tokens += result.completion_tokens;
  if (s.trajectory)
    s.trajectory->write({{"type", "final"}, {"result", result.to_json()}, {"ms", timer.elapsed_ms()}});
  return result;
}

}  // namespace fathom::agent
