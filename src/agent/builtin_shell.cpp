// `fathom mcp shell` (one tool, `run`: a /bin/sh command in the workspace, sandboxed, with a
// timeout and an output cap) and `fathom mcp echo` (benchmarks and protocol tests).
#include <fcntl.h>
#include <unistd.h>

#include <thread>

#include "agent/builtins.h"
#include "agent/command_runner.h"
#include "agent/process.h"
#include "agent/workspace_fs.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

ToolOutput run_shell(const ShellPluginOptions& o, const json& a, ToolContext& ctx) {
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", a["command"].get<std::string>()};
  auto ws = Workspace::open(o.workspace);
  if (!ws.ok()) return tool_error(ws.status().message());
  spec.cwd = ws->root();
  if (a.contains("cwd")) {  // confined like a file path, then used by name
    int fd = ws->open_at(a["cwd"].get<std::string>(), O_PATH | O_DIRECTORY).value_or(-1);
    if (fd < 0)
      return tool_error(
          fmt::format("cwd '{}' is not a directory inside the workspace", a["cwd"].get<std::string>()));
    ::close(fd);
    spec.cwd = ws->root() + "/" + ws->relative(a["cwd"].get<std::string>()).value_or(".");
  }
  spec.env = environment_subset(o.env_keep);
  spec.env.push_back("HOME=" + ws->root());
  spec.env.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  spec.env.push_back("LANG=C.UTF-8");
  spec.timeout_ms = o.timeout_ms;
  if (a.contains("timeout_s"))
    spec.timeout_ms =
        std::min<int64_t>(o.timeout_ms, static_cast<int64_t>(a["timeout_s"].get<double>() * 1000));
  spec.output_cap_bytes = o.output_cap_bytes;
  spec.cpu_seconds = o.cpu_seconds;
  spec.sandbox.workspace = ws->root();
  spec.sandbox.network = o.network;
  auto r = run_command(spec, ctx.cancelled, [&](double s, size_t bytes) {
    ctx.progress(s, 0, fmt::format("running for {:.0f} s, {} bytes of output", s, bytes));
  });
  if (!r.ok()) return tool_error(r.status().message());
  ToolOutput out{.text = r->render()};
  out.is_error = r->exit_status != 0 || r->timed_out || r->truncated;
  out.structured = {{"exit_status", r->exit_status},
                    {"timed_out", r->timed_out},
                    {"truncated", r->truncated},
                    {"elapsed_ms", r->elapsed_ms}};
  return out;
}

}  // namespace

std::vector<ServerTool> shell_tools(const ShellPluginOptions& o) {
  nlohmann::ordered_json schema = {
      {"type", "object"},
      {"properties",
       {{"command", {{"type", "string"}, {"description", "a /bin/sh command line"}}},
        {"timeout_s", {{"type", "number"}, {"minimum", 0}}},
        {"cwd", {{"type", "string"}, {"description", "directory inside the workspace"}}}}},
      {"required", {"command"}},
      {"additionalProperties", false}};
  return {
      {"run",
       fmt::format("Run a shell command in the workspace {} (sandboxed; timeout {} s, output cap {} bytes). "
                   "Returns the exit status, stdout and stderr.",
                   o.workspace, o.timeout_ms / 1000, o.output_cap_bytes),
       schema, [o](const json& a, ToolContext& ctx) { return run_shell(o, a, ctx); }}};
}

std::vector<ServerTool> echo_tools() {
  std::vector<ServerTool> tools;
  tools.push_back(
      {"echo",
       "Return the text unchanged.",
       {{"type", "object"}, {"properties", {{"text", {{"type", "string"}}}}}, {"required", {"text"}}},
       [](const json& a, ToolContext&) { return ToolOutput{.text = a["text"].get<std::string>()}; }});
  tools.push_back({"sleep",
                   "Sleep for ms milliseconds, reporting progress every 100 ms; stops when cancelled.",
                   {{"type", "object"},
                    {"properties", {{"ms", {{"type", "integer"}, {"minimum", 0}}}}},
                    {"required", {"ms"}}},
                   [](const json& a, ToolContext& ctx) {
                     const int64_t ms = a["ms"];
                     for (int64_t t = 0; t < ms; t += 10) {
                       if (ctx.cancelled && ctx.cancelled->load()) return tool_error("cancelled");
                       if (t % 100 == 0)
                         ctx.progress(static_cast<double>(t), static_cast<double>(ms), "sleeping");
                       std::this_thread::sleep_for(std::chrono::milliseconds(10));
                     }
                     return ToolOutput{.text = fmt::format("slept {} ms", ms)};
                   }});
  return tools;
}

}  // namespace fathom::agent
