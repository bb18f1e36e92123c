// Small file-system helpers with Status errors: whole-file reads, atomic durable writes, free
// space. Large data goes through mmap.h or the storage component, not through these.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom {

Result<std::string> read_file(const std::string& path);
// At most the first `max_bytes` bytes of a file.
Result<std::string> read_file_prefix(const std::string& path, size_t max_bytes);
// Writes to "<path>.tmp.<pid>", fsyncs, renames over path, fsyncs the directory.
Status write_file_atomic(const std::string& path, std::string_view data);
Result<uint64_t> free_disk_bytes(const std::string& path);
Result<uint64_t> file_size(const std::string& path);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
Status make_directories(const std::string& path);
// Writes all of data to fd, retrying on EINTR and short writes.
Status write_all(int fd, const void* data, size_t size, std::string_view what);
// Reads exactly size bytes at offset (pread), failing on EOF.
Status read_exact_at(int fd, void* data, size_t size, uint64_t offset, std::string_view what);

// A file opened for writing that is closed on destruction; for streaming writers.
class OutputFile {
 public:
  static Result<OutputFile> create(const std::string& path);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  ~OutputFile();
  Status write(const void* data, size_t size);
  Status write(std::string_view s) { return write(s.data(), s.size()); }
  Status pwrite_at(const void* data, size_t size, uint64_t offset);
  uint64_t position() const { return position_; }
  Status sync();
  Status close();  // syncs and closes; errors are reported, unlike the destructor
  const std::string& path() const { return path_; }

 private:
  OutputFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  uint64_t position_ = 0;
};

}  // namespace fathom
