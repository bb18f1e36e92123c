// `fathom agent`: the agent harness. Subcommands: `agent [options] [TASK]` (the loop), `agent replay
// FILE`, `agent probe` (which sandbox protections this host allows) and `agent sandbox` (the
// sandbox helper the agent spawns for every plugin process).
#include <cstdio>
#include <cstring>
#include <string>

#include "agent/sandbox.h"
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
    print_json_line(nlohmann::json{{"active", report->active}, {"notes", report->notes}, {"uid", report->uid}}.dump());
  } else {
    std::printf("sandbox: %s\n", report->summary().c_str());
  }
  return 0;
}

int run_agent_command(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "sandbox") == 0) return agent::sandbox_main(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "probe") == 0) {
    std::string name = "fathom agent probe";
    argv[1] = name.data();
    return run_probe(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "fathom agent: not yet\n");
  return 2;
}

}  // namespace

FATHOM_COMMAND("agent", "Run the agent harness against an OpenAI-compatible endpoint (MCP plugins, sandbox)",
               run_agent_command);

}  // namespace fathom::cli
