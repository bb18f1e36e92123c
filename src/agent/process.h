// ChildProcess: a child started with fork+exec whose stdin/stdout/stderr are pipes owned by the
// parent. Internal to the agent component (MCP transport, shell tool, sandbox helper).
//
// Everything the child needs (argv, envp) is built before fork so the child only calls
// async-signal-safe functions; that keeps spawning safe from a multi-threaded process.
// wait() and kill_tree() may be called from several threads; the rest belongs to one owner.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

struct SpawnOptions {
  std::vector<std::string> argv;              // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;               // "K=V"; the child's whole environment
  std::string cwd;                            // empty: inherit
  bool new_process_group = true;              // setsid(): lets the owner kill the whole tree
  bool merge_stderr = false;                  // stderr into the stdout pipe
  bool pipe_stdin = true;                     // else /dev/null
  std::vector<std::pair<int, long>> rlimits;  // (RLIMIT_*, value) set in the child before exec
};

class ChildProcess {
 public:
  static Result<std::unique_ptr<ChildProcess>> spawn(const SpawnOptions& options);
  ~ChildProcess();  // closes the pipes, kills the group and reaps
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_; }
  int stdout_fd() const { return out_; }
  int stderr_fd() const { return err_; }
  void close_stdin();
  // SIGKILL to the process (and its group when it has one).
  void kill_tree(int sig = 9);
  // Waits up to timeout_ms (negative: forever); true when it exited. exit_status() afterwards.
  bool wait(int timeout_ms);
  bool exited() const {
    std::lock_guard<std::mutex> lock(mu_);
    return exited_;
  }
  // Shell-style: exit code, or 128 + signal.
  int exit_status() const { return status_; }
  std::string describe_exit() const;

 private:
  ChildProcess() = default;
  mutable std::mutex mu_;  // exited_, status_: reaping races with kill
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool group_ = false;
  bool exited_ = false;
  int status_ = -1;
};

// The current process environment as "K=V" strings, filtered to keys in `keep` (empty: none).
std::vector<std::string> environment_subset(const std::vector<std::string>& keep);
// Absolute path of argv0 found in PATH ("" when not found).
std::string find_in_path(const std::string& name, const std::string& path_env);
// The fathom executable: /proc/self/exe, unless set_self_executable() named another (tests that
// link the agent library into their own binary point it at build/bin/fathom).
std::string self_executable();
void set_self_executable(std::string path);

}  // namespace fathom::agent
