// `fathom agent`: the agent harness. Subcommands: `agent [options] [TASK]` (the loop), `agent replay
// FILE`, `agent probe` (which sandbox protections this host allows) and `agent sandbox` (the
// sandbox helper the agent spawns for every plugin process).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "agent/agent.h"
#include "agent/plugin_host.h"
#include "agent/sandbox.h"
#include "base/log.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/command.h"

namespace fathom::cli {
namespace {

int run_probe(int argc, char** argv) {
  agent::SandboxProfile profile;
  std::string workspace = ".";
  bool json = false, network = false;
  std::string mode = "auto";
  Args args(argv[0], "Report which sandbox protections this host allows.");
  args.option("--workspace", &workspace, "workspace directory bound read-write", "DIR");
  args.option("--sandbox", &mode, "auto|require|off", "MODE");
  args.flag("--network", &network, "keep the host network (as a manifest granting it would)");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  profile.workspace = workspace;
  profile.mode = mode;
  profile.network = network;
  auto report = agent::probe_sandbox(profile);
  if (!report.ok()) return fail(args.command(), report.status());
  if (json) {
    print_json_line(
        nlohmann::json{{"active", report->active}, {"notes", report->notes}, {"uid", report->uid}}.dump());
  } else {
    std::printf("sandbox: %s\n", report->summary().c_str());
  }
  return 0;
}

bool ask_on_terminal(const std::string& question) {
  std::FILE* tty = std::fopen("/dev/tty", "r+");
  if (!tty) return false;
  std::fprintf(tty, "fathom agent: %s [y/N] ", question.c_str());
  std::fflush(tty);
  char line[64] = {0};
  const bool yes = std::fgets(line, sizeof(line), tty) && (line[0] == 'y' || line[0] == 'Y');
  std::fclose(tty);
  return yes;
}

int run_replay(int argc, char** argv) {
  agent::ReplayOptions o;
  bool json = false;
  Args args(
      argv[0],
      "Re-run a recorded trajectory without a model: re-execute its tool calls and report differences.");
  args.usage("[options] TRAJECTORY.jsonl");
  args.positional("TRAJECTORY", &o.trajectory_path, "the JSONL file written by --trajectory");
  args.option("--workspace", &o.workspace, "workspace (default: the recorded one)", "DIR");
  args.multi("--plugin", &o.plugins, "plugin command line (default: the recorded ones)", "CMD");
  args.option("--plugins-dir", &o.plugins_dir, "plugin manifests (default: the recorded directory)", "DIR");
  args.option("--sandbox", &o.sandbox_mode, "auto|require|off", "MODE");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  o.on_notice = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  auto report = agent::replay_trajectory(o);
  if (!report.ok()) return fail(args.command(), report.status());
  if (json) {
    print_json_line(report->to_json());
  } else {
    std::printf("replayed %d model turns, %d tool calls: %d identical, %d differed, %d skipped\n",
                report->model_turns, report->tool_calls, report->identical, report->differed,
                report->skipped);
    for (const auto& d : report->differences) std::printf("  differs: %s\n", d.c_str());
  }
  return report->differed > 0 ? 4 : 0;
}

int run_tools(int argc, char** argv) {
  std::vector<std::string> plugins;
  std::string plugins_dir, workspace = ".", mode = "auto", call, call_args = "{}";
  bool json = false;
  Args args(argv[0], "Start the plugins and list the tools the model would see (or call one).");
  args.multi("--plugin", &plugins, "a plugin as \"[NAME=]CMD ARGS\" (repeatable)", "CMD");
  args.option("--plugins-dir", &plugins_dir, "directory of plugin manifests", "DIR");
  args.option("--workspace", &workspace, "workspace directory", "DIR");
  args.option("--sandbox", &mode, "auto|require|off", "MODE");
  args.option("--call", &call, "call this namespaced tool and print its result", "TOOL");
  args.option("--args", &call_args, "JSON arguments for --call", "JSON");
  args.flag("--json", &json,
            "print one JSON object (with openai_tools: the tool definitions the model is offered)");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  char buf[4096];
  if (!::realpath(workspace.c_str(), buf)) return fail(args.command(), errno_status(errno, "--workspace"));
  workspace = buf;
  std::vector<agent::PluginManifest> manifests;
  for (const auto& spec : plugins) {
    auto m = agent::manifest_from_command_line(spec, workspace);
    if (!m.ok()) return fail(args.command(), m.status());
    m->sandbox.mode = mode;
    manifests.push_back(*m);
  }
  agent::PluginHostOptions ho{
      .workspace = workspace, .plugins_dir = plugins_dir, .sandbox = {.mode = mode, .workspace = workspace}};
  auto host = agent::PluginHost::create(ho, manifests);
  if (!host.ok()) return fail(args.command(), host.status());
  nlohmann::ordered_json out = {{"plugins", nlohmann::ordered_json::array()},
                                {"tools", nlohmann::ordered_json::array()}};
  for (const auto& s : (*host)->status())
    out["plugins"].push_back(
        {{"name", s.name}, {"state", s.state}, {"tools", s.n_tools}, {"error", s.last_error}});
  for (const auto& t : (*host)->tools())
    out["tools"].push_back({{"name", t.name}, {"description", t.description}});
  out["openai_tools"] = agent::openai_tool_specs((*host)->tools());  // what `fathom agent` offers the model
  if (!call.empty()) {
    nlohmann::json a = nlohmann::json::parse(call_args, nullptr, false);
    if (a.is_discarded()) return fail(args.command(), invalid_argument("--args is not JSON"));
    auto r = (*host)->call(call, a, 60000, {}, nullptr);
    if (!r.ok()) return fail(args.command(), r.status());
    out["result"] = {{"text", r->text()}, {"is_error", r->is_error}};
  }
  if (json) {
    // print_json_line is lossy: plugin errors quote their stderr and stdout, which need not be UTF-8.
    print_json_line(out);
    return 0;
  }
  for (const auto& p : out["plugins"])
    std::printf("plugin %s: %s, %d tools %s\n", p["name"].get<std::string>().c_str(),
                p["state"].get<std::string>().c_str(), p["tools"].get<int>(),
                p["error"].get<std::string>().c_str());
  for (const auto& t : out["tools"]) std::printf("  %s\n", t["name"].get<std::string>().c_str());
  if (out.contains("result")) std::printf("%s\n", out["result"]["text"].get<std::string>().c_str());
  return 0;
}

int run_agent(int argc, char** argv) {
  agent::AgentOptions o;
  std::string task, api_key_env;
  int64_t tool_timeout_s = 120;
  std::string temperature = "0";  // as OpenHands: agents sample greedily unless told otherwise
  bool json = false, no_stream = false;
  Args args(argv[0],
            "Run an agent: a model behind an OpenAI-compatible endpoint using MCP plugins as tools.");
  args.usage("[options] [TASK]   (no TASK: interactive; subcommands: replay FILE, probe)");
  args.positional("TASK", &task, "the task; without it, read tasks from stdin one per line", false);
  args.option("--endpoint", &o.endpoint, "OpenAI-compatible base URL (…/v1)", "URL");
  args.option("--model", &o.model, "model name sent to the endpoint", "NAME");
  args.option("--api-key-env", &api_key_env, "environment variable holding the API key", "VAR");
  args.multi("--plugin", &o.plugins, "a plugin as \"[NAME=]CMD ARGS\" (repeatable; allowed by default)",
             "CMD");
  args.option("--plugins-dir", &o.plugins_dir, "directory of plugin manifests (*.toml, *.json), watched",
              "DIR");
  args.option("--workspace", &o.workspace, "directory the tools work in (read-write in the sandbox)", "DIR");
  args.option("--max-steps", &o.max_steps, "model requests per task at most");
  args.option("--max-tokens-total", &o.max_total_tokens,
              "stop when prompt+completion tokens reach this (0: none)");
  args.option("--max-seconds", &o.max_seconds, "stop a task after this many seconds (0: none)");
  args.option(
      "--temperature", &temperature,
      "sampling temperature sent with each request, 0 to 2 ('server': send none, the endpoint's default)",
      "X");
  args.option("--context-tokens", &o.context_tokens, "the model's context window in tokens");
  args.option("--reserve-tokens", &o.reserve_tokens, "tokens kept free for the answer");
  args.option("--tool-timeout", &tool_timeout_s,
              "seconds a tool call may take (progress extends it up to 10x)");
  args.option("--policy", &o.policy_path, "permission rules (TOML or JSON)", "FILE");
  args.flag("--yes", &o.yes, "approve `ask` decisions without a terminal");
  args.option("--trajectory", &o.trajectory_path, "append the run to this JSONL file", "FILE");
  args.option("--audit-log", &o.audit_path, "append every permission decision to this JSONL file", "FILE");
  args.option("--sandbox", &o.sandbox_mode, "auto (use what the host allows) | require | off", "MODE");
  args.option("--system", &o.system_prompt, "system prompt (default: a short one naming the workspace)",
              "TEXT");
  args.flag("--no-stream", &no_stream, "ask for a plain JSON response instead of SSE");
  args.flag("--json", &json, "print one JSON object with the result last");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (!api_key_env.empty()) {
    const char* key = std::getenv(api_key_env.c_str());
    if (!key || !*key)
      return fail(args.command(), invalid_argument("--api-key-env {}: the variable is not set", api_key_env));
    o.api_key = key;
  }
  o.tool_timeout_ms = tool_timeout_s * 1000;
  if (temperature != "server") {
    auto t = parse_double(temperature, "--temperature");
    if (!t.ok()) return fail(args.command(), t.status());
    if (!(*t >= 0 && *t <= 2))
      return fail(args.command(),
                  invalid_argument("--temperature must be from 0 to 2 or 'server', not {}", *t));
    o.temperature = *t;
  }
  o.stream = !no_stream;
  o.on_text = [](const std::string& t) {
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  };
  o.on_notice = [](const std::string& s) { std::fprintf(stderr, "fathom agent: %s\n", s.c_str()); };
  if (::isatty(0) && ::isatty(2)) o.confirm = ask_on_terminal;
  auto agent = agent::Agent::create(o);
  if (!agent.ok()) return fail(args.command(), agent.status());
  std::fprintf(stderr, "fathom agent: sandbox %s\n", (*agent)->sandbox_summary().c_str());
  std::fprintf(stderr, "fathom agent: %zu tools\n", (*agent)->tool_names().size());
  auto run_one = [&](const std::string& t) -> int {
    auto r = (*agent)->run(t);
    std::printf("\n");
    if (!r.ok()) {
      fail(args.command(), r.status());
      return 1;
    }
    if (json) print_json_line(r->to_json());
    return r->status == "final" ? 0 : 3;
  };
  if (!task.empty()) return run_one(task);
  int rc = 0;
  for (std::string line; (std::fprintf(stderr, "> "), std::getline(std::cin, line));)
    if (!line.empty()) rc = run_one(line);
  return rc;
}

int run_agent_command(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "replay") == 0) {
    std::string name = "fathom agent replay";
    argv[1] = name.data();
    return run_replay(argc - 1, argv + 1);
  }
  if (argc >= 2 && std::strcmp(argv[1], "tools") == 0) {
    std::string name = "fathom agent tools";
    argv[1] = name.data();
    return run_tools(argc - 1, argv + 1);
  }
  if (argc >= 2 && std::strcmp(argv[1], "sandbox") == 0) return agent::sandbox_main(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "probe") == 0) {
    std::string name = "fathom agent probe";
    argv[1] = name.data();
    return run_probe(argc - 1, argv + 1);
  }
  return run_agent(argc, argv);
}

}  // namespace

FATHOM_COMMAND("agent", "Run the agent harness against an OpenAI-compatible endpoint (MCP plugins, sandbox)",
               run_agent_command);

}  // namespace fathom::cli
