// Policy rules and the audit log. See policy.h.
#include "agent/policy.h"

#include <fnmatch.h>
#include <toml++/toml.h>

#include <chrono>
#include <cstdio>

#include "agent/regex.h"
#include "agent/toml_json.h"
#include "base/fs.h"
#include "base/strings.h"

namespace fathom::agent {

using json = nlohmann::json;

std::string_view decision_name(Decision d) {
  switch (d) {
    case Decision::kAllow:
      return "allow";
    case Decision::kAsk:
      return "ask";
    case Decision::kDeny:
      return "deny";
  }
  return "?";
}

Result<Decision> parse_decision(std::string_view s, std::string_view where) {
  if (s == "allow") return Decision::kAllow;
  if (s == "ask") return Decision::kAsk;
  if (s == "deny") return Decision::kDeny;
  return invalid_argument("{}: decision '{}' is not one of allow, ask, deny", where, s);
}

namespace {

bool matches(const std::string& pattern, const std::string& value) {
  if (starts_with(pattern, "re:")) {
    auto re = Regex::compile(pattern.substr(3));  // validated when the policy was loaded
    return re.ok() && re->search(value);
  }
  return ::fnmatch(pattern.c_str(), value.c_str(), 0) == 0;
}

}  // namespace

Result<Policy> Policy::from_json(const json& j, const std::string& source) {
  try {
    return from_json_unchecked(j, source);
  } catch (const std::exception& e) {
    return invalid_argument("{}: {}", source, e.what());
  }
}

Result<Policy> Policy::from_json_unchecked(const json& j, const std::string& source) {
  Policy p;
  if (!j.is_object())
    return invalid_argument("{}: a policy is an object with 'default' and 'rule' entries", source);
  if (j.contains("default")) {
    if (!j["default"].is_string()) return invalid_argument("{}: 'default' must be a string", source);
    p.default_ = TRY(parse_decision(j["default"].get<std::string>(), source + ": default"));
  }
  json rules = j.contains("rule") ? j["rule"] : j.value("rules", json::array());
  if (!rules.is_array()) return invalid_argument("{}: 'rule' must be an array of tables", source);
  for (size_t i = 0; i < rules.size(); ++i) {
    const json& r = rules[i];
    const std::string where = fmt::format("{}: rule {}", source, i + 1);
    if (!r.is_object() || !r.contains("tool") || !r["tool"].is_string() || !r.contains("decision") ||
        !r["decision"].is_string())
      return invalid_argument("{}: needs string fields 'tool' and 'decision'", where);
    PolicyRule rule{.tool = r["tool"],
                    .decision = TRY(parse_decision(r["decision"].get<std::string>(), where)),
                    .reason = r.value("reason", "")};
    const json args = r.contains("args") && r["args"].is_object() ? r["args"] : json::object();
    for (auto it = args.begin(); it != args.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (!v.is_string()) return invalid_argument("{}: args.{} must be a pattern string", where, k);
      rule.args[k] = v.get<std::string>();
      if (starts_with(rule.args[k], "re:"))
        if (auto re = Regex::compile(rule.args[k].substr(3)); !re.ok())
          return invalid_argument("{}: args.{}: bad {}", where, k, re.status().message());
    }
    p.rules_.push_back(std::move(rule));
  }
  return p;
}

Result<Policy> Policy::load(const std::string& path) {
  const std::string text = TRY(read_file(path));
  json j;
  if (ends_with(path, ".toml")) {
    try {
      j = toml_to_json(toml::parse(text, path));
    } catch (const toml::parse_error& e) {
      return invalid_argument("{}: line {}: {}", path, e.source().begin.line, e.description());
    }
  } else {
    TRY(check_json_nesting(text, path));
    j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return invalid_argument("{}: not valid JSON", path);
  }
  return from_json(j, path);
}

Verdict Policy::decide(const std::string& tool, const json& args, const std::string& plugin_default) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    const PolicyRule& r = rules_[i];
    if (::fnmatch(r.tool.c_str(), tool.c_str(), 0) != 0) continue;
    bool all = true;
    for (const auto& [k, pattern] : r.args) {
      if (!args.is_object() || !args.contains(k)) {
        all = false;
        break;
      }
      const json& v = args[k];
      if (!matches(pattern, v.is_string() ? v.get<std::string>() : v.dump())) all = false;
    }
    if (all)
      return {r.decision,
              fmt::format("policy rule {}{}", i + 1, r.reason.empty() ? "" : " (" + r.reason + ")")};
  }
  if (default_) return {*default_, "policy default"};
  auto d = parse_decision(plugin_default, "plugin");
  return {d.ok() ? *d : Decision::kAsk, "plugin default"};
}

Result<std::unique_ptr<AuditLog>> AuditLog::open(const std::string& path) {
  auto log = std::make_unique<AuditLog>();
  if (path.empty()) return log;
  log->file_ = std::fopen(path.c_str(), "a");
  if (!log->file_) return errno_status(errno, "audit log '" + path + "'");
  return log;
}

AuditLog::~AuditLog() {
  if (file_) std::fclose(file_);
}

void AuditLog::record(const json& entry) {
  if (!file_) return;
  json e = entry;
  e["ts"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string line = e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace fathom::agent
