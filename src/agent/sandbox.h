// The sandbox every plugin process runs in, built from what Linux offers without a container
// daemon: user, mount, PID, network, IPC and UTS namespaces; a pivot_root view holding the
// workspace read-write at its real path, system directories and the plugin's install directory
// read-only, and nothing else; an unprivileged uid even when the agent runs as root (the
// workspace is then an idmapped mount so files keep their owner); no_new_privs; a libseccomp
// filter (no ptrace, mount, keyring, bpf, module loading, new namespaces, TIOCSTI, ...); rlimits;
// a pids cgroup (v1 or v2); a wall-clock timeout. Internal to the agent component.
//
// The work is done by a helper process, `fathom agent sandbox --profile JSON -- CMD ARGS`, that
// the agent spawns instead of CMD: it is single-threaded, so it can clone and set up namespaces
// freely. It stays outside as the monitor (timeout, cgroup cleanup); inside, a tiny init (PID 1)
// reaps and forwards signals, and CMD runs as its child with stdin/stdout/stderr passed through.
//
// Modes: "require" fails when a protection cannot be set up; "auto" (the default) uses what
// the host allows and reports the rest; "off" runs CMD directly. probe_sandbox() runs the helper
// once and says which protections are active.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

struct SandboxLimits {
  int64_t cpu_seconds = 0;                     // RLIMIT_CPU; 0: none
  int64_t address_space_bytes = 0;             // RLIMIT_AS; 0: none (node reserves a lot)
  int64_t open_files = 1024;                   // RLIMIT_NOFILE
  int64_t file_size_bytes = int64_t{1} << 30;  // RLIMIT_FSIZE
  int64_t pids_max = 256;                      // pids cgroup (and RLIMIT_NPROC as a second layer)
  int64_t wall_timeout_ms = 0;                 // whole-process limit; 0: none (per-call limits elsewhere)
  int64_t tmp_bytes = int64_t{64} << 20;       // the private /tmp (tmpfs)
};

struct SandboxProfile {
  std::string mode = "auto";            // auto | require | off
  bool network = false;                 // keep the host network (no network namespace)
  std::string workspace;                // read-write at its real path; the working directory
  std::vector<std::string> read_only;   // extra read-only paths (install directory, binary)
  std::vector<std::string> read_write;  // extra read-write paths
  SandboxLimits limits;
  uint32_t uid = 65534, gid = 65534;  // the uid/gid the process gets when the agent is root

  nlohmann::json to_json() const;
  static Result<SandboxProfile> from_json(const nlohmann::json& j);
};

// What a sandbox actually got; from the helper's probe.
struct SandboxReport {
  nlohmann::json active = nlohmann::json::object();  // protection -> true/false
  std::vector<std::string> notes;                    // why something is off
  uint32_t uid = 0;                                  // uid the process runs as (outside view)
  bool ok = false;
  // "active: user ns, mount ns, ...; not active: ...(reason)"
  std::string summary() const;
};

// argv that runs `argv` inside the sandbox (the helper from this executable), or argv itself
// when mode is off.
std::vector<std::string> sandbox_wrap(const SandboxProfile& profile, const std::vector<std::string>& argv);
// Runs the helper in probe mode with this profile and returns what was active.
Result<SandboxReport> probe_sandbox(const SandboxProfile& profile);
// The helper's entry point (`fathom agent sandbox ...`); returns the exit code.
int sandbox_main(int argc, char** argv);
// True inside a Fathom sandbox (the helper sets FATHOM_SANDBOX=1).
bool inside_sandbox();

}  // namespace fathom::agent
