// Child processes for the storage end-to-end tests: run a command to completion (capturing
// stdout/stderr), or start a long-running server, read its readiness line, signal and reap it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace fathom::storage::e2e {

inline std::string fathom_bin() {
  const char* bin = std::getenv("FATHOM_BIN");
  return bin ? bin : "fathom";
}

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

// Reads both pipes until both close (poll, so neither can fill up and stall the child).
inline void drain(int out_fd, int err_fd, std::string& out, std::string& err) {
  pollfd p[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  int open = 2;
  char buf[65536];
  while (open > 0) {
    if (::poll(p, 2, -1) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || p[i].revents == 0) continue;
      const ssize_t n = ::read(p[i].fd, buf, sizeof(buf));
      if (n > 0) {
        (i == 0 ? out : err).append(buf, static_cast<size_t>(n));
      } else {
        ::close(p[i].fd);
        p[i].fd = -1;
        --open;
      }
    }
  }
}

inline pid_t spawn(const std::vector<std::string>& args, int* out_fd, int* err_fd,
                   const std::string& stdin_data = "") {
  int out[2], err[2], in[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0 || ::pipe(in) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) ::close(fd);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (!stdin_data.empty()) (void)!::write(in[1], stdin_data.data(), stdin_data.size());
  ::close(in[1]);
  *out_fd = out[0];
  *err_fd = err[0];
  return pid;
}

// Runs `fathom ARGS...` to completion.
inline RunResult run(const std::vector<std::string>& args, const std::string& stdin_data = "") {
  std::vector<std::string> full = {fathom_bin()};
  full.insert(full.end(), args.begin(), args.end());
  RunResult r;
  int out = -1, err = -1;
  const pid_t pid = spawn(full, &out, &err, stdin_data);
  if (pid < 0) return r;
  drain(out, err, r.out, r.err);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A `fathom store server` child.
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ~ServerProcess() { kill(SIGKILL); }

  // Starts the server and waits for its readiness line; false (with the output in log()) if it
  // exits instead.
  bool start(const std::vector<std::string>& args) {
    std::vector<std::string> full = {fathom_bin(), "store", "server", "--listen", "127.0.0.1:0"};
    full.insert(full.end(), args.begin(), args.end());
    pid_ = spawn(full, &out_, &err_);
    if (pid_ < 0) return false;
    std::string line;
    char c;
    while (::read(out_, &c, 1) == 1) {
      if (c != '\n') {
        line.push_back(c);
        continue;
      }
      stdout_ += line + "\n";
      const size_t at = line.find("ready listen=");
      if (at != std::string::npos) {
        address_ = line.substr(at + 13, line.find(' ', at + 13) - (at + 13));
        // Keep reading its output so a chatty server never blocks on a full pipe.
        drainer_ = std::thread([this] { drain(out_, err_, rest_out_, rest_err_); });
        return true;
      }
      line.clear();
    }
    wait();
    return false;
  }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  void kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
    if (sig == SIGKILL) wait();
  }
  // Reaps the child; its exit code (128+signal when killed).
  int wait() {
    if (pid_ <= 0) return exit_code_;
    if (drainer_.joinable()) {
      drainer_.join();
    } else {
      drain(out_, err_, rest_out_, rest_err_);
    }
    stdout_ += rest_out_;
    stderr_ += rest_err_;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  std::string log() const { return stdout_ + stderr_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  int exit_code_ = -1;
  std::string address_, stdout_, stderr_;
  std::string rest_out_, rest_err_;
  std::thread drainer_;
};

}  // namespace fathom::storage::e2e
