// FaultInjector: the fault-injection layer under a chunk engine's data files and its RocksDB
// metadata, for crash-consistency tests. A process kill leaves the page cache intact, so it
// cannot expose a missing sync; this layer can:
//   - power_loss() drops every write not yet made durable (data-file writes since the file's last
//     fdatasync are rolled back to the bytes they overwrote; RocksDB files are truncated to their
//     last synced length) and then fails all further I/O, as a dead device would, until reset();
//   - rules fail chosen operations (the 3rd data write, every metadata sync, fallocate with
//     ENOSPC, ...) with a chosen errno.
// Not simulated: loss of directory entries (renames, file creation) that were never fsynced, and
// reordering inside a synced range. Thread-safe. Internal to storage/.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom::storage {

enum class FaultOp : uint8_t {
  kDataRead,
  kDataWrite,
  kDataSync,
  kDataAllocate,  // fallocate of a new group
  kDataPunch,     // hole punch of a freed group
  kMetaWrite,     // any append to a RocksDB file
  kMetaSync,      // any sync of a RocksDB file or directory
};

std::string_view fault_op_name(FaultOp op);

struct FaultRule {
  FaultOp op = FaultOp::kDataWrite;
  int skip = 0;               // let this many matching operations through first
  int count = 1;              // then fail this many (-1: all following)
  int error = 5;              // errno reported (EIO by default; ENOSPC to simulate a full disk)
  std::string path_contains;  // only operations on paths containing this ("" = any)
};

class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  void add_rule(FaultRule rule);
  void clear_rules();
  // Simulated power loss: rolls back every unsynced write, then fails all I/O until reset().
  Status power_loss();
  // Power is back: I/O works again and tracking restarts from a clean state.
  void reset();
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  uint64_t failures_injected() const { return injected_.load(); }

  // --- hooks for the I/O layers ---
  // Held (shared) by an I/O layer from check() until the operation and its record_*/meta_* call
  // are done, so power_loss() (exclusive) never interleaves with a half-recorded write.
  std::shared_lock<std::shared_mutex> hold() { return std::shared_lock(gate_); }
  // An injected failure (errno-style Status) or ok; fails everything after power_loss().
  Status check(FaultOp op, std::string_view path);
  // Before a data write lands: the bytes it is about to overwrite (aligned, len bytes).
  void record_data_write(const std::string& path, uint64_t offset, std::string old_bytes);
  void data_synced(const std::string& path);
  // RocksDB file tracking: bytes appended so far and bytes made durable.
  void meta_appended(const std::string& path, uint64_t size_now);
  void meta_synced(const std::string& path, uint64_t size_now);
  void meta_created(const std::string& path);

 private:
  struct Undo {
    uint64_t offset;
    std::string old_bytes;
  };
  struct MetaFile {
    uint64_t size = 0;
    uint64_t synced = 0;
  };
  std::shared_mutex gate_;
  std::mutex mu_;
  std::vector<FaultRule> rules_;
  std::vector<int> rule_seen_;
  std::map<std::string, std::vector<Undo>> undo_;  // path -> unsynced writes, oldest first
  std::map<std::string, MetaFile> meta_;
  std::atomic<bool> dead_{false};
  std::atomic<uint64_t> injected_{0};
};

}  // namespace fathom::storage
