// run_command: runs one command for a tool call (shell, build) with a wall-clock timeout, an output
// cap, cancellation and progress. Outside a Fathom sandbox the command gets a sandbox of its own
// (the helper, one per call); inside one (a plugin started by the agent) it runs directly in a new
// process group, with CPU and file-size rlimits, and the plugin's sandbox contains it. Internal.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "agent/sandbox.h"
#include "base/status.h"

namespace fathom::agent {

struct CommandSpec {
  std::vector<std::string> argv;  // e.g. {"/bin/sh", "-c", "make -j2"}
  std::string cwd;                // inside the workspace
  std::vector<std::string> env;   // the whole environment
  int64_t timeout_ms = 60000;
  size_t output_cap_bytes = 64 * 1024;  // stdout + stderr kept; past it the command is killed
  int64_t cpu_seconds = 0;
  int64_t file_size_bytes = int64_t{1} << 30;
  SandboxProfile sandbox;  // used when not already inside a sandbox
};

struct CommandResult {
  int exit_status = -1;  // shell-style: code or 128+signal
  std::string out, err;
  bool timed_out = false, cancelled = false, truncated = false;
  double elapsed_ms = 0;
  bool sandboxed_per_call = false;
  // "exit status 0 (12 ms)\n--- stdout ---\n...\n--- stderr ---\n..."
  std::string render() const;
};

Result<CommandResult> run_command(const CommandSpec& spec, const std::atomic<bool>* cancel,
                                  const std::function<void(double seconds, size_t bytes)>& progress);

}  // namespace fathom::agent
