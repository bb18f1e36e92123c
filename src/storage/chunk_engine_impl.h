// Private pieces of ChunkEngine shared by its .cpp files (open/write, read, evict).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "storage/buffer.h"
#include "storage/chunk_engine.h"

namespace fathom::storage {

inline constexpr char kSuperblockKey[] = "s";
inline constexpr char kChunkPrefix = 'c';

inline std::string chunk_key(std::string_view id) {
  std::string k;
  k.reserve(id.size() + 1);
  k.push_back(kChunkPrefix);
  k.append(id);
  return k;
}

struct ChunkEngine::Entry {
  ChunkMeta meta;
  int64_t access_ms = 0;            // last read or write (approximate LRU)
  int64_t lease_until_ms = 0;       // no eviction or expiry before this
  uint32_t evict_pos = UINT32_MAX;  // index in evictable_[class], or none
};

enum class DeleteReason : uint8_t { kRemove, kEvict, kExpire };

struct ChunkEngine::CommitOp {
  bool is_put = true;
  std::string_view id;  // owned by the caller for the duration of commit()
  // put
  ChunkMeta meta;  // the new record; version filled in when the commit is decided
  WriteMode mode = WriteMode::kOverwrite;
  WriteTag tag;
  int data_file = -1;  // the data file the put wrote: the commit syncs it before the metadata
  // delete
  DeleteReason reason = DeleteReason::kRemove;
  std::optional<uint64_t> expect_version;  // eviction/expiry: only if unchanged since chosen
  // outcome
  Status status;
  bool skip = false;  // decided: nothing to write
  bool existed = false;
  bool duplicate = false;
  uint64_t version = 0;
};

struct ChunkEngine::CommitGroup {
  std::span<CommitOp> ops;
  bool done = false;
};

struct ChunkEngine::Pending {
  bool exists = false;
  ChunkMeta meta;
};

}  // namespace fathom::storage
