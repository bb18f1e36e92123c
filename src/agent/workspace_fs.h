// Workspace-confined file access for the built-in plugins: every path is resolved with openat2
// and RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS relative to the workspace directory, so `..`,
// absolute symlinks and /proc magic links cannot leave it (the kernel checks each step).
// Internal to the agent component.
#pragma once

#include <sys/types.h>

#include <string>

#include "base/status.h"

namespace fathom::agent {

class Workspace {
 public:
  static Result<Workspace> open(const std::string& root);
  Workspace(Workspace&& o) noexcept : root_(std::move(o.root_)), fd_(o.fd_) { o.fd_ = -1; }
  ~Workspace();
  const std::string& root() const { return root_; }
  int fd() const { return fd_; }

  // A path as the model gave it ("src/a.c", "/abs/in/ws/a.c") -> relative to the root.
  // Absolute paths outside the workspace are rejected by name.
  Result<std::string> relative(const std::string& path) const;
  // openat2 beneath the root; errors say "escapes the workspace" for EXDEV/ELOOP.
  Result<int> open_at(const std::string& path, int flags, mode_t mode = 0644) const;
  Result<std::string> read(const std::string& path, size_t max_bytes) const;
  // Atomic write (temp file + rename) creating parent directories (each made beneath the root).
  Status write(const std::string& path, std::string_view data) const;
  Status make_dirs(const std::string& rel_dir) const;

 private:
  Workspace(std::string root, int fd) : root_(std::move(root)), fd_(fd) {}
  std::string root_;
  int fd_ = -1;
};

}  // namespace fathom::agent
