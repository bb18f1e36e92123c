// replay_trajectory: re-runs a recorded agent run without a model. The recorded model responses
// stand in for the model; every tool call they contain is executed again (same plugins, same
// workspace unless overridden) and its result compared with the recorded one. Calls that were
// denied are not executed (counted as skipped).
#include <map>

#include "agent/agent.h"
#include "agent/plugin_host.h"
#include "agent/policy.h"
#include "agent/sandbox.h"
#include "agent/tool_exec.h"
#include "agent/trajectory.h"
#include "base/strings.h"

namespace fathom::agent {

using json = nlohmann::json;

json ReplayReport::to_json() const {
  return {{"model_turns", model_turns}, {"tool_calls", tool_calls}, {"identical", identical},
          {"differed", differed},       {"skipped", skipped},       {"differences", differences}};
}

namespace {

std::string first_difference(const std::string& a, const std::string& b) {
  auto la = split(a, '\n'), lb = split(b, '\n');
  for (size_t i = 0; i < std::max(la.size(), lb.size()); ++i) {
    std::string_view x = i < la.size() ? la[i] : "<end>", y = i < lb.size() ? lb[i] : "<end>";
    if (x != y)
      return fmt::format("line {}: recorded '{}' now '{}'", i + 1, std::string(x.substr(0, 120)),
                         std::string(y.substr(0, 120)));
  }
  return "same text";
}

}  // namespace

namespace {
Result<ReplayReport> replay_unchecked(const ReplayOptions& o);
}

Result<ReplayReport> replay_trajectory(const ReplayOptions& o) {
  try {
    return replay_unchecked(o);
  } catch (const std::exception& e) {
    return corrupt("{}: malformed trajectory: {}", o.trajectory_path, e.what());
  }
}

namespace {
Result<ReplayReport> replay_unchecked(const ReplayOptions& o) {
  const std::vector<json> events = TRY(read_trajectory(o.trajectory_path));
  const json& meta = events[0];
  const std::string workspace = o.workspace.empty() ? meta.value("workspace", ".") : o.workspace;
  std::vector<std::string> specs =
      o.plugins.empty() ? meta.value("plugins", std::vector<std::string>{}) : o.plugins;
  std::vector<PluginManifest> plugins;
  for (const auto& spec : specs) {
    PluginManifest m = TRY(manifest_from_command_line(spec, workspace));
    m.sandbox.mode = o.sandbox_mode;
    plugins.push_back(std::move(m));
  }
  const std::string dir = o.plugins_dir.empty() ? meta.value("plugins_dir", "") : o.plugins_dir;
  PluginHostOptions ho{.workspace = workspace,
                       .plugins_dir = dir,
                       .sandbox = {.mode = o.sandbox_mode, .workspace = workspace},
                       .tool_timeout_ms = o.tool_timeout_ms,
                       .on_event = o.on_notice};
  auto host = TRY(PluginHost::create(ho, std::move(plugins)));
  Policy allow_all = TRY(Policy::from_json({{"default", "allow"}}, "replay"));
  auto audit = TRY(AuditLog::open(""));
  ToolExecContext ctx{.host = host.get(),
                      .policy = &allow_all,
                      .audit = audit.get(),
                      .yes = true,
                      .on_notice = o.on_notice,
                      .timeout_ms = o.tool_timeout_ms};
  std::map<std::string, json> recorded;  // call id -> tool_result event
  for (const auto& e : events)
    if (e.value("type", "") == "tool_result") recorded[e.value("id", "")] = e;
  ReplayReport report;
  for (const auto& e : events) {
    if (e.value("type", "") != "model_response") continue;
    report.model_turns++;
    const json msg = e.value("message", json::object());
    const json calls =
        msg.contains("tool_calls") && msg["tool_calls"].is_array() ? msg["tool_calls"] : json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      json call = calls[i];
      if (call.value("id", "").empty()) call["id"] = fmt::format("call_{}_{}", e.value("step", 0), i);
      const std::string id = call["id"];
      report.tool_calls++;
      auto it = recorded.find(id);
      if (it == recorded.end()) {
        report.skipped++;
        report.differences.push_back(fmt::format("{}: no recorded result (the run stopped before it)", id));
        continue;
      }
      const std::string decision = it->second.value("decision", "");
      if (starts_with(decision, "deny") || starts_with(decision, "ask->deny")) {
        report.skipped++;
        continue;
      }
      ToolOutcome now = execute_tool_call(ctx, call);
      const std::string was = it->second.value("content", "");
      if (now.text == was && now.is_error == it->second.value("is_error", false)) {
        report.identical++;
      } else {
        report.differed++;
        report.differences.push_back(fmt::format("{} {}: {}", id, now.name, first_difference(was, now.text)));
      }
    }
  }
  return report;
}

}  // namespace

}  // namespace fathom::agent
