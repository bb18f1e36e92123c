// Workspace: openat2-confined paths. See workspace_fs.h.
#include "agent/workspace_fs.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "base/fs.h"
#include "base/strings.h"

namespace fathom::agent {

Result<Workspace> Workspace::open(const std::string& root) {
  char buf[PATH_MAX];
  if (!::realpath(root.c_str(), buf)) return errno_status(errno, "workspace '" + root + "'");
  int fd = ::open(buf, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "workspace '" + root + "'");
  return Workspace(buf, fd);
}

Workspace::~Workspace() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::string> Workspace::relative(const std::string& path) const {
  if (path.find('\0') != std::string::npos) return invalid_argument("path contains a NUL byte");
  if (path.empty() || path == "." || path == root_) return std::string(".");
  if (path[0] != '/') return path;
  if (starts_with(path, root_ + "/")) return path.substr(root_.size() + 1);
  return permission_denied("path '{}' is outside the workspace {}", path, root_);
}

Result<int> Workspace::open_at(const std::string& path, int flags, mode_t mode) const {
  const std::string rel = TRY(relative(path));
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  int fd = static_cast<int>(::syscall(SYS_openat2, fd_, rel.c_str(), &how, sizeof(how)));
  if (fd >= 0) return fd;
  if (errno == EXDEV || errno == ELOOP)
    return permission_denied("path '{}' escapes the workspace {} (through '..' or a symlink)", path, root_);
  return errno_status(errno, "'" + path + "'");
}

Result<std::string> Workspace::read(const std::string& path, size_t max_bytes) const {
  int fd = TRY(open_at(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return invalid_argument("'{}' is a directory", path);
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return errno_status(e, "read '" + path + "'");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return resource_exhausted("'{}' is larger than {} bytes; read it by line ranges", path, max_bytes);
    }
  }
  ::close(fd);
  return out;
}

Status Workspace::make_dirs(const std::string& rel_dir) const {
  std::string cur;
  for (auto part : split(rel_dir, '/')) {
    if (part.empty() || part == ".") continue;
    std::string parent = cur.empty() ? "." : cur;
    cur += (cur.empty() ? "" : "/") + std::string(part);
    if (part == "..") return permission_denied("path '{}' escapes the workspace", rel_dir);
    int pfd = TRY(open_at(parent, O_PATH | O_DIRECTORY));
    int r = ::mkdirat(pfd, std::string(part).c_str(), 0755);
    int e = errno;
    ::close(pfd);
    if (r != 0 && e != EEXIST) return errno_status(e, "mkdir '" + cur + "'");
    int check = TRY(open_at(cur, O_PATH | O_DIRECTORY));  // a symlinked dir pointing out fails here
    ::close(check);
  }
  return {};
}

Status Workspace::write(const std::string& path, std::string_view data) const {
  const std::string rel = TRY(relative(path));
  const size_t slash = rel.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : rel.substr(0, slash);
  const std::string base = slash == std::string::npos ? rel : rel.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") return invalid_argument("'{}' is not a file path", path);
  TRY(make_dirs(dir));
  int dfd = TRY(open_at(dir, O_PATH | O_DIRECTORY));
  // An existing symlink at the target is never followed: rename replaces the link itself.
  const std::string tmp = fmt::format(".{}.fathom-tmp-{}", base, ::getpid());
  int fd = ::openat(dfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    int e = errno;
    ::close(dfd);
    return errno_status(e, "create '" + path + "'");
  }
  struct stat old;
  if (::fstatat(dfd, base.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(old.st_mode))
    ::fchmod(fd, old.st_mode & 07777);
  Status s = write_all(fd, data.data(), data.size(), "'" + path + "'");
  ::close(fd);
  if (s.ok() && ::renameat(dfd, tmp.c_str(), dfd, base.c_str()) != 0)
    s = errno_status(errno, "rename into '" + path + "'");
  if (!s.ok()) ::unlinkat(dfd, tmp.c_str(), 0);
  ::close(dfd);
  return s;
}

}  // namespace fathom::agent
