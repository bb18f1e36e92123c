// execute_tool_call: see tool_exec.h. Every failure becomes a tool error the model reads.
#include "agent/tool_exec.h"

#include "agent/schema.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {

using json = nlohmann::json;

namespace {

// Keeps the first and last max_chars/2 bytes, cut at character boundaries: half a UTF-8 sequence
// would make the conversation unserialisable (the request, the context estimate, the trajectory).
std::string cap_text(std::string s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  const size_t head = utf8_floor(s, max_chars / 2), tail = utf8_ceil(s, s.size() - max_chars / 2);
  return s.substr(0, head) +
         fmt::format("\n[... {} characters of tool output cut by fathom ...]\n", tail - head) +
         s.substr(tail);
}

}  // namespace

namespace {
ToolOutcome execute_unchecked(const ToolExecContext& ctx, const json& call);
}

ToolOutcome execute_tool_call(const ToolExecContext& ctx, const json& call) {
  try {
    return execute_unchecked(ctx, call);
  } catch (const std::exception& e) {  // a field of the wrong type in the model's call
    ToolOutcome out;
    out.text = std::string("Error: malformed tool call: ") + e.what();
    out.is_error = true;
    out.decision = "invalid";
    log_warn("malformed tool call {}: {}", utf8_prefix(call.dump(), 200), e.what());
    return out;
  }
}

namespace {
ToolOutcome execute_unchecked(const ToolExecContext& ctx, const json& call) {
  Timer t;
  ToolOutcome out;
  out.id = call.value("id", "");
  const json fn = call.value("function", json::object());
  out.name = fn.is_object() ? fn.value("name", "") : "";
  auto error = [&](const std::string& text, const std::string& decision) {
    out.text = "Error: " + text;
    out.is_error = true;
    out.decision = decision;
    out.ms = t.elapsed_ms();
    log_warn("tool call {} {}: {}", out.id, out.name, text);
    if (ctx.audit)
      ctx.audit->record({{"tool", out.name}, {"call_id", out.id}, {"decision", decision}, {"error", text}});
    return out;
  };
  const std::vector<ToolEntry> tools = ctx.host->tools();
  const ToolEntry* entry = nullptr;
  for (const auto& e : tools)
    if (e.name == out.name) entry = &e;
  if (!entry) {
    std::string names;
    for (const auto& e : tools) names += (names.empty() ? "" : ", ") + e.name;
    return error(
        fmt::format("unknown tool '{}'. Available tools: {}", out.name, names.empty() ? "(none)" : names),
        "invalid");
  }
  const json raw = fn.value("arguments", json(""));
  if (raw.is_object()) {
    out.arguments = raw;  // some servers send an object instead of a string
  } else {
    const std::string text = raw.is_string() ? raw.get<std::string>() : raw.dump();
    if (Status st = check_json_nesting(text, "the arguments of " + out.name); !st.ok())
      return error(st.message(), "invalid");
    out.arguments = text.find_first_not_of(" \t\r\n") == std::string::npos
                        ? json::object()
                        : json::parse(text, nullptr, false);
    if (out.arguments.is_discarded()) {
      out.arguments = json();
      return error(
          fmt::format("the arguments of {} are not valid JSON: {}", out.name, utf8_prefix(text, 300)),
          "invalid");
    }
  }
  if (!out.arguments.is_object())
    return error(fmt::format("the arguments of {} must be a JSON object", out.name), "invalid");
  if (Status s = validate_json(entry->input_schema, out.arguments); !s.ok())
    return error(fmt::format("invalid arguments for {}: {}", out.name, s.message()), "invalid");

  Verdict v = ctx.policy->decide(out.name, out.arguments, entry->permission);
  std::string decision(decision_name(v.decision));
  if (v.decision == Decision::kAsk) {
    if (ctx.confirm) {
      const bool ok =
          ctx.confirm(fmt::format("allow {} {}?", out.name, utf8_prefix(out.arguments.dump(), 500)));
      decision = ok ? "ask->allow (user)" : "ask->deny (user)";
      v.decision = ok ? Decision::kAllow : Decision::kDeny;
    } else if (ctx.yes) {
      decision = "ask->allow (--yes)";
      v.decision = Decision::kAllow;
    } else {
      decision = "ask->deny (no terminal; pass --yes to allow)";
      v.decision = Decision::kDeny;
    }
  }
  if (ctx.audit)
    ctx.audit->record({{"tool", out.name},
                       {"call_id", out.id},
                       {"arguments", out.arguments},
                       {"decision", decision},
                       {"why", v.why}});
  out.decision = decision;
  if (v.decision == Decision::kDeny) {
    out.text = fmt::format("Error: calling {} was denied ({}: {})", out.name, v.why, decision);
    out.is_error = true;
    out.ms = t.elapsed_ms();
    if (ctx.on_notice) ctx.on_notice(fmt::format("[{}] denied: {}", out.name, v.why));
    return out;
  }
  if (ctx.on_notice) ctx.on_notice(fmt::format("[{}] {}", out.name, utf8_prefix(out.arguments.dump(), 200)));
  const std::string name = out.name;
  auto on_progress = [&ctx, name](double progress, double total, const std::string& message) {
    if (!ctx.on_notice) return;
    ctx.on_notice(total > 0 ? fmt::format("[{}] progress {}/{} {}", name, progress, total, message)
                            : fmt::format("[{}] progress {} {}", name, progress, message));
  };
  auto r = ctx.host->call(out.name, out.arguments, ctx.timeout_ms, on_progress, ctx.cancel);
  out.ms = t.elapsed_ms();
  if (!r.ok()) {
    out.text = "Error: " + r.status().message();
    out.is_error = true;
    log_warn("tool call {} {}: {}", out.id, out.name, r.status().message());
    return out;
  }
  out.is_error = r->is_error;
  if (r->is_error)
    log_warn("tool call {} {} returned an error: {}", out.id, out.name, utf8_prefix(r->text(), 300));
  out.text = cap_text(r->is_error ? "Error: " + r->text() : r->text(), ctx.max_chars);
  return out;
}

}  // namespace

}  // namespace fathom::agent
