// run_command: poll loop over the child's stdout/stderr with deadline, cap, cancel and progress.
#include "agent/command_runner.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "agent/process.h"
#include "base/timer.h"

namespace fathom::agent {

std::string CommandResult::render() const {
  std::string s;
  if (timed_out)
    s += fmt::format("command timed out after {:.0f} ms and was killed\n", elapsed_ms);
  else if (cancelled)
    s += "command cancelled and killed\n";
  else
    s += fmt::format("exit status {}\n", exit_status);
  if (truncated) s += "output exceeded the cap; the command was killed and the output truncated\n";
  if (!out.empty()) s += "--- stdout ---\n" + out + (out.back() == '\n' ? "" : "\n");
  if (!err.empty()) s += "--- stderr ---\n" + err + (err.back() == '\n' ? "" : "\n");
  return s;
}

Result<CommandResult> run_command(const CommandSpec& spec, const std::atomic<bool>* cancel,
                                  const std::function<void(double, size_t)>& progress) {
  SpawnOptions so{.argv = spec.argv, .env = spec.env, .cwd = spec.cwd, .pipe_stdin = false};
  CommandResult r;
  if (!inside_sandbox() && spec.sandbox.mode != "off") {
    SandboxProfile p = spec.sandbox;
    p.limits.cpu_seconds = spec.cpu_seconds;
    p.limits.file_size_bytes = spec.file_size_bytes;
    so.argv = sandbox_wrap(p, spec.argv);
    r.sandboxed_per_call = true;
  } else {
    if (spec.cpu_seconds > 0) so.rlimits.emplace_back(RLIMIT_CPU, static_cast<long>(spec.cpu_seconds));
    if (spec.file_size_bytes > 0)
      so.rlimits.emplace_back(RLIMIT_FSIZE, static_cast<long>(spec.file_size_bytes));
    so.rlimits.emplace_back(RLIMIT_CORE, 0L);
  }
  Timer t;
  auto proc = TRY(ChildProcess::spawn(so));
  size_t total = 0;
  bool out_open = true, err_open = true, exited = false;
  double last_progress = 0, exited_at = 0;
  auto stop = [&](bool* flag) {
    *flag = true;
    proc->kill_tree(SIGKILL);
  };
  while (out_open || err_open) {
    struct pollfd fds[2] = {{out_open ? proc->stdout_fd() : -1, POLLIN, 0},
                            {err_open ? proc->stderr_fd() : -1, POLLIN, 0}};
    ::poll(fds, 2, 100);
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      total += static_cast<size_t>(n);
      std::string& dst = i == 0 ? r.out : r.err;
      const size_t room = spec.output_cap_bytes > r.out.size() + r.err.size()
                              ? spec.output_cap_bytes - r.out.size() - r.err.size()
                              : 0;
      dst.append(buf, std::min(room, static_cast<size_t>(n)));
      if (total > spec.output_cap_bytes && !r.truncated) stop(&r.truncated);
    }
    const double ms = t.elapsed_ms();
    if (!exited && proc->wait(0)) exited = true, exited_at = ms;
    // Background children may hold the pipes open after the command exits: give them 200 ms.
    if (exited && ms - exited_at > 200) proc->kill_tree(SIGKILL);
    if (exited && ms - exited_at > 1000) break;
    if (!r.timed_out && spec.timeout_ms > 0 && ms > static_cast<double>(spec.timeout_ms)) stop(&r.timed_out);
    if (!r.cancelled && cancel && cancel->load()) stop(&r.cancelled);
    if (progress && ms - last_progress >= 1000) {
      last_progress = ms;
      progress(ms / 1000.0, total);
    }
  }
  proc->wait(-1);
  // A fork bomb refills its group while we kill it: keep killing until it is empty.
  for (int i = 0; i < 100 && ::kill(-proc->pid(), 0) == 0; ++i) {
    ::kill(-proc->pid(), SIGKILL);
    ::usleep(2000);
  }
  r.exit_status = proc->exit_status();
  r.elapsed_ms = t.elapsed_ms();
  return r;
}

}  // namespace fathom::agent
