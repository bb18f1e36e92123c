// ChunkEngine: one storage target, a directory on a local disk holding chunks (byte strings up
// to 64 MiB named by ids up to 1 KiB). Layout (docs/storage.md "Target layout"):
//   DIR/meta/   RocksDB: superblock + one 68-byte record per chunk (id -> slot, length, version,
//               CRC32C, flags, expiry, last writer)
//   DIR/data/   one preallocated data file per size class, in groups of slots (allocator.h)
//
// Writes are copy-on-write: the data lands in a fresh slot, is fdatasync'ed, then one synced
// RocksDB batch commits the new record and only then is the old slot freed. A crash at any point
// leaves the old chunk or the new one whole; slots written but never committed are free after a
// restart (the allocator is rebuilt from RocksDB; groups no chunk uses are hole-punched, or kept
// empty for new puts when all their blocks are written).
// Concurrent writers share commits (a leader writes the queued batches in one RocksDB write).
// Every read verifies the CRC32C; a mismatch is kCorrupt, never data.
//
// Cache semantics for evictable chunks (the KV-cache tier): a TTL makes a chunk disappear after
// expiry; when live data passes the high-water mark (or a reservation would pass the capacity)
// the least recently used evictable chunks are removed (sampled, approximate LRU). A read lease
// keeps a chunk from eviction and expiry for a while; a chunk being read is pinned, so its slot
// is never reused under the reader even if it is removed meanwhile.
//
// Thread safety: all methods may be called concurrently. Internal to storage/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/rng.h"
#include "base/status.h"
#include "storage/allocator.h"
#include "storage/io.h"
#include "storage/meta_store.h"

namespace fathom::storage {

class FaultInjector;

inline constexpr uint32_t kMaxChunkBytes = 64u << 20;
inline constexpr uint32_t kMaxChunkIdBytes = 1024;
inline constexpr uint32_t kWholeChunk = UINT32_MAX;

struct EngineParams {
  std::string dir;
  uint32_t target_id = 0;  // recorded at creation; a mismatch later is an error
  uint32_t chain_id = 0;
  uint64_t capacity_bytes = 0;  // cap on reserved data-file space; 0: the disk is the limit
  IoBackend io = IoBackend::kAuto;
  bool direct = true;
  FaultInjector* faults = nullptr;   // not owned
  uint64_t group_bytes = 16u << 20;  // used when the target is created; persisted
  // Groups emptied by removal, overwrite or eviction stay allocated, up to this many bytes, for
  // the next puts: on ext4 a direct write into blocks already written skips the unwritten-extent
  // conversion that a freshly allocated block journals before the commit's flush (docs/storage.md,
  // "Kept empty groups"). They are hole-punched when a reservation would pass the capacity or
  // the disk is full; a restart keeps the unused groups whose blocks are all written, up to this.
  uint64_t keep_empty_bytes = 1u << 30;
  double evict_high_water = 0.95;  // of capacity (live slot bytes), for maintain()
  double evict_low_water = 0.90;
  uint32_t evict_sample = 16;         // candidates compared per eviction (approximate LRU)
  std::function<int64_t()> clock_ms;  // Unix ms; the system clock when empty (tests inject one)
};

enum class WriteMode : uint8_t {
  kOverwrite = 0,  // replace any existing chunk (file data)
  kCreate = 1,     // keep an existing live chunk and report existed (immutable cache blocks)
};

struct WriteItem {
  std::string_view id;
  const uint8_t* data = nullptr;
  uint32_t length = 0;
  // data is 4096-aligned and align_up(length) bytes long with zero padding: written in place.
  // Otherwise the engine copies it into an aligned buffer first.
  bool data_padded = false;
  WriteMode mode = WriteMode::kOverwrite;
  uint8_t flags = 0;   // ChunkFlags
  uint32_t ttl_s = 0;  // 0: no expiry
  uint32_t chain_ver = 0;
  std::optional<uint32_t> expected_crc;  // the sender's CRC32C; a mismatch rejects the item
};

// The (client id, request id) of a write, recorded with the chunk: a retried write carrying the
// same tag is recognised and not applied twice. {0, 0} means untagged.
struct WriteTag {
  uint64_t client = 0;
  uint64_t request = 0;
};

struct WriteResult {
  Status status;
  uint64_t version = 0;
  bool existed = false;    // kCreate found a live chunk (nothing written)
  bool duplicate = false;  // same tag as the stored chunk: a retry, nothing written
};

struct ChunkInfo {
  std::string id;
  ChunkMeta meta;
};

struct ReadItem {
  std::string_view id;
  uint32_t offset = 0;
  uint32_t length = kWholeChunk;  // clipped to the chunk
  uint32_t lease_ms = 0;          // protect from eviction/expiry this long after the read
};

// A chunk located and pinned for reading (engine.pin); release with engine.unpin.
struct ReadPin {
  Status status;
  ChunkMeta meta;
  uint32_t offset = 0;  // requested range, clipped
  uint32_t length = 0;
  bool pinned = false;
};

struct EngineStats {
  uint64_t chunks = 0;
  uint64_t live_bytes = 0;         // chunk bytes
  uint64_t used_slot_bytes = 0;    // slot bytes of live chunks (what eviction targets)
  uint64_t reserved_bytes = 0;     // data-file space reserved (what the capacity caps)
  uint64_t empty_group_bytes = 0;  // of it, groups with no chunk, kept for the next puts
  uint64_t capacity_bytes = 0;
  uint64_t reads = 0, read_bytes = 0, writes = 0, write_bytes = 0, removes = 0;
  uint64_t checksum_errors = 0, evictions = 0, expirations = 0, commits = 0;
  uint64_t orphan_bytes_reclaimed = 0;  // at the last open
  uint64_t quarantined_slots = 0;       // held after failed commits until the next open
};

class ChunkEngine {
 public:
  static Result<std::unique_ptr<ChunkEngine>> open(EngineParams params);
  ~ChunkEngine();
  ChunkEngine(const ChunkEngine&) = delete;
  ChunkEngine& operator=(const ChunkEngine&) = delete;

  // Writes every item (independently: each has its own result); returns when the successful ones
  // are durable.
  void write_batch(std::span<const WriteItem> items, WriteTag tag, std::span<WriteResult> results);
  Status write(std::string_view id, std::string_view data, WriteMode mode = WriteMode::kOverwrite,
               uint8_t flags = 0, uint32_t ttl_s = 0);

  // Reading in two steps lets the caller size its buffers from the pinned lengths.
  void pin(std::span<const ReadItem> items, std::span<ReadPin> pins);
  // bufs[i]: 4096-aligned, at least align_up(pins[i].meta.length) bytes; receives the whole chunk
  // (the requested range starts at pins[i].offset). Verifies the CRC32C.
  void read_pinned(std::span<ReadPin> pins, std::span<uint8_t* const> bufs);
  void unpin(std::span<ReadPin> pins);
  Result<std::string> read(std::string_view id);  // convenience: whole chunk

  // Removes each id; existed[i] says whether it was there. Durable on return.
  Status remove_batch(std::span<const std::string_view> ids, std::span<bool> existed);
  Result<ChunkMeta> stat(std::string_view id, uint32_t lease_ms = 0);
  // Ids starting with prefix and greater than start_after, in order, at most limit.
  Result<std::vector<ChunkInfo>> list(std::string_view prefix, std::string_view start_after, uint32_t limit);

  // Expires chunks past their TTL and evicts down to the low-water mark when above the high one.
  Status maintain();
  // Reads every chunk and checks its CRC32C; returns the ids that fail.
  Result<std::vector<std::string>> scrub();

  EngineStats stats() const;
  const std::string& dir() const { return params_.dir; }
  uint32_t target_id() const { return target_id_; }
  uint32_t chain_id() const { return chain_id_; }
  // 32 hex digits, random at creation: the target's identity whatever server or address serves it.
  const std::string& uuid() const { return uuid_; }
  IoBackend io_backend() const { return files_->backend(); }
  bool direct_io() const { return files_->direct(); }
  // Where a chunk lives (data file path, byte offset): for tests and `fathom store stat --raw`.
  Result<std::pair<std::string, uint64_t>> locate(std::string_view id);

 private:
  struct Entry;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Index = std::unordered_map<std::string, Entry, StringHash, std::equal_to<>>;
  struct CommitOp;
  struct CommitGroup;
  struct Pending;

  explicit ChunkEngine(EngineParams params);
  Status load_superblock();
  Status rebuild();
  Status reclaim_orphans();
  int64_t now_ms() const;
  Result<int> class_file(int cls);

  // Write path (chunk_engine.cpp).
  Status reserve_slot(int cls, Slot* slot);  // under mu_
  bool skip_existing(const WriteItem& item, WriteTag tag, int64_t now, WriteResult& result);
  Status allocate_with_eviction(int cls, Slot* slot);
  void free_slot_locked(const Slot& slot);
  void release_slot_locked(const Slot& slot);
  void release_group_locked(int cls, uint32_t group);  // hole-punches an empty group
  // Hole-punches empty groups: at least `bytes` of them, or all; returns the bytes released.
  uint64_t release_empty_groups_locked(uint64_t bytes);
  // How far reserving `bytes` more would pass the capacity (0: it fits, or there is no cap).
  uint64_t capacity_short_by_locked(uint64_t bytes) const;
  void write_data_and_commit(std::span<const WriteItem> items, std::vector<CommitOp>& ops,
                             const std::vector<Slot>& slots, std::vector<IoOp>& io,
                             const std::vector<size_t>& io_item, std::vector<bool>& active,
                             std::span<WriteResult> results);
  void commit(std::span<CommitOp> ops);
  void run_commit(std::vector<CommitGroup*>& groups);
  void decide_locked(CommitOp& op, std::unordered_map<std::string_view, Pending>& overlay, int64_t now,
                     std::vector<MetaWrite>& writes);
  void apply_locked(CommitOp& op, bool committed);
  void index_put_locked(std::string_view id, const ChunkMeta& meta, int64_t access_ms);
  void index_erase_locked(Index::iterator it);
  bool live(const ChunkMeta& meta, int64_t now) const { return meta.expire_ms == 0 || meta.expire_ms > now; }

  // Eviction (chunk_engine_evict.cpp).
  void choose_victims_locked(int prefer_cls, uint64_t bytes, int64_t now, std::vector<std::string>& out);
  // Evicts at least `bytes` of slot space (from class prefer_cls first, -1: any); the number of
  // chunks evicted (0 when nothing is evictable).
  Result<size_t> evict(int prefer_cls, uint64_t bytes);
  size_t evictable_count_locked() const;

  EngineParams params_;
  uint32_t target_id_ = 0, chain_id_ = 0;
  std::string uuid_;
  std::unique_ptr<MetaStore> meta_;
  std::unique_ptr<DataFiles> files_;

  mutable std::mutex mu_;  // index_, alloc_, pins_, deferred_, evictable_, class_files_
  std::unique_ptr<SlotAllocator> alloc_;
  Index index_;
  std::unordered_map<uint64_t, uint32_t> pins_;             // slot key -> readers
  std::unordered_map<uint64_t, Slot> deferred_;             // freed while pinned
  std::vector<std::vector<const std::string*>> evictable_;  // per class, for sampling
  std::vector<int> class_files_;                            // per class, -1 until opened
  Rng rng_{0x5eed};
  uint64_t live_bytes_ = 0;

  std::mutex commit_mu_;  // the commit queue and leadership
  std::condition_variable commit_cv_;
  std::vector<CommitGroup*> commit_queue_;
  bool committing_ = false;

  std::mutex evict_mu_;  // one eviction at a time

  struct Counters {
    std::atomic<uint64_t> reads{0}, read_bytes{0}, writes{0}, write_bytes{0}, removes{0};
    std::atomic<uint64_t> checksum_errors{0}, evictions{0}, expirations{0}, commits{0};
  };
  mutable Counters counters_;
  uint64_t orphan_bytes_reclaimed_ = 0;
  uint64_t quarantined_slots_ = 0;  // new slots of commits that failed; freed by a restart
};

}  // namespace fathom::storage
