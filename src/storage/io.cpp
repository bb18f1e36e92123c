// DataFiles: O_DIRECT files driven by io_uring (one ring per thread) or pread/pwrite, with the
// fault-injection hooks. Short transfers on io_uring finish synchronously.
#include "storage/io.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "base/fs.h"
#include "base/log.h"
#include "storage/faults.h"

namespace fathom::storage {

std::string_view io_backend_name(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "io_uring";
    case IoBackend::kPsync:
      return "psync";
  }
  return "?";
}

Result<IoBackend> parse_io_backend(std::string_view name) {
  if (name == "auto") return IoBackend::kAuto;
  if (name == "io_uring" || name == "uring") return IoBackend::kUring;
  if (name == "psync") return IoBackend::kPsync;
  return invalid_argument("unknown I/O backend '{}' (expected auto, io_uring or psync)", name);
}

namespace {

constexpr unsigned kRingEntries = 128;

// One ring per thread, created on first use; `error` is the -errno of a failed setup.
struct ThreadRing {
  io_uring ring{};
  int error = 0;
  ThreadRing() { error = io_uring_queue_init(kRingEntries, &ring, 0); }
  ~ThreadRing() {
    if (error == 0) io_uring_queue_exit(&ring);
  }
};

ThreadRing& thread_ring() {
  thread_local ThreadRing ring;
  return ring;
}

// Full pread/pwrite of one op, retrying EINTR and short transfers.
Status transfer_sync(int fd, IoOp& op, uint64_t done, const std::string& path) {
  auto* p = static_cast<uint8_t*>(op.buf);
  while (done < op.length) {
    const off_t at = static_cast<off_t>(op.offset + done);
    ssize_t n =
        op.write ? ::pwrite(fd, p + done, op.length - done, at) : ::pread(fd, p + done, op.length - done, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, fmt::format("{} '{}' at {}", op.write ? "write" : "read", path, at));
    }
    if (n == 0) return io_error("read '{}' at {}: unexpected end of file", path, at);
    done += static_cast<uint64_t>(n);
  }
  return {};
}

// Bytes currently stored at [offset, offset+length) (zeros past the end of the file).
Result<std::string> read_old(int fd, uint64_t offset, uint32_t length, const std::string& path) {
  void* buf = nullptr;
  if (posix_memalign(&buf, kIoAlign, align_up(length ? length : 1)) != 0) {
    return resource_exhausted("fault injector: no memory for an undo image of {} bytes", length);
  }
  std::memset(buf, 0, length);
  uint64_t done = 0;
  Status st;
  while (done < length) {
    ssize_t n =
        ::pread(fd, static_cast<uint8_t*>(buf) + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      st = errno_status(errno, fmt::format("fault injector: read undo image of '{}'", path));
      break;
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  std::string out(static_cast<const char*>(buf), length);
  std::free(buf);
  if (!st.ok()) return st;
  return out;
}

void op_fail(IoOp& op, Status status) {
  if (op.status.ok()) op.status = std::move(status);
}

}  // namespace

Result<std::unique_ptr<DataFiles>> DataFiles::open(DataFilesParams params) {
  TRY(make_directories(params.dir));
  std::unique_ptr<DataFiles> files(new DataFiles(std::move(params)));
  files->direct_ = files->params_.direct;
  IoBackend b = files->params_.backend;
  if (b != IoBackend::kPsync) {
    const int err = thread_ring().error;
    if (err != 0) {
      if (b == IoBackend::kUring) return errno_status(-err, "io_uring_queue_init (requested --io io_uring)");
      log_warn("storage: io_uring unavailable ({}); using pread/pwrite", std::strerror(-err));
      b = IoBackend::kPsync;
    } else {
      b = IoBackend::kUring;
    }
  }
  files->backend_ = b;
  return files;
}

DataFiles::~DataFiles() {
  const int n = n_files_.load();
  for (int i = 0; i < n; ++i) {
    if (files_[i].fd >= 0) ::close(files_[i].fd);
  }
}

Result<int> DataFiles::open_file(const std::string& name) {
  std::lock_guard lock(open_mu_);
  const int n = n_files_.load();
  for (int i = 0; i < n; ++i) {
    if (files_[i].name == name) return i;
  }
  if (n >= kMaxFiles)
    return resource_exhausted("data files: more than {} files in '{}'", kMaxFiles, params_.dir);
  const std::string path = params_.dir + "/" + name;
  int fd = -1;
  if (direct_) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EINVAL) {
      log_warn("storage: '{}' does not support O_DIRECT; using buffered I/O with fdatasync", params_.dir);
      direct_ = false;
    } else if (fd < 0) {
      return errno_status(errno, fmt::format("open data file '{}'", path));
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errno_status(errno, fmt::format("open data file '{}'", path));
  }
  files_[n] = File{name, path, fd};
  n_files_.store(n + 1);
  return n;
}

Status DataFiles::prepare_faults(std::span<IoOp> ops) {
  for (IoOp& op : ops) {
    const File& f = files_[op.file];
    op.status = params_.faults->check(op.write ? FaultOp::kDataWrite : FaultOp::kDataRead, f.path);
    if (!op.status.ok() || !op.write) continue;
    auto old = read_old(f.fd, op.offset, op.length, f.path);
    if (!old.ok()) {
      op.status = old.status();
      continue;
    }
    params_.faults->record_data_write(f.path, op.offset, std::move(*old));
  }
  return {};
}

Status DataFiles::run(std::span<IoOp> ops, const std::function<void(size_t)>& done) {
  std::optional<std::shared_lock<std::shared_mutex>> gate;
  if (params_.faults) {
    gate.emplace(params_.faults->hold());
    TRY(prepare_faults(ops));
  } else {
    for (IoOp& op : ops) op.status = Status();
  }
  for (const IoOp& op : ops) {
    CHECK(op.file >= 0 && op.file < n_files_.load());
    if (direct_)
      CHECK_MSG(op.offset % kIoAlign == 0 && op.length % kIoAlign == 0 &&
                    reinterpret_cast<uintptr_t>(op.buf) % kIoAlign == 0,
                "unaligned O_DIRECT op at {} length {}", op.offset, op.length);
  }
  if (backend_ == IoBackend::kUring) {
    bool unavailable = false;
    Status st = run_uring(ops, &unavailable, done);
    if (!unavailable) return st;
  }
  return run_psync(ops, done);
}

Status DataFiles::run_psync(std::span<IoOp> ops, const std::function<void(size_t)>& done) {
  Status first;
  for (size_t i = 0; i < ops.size(); ++i) {
    IoOp& op = ops[i];
    if (op.status.ok()) op.status = transfer_sync(files_[op.file].fd, op, 0, files_[op.file].path);
    if (!op.status.ok() && first.ok()) first = op.status;
    if (done) done(i);
  }
  return first;
}

Status DataFiles::run_uring(std::span<IoOp> ops, bool* unavailable, const std::function<void(size_t)>& done) {
  ThreadRing& tr = thread_ring();
  if (tr.error != 0) {  // this thread could not get a ring (e.g. locked-memory limit)
    *unavailable = true;
    return {};
  }
  io_uring* ring = &tr.ring;
  const size_t n = ops.size();
  const unsigned depth = std::min<unsigned>(params_.queue_depth ? params_.queue_depth : 1, kRingEntries);
  size_t next = 0, inflight = 0;
  std::vector<size_t> finished;  // completions reported after the ring is advanced: done() may take time
  auto skip_failed = [&] {
    for (; next < n && !ops[next].status.ok(); ++next) {
      if (done) done(next);
    }
  };
  skip_failed();
  while (next < n || inflight > 0) {
    while (next < n && inflight < depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      IoOp& op = ops[next];
      const int fd = files_[op.file].fd;
      if (op.write) {
        io_uring_prep_write(sqe, fd, op.buf, op.length, op.offset);
      } else {
        io_uring_prep_read(sqe, fd, op.buf, op.length, op.offset);
      }
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++inflight;
      skip_failed();
    }
    int r = io_uring_submit_and_wait(ring, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // The ring refuses work: fail what was not submitted, then drain what the kernel holds
      // (its buffers must not be released while it may still write into them).
      for (; next < n; ++next) {
        op_fail(ops[next], errno_status(-r, "io_uring_submit_and_wait"));
        if (done) done(next);
      }
      if (inflight > 0) {
        io_uring_cqe* wait_cqe = nullptr;
        const int w = io_uring_wait_cqe(ring, &wait_cqe);
        CHECK_MSG(w == 0 || w == -EINTR, "io_uring_wait_cqe failed with {} and {} requests in flight", w,
                  inflight);
      }
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head, seen = 0;
    finished.clear();
    io_uring_for_each_cqe(ring, head, cqe) {
      if (done) finished.push_back(cqe->user_data);
      IoOp& op = ops[cqe->user_data];
      const int res = cqe->res;
      const std::string& path = files_[op.file].path;
      if (res < 0) {
        op.status =
            errno_status(-res, fmt::format("{} '{}' at {}", op.write ? "write" : "read", path, op.offset));
      } else if (static_cast<uint32_t>(res) < op.length) {
        op.status = transfer_sync(files_[op.file].fd, op, static_cast<uint64_t>(res), path);
      }
      ++seen;
    }
    io_uring_cq_advance(ring, seen);
    inflight -= seen;
    if (done) {
      for (size_t i : finished) done(i);
    }
  }
  for (const IoOp& op : ops) {
    if (!op.status.ok()) return op.status;
  }
  return {};
}

Status DataFiles::sync(int file) {
  const File& f = files_[file];
  std::optional<std::shared_lock<std::shared_mutex>> gate;
  if (params_.faults) {
    gate.emplace(params_.faults->hold());
    TRY(params_.faults->check(FaultOp::kDataSync, f.path));
  }
  if (::fdatasync(f.fd) != 0) return errno_status(errno, fmt::format("fdatasync '{}'", f.path));
  if (params_.faults) params_.faults->data_synced(f.path);
  return {};
}

Status DataFiles::allocate(int file, uint64_t offset, uint64_t length) {
  const File& f = files_[file];
  std::optional<std::shared_lock<std::shared_mutex>> gate;
  if (params_.faults) {
    gate.emplace(params_.faults->hold());
    TRY(params_.faults->check(FaultOp::kDataAllocate, f.path));
  }
  int r = ::fallocate(f.fd, 0, static_cast<off_t>(offset), static_cast<off_t>(length));
  if (r != 0 && errno == EOPNOTSUPP)
    r = ::posix_fallocate(f.fd, static_cast<off_t>(offset), static_cast<off_t>(length));
  if (r != 0) {
    const int err = r > 0 ? r : errno;
    return errno_status(err, fmt::format("fallocate '{}' [{}, +{})", f.path, offset, length));
  }
  return {};
}

Status DataFiles::punch(int file, uint64_t offset, uint64_t length) {
  const File& f = files_[file];
  std::optional<std::shared_lock<std::shared_mutex>> gate;
  if (params_.faults) {
    gate.emplace(params_.faults->hold());
    TRY(params_.faults->check(FaultOp::kDataPunch, f.path));
  }
  if (::fallocate(f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) != 0) {
    if (errno == EOPNOTSUPP) return {};  // the space stays allocated; correctness is unaffected
    return errno_status(errno, fmt::format("punch hole '{}' [{}, +{})", f.path, offset, length));
  }
  return {};
}

Result<uint64_t> DataFiles::size(int file) const {
  struct stat st {};
  if (::fstat(files_[file].fd, &st) != 0)
    return errno_status(errno, fmt::format("stat '{}'", files_[file].path));
  return static_cast<uint64_t>(st.st_size);
}

bool DataFiles::all_written(int file, uint64_t offset, uint64_t length) const {
  const off_t hole = ::lseek(files_[file].fd, static_cast<off_t>(offset), SEEK_HOLE);
  return hole >= 0 && static_cast<uint64_t>(hole) >= offset + length;
}

}  // namespace fathom::storage
