// The agent harness: a model behind any OpenAI-compatible endpoint turned into an agent whose
// tools are MCP plugins (sandboxed processes), with permissions, a context budget, and a JSONL
// trajectory that `replay_trajectory` re-runs without the model.
//
// Agent::run(task) appends the task to the conversation, then loops: ask the model (streaming
// its text through on_text), run the tool calls it made (several per turn in parallel), feed the
// results back as `tool` messages, until the model answers without tool calls or a limit is hit
// (steps, tokens, seconds). Every failure on the tool side (unknown tool, malformed arguments,
// schema violation, denial, timeout, plugin crash) becomes a tool result the model sees; the loop
// goes on. Endpoint failures end run() with an error. Not thread-safe: one run at a time.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

struct AgentOptions {
  std::string endpoint = "http://127.0.0.1:8000/v1";
  std::string model = "default";  // fathom serve answers to "default"
  std::string api_key;
  std::vector<std::string> plugins;  // "[NAME=]CMD ARGS", allowed by default
  std::string plugins_dir;           // manifests; watched for hot-swap
  std::string workspace = ".";
  std::string policy_path;
  std::string trajectory_path;        // JSONL; "" -> none
  std::string audit_path;             // JSONL; "" -> none
  std::string sandbox_mode = "auto";  // auto | require | off
  std::string system_prompt;          // "" -> a short default naming the workspace
  int max_steps = 30;                 // model requests per run()
  int64_t max_total_tokens = 0;       // prompt + completion over the session; 0: none
  double max_seconds = 0;             // per run(); 0: none
  int64_t context_tokens = 32768;     // the model's window
  int64_t reserve_tokens = 4096;      // kept free for the answer
  int64_t tool_timeout_ms = 120000;
  size_t tool_result_max_chars = 100000;
  bool stream = true;
  std::optional<double> temperature;  // sent with each model request; unset: the server's default
                                      // (`fathom agent` sends 0 unless --temperature server)
  bool yes = false;                                   // an `ask` decision becomes allow without a terminal
  std::function<void(const std::string&)> on_text;    // streamed model text
  std::function<void(const std::string&)> on_notice;  // progress and decisions (stderr)
  std::function<bool(const std::string&)> confirm;    // interactive ask; null: no terminal
};

struct AgentResult {
  std::string status;  // final | step_limit | budget_limit | time_limit
  std::string final_text;
  int steps = 0, tool_calls = 0, tool_errors = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int context_truncations = 0;
  nlohmann::json to_json() const;
};

class Agent {
 public:
  static Result<std::unique_ptr<Agent>> create(AgentOptions options);
  ~Agent();
  Result<AgentResult> run(const std::string& task);
  // "active: ...; NOT active: ..." from the sandbox probe at start.
  std::string sandbox_summary() const;
  std::vector<std::string> tool_names() const;

  struct Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ReplayOptions {
  std::string trajectory_path;
  std::string workspace;             // "" -> the recorded one
  std::vector<std::string> plugins;  // empty -> the recorded plugins
  std::string plugins_dir;
  std::string sandbox_mode = "auto";
  int64_t tool_timeout_ms = 120000;
  std::function<void(const std::string&)> on_notice;
};

struct ReplayReport {
  int model_turns = 0, tool_calls = 0, identical = 0, differed = 0, skipped = 0;
  std::vector<std::string> differences;  // one line each: call id, tool, first differing line
  nlohmann::json to_json() const;
};

Result<ReplayReport> replay_trajectory(const ReplayOptions& options);

}  // namespace fathom::agent
