// MetaStore: a storage target's chunk metadata in RocksDB, and the binary record it keeps per
// chunk. Every commit is one WriteBatch written with sync=true, so a commit is either durable as
// a whole or absent after a crash. With a FaultInjector, RocksDB's files go through a wrapping
// FileSystem that tracks unsynced bytes (truncated on a simulated power loss) and fails chosen
// operations. Thread-safe (RocksDB is). Internal to storage/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>

#include "base/function_ref.h"
#include "base/status.h"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace fathom::storage {

class FaultInjector;

enum class ChunkState : uint8_t { kCommitted = 1 };  // kDirty (CRAQ, part 2) will be 2
enum ChunkFlags : uint8_t { kChunkEvictable = 1 };   // a cache block: TTL/LRU may remove it

// Chunk record, format 1 (docs/storage.md "Chunk metadata"): 68 bytes, little-endian, ending in
// a CRC32C of the preceding bytes.
struct ChunkMeta {
  ChunkState state = ChunkState::kCommitted;
  uint8_t size_class = 0;      // index into the target's slot classes
  uint8_t flags = 0;           // ChunkFlags
  uint32_t crc32c = 0;         // of the chunk's `length` bytes
  uint64_t offset = 0;         // byte offset of the slot in the class's data file
  uint32_t length = 0;         // chunk bytes (the slot is larger, zero padded)
  uint32_t chain_ver = 0;      // chain table version the write was accepted under
  uint64_t version = 0;        // 1 for the first write of an id, +1 per overwrite
  int64_t created_ms = 0;      // wall clock of the write (Unix ms)
  int64_t expire_ms = 0;       // wall clock after which the chunk is gone (0: never)
  uint64_t writer_client = 0;  // (client id, request id) of the write, for idempotent retries
  uint64_t writer_request = 0;
};

inline constexpr size_t kChunkMetaBytes = 68;
std::string encode_chunk_meta(const ChunkMeta& m);
// `what` names the record in errors (the chunk id).
Result<ChunkMeta> decode_chunk_meta(std::string_view bytes, std::string_view what);

struct MetaWrite {
  std::string key;
  std::optional<std::string> value;  // nullopt: delete
};

struct MetaStoreParams {
  std::string dir;
  FaultInjector* faults = nullptr;  // not owned
  uint64_t write_buffer_bytes = 8u << 20;
};

class MetaStore {
 public:
  static Result<std::unique_ptr<MetaStore>> open(MetaStoreParams params);
  ~MetaStore();
  MetaStore(const MetaStore&) = delete;
  MetaStore& operator=(const MetaStore&) = delete;

  Result<std::optional<std::string>> get(std::string_view key);
  // One WriteBatch, written with sync=true. After a failure the database is reopened (RocksDB
  // stops writing after a WAL error) and the batch tried once more.
  Status commit(std::span<const MetaWrite> writes);
  // Calls fn for every key starting with prefix, in key order from `start` (the prefix when
  // empty); stops at the first error and returns it.
  Status scan(std::string_view prefix, std::string_view start,
              FunctionRef<Status(std::string_view key, std::string_view value)> fn);
  Status scan(std::string_view prefix, FunctionRef<Status(std::string_view key, std::string_view value)> fn) {
    return scan(prefix, {}, fn);
  }

 private:
  MetaStore() = default;
  Status open_db();      // (re)opens db_ under mu_ held exclusively
  Status ensure_open();  // reopens after a failed reopen

  MetaStoreParams params_;
  std::unique_ptr<rocksdb::Env> env_;
  std::shared_mutex mu_;  // exclusive only to reopen after a failed commit
  rocksdb::DB* db_ = nullptr;
};

}  // namespace fathom::storage
