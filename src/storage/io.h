// DataFiles: the chunk engine's data files and the one way bytes reach them. Reads and writes go
// in batches; on io_uring (liburing) a batch is submitted at once and completes in any order,
// with a ring per calling thread; where io_uring is unavailable (old kernel, seccomp) the same
// batch runs as pread/pwrite. Files are opened O_DIRECT (no page-cache copy, no double caching)
// unless the filesystem refuses it (tmpfs), in which case buffered I/O with fdatasync is used and
// direct() says so. Every operation passes through the optional FaultInjector.
//
// Thread safety: every method may be called from any thread. Buffers for O_DIRECT must be
// 4096-aligned with lengths and offsets multiples of 4096. Internal to storage/.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom::storage {

class FaultInjector;

enum class IoBackend : uint8_t { kAuto, kUring, kPsync };
std::string_view io_backend_name(IoBackend backend);
Result<IoBackend> parse_io_backend(std::string_view name);

inline constexpr uint32_t kIoAlign = 4096;
inline constexpr uint64_t align_up(uint64_t n, uint64_t a = kIoAlign) {
  return (n + a - 1) / a * a;
}

struct IoOp {
  int file = 0;
  bool write = false;
  uint64_t offset = 0;
  void* buf = nullptr;
  uint32_t length = 0;
  Status status;  // set by run()
};

struct DataFilesParams {
  std::string dir;  // created if missing
  IoBackend backend = IoBackend::kAuto;
  bool direct = true;               // O_DIRECT where the filesystem allows it
  FaultInjector* faults = nullptr;  // not owned; may be null
  unsigned queue_depth = 64;        // io_uring submissions in flight per batch
};

class DataFiles {
 public:
  static constexpr int kMaxFiles = 64;

  static Result<std::unique_ptr<DataFiles>> open(DataFilesParams params);
  ~DataFiles();
  DataFiles(const DataFiles&) = delete;
  DataFiles& operator=(const DataFiles&) = delete;

  // Opens (creating if needed) dir/name; the same name always yields the same index.
  Result<int> open_file(const std::string& name);
  // Runs every op; each op's status is set; returns the first failure (or ok). `done(i)`, when
  // given, runs on the calling thread once for every op as soon as op i is final (its status set),
  // while later ops may still be in flight: a reader verifies a chunk while the rest load.
  Status run(std::span<IoOp> ops, const std::function<void(size_t)>& done = {});
  Status sync(int file);
  Status allocate(int file, uint64_t offset, uint64_t length);  // fallocate (ENOSPC: exhausted)
  Status punch(int file, uint64_t offset, uint64_t length);     // release the blocks of a range
  Result<uint64_t> size(int file) const;
  // Whether every block of [offset, offset + length) holds written data (no hole, and on ext4 no
  // allocated-but-unwritten extent: SEEK_HOLE reports those as holes). False where SEEK_HOLE is
  // unsupported.
  bool all_written(int file, uint64_t offset, uint64_t length) const;
  const std::string& path(int file) const { return files_[file].path; }

  IoBackend backend() const { return backend_; }
  bool direct() const { return direct_; }

 private:
  struct File {
    std::string name;
    std::string path;
    int fd = -1;
  };
  explicit DataFiles(DataFilesParams params) : params_(std::move(params)) {}
  Status run_psync(std::span<IoOp> ops, const std::function<void(size_t)>& done);
  Status run_uring(std::span<IoOp> ops, bool* unavailable, const std::function<void(size_t)>& done);
  Status prepare_faults(std::span<IoOp> ops);

  DataFilesParams params_;
  IoBackend backend_ = IoBackend::kPsync;
  bool direct_ = false;
  std::mutex open_mu_;
  std::atomic<int> n_files_{0};
  File files_[kMaxFiles];
};

}  // namespace fathom::storage
