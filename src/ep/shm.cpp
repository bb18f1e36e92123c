// SharedArena and PrivateRegion. The arena's name carries the creator's pid and a random part;
// creation failures on any rank (no room in /dev/shm, shm_open refused) fail on every rank of the
// node with the creator's reason.
#include "ep/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/progress.h"
#include "ep/sync.h"

namespace fathom::ep::internal {
namespace {

constexpr size_t kNameBytes = 64;
constexpr size_t kReasonBytes = 192;

struct Announcement {
  char name[kNameBytes];
  char reason[kReasonBytes];  // empty on success
};

Status create_segment(const char* name, uint64_t bytes) {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < bytes)
      return resource_exhausted(
          "ep: the shared-memory arena needs {} but /dev/shm has {} free; lower "
          "max_tokens_per_rank, hidden or max_recv_tokens",
          format_bytes(bytes), format_bytes(avail));
  }
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errno_status(errno, fmt::format("ep: shm_open '{}'", name));
  const int rc = ftruncate(fd, static_cast<off_t>(bytes));
  const int err = errno;
  close(fd);
  if (rc != 0) {
    shm_unlink(name);
    return errno_status(err, fmt::format("ep: sizing shared memory '{}' to {}", name, format_bytes(bytes)));
  }
  return {};
}

Result<uint8_t*> map_segment(const char* name, uint64_t bytes) {
  const int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) return errno_status(errno, fmt::format("ep: shm_open '{}'", name));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return errno_status(err, fmt::format("ep: mmap of shared memory '{}'", name));
  return static_cast<uint8_t*>(p);
}

}  // namespace

Result<std::unique_ptr<SharedArena>> SharedArena::create(MPI_Comm node_comm, uint64_t bytes,
                                                         int64_t timeout_ms) {
  int node_rank = 0;
  MPI_Comm_rank(node_comm, &node_rank);
  Announcement a{};
  if (node_rank == 0) {
    std::random_device rd;
    std::snprintf(a.name, kNameBytes, "/fathom-ep-%d-%08x", static_cast<int>(getpid()), rd());
    if (Status s = create_segment(a.name, bytes); !s.ok())
      std::snprintf(a.reason, kReasonBytes, "%s", s.message().c_str());
  }
  MPI_Request req;
  MPI_Ibcast(&a, sizeof(a), MPI_BYTE, 0, node_comm, &req);
  TRY(wait_collective(&req, timeout_ms, "creating the shared-memory arena"));
  if (a.reason[0] != '\0') return resource_exhausted("{}", a.reason);
  uint8_t* data = nullptr;
  Status mapped;
  if (auto m = map_segment(a.name, bytes); m.ok())
    data = *m;
  else
    mapped = m.status();
  int ok_local = mapped.ok() ? 1 : 0, ok_all = 0;
  MPI_Iallreduce(&ok_local, &ok_all, 1, MPI_INT, MPI_MIN, node_comm, &req);
  Status all = wait_collective(&req, timeout_ms, "mapping the shared-memory arena");
  if (node_rank == 0) shm_unlink(a.name);  // every rank has mapped it (or failed): drop the name
  if (!all.ok() || !mapped.ok() || ok_all == 0) {
    if (data) munmap(data, bytes);
    if (!mapped.ok()) return mapped;
    if (!all.ok()) return all;
    return unavailable("ep: another rank of this node could not map the shared-memory arena '{}'", a.name);
  }
  return std::unique_ptr<SharedArena>(new SharedArena(data, bytes));
}

SharedArena::~SharedArena() {
  if (data_) munmap(data_, size_);
}

Result<PrivateRegion> PrivateRegion::allocate(uint64_t bytes, std::string_view what) {
  PrivateRegion r;
  if (bytes == 0) return r;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return errno_status(errno, fmt::format("ep: reserving {} for {}", format_bytes(bytes), what));
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  return r;
}

PrivateRegion& PrivateRegion::operator=(PrivateRegion&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = o.data_, size_ = o.size_;
    o.data_ = nullptr, o.size_ = 0;
  }
  return *this;
}

PrivateRegion::~PrivateRegion() {
  if (data_) munmap(data_, size_);
}

}  // namespace fathom::ep::internal
