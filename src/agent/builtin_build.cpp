// `fathom mcp build`: a build/lint runner for configured commands. Each command becomes a tool
// `run_<name>` that runs it (sandboxed, timeout, output cap) and returns the exit status, the
// compiler diagnostics it found (file:line:col: error|warning: ...) and the output tail. The
// config file is re-read when it changes and the client is told (tools/list_changed).
#include <toml++/toml.h>

#include "agent/builtins.h"
#include "agent/command_runner.h"
#include "agent/process.h"
#include "agent/regex.h"
#include "agent/workspace_fs.h"
#include "base/strings.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 40) return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

std::string summarize_diagnostics(const std::string& output) {
  static const Regex diag =
      Regex::compile(R"(^([^\s:][^:]*):(\d+)(?::(\d+))?: (fatal error|error|warning): (.*)$)").value();
  int errors = 0, warnings = 0;
  std::string listed;
  int shown = 0;
  std::vector<std::string> m;
  for (auto line : split(output, '\n')) {
    std::string l(line.substr(0, 2000));
    if (!diag.search(l, &m) || m.size() < 6) continue;
    (m[4] == "warning" ? warnings : errors)++;
    if (shown++ < 20) listed += "  " + l + "\n";
  }
  if (errors + warnings == 0) return "";
  return fmt::format("diagnostics: {} error(s), {} warning(s)\n{}", errors, warnings, listed);
}

ToolOutput run_build(const BuildPluginOptions& o, const BuildCommand& c, const json& a, ToolContext& ctx) {
  auto ws = Workspace::open(o.workspace);
  if (!ws.ok()) return tool_error(ws.status().message());
  CommandSpec spec;
  std::string cmd = c.run;
  if (a.contains("args")) cmd += " " + a["args"].get<std::string>();
  spec.argv = {"/bin/sh", "-c", cmd};
  spec.cwd = ws->root();
  spec.env = environment_subset({"PATH", "LANG", "CC", "CXX", "CCACHE_DIR"});
  spec.env.push_back("HOME=" + ws->root());
  spec.timeout_ms = c.timeout_ms;
  spec.output_cap_bytes = o.output_cap_bytes;
  spec.sandbox.workspace = ws->root();
  auto r = run_command(spec, ctx.cancelled, [&](double s, size_t bytes) {
    ctx.progress(s, 0, fmt::format("{}: {:.0f} s, {} bytes of output", c.name, s, bytes));
  });
  if (!r.ok()) return tool_error(r.status().message());
  std::string text = fmt::format("$ {}\n{}", cmd, summarize_diagnostics(r->out + "\n" + r->err));
  text += r->render();
  return ToolOutput{.text = text, .is_error = r->exit_status != 0 || r->timed_out};
}

}  // namespace

Result<std::vector<BuildCommand>> load_build_commands(const BuildPluginOptions& o) {
  std::vector<BuildCommand> out;
  if (!o.config.empty()) {
    toml::table t;
    try {
      t = toml::parse_file(o.config);
    } catch (const toml::parse_error& e) {
      return invalid_argument("{}: line {}: {}", o.config, e.source().begin.line, e.description());
    }
    const toml::array* cmds = t["command"].as_array();
    if (!cmds) return invalid_argument("{}: expected [[command]] tables with name and run", o.config);
    for (size_t i = 0; i < cmds->size(); ++i) {
      const toml::table* c = cmds->get(i)->as_table();
      if (!c) return invalid_argument("{}: command[{}] is not a table", o.config, i);
      BuildCommand b;
      b.name = c->get("name") ? c->get("name")->value_or(std::string()) : "";
      b.run = c->get("run") ? c->get("run")->value_or(std::string()) : "";
      b.description = c->get("description") ? c->get("description")->value_or(std::string()) : "";
      if (c->get("timeout_s")) b.timeout_ms = c->get("timeout_s")->value_or(int64_t{600}) * 1000;
      if (!valid_name(b.name) || b.run.empty())
        return invalid_argument("{}: command[{}] needs a name ([A-Za-z0-9_-], at most 40) and a run string",
                                o.config, i);
      out.push_back(b);
    }
  }
  out.insert(out.end(), o.commands.begin(), o.commands.end());
  for (const auto& c : out)
    if (!valid_name(c.name))
      return invalid_argument("build command name '{}' must be [A-Za-z0-9_-]{{1,40}}", c.name);
  return out;
}

std::vector<ServerTool> build_tools(const BuildPluginOptions& o, const std::vector<BuildCommand>& commands) {
  std::vector<ServerTool> tools;
  std::string names;
  for (const auto& c : commands) {
    names += (names.empty() ? "" : ", ") + c.name;
    tools.push_back(
        {"run_" + c.name,
         (c.description.empty() ? "Run the configured command" : c.description) + ": `" + c.run +
             "` in the workspace; returns exit status, diagnostics and output.",
         {{"type", "object"},
          {"properties", {{"args", {{"type", "string"}, {"description", "extra arguments appended"}}}}},
          {"additionalProperties", false}},
         [o, c](const json& a, ToolContext& ctx) { return run_build(o, c, a, ctx); }});
  }
  tools.push_back({"list_commands",
                   "List the configured build/lint commands.",
                   {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}},
                   [commands](const json&, ToolContext&) {
                     std::string out;
                     for (const auto& c : commands) out += fmt::format("{}: {}\n", c.name, c.run);
                     return ToolOutput{.text = out.empty() ? "no commands configured\n" : out};
                   }});
  return tools;
}

}  // namespace fathom::agent
