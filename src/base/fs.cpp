// File helpers over POSIX calls.
#include "base/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>

namespace fathom {

Result<std::string> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, fmt::format("open '{}'", path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return errno_status(err, fmt::format("read '{}'", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::string> read_file_prefix(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, fmt::format("open '{}'", path));
  std::string out(max_bytes, '\0');
  size_t got = 0;
  while (got < max_bytes) {
    ssize_t n = ::read(fd, out.data() + got, max_bytes - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return errno_status(err, fmt::format("read '{}'", path));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

Status write_all(int fd, const void* data, size_t size, std::string_view what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, fmt::format("write {}", what));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

Status read_exact_at(int fd, void* data, size_t size, uint64_t offset, std::string_view what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, fmt::format("read {}", what));
    }
    if (n == 0) return corrupt("read {}: unexpected end of file at offset {}", what, offset);
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

Status write_file_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, fmt::format("create '{}'", tmp));
  Status st = write_all(fd, data.data(), data.size(), fmt::format("'{}'", tmp));
  if (st.ok() && ::fsync(fd) != 0) st = errno_status(errno, fmt::format("fsync '{}'", tmp));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = errno_status(errno, fmt::format("rename '{}' to '{}'", tmp, path));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

Result<uint64_t> free_disk_bytes(const std::string& path) {
  struct statvfs st{};
  if (statvfs(path.c_str(), &st) != 0) return errno_status(errno, fmt::format("statvfs '{}'", path));
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

Result<uint64_t> file_size(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return errno_status(errno, fmt::format("stat '{}'", path));
  return static_cast<uint64_t>(st.st_size);
}

bool path_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return io_error("create directory '{}': {}", path, ec.message());
  return {};
}

Result<OutputFile> OutputFile::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, fmt::format("create '{}'", path));
  return OutputFile(path, fd);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), position_(other.position_) {
  other.fd_ = -1;
}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    position_ = other.position_;
    other.fd_ = -1;
  }
  return *this;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status OutputFile::write(const void* data, size_t size) {
  TRY(write_all(fd_, data, size, fmt::format("'{}'", path_)));
  position_ += size;
  return {};
}

Status OutputFile::pwrite_at(const void* data, size_t size, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, fmt::format("write '{}'", path_));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

Status OutputFile::sync() {
  if (::fsync(fd_) != 0) return errno_status(errno, fmt::format("fsync '{}'", path_));
  return {};
}

Status OutputFile::close() {
  if (fd_ < 0) return {};
  Status st = sync();
  if (::close(fd_) != 0 && st.ok()) st = errno_status(errno, fmt::format("close '{}'", path_));
  fd_ = -1;
  return st;
}

}  // namespace fathom
