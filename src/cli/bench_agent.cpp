// `fathom bench agent`: the harness's own overheads. Round trip of a no-op MCP tool call
// (`fathom mcp echo`) over a warm plugin, plain (no sandbox) and inside the sandbox, as p50/p99;
// and the start-up time of a sandboxed process against a plain fork+exec of the same program,
// measured in the same run. Goals: no-op p50 < 2 ms, sandboxed start < 50 ms.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "agent/mcp_client.h"
#include "agent/process.h"
#include "agent/sandbox.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"

namespace fathom::cli {
namespace {

struct Percentiles {
  double p50 = 0, p99 = 0, mean = 0;
};

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  for (double x : v) p.mean += x / static_cast<double>(v.size());
  return p;
}

Result<Percentiles> noop_calls(const std::vector<std::string>& argv, const std::string& ws, int n) {
  auto client =
      TRY(agent::McpClient::start(argv, agent::environment_subset({"PATH"}), ws, {.name = "bench"}));
  std::vector<double> ms;
  for (int i = 0; i < n + 10; ++i) {
    Timer t;
    auto r = client->call_tool("echo", {{"text", "x"}}, 10000);
    if (!r.ok()) return r.status();
    if (i >= 10) ms.push_back(t.elapsed_ms());  // the first calls warm the plugin
  }
  return percentiles(ms);
}

Result<Percentiles> starts(const std::vector<std::string>& argv, int n) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    Timer t;
    auto p = TRY(agent::ChildProcess::spawn(
        {.argv = argv, .env = agent::environment_subset({"PATH"}), .pipe_stdin = false}));
    p->wait(-1);
    if (p->exit_status() != 0) return internal_error("'{}' exited with {}", argv.back(), p->exit_status());
    ms.push_back(t.elapsed_ms());
  }
  return percentiles(ms);
}

int run_bench_agent(int argc, char** argv) {
  int calls = 300, spawns = 30;
  bool json = false;
  Args args(argv[0], "No-op MCP call round trip (plain vs sandboxed plugin) and sandboxed process start-up.");
  args.option("--calls", &calls, "no-op calls per plugin");
  args.option("--starts", &spawns, "process starts per variant");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  const std::string ws = std::filesystem::temp_directory_path() / "fathom-bench-agent";
  std::filesystem::create_directories(ws);
  const std::string self = agent::self_executable();
  agent::SandboxProfile profile{.workspace = ws, .read_only = {self}};  // the binary itself is visible
  auto report = agent::probe_sandbox(profile);
  if (!report.ok()) return fail(args.command(), report.status());
  auto plain = noop_calls({self, "mcp", "echo"}, ws, calls);
  auto boxed = noop_calls(agent::sandbox_wrap(profile, {self, "mcp", "echo"}), ws, calls);
  auto start_plain = starts({"/bin/true"}, spawns);
  auto start_boxed = starts(agent::sandbox_wrap(profile, {"/bin/true"}), spawns);
  for (const auto* r : {&plain, &boxed, &start_plain, &start_boxed})
    if (!r->ok()) return fail(args.command(), r->status());
  if (json) {
    nlohmann::json j = {{"noop_plain_p50_ms", plain->p50},
                        {"noop_plain_p99_ms", plain->p99},
                        {"noop_sandboxed_p50_ms", boxed->p50},
                        {"noop_sandboxed_p99_ms", boxed->p99},
                        {"start_plain_p50_ms", start_plain->p50},
                        {"start_sandboxed_p50_ms", start_boxed->p50},
                        {"start_sandboxed_p99_ms", start_boxed->p99},
                        {"noop_sandboxed_over_plain", boxed->p50 / plain->p50},
                        {"start_sandboxed_over_plain", start_boxed->p50 / start_plain->p50},
                        {"noop_goal_ms", 2.0},
                        {"start_goal_ms", 50.0},
                        {"calls", calls},
                        {"starts", spawns},
                        {"sandbox", report->summary()}};
    print_json_line(j.dump());
    return 0;
  }
  std::printf("sandbox: %s\n", report->summary().c_str());
  std::printf(
      "no-op tool call, warm plugin (%d calls): plain p50 %.3f ms p99 %.3f ms; sandboxed p50 %.3f ms p99 "
      "%.3f ms "
      "(%.2fx plain; goal p50 < 2 ms)\n",
      calls, plain->p50, plain->p99, boxed->p50, boxed->p99, boxed->p50 / plain->p50);
  std::printf(
      "process start (%d starts of /bin/true): plain p50 %.2f ms; sandboxed p50 %.2f ms p99 %.2f ms "
      "(%.1fx plain; goal < 50 ms)\n",
      spawns, start_plain->p50, start_boxed->p50, start_boxed->p99, start_boxed->p50 / start_plain->p50);
  return 0;
}

}  // namespace

FATHOM_BENCH("agent", "Agent harness: no-op MCP call round trip (plain/sandboxed) and sandbox start-up",
             run_bench_agent);

}  // namespace fathom::cli
