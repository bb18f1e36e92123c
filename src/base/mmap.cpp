// MappedFile over mmap(2)/madvise(2).
#include "base/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace fathom {

namespace {

std::atomic<LoadMode> g_load_mode{LoadMode::kMap};

// The whole file into fresh anonymous memory, then read-only; the page cache copy is dropped
// piece by piece so the file is not resident twice. File byte `align_at` lands on a kCacheLine
// boundary: the copy starts `shift` bytes into the allocation.
struct ReadCopy {
  void* base = nullptr;
  size_t base_size = 0;
  const uint8_t* data = nullptr;
};

Result<ReadCopy> read_whole(int fd, const std::string& path, size_t size, uint64_t align_at) {
  const size_t shift = static_cast<size_t>((kCacheLine - align_at % kCacheLine) % kCacheLine);
  const size_t base_size = size + shift;
  void* p = mmap(nullptr, base_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return errno_status(errno, fmt::format("allocate {} bytes to read '{}'", size, path));
  (void)madvise(p, base_size, MADV_HUGEPAGE);  // advice only
  auto* dst = static_cast<uint8_t*>(p) + shift;
  constexpr size_t kPiece = size_t{64} << 20;
  for (size_t off = 0; off < size;) {
    const ssize_t n = pread(fd, dst + off, std::min(kPiece, size - off), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      munmap(p, base_size);
      if (err != 0) return errno_status(err, fmt::format("read '{}' at byte {}", path, off));
      return io_error("'{}' ended at byte {} while reading {} bytes (truncated while loading?)", path, off,
                      size);
    }
    (void)posix_fadvise(fd, static_cast<off_t>(off), n, POSIX_FADV_DONTNEED);
    off += static_cast<size_t>(n);
  }
  (void)mprotect(p, base_size, PROT_READ);
  return ReadCopy{p, base_size, dst};
}

}  // namespace

void set_default_load_mode(LoadMode mode) {
  g_load_mode.store(mode, std::memory_order_relaxed);
}

LoadMode default_load_mode() {
  return g_load_mode.load(std::memory_order_relaxed);
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  return open(path, default_load_mode());
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path, LoadMode mode) {
  return open(path, mode, 0);
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path, LoadMode mode,
                                                     uint64_t align_at) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, fmt::format("open '{}'", path));
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return errno_status(err, fmt::format("stat '{}'", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("'{}' is not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0 && mode == LoadMode::kRead) {
    auto read = read_whole(fd, path, size, align_at);
    ::close(fd);
    if (!read.ok()) return read.status();
    return std::unique_ptr<MappedFile>(
        new MappedFile(path, read->data, size, mode, read->base, read->base_size));
  }
  if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return errno_status(err, fmt::format("mmap '{}' ({} bytes)", path, size));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, data, size, mode, const_cast<uint8_t*>(data), data == nullptr ? 0 : size));
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) munmap(base_, base_size_);
}

void MappedFile::advise(size_t offset, size_t length, MapAdvice advice) const {
  if (data_ == nullptr || offset >= size_ || mode_ == LoadMode::kRead) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + length);
  int flag = MADV_NORMAL;
  switch (advice) {
    // clang-format off
    case MapAdvice::kNormal: flag = MADV_NORMAL; break;
    case MapAdvice::kSequential: flag = MADV_SEQUENTIAL; break;
    case MapAdvice::kRandom: flag = MADV_RANDOM; break;
    case MapAdvice::kWillNeed: flag = MADV_WILLNEED; break;
    // clang-format on
  }
  (void)madvise(const_cast<uint8_t*>(data_) + begin, end - begin, flag);
}

void MappedFile::prefault(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t end = std::min(size_, offset + length);
  volatile uint8_t sink = 0;
  for (size_t i = offset; i < end; i += page) sink = static_cast<uint8_t>(sink + data_[i]);
  (void)sink;
}

}  // namespace fathom
