// Executing one tool call the model made: name lookup, argument parsing and schema validation,
// the permission decision (audited), the call itself with progress and timeout, and the result
// as the text of a `tool` message. Shared by the agent loop and replay. Internal.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "agent/plugin_host.h"
#include "agent/policy.h"

namespace fathom::agent {

struct ToolExecContext {
  PluginHost* host = nullptr;
  const Policy* policy = nullptr;
  AuditLog* audit = nullptr;
  bool yes = false;
  std::function<bool(const std::string&)> confirm;  // null: no terminal
  std::function<void(const std::string&)> on_notice;
  int64_t timeout_ms = 120000;
  size_t max_chars = 100000;
  const std::atomic<bool>* cancel = nullptr;
};

struct ToolOutcome {
  std::string id, name;
  nlohmann::json arguments;  // parsed (null when they did not parse)
  std::string decision;      // allow | deny | ask->allow ... or "invalid"
  std::string text;          // the tool message content
  bool is_error = false;
  double ms = 0;
};

// call: {"id":..., "function":{"name":..., "arguments":"<json string>"}}
ToolOutcome execute_tool_call(const ToolExecContext& ctx, const nlohmann::json& call);

}  // namespace fathom::agent
