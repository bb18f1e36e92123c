// Permissions: a policy decides allow, ask or deny for every tool call, from rules matching the
// namespaced tool name (glob) and argument values (glob, or a regex after "re:"); the first
// matching rule wins, then the plugin's own default (manifest, or allow for --plugin). Every
// decision is appended to an audit log (JSONL). Internal to the agent component.
//
// Policy file (TOML or JSON):
//   default = "ask"                       # optional: overrides every plugin default
//   [[rule]]
//   tool = "shell__run"                   # glob on <plugin>__<tool>
//   args = { command = "*rm -rf*" }       # every listed argument must match
//   decision = "deny"
//   reason = "no recursive deletes"
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

enum class Decision { kAllow, kAsk, kDeny };
std::string_view decision_name(Decision d);
Result<Decision> parse_decision(std::string_view s, std::string_view where);

struct PolicyRule {
  std::string tool;                         // glob
  std::map<std::string, std::string> args;  // argument name -> glob or "re:REGEX"
  Decision decision = Decision::kAsk;
  std::string reason;
};

struct Verdict {
  Decision decision;
  std::string why;  // "rule 2 (no recursive deletes)" or "plugin default"
};

class Policy {
 public:
  static Result<Policy> load(const std::string& path);
  static Result<Policy> from_json(const nlohmann::json& j, const std::string& source);
  static Result<Policy> from_json_unchecked(const nlohmann::json& j, const std::string& source);
  Verdict decide(const std::string& tool, const nlohmann::json& args,
                 const std::string& plugin_default) const;

 private:
  std::vector<PolicyRule> rules_;
  std::optional<Decision> default_;
};

class AuditLog {
 public:
  static Result<std::unique_ptr<AuditLog>> open(const std::string& path);  // "" -> discards
  void record(const nlohmann::json& entry);                                // adds "ts"; one line, flushed

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;

 public:
  ~AuditLog();
};

}  // namespace fathom::agent
