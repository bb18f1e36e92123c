// `fathom mcp <server>`: Fathom's built-in plugins as MCP servers on stdin/stdout (MCP 2025-11-25),
// usable by `fathom agent` and by any other MCP client: shell, files, sqlite, build, echo.
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "agent/builtins.h"
#include "agent/mcp_server.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/command.h"

namespace fathom::cli {
namespace {

using agent::McpServer;
using agent::McpServerOptions;

int serve(std::vector<agent::ServerTool> tools, const std::string& name, int page_size) {
  McpServer server(std::move(tools), McpServerOptions{.name = "fathom-" + name, .page_size = page_size});
  return server.serve();
}

int run_mcp(int argc, char** argv) {
  const char* kUsage =
      "usage: fathom mcp shell|files|sqlite|build|echo [options]   (fathom mcp <server> --help)\n";
  if (argc < 2 || argv[1][0] == '-') {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string which = argv[1];
  std::string title = "fathom mcp " + which;
  argv[1] = title.data();
  --argc, ++argv;
  std::string workspace = ".";
  int page_size = 0;
  Args args(title, "Serve Fathom's built-in '" + which + "' plugin over MCP (stdio).");
  args.option("--workspace", &workspace, "directory the tools are confined to", "DIR");
  args.option("--page-size", &page_size, "tools per tools/list page (0: all)");
  agent::ShellPluginOptions shell;
  agent::FilesPluginOptions files;
  agent::SqlitePluginOptions sqlite;
  agent::BuildPluginOptions build;
  std::vector<std::string> build_cmds;
  int64_t timeout_s = 120, cap = 64 * 1024;
  bool network = false;
  if (which == "shell") {
    args.option("--timeout", &timeout_s, "seconds per command at most");
    args.option("--output-cap", &cap,
                "bytes of stdout+stderr kept per command; past it the command is killed");
    args.option("--cpu-seconds", &shell.cpu_seconds, "CPU seconds per command (0: none)");
    args.flag("--network", &network, "give commands network access (per-call sandbox only)");
    args.multi("--env", &shell.env_keep, "environment variable passed to commands (repeatable)", "NAME");
  } else if (which == "files") {
    args.flag("--read-only", &files.read_only, "only read_file, list_directory and search");
  } else if (which == "sqlite") {
    args.option("--db", &sqlite.database, "database file (inside the workspace)", "FILE");
    args.flag("--allow-writes", &sqlite.allow_writes,
              "allow statements that write (granted by the manifest)");
    args.option("--max-rows", &sqlite.max_rows, "default row limit of results");
  } else if (which == "build") {
    args.option("--config", &build.config, "TOML file with [[command]] name/run/description/timeout_s",
                "FILE");
    args.multi("--command", &build_cmds, "a command as NAME=CMD (repeatable)", "NAME=CMD");
    args.option("--output-cap", &cap, "bytes of output kept per run");
  } else if (which != "echo") {
    std::fprintf(stderr, "fathom mcp: unknown server '%s'\n%s", which.c_str(), kUsage);
    return 2;
  }
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (which == "echo") return serve(agent::echo_tools(), which, page_size);
  if (which == "shell") {
    shell.workspace = workspace;
    shell.timeout_ms = timeout_s * 1000;
    shell.output_cap_bytes = static_cast<size_t>(cap);
    shell.network = network;
    return serve(agent::shell_tools(shell), which, page_size);
  }
  if (which == "files") {
    files.workspace = workspace;
    auto tools = agent::files_tools(files);
    if (!tools.ok()) return fail(args.command(), tools.status());
    return serve(*tools, which, page_size);
  }
  if (which == "sqlite") {
    sqlite.workspace = workspace;
    auto tools = agent::sqlite_tools(sqlite);
    if (!tools.ok()) return fail(args.command(), tools.status());
    return serve(*tools, which, page_size);
  }
  build.workspace = workspace;
  build.output_cap_bytes = static_cast<size_t>(cap);
  for (const auto& c : build_cmds) {
    auto eq = c.find('=');
    if (eq == std::string::npos)
      return fail(args.command(), invalid_argument("--command '{}' is not NAME=CMD", c));
    build.commands.push_back({.name = c.substr(0, eq), .run = c.substr(eq + 1)});
  }
  // The config's state as read: taken before the read, so a change made while the server starts
  // (before the watcher's first look) is still seen as a change.
  struct stat loaded = {};
  if (!build.config.empty()) ::stat(build.config.c_str(), &loaded);
  auto commands = agent::load_build_commands(build);
  if (!commands.ok()) return fail(args.command(), commands.status());
  McpServer server(agent::build_tools(build, *commands),
                   McpServerOptions{.name = "fathom-build", .page_size = page_size});
  std::atomic<bool> stop{false};
  std::thread watcher;
  if (!build.config.empty()) {  // re-read the config when it changes; tell the client
    watcher = std::thread([&] {
      struct stat last = loaded;
      while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        struct stat now = {};
        if (::stat(build.config.c_str(), &now) != 0) continue;
        if (now.st_mtim.tv_sec == last.st_mtim.tv_sec && now.st_mtim.tv_nsec == last.st_mtim.tv_nsec &&
            now.st_size == last.st_size)
          continue;
        last = now;
        auto reloaded = agent::load_build_commands(build);
        if (reloaded.ok())
          server.set_tools(agent::build_tools(build, *reloaded));
        else
          std::fprintf(stderr, "fathom mcp build: keeping the old commands: %s\n",
                       reloaded.status().message().c_str());
      }
    });
  }
  int rc = server.serve();
  stop = true;
  if (watcher.joinable()) watcher.join();
  return rc;
}

}  // namespace

FATHOM_COMMAND("mcp", "Serve a built-in plugin (shell, files, sqlite, build, echo) as an MCP server on stdio",
               run_mcp);

}  // namespace fathom::cli
