// FaultInjector: rule matching, unsynced-write tracking and the simulated power loss.
#include "storage/faults.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace fathom::storage {

std::string_view fault_op_name(FaultOp op) {
  switch (op) {
    case FaultOp::kDataRead:
      return "data read";
    case FaultOp::kDataWrite:
      return "data write";
    case FaultOp::kDataSync:
      return "data sync";
    case FaultOp::kDataAllocate:
      return "data allocate";
    case FaultOp::kDataPunch:
      return "data punch";
    case FaultOp::kMetaWrite:
      return "metadata write";
    case FaultOp::kMetaSync:
      return "metadata sync";
  }
  return "?";
}

void FaultInjector::add_rule(FaultRule rule) {
  std::lock_guard lock(mu_);
  rules_.push_back(std::move(rule));
  rule_seen_.push_back(0);
}

void FaultInjector::clear_rules() {
  std::lock_guard lock(mu_);
  rules_.clear();
  rule_seen_.clear();
}

Status FaultInjector::check(FaultOp op, std::string_view path) {
  if (dead()) return io_error("{} on '{}': device lost power (simulated)", fault_op_name(op), path);
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& r = rules_[i];
    if (r.op != op) continue;
    if (!r.path_contains.empty() && path.find(r.path_contains) == std::string_view::npos) continue;
    const int seen = rule_seen_[i]++;
    if (seen < r.skip) continue;
    if (r.count >= 0 && seen >= r.skip + r.count) continue;
    injected_.fetch_add(1);
    return errno_status(r.error, fmt::format("{} on '{}' (injected)", fault_op_name(op), path));
  }
  return {};
}

void FaultInjector::record_data_write(const std::string& path, uint64_t offset, std::string old_bytes) {
  std::lock_guard lock(mu_);
  undo_[path].push_back(Undo{offset, std::move(old_bytes)});
}

void FaultInjector::data_synced(const std::string& path) {
  std::lock_guard lock(mu_);
  undo_.erase(path);
}

void FaultInjector::meta_created(const std::string& path) {
  std::lock_guard lock(mu_);
  meta_[path] = MetaFile{};
}

void FaultInjector::meta_appended(const std::string& path, uint64_t size_now) {
  std::lock_guard lock(mu_);
  meta_[path].size = size_now;
}

void FaultInjector::meta_synced(const std::string& path, uint64_t size_now) {
  std::lock_guard lock(mu_);
  MetaFile& f = meta_[path];
  f.size = size_now;
  f.synced = size_now;
}

namespace {

// Writes `bytes` back at `offset` through an O_DIRECT descriptor (the engine's writes are
// aligned, so their undo images are too).
Status restore(int fd, uint64_t offset, const std::string& bytes, const std::string& path) {
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, bytes.size() ? bytes.size() : 4096) != 0) {
    return resource_exhausted("power loss: no memory for undo image of '{}'", path);
  }
  std::memcpy(buf, bytes.data(), bytes.size());
  const ssize_t n = pwrite(fd, buf, bytes.size(), static_cast<off_t>(offset));
  const int err = errno;
  std::free(buf);
  if (n != static_cast<ssize_t>(bytes.size()))
    return errno_status(err, fmt::format("power loss: restore '{}'", path));
  return {};
}

}  // namespace

Status FaultInjector::power_loss() {
  // Dead first, so no new write slips in between the rollback and the flag.
  dead_.store(true, std::memory_order_release);
  std::unique_lock gate(gate_);
  std::lock_guard lock(mu_);
  Status first;
  for (auto& [path, undos] : undo_) {
    int fd = ::open(path.c_str(), O_RDWR | O_DIRECT);
    if (fd < 0) fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0) {
      if (first.ok()) first = errno_status(errno, fmt::format("power loss: open '{}'", path));
      continue;
    }
    for (auto it = undos.rbegin(); it != undos.rend(); ++it) {
      Status s = restore(fd, it->offset, it->old_bytes, path);
      if (!s.ok() && first.ok()) first = s;
    }
    if (::fsync(fd) != 0 && first.ok())
      first = errno_status(errno, fmt::format("power loss: fsync '{}'", path));
    ::close(fd);
  }
  undo_.clear();
  for (auto& [path, f] : meta_) {
    if (f.size <= f.synced) continue;
    if (::truncate(path.c_str(), static_cast<off_t>(f.synced)) != 0 && errno != ENOENT && first.ok()) {
      first = errno_status(errno, fmt::format("power loss: truncate '{}'", path));
    }
  }
  meta_.clear();
  log_debug("fault injector: simulated power loss");
  return first;
}

void FaultInjector::reset() {
  std::lock_guard lock(mu_);
  undo_.clear();
  meta_.clear();
  rules_.clear();
  rule_seen_.clear();
  dead_.store(false, std::memory_order_release);
}

}  // namespace fathom::storage
