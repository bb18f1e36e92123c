// MappedFile over mmap(2)/madvise(2).
#include "base/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace fathom {

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
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
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::advise(size_t offset, size_t length, MapAdvice advice) const {
  if (data_ == nullptr || offset >= size_) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + length);
  int flag = MADV_NORMAL;
  switch (advice) {
    case MapAdvice::kNormal: flag = MADV_NORMAL; break;
    case MapAdvice::kSequential: flag = MADV_SEQUENTIAL; break;
    case MapAdvice::kRandom: flag = MADV_RANDOM; break;
    case MapAdvice::kWillNeed: flag = MADV_WILLNEED; break;
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
