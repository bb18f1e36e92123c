// ChunkEngine read side: pinning, reading with CRC32C verification, stat, list, scrub, stats.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "storage/chunk_engine_impl.h"
#include "storage/crc32c.h"
#include "storage/ids.h"

namespace fathom::storage {

void ChunkEngine::pin(std::span<const ReadItem> items, std::span<ReadPin> pins) {
  CHECK(items.size() == pins.size());
  std::lock_guard lock(mu_);
  const int64_t now = now_ms();
  for (size_t i = 0; i < items.size(); ++i) {
    const ReadItem& item = items[i];
    ReadPin& p = pins[i];
    p = ReadPin{};
    auto it = index_.find(item.id);
    if (it == index_.end() || !live(it->second.meta, now)) {
      p.status = not_found("chunk '{}' not found on target {}", printable_id(item.id), target_id_);
      continue;
    }
    Entry& e = it->second;
    if (item.offset > e.meta.length) {
      p.status = out_of_range("chunk '{}': offset {} past its {} bytes", printable_id(item.id), item.offset,
                              e.meta.length);
      continue;
    }
    p.meta = e.meta;
    p.offset = item.offset;
    p.length = std::min<uint32_t>(item.length, e.meta.length - item.offset);
    p.pinned = true;
    ++pins_[Slot{e.meta.size_class, e.meta.offset}.key()];
    e.access_ms = now;
    if (item.lease_ms > 0) e.lease_until_ms = std::max(e.lease_until_ms, now + int64_t{item.lease_ms});
  }
}

void ChunkEngine::read_pinned(std::span<ReadPin> pins, std::span<uint8_t* const> bufs) {
  CHECK(pins.size() == bufs.size());
  std::vector<IoOp> io;
  std::vector<size_t> which;
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < pins.size(); ++i) {
      if (!pins[i].status.ok() || !pins[i].pinned || pins[i].meta.length == 0) continue;
      io.push_back(IoOp{.file = class_files_[pins[i].meta.size_class],
                        .offset = pins[i].meta.offset,
                        .buf = bufs[i],
                        .length = static_cast<uint32_t>(align_up(pins[i].meta.length))});
      which.push_back(i);
    }
  }
  // Each chunk is verified as soon as its read completes, while the rest of the batch loads.
  (void)files_->run(io, [&](size_t k) {
    ReadPin& p = pins[which[k]];
    if (!io[k].status.ok()) {
      p.status = io[k].status;
      return;
    }
    const uint32_t crc = crc32c(bufs[which[k]], p.meta.length);
    if (crc != p.meta.crc32c) {
      counters_.checksum_errors.fetch_add(1, std::memory_order_relaxed);
      p.status = corrupt(
          "chunk ({} bytes at offset {} of class {} on target {} '{}'): CRC32C {:08x}, stored {:08x}",
          p.meta.length, p.meta.offset, p.meta.size_class, target_id_, params_.dir, crc, p.meta.crc32c);
      return;
    }
    counters_.reads.fetch_add(1, std::memory_order_relaxed);
    counters_.read_bytes.fetch_add(p.length, std::memory_order_relaxed);
  });
  for (ReadPin& p : pins) {
    if (p.status.ok() && p.pinned && p.meta.length == 0)
      counters_.reads.fetch_add(1, std::memory_order_relaxed);
  }
}

void ChunkEngine::unpin(std::span<ReadPin> pins) {
  std::lock_guard lock(mu_);
  for (ReadPin& p : pins) {
    if (!p.pinned) continue;
    p.pinned = false;
    const Slot slot{p.meta.size_class, p.meta.offset};
    auto it = pins_.find(slot.key());
    CHECK(it != pins_.end() && it->second > 0);
    if (--it->second > 0) continue;
    pins_.erase(it);
    if (auto d = deferred_.find(slot.key()); d != deferred_.end()) {
      deferred_.erase(d);
      release_slot_locked(slot);
    }
  }
}

Result<std::string> ChunkEngine::read(std::string_view id) {
  const ReadItem item{.id = id};
  ReadPin pin_state;
  pin(std::span(&item, 1), std::span(&pin_state, 1));
  if (!pin_state.status.ok()) return pin_state.status;
  auto buf = AlignedBuffer::allocate(align_up(pin_state.meta.length));
  if (!buf.ok()) {
    unpin(std::span(&pin_state, 1));
    return buf.status();
  }
  uint8_t* const ptr = buf->data();
  read_pinned(std::span(&pin_state, 1), std::span(&ptr, 1));
  unpin(std::span(&pin_state, 1));
  if (!pin_state.status.ok())
    return pin_state.status.with_context(fmt::format("read '{}'", printable_id(id)));
  return std::string(reinterpret_cast<const char*>(ptr), pin_state.meta.length);
}

Result<ChunkMeta> ChunkEngine::stat(std::string_view id, uint32_t lease_ms) {
  std::lock_guard lock(mu_);
  const int64_t now = now_ms();
  auto it = index_.find(id);
  if (it == index_.end() || !live(it->second.meta, now)) {
    return not_found("chunk '{}' not found on target {}", printable_id(id), target_id_);
  }
  if (lease_ms > 0) it->second.lease_until_ms = std::max(it->second.lease_until_ms, now + int64_t{lease_ms});
  return it->second.meta;
}

Result<std::pair<std::string, uint64_t>> ChunkEngine::locate(std::string_view id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return not_found("chunk '{}' not found on target {}", printable_id(id), target_id_);
  return std::pair<std::string, uint64_t>(files_->path(class_files_[it->second.meta.size_class]),
                                          it->second.meta.offset);
}

Result<std::vector<ChunkInfo>> ChunkEngine::list(std::string_view prefix, std::string_view start_after,
                                                 uint32_t limit) {
  std::vector<ChunkInfo> out;
  if (limit == 0) return out;
  const int64_t now = now_ms();
  const std::string seek = chunk_key(std::max(prefix, start_after));
  const std::string key_prefix = chunk_key(prefix);
  Status stop_early = cancelled("list limit reached");
  Status s = meta_->scan(key_prefix, seek, [&](std::string_view key, std::string_view value) -> Status {
    const std::string_view id = key.substr(1);
    if (!start_after.empty() && id <= start_after) return {};
    ChunkMeta m = TRY(decode_chunk_meta(value, id));
    if (!live(m, now)) return {};
    out.push_back(ChunkInfo{std::string(id), m});
    return out.size() >= limit ? stop_early : Status();
  });
  if (!s.ok() && s.code() != StatusCode::kCancelled) return s;
  return out;
}

Result<std::vector<std::string>> ChunkEngine::scrub() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    ids.reserve(index_.size());
    for (const auto& [id, e] : index_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> bad;
  AlignedBuffer buf;
  for (const std::string& id : ids) {
    const ReadItem item{.id = id};
    ReadPin p;
    pin(std::span(&item, 1), std::span(&p, 1));
    if (p.status.code() == StatusCode::kNotFound) continue;  // removed meanwhile
    Status s = p.status.ok() ? buf.reserve(align_up(p.meta.length)) : p.status;
    if (s.ok()) {
      uint8_t* const ptr = buf.data();
      read_pinned(std::span(&p, 1), std::span(&ptr, 1));
      s = p.status;
    }
    unpin(std::span(&p, 1));
    if (!s.ok()) bad.push_back(id);
  }
  return bad;
}

EngineStats ChunkEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard lock(mu_);
    s.chunks = index_.size();
    s.live_bytes = live_bytes_;
    s.used_slot_bytes = alloc_->used_bytes();
    s.reserved_bytes = alloc_->reserved_bytes();
    s.empty_group_bytes = alloc_->empty_bytes();
    s.quarantined_slots = quarantined_slots_;
  }
  s.capacity_bytes = params_.capacity_bytes;
  s.reads = counters_.reads.load();
  s.read_bytes = counters_.read_bytes.load();
  s.writes = counters_.writes.load();
  s.write_bytes = counters_.write_bytes.load();
  s.removes = counters_.removes.load();
  s.checksum_errors = counters_.checksum_errors.load();
  s.evictions = counters_.evictions.load();
  s.expirations = counters_.expirations.load();
  s.commits = counters_.commits.load();
  s.orphan_bytes_reclaimed = orphan_bytes_reclaimed_;
  return s;
}

}  // namespace fathom::storage
