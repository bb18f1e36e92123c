// ChildProcess: fork+exec with pipes. The child runs only async-signal-safe code: every string is
// prepared before fork. Not a general process library: no pty, no resource accounting.
#include "agent/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "base/strings.h"
#include "base/timer.h"

extern char** environ;

namespace fathom::agent {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Writes a message and exits; only async-signal-safe calls.
[[noreturn]] void child_fail(int err_fd, const char* what, int err) {
  const char* msg = strerror(err);  // not strictly AS-safe, but the table lookup takes no locks
  if (err_fd >= 0) {
    ssize_t r = ::write(err_fd, what, strlen(what));
    r = ::write(err_fd, ": ", 2);
    r = ::write(err_fd, msg, strlen(msg));
    r = ::write(err_fd, "\n", 1);
    (void)r;
  }
  _exit(127);
}

}  // namespace

std::string find_in_path(const std::string& name, const std::string& path_env) {
  if (name.find('/') != std::string::npos) return name;
  // Named: split() returns views into it, and a temporary in the range-for initialiser would be
  // destroyed before the loop body runs (a use-after-free ASan found).
  const std::string dirs = path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env;
  for (auto dir : split(dirs, ':')) {
    std::string candidate = std::string(dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

namespace {
std::string& self_override() {
  static std::string path;
  return path;
}
}  // namespace

void set_self_executable(std::string path) {
  self_override() = std::move(path);
}

std::string self_executable() {
  if (!self_override().empty()) return self_override();
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

std::vector<std::string> environment_subset(const std::vector<std::string>& keep) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    for (const auto& k : keep)
      if (kv.substr(0, eq) == k) out.emplace_back(kv);
  }
  return out;
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return invalid_argument("spawn: empty command");
  std::string path_env = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : o.env)
    if (starts_with(kv, "PATH=")) path_env = kv.substr(5);
  const std::string exe = find_in_path(o.argv[0], path_env);
  if (exe.empty()) return not_found("spawn: '{}' not found in PATH ({})", o.argv[0], path_env);
  std::vector<char*> argv, envp;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : o.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int in[2] = {-1, -1}, out[2], err[2], status_pipe[2];
  if (o.pipe_stdin && ::pipe2(in, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
  if (::pipe2(out, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
  const int devnull = o.pipe_stdin ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  pid_t pid = ::fork();
  if (pid < 0) return errno_status(errno, "fork");
  if (pid == 0) {
    // Child: async-signal-safe only.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (o.new_process_group) setsid();
    if (::dup2(o.pipe_stdin ? in[0] : devnull, 0) < 0) child_fail(status_pipe[1], "dup2", errno);
    if (::dup2(out[1], 1) < 0) child_fail(status_pipe[1], "dup2", errno);
    if (::dup2(o.merge_stderr ? out[1] : err[1], 2) < 0) child_fail(status_pipe[1], "dup2", errno);
    for (const auto& [res, value] : o.rlimits) {
      struct rlimit rl = {static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
      if (::setrlimit(res, &rl) != 0) child_fail(status_pipe[1], "setrlimit", errno);
    }
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) child_fail(status_pipe[1], "chdir", errno);
    ::execve(exe.c_str(), argv.data(), envp.data());
    child_fail(status_pipe[1], exe.c_str(), errno);
  }
  auto p = std::unique_ptr<ChildProcess>(new ChildProcess());
  p->pid_ = pid;
  p->group_ = o.new_process_group;
  if (o.pipe_stdin) ::close(in[0]);
  if (devnull >= 0) ::close(devnull);
  ::close(out[1]);
  ::close(err[1]);
  ::close(status_pipe[1]);
  p->in_ = in[1];
  p->out_ = out[0];
  p->err_ = err[0];
  // exec succeeded when the CLOEXEC status pipe closes with nothing written.
  char buf[512];
  ssize_t n;
  do n = ::read(status_pipe[0], buf, sizeof(buf) - 1);
  while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n > 0) {
    p->wait(-1);
    std::string msg(buf, static_cast<size_t>(n));
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    return unavailable("spawn '{}': {}", o.argv[0], msg);
  }
  return p;
}

ChildProcess::~ChildProcess() {
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
  kill_tree(SIGKILL);
  wait(-1);
}

void ChildProcess::close_stdin() {
  close_fd(in_);
}

void ChildProcess::kill_tree(int sig) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ <= 0) return;
  // The group outlives its leader while members remain, and its id is not reused until then.
  if (group_) ::kill(-pid_, sig);
  if (!exited_) ::kill(pid_, sig);
}

bool ChildProcess::wait(int timeout_ms) {
  Timer t;
  int backoff_us = 100;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    if (exited_) return true;
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      return true;
    }
    if (r < 0 && errno != EINTR) {
      exited_ = true;  // not our child any more (reaped elsewhere)
      return true;
    }
    lock.unlock();
    if (timeout_ms >= 0 && t.elapsed_ms() >= timeout_ms) return false;
    ::usleep(backoff_us);
    backoff_us = std::min(backoff_us * 2, 10000);
  }
}

std::string ChildProcess::describe_exit() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!exited_) return "still running";
  if (status_ > 128) return fmt::format("killed by signal {} ({})", status_ - 128, strsignal(status_ - 128));
  return fmt::format("exited with status {}", status_);
}

}  // namespace fathom::agent
