// ChunkEngine: opening a target (superblock, allocator rebuild, orphan reclamation) and the write
// path (slot reservation, data I/O, fdatasync, group commit of the metadata). Reads live in
// chunk_engine_read.cpp, eviction and expiry in chunk_engine_evict.cpp.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "base/check.h"
#include "base/fs.h"
#include "base/log.h"
#include "storage/chunk_engine_impl.h"
#include "storage/crc32c.h"
#include "storage/ids.h"

namespace fathom::storage {

ChunkEngine::ChunkEngine(EngineParams params) : params_(std::move(params)) {}
ChunkEngine::~ChunkEngine() = default;

int64_t ChunkEngine::now_ms() const {
  if (params_.clock_ms) return params_.clock_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<std::unique_ptr<ChunkEngine>> ChunkEngine::open(EngineParams params) {
  if (params.dir.empty()) return invalid_argument("storage target: empty directory");
  if (!(params.evict_low_water > 0 && params.evict_low_water <= params.evict_high_water &&
        params.evict_high_water <= 1.0)) {
    return invalid_argument("storage target '{}': need 0 < low water ({}) <= high water ({}) <= 1",
                            params.dir, params.evict_low_water, params.evict_high_water);
  }
  std::unique_ptr<ChunkEngine> e(new ChunkEngine(std::move(params)));
  auto ctx = [&](const Status& s) {
    return s.with_context(fmt::format("storage target '{}'", e->params_.dir));
  };
  auto meta = MetaStore::open(MetaStoreParams{.dir = e->params_.dir + "/meta", .faults = e->params_.faults});
  if (!meta.ok()) return ctx(meta.status());
  e->meta_ = std::move(*meta);
  if (Status s = e->load_superblock(); !s.ok()) return ctx(s);
  auto files = DataFiles::open(DataFilesParams{.dir = e->params_.dir + "/data",
                                               .backend = e->params_.io,
                                               .direct = e->params_.direct,
                                               .faults = e->params_.faults});
  if (!files.ok()) return ctx(files.status());
  e->files_ = std::move(*files);
  if (Status s = e->rebuild(); !s.ok()) return ctx(s);
  if (Status s = e->reclaim_orphans(); !s.ok()) return ctx(s);
  return e;
}

Status ChunkEngine::load_superblock() {
  auto stored = TRY(meta_->get(kSuperblockKey));
  if (!stored) {
    if (params_.group_bytes < 4096) return invalid_argument("group bytes {} below 4096", params_.group_bytes);
    const std::vector<uint32_t> sizes = SlotAllocator::default_slot_sizes();
    std::random_device rd;
    uuid_ = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
    nlohmann::json sb = {{"magic", "fathom-storage-target"},
                         {"format", 1},
                         {"uuid", uuid_},
                         {"target_id", params_.target_id},
                         {"chain_id", params_.chain_id},
                         {"group_bytes", params_.group_bytes},
                         {"slot_sizes", sizes},
                         {"created_ms", now_ms()}};
    const MetaWrite w{kSuperblockKey, sb.dump()};
    TRY(meta_->commit(std::span(&w, 1)));
    target_id_ = params_.target_id;
    chain_id_ = params_.chain_id;
    alloc_ = std::make_unique<SlotAllocator>(SlotAllocator::make_classes(sizes, params_.group_bytes));
  } else {
    try {
      const auto sb = nlohmann::json::parse(*stored);
      if (sb.at("magic") != "fathom-storage-target" || sb.at("format") != 1) {
        return corrupt("superblock: not a format-1 fathom storage target");
      }
      target_id_ = sb.at("target_id").get<uint32_t>();
      uuid_ = sb.at("uuid").get<std::string>();
      chain_id_ = sb.at("chain_id").get<uint32_t>();
      const auto sizes = sb.at("slot_sizes").get<std::vector<uint32_t>>();
      const auto group = sb.at("group_bytes").get<uint64_t>();
      if (sizes.empty() || sizes.size() > 255) return corrupt("superblock: {} slot classes", sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] == 0 || sizes[i] % 4096 != 0 || (i > 0 && sizes[i] <= sizes[i - 1])) {
          return corrupt("superblock: bad slot size list");
        }
      }
      alloc_ = std::make_unique<SlotAllocator>(SlotAllocator::make_classes(sizes, group));
    } catch (const nlohmann::json::exception& ex) {
      return corrupt("superblock: {}", ex.what());
    }
  }
  class_files_.assign(alloc_->classes().size(), -1);
  evictable_.assign(alloc_->classes().size(), {});
  return {};
}

Result<int> ChunkEngine::class_file(int cls) {
  if (class_files_[cls] >= 0) return class_files_[cls];
  const int f =
      TRY(files_->open_file(fmt::format("class{:02}_{}.dat", cls, alloc_->classes()[cls].slot_bytes)));
  class_files_[cls] = f;
  return f;
}

Status ChunkEngine::rebuild() {
  const int64_t now = now_ms();
  std::lock_guard lock(mu_);
  return meta_->scan(
      std::string(1, kChunkPrefix), [&](std::string_view key, std::string_view value) -> Status {
        const std::string id(key.substr(1));
        const ChunkMeta m = TRY(decode_chunk_meta(value, id));
        if (m.size_class >= alloc_->classes().size() ||
            m.length > alloc_->classes()[m.size_class].slot_bytes) {
          return corrupt("chunk '{}': {} bytes in class {}", printable_id(id), m.length, m.size_class);
        }
        TRY(alloc_->mark_used(Slot{m.size_class, m.offset}, id));
        TRY(class_file(m.size_class));
        index_put_locked(id, m, m.created_ms > 0 ? std::min(m.created_ms, now) : 0);
        return {};
      });
}

// Every data-file range outside a reserved group holds no committed chunk: groups emptied before
// the restart (kept for reuse or not yet punched) or data written there before a crash and never
// committed. Whole groups whose blocks are all written become kept empty groups again, up to
// keep_empty_bytes (and the capacity), so puts after a restart still overwrite written blocks;
// every other such range gives its blocks back.
Status ChunkEngine::reclaim_orphans() {
  std::lock_guard lock(mu_);
  const auto& classes = alloc_->classes();
  for (size_t cls = 0; cls < classes.size(); ++cls) {
    const std::string name = fmt::format("class{:02}_{}.dat", cls, classes[cls].slot_bytes);
    if (class_files_[cls] < 0 && !path_exists(params_.dir + "/data/" + name)) continue;  // never used
    auto existing = files_->open_file(name);
    if (!existing.ok()) return existing.status();
    class_files_[cls] = *existing;
    const uint64_t size = TRY(files_->size(*existing));
    const uint64_t gb = classes[cls].group_bytes();
    uint64_t start = UINT64_MAX;  // of the run of ranges to punch
    auto punch_run = [&](uint64_t end) -> Status {
      if (start == UINT64_MAX) return {};
      TRY(files_->punch(*existing, start, end - start));
      orphan_bytes_reclaimed_ += end - start;
      start = UINT64_MAX;
      return {};
    };
    for (uint64_t g = 0; g * gb < size; ++g) {
      const auto group = static_cast<uint32_t>(g);
      bool keep = alloc_->group_reserved(static_cast<int>(cls), group);
      if (!keep && (g + 1) * gb <= size && alloc_->empty_bytes() + gb <= params_.keep_empty_bytes &&
          capacity_short_by_locked(gb) == 0 && files_->all_written(*existing, g * gb, gb)) {
        alloc_->add_group(static_cast<int>(cls), group);  // empty: counts in empty_bytes()
        keep = true;
      }
      if (keep) {
        TRY(punch_run(g * gb));
      } else if (start == UINT64_MAX) {
        start = g * gb;
      }
    }
    if (start != UINT64_MAX && start < size) TRY(punch_run(size));
  }
  if (orphan_bytes_reclaimed_ > 0 || alloc_->empty_bytes() > 0) {
    log_info(
        "storage target '{}': {} bytes of data-file space outside live groups released, {} kept for new puts",
        params_.dir, orphan_bytes_reclaimed_, alloc_->empty_bytes());
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Index and slots (callers hold mu_)

void ChunkEngine::index_put_locked(std::string_view id, const ChunkMeta& meta, int64_t access_ms) {
  auto it = index_.find(id);
  const bool inserted = it == index_.end();
  if (inserted) it = index_.try_emplace(std::string(id)).first;
  Entry& e = it->second;
  if (!inserted) {
    live_bytes_ -= e.meta.length;
    if (e.evict_pos != UINT32_MAX) {
      auto& list = evictable_[e.meta.size_class];
      const std::string* moved = list.back();
      list[e.evict_pos] = moved;
      index_.find(*moved)->second.evict_pos = e.evict_pos;
      list.pop_back();
      e.evict_pos = UINT32_MAX;
    }
  }
  e.meta = meta;
  e.access_ms = access_ms;
  live_bytes_ += meta.length;
  if (meta.flags & kChunkEvictable) {
    auto& list = evictable_[meta.size_class];
    e.evict_pos = static_cast<uint32_t>(list.size());
    list.push_back(&it->first);
  }
}

void ChunkEngine::index_erase_locked(Index::iterator it) {
  Entry& e = it->second;
  live_bytes_ -= e.meta.length;
  if (e.evict_pos != UINT32_MAX) {
    auto& list = evictable_[e.meta.size_class];
    const std::string* moved = list.back();
    list[e.evict_pos] = moved;
    index_.find(*moved)->second.evict_pos = e.evict_pos;
    list.pop_back();
  }
  index_.erase(it);
}

void ChunkEngine::free_slot_locked(const Slot& slot) {
  if (pins_.count(slot.key())) {
    deferred_.emplace(slot.key(), slot);
    return;
  }
  release_slot_locked(slot);
}

void ChunkEngine::release_slot_locked(const Slot& slot) {
  const auto group = alloc_->free(slot);
  if (group && alloc_->empty_bytes() > params_.keep_empty_bytes)
    release_group_locked(slot.size_class, *group);
}

void ChunkEngine::release_group_locked(int cls, uint32_t group) {
  const uint64_t gb = alloc_->classes()[cls].group_bytes();
  if (Status s = files_->punch(class_files_[cls], group * gb, gb); !s.ok()) {
    log_warn("storage target '{}': {} (space stays allocated until restart)", params_.dir, s.to_string());
  }
  alloc_->release_group(cls, group);
}

uint64_t ChunkEngine::release_empty_groups_locked(uint64_t bytes) {
  uint64_t released = 0;
  for (int cls = 0; cls < static_cast<int>(alloc_->classes().size()) && released < bytes; ++cls) {
    while (released < bytes) {
      const auto group = alloc_->highest_empty_group(cls);
      if (!group) break;
      release_group_locked(cls, *group);
      released += alloc_->classes()[cls].group_bytes();
    }
  }
  return released;
}

uint64_t ChunkEngine::capacity_short_by_locked(uint64_t bytes) const {
  const uint64_t need = alloc_->reserved_bytes() + bytes, cap = params_.capacity_bytes;
  return cap > 0 && need > cap ? need - cap : 0;
}

Status ChunkEngine::reserve_slot(int cls, Slot* slot) {
  if (auto s = alloc_->allocate(cls)) {
    *slot = *s;
    return {};
  }
  // No free slot of this class, so none of its groups is empty; kept groups of other classes
  // give their space back first when the capacity or the disk is short.
  const uint64_t gb = alloc_->classes()[cls].group_bytes();
  if (const uint64_t short_by = capacity_short_by_locked(gb); short_by > 0)
    release_empty_groups_locked(short_by);
  if (capacity_short_by_locked(gb) > 0) {
    return resource_exhausted(
        "storage target {} ('{}') is full: {} of {} bytes reserved, a {}-byte group needed", target_id_,
        params_.dir, alloc_->reserved_bytes(), params_.capacity_bytes, gb);
  }
  const uint32_t g = alloc_->next_group(cls);
  const int file = TRY(class_file(cls));
  Status s = files_->allocate(file, alloc_->group_offset(cls, g), gb);
  if (s.code() == StatusCode::kResourceExhausted && release_empty_groups_locked(UINT64_MAX) > 0) {
    s = files_->allocate(file, alloc_->group_offset(cls, g), gb);
  }
  if (!s.ok()) {
    if (s.code() == StatusCode::kResourceExhausted) {
      return resource_exhausted("storage target {} ('{}') is full: the disk has no space ({})", target_id_,
                                params_.dir, s.message());
    }
    return s;
  }
  alloc_->add_group(cls, g);
  auto a = alloc_->allocate(cls);
  CHECK(a.has_value());
  *slot = *a;
  return {};
}

Status ChunkEngine::allocate_with_eviction(int cls, Slot* slot) {
  Status first;
  {
    std::lock_guard lock(mu_);
    first = reserve_slot(cls, slot);
  }
  for (int attempt = 0; attempt < 8 && first.code() == StatusCode::kResourceExhausted; ++attempt) {
    auto evicted = evict(cls, alloc_->classes()[cls].slot_bytes);
    if (!evicted.ok()) return evicted.status();
    std::lock_guard lock(mu_);
    Status again = reserve_slot(cls, slot);
    if (again.code() != StatusCode::kResourceExhausted) return again;
    if (evictable_count_locked() == 0) break;
  }
  return first;
}

// ---------------------------------------------------------------------------------------------
// Write path

namespace {

Status validate_item(const WriteItem& item) {
  if (item.id.empty() || item.id.size() > kMaxChunkIdBytes) {
    return invalid_argument("chunk id of {} bytes (expected 1..{})", item.id.size(), kMaxChunkIdBytes);
  }
  if (item.length > kMaxChunkBytes) {
    return invalid_argument("chunk of {} bytes is larger than the {}-byte limit", item.length,
                            kMaxChunkBytes);
  }
  if (item.data == nullptr && item.length > 0) return invalid_argument("chunk with no data");
  return {};
}

}  // namespace

// A live chunk that makes this write a no-op: kCreate over an existing block, or a retry of the
// write that stored it. The commit checks again (another writer may get there first).
bool ChunkEngine::skip_existing(const WriteItem& item, WriteTag tag, int64_t now, WriteResult& result) {
  std::lock_guard lock(mu_);
  auto e = index_.find(item.id);
  if (e == index_.end() || !live(e->second.meta, now)) return false;
  const ChunkMeta& m = e->second.meta;
  const bool same_tag = tag.client != 0 && m.writer_client == tag.client && m.writer_request == tag.request;
  if (!same_tag && item.mode != WriteMode::kCreate) return false;
  result.existed = true;
  result.duplicate = same_tag;
  result.version = m.version;
  e->second.access_ms = now;
  return true;
}

void ChunkEngine::write_batch(std::span<const WriteItem> items, WriteTag tag,
                              std::span<WriteResult> results) {
  CHECK(results.size() == items.size());
  const size_t n = items.size();
  std::vector<CommitOp> ops(n);
  std::vector<Slot> slots(n);
  std::vector<AlignedBuffer> bounce(n);
  std::vector<IoOp> io;
  std::vector<size_t> io_item;
  std::vector<bool> active(n, false);
  const int64_t now = now_ms();
  for (size_t i = 0; i < n; ++i) {
    const WriteItem& it = items[i];
    results[i] = WriteResult{};
    Status st = validate_item(it);
    const uint32_t crc = st.ok() ? crc32c(it.data, it.length) : 0;
    if (st.ok() && it.expected_crc && *it.expected_crc != crc) {
      st = corrupt("chunk '{}': data CRC32C {:08x} differs from the sender's {:08x} (corrupted in transit)",
                   printable_id(it.id), crc, *it.expected_crc);
    }
    if (st.ok() && (it.mode == WriteMode::kCreate || tag.client != 0) &&
        skip_existing(it, tag, now, results[i])) {
      continue;
    }
    const int cls = alloc_->class_for(it.length);
    if (st.ok()) st = allocate_with_eviction(cls, &slots[i]);
    if (!st.ok()) {
      results[i].status = st.with_context(fmt::format("write '{}'", printable_id(it.id)));
      continue;
    }
    CommitOp& op = ops[i];
    op.is_put = true;
    op.id = it.id;
    op.mode = it.mode;
    op.tag = tag;
    op.meta = ChunkMeta{.size_class = static_cast<uint8_t>(cls),
                        .flags = it.flags,
                        .crc32c = crc,
                        .offset = slots[i].offset,
                        .length = it.length,
                        .chain_ver = it.chain_ver,
                        .created_ms = now,
                        .expire_ms = it.ttl_s ? now + int64_t{it.ttl_s} * 1000 : 0,
                        .writer_client = tag.client,
                        .writer_request = tag.request};
    active[i] = true;
    if (it.length == 0) continue;
    uint8_t* src = const_cast<uint8_t*>(it.data);
    if (!it.data_padded || reinterpret_cast<uintptr_t>(it.data) % kIoAlign != 0) {
      auto buf = AlignedBuffer::allocate(align_up(it.length));
      if (!buf.ok()) {
        results[i].status = buf.status();
        active[i] = false;
        std::lock_guard lock(mu_);
        free_slot_locked(slots[i]);
        continue;
      }
      bounce[i] = std::move(*buf);
      std::memcpy(bounce[i].data(), it.data, it.length);
      src = bounce[i].data();
    }
    std::lock_guard lock(mu_);
    io.push_back(IoOp{.file = class_files_[cls],
                      .write = true,
                      .offset = slots[i].offset,
                      .buf = src,
                      .length = static_cast<uint32_t>(align_up(it.length))});
    io_item.push_back(i);
  }
  write_data_and_commit(items, ops, slots, io, io_item, active, results);
}

void ChunkEngine::write_data_and_commit(std::span<const WriteItem> items, std::vector<CommitOp>& ops,
                                        const std::vector<Slot>& slots, std::vector<IoOp>& io,
                                        const std::vector<size_t>& io_item, std::vector<bool>& active,
                                        std::span<WriteResult> results) {
  auto fail = [&](size_t i, const Status& s) {
    results[i].status = s.with_context(fmt::format("write '{}'", printable_id(items[i].id)));
    active[i] = false;
    std::lock_guard lock(mu_);
    free_slot_locked(slots[i]);
  };
  (void)files_->run(io);
  for (size_t k = 0; k < io.size(); ++k) {
    if (!io[k].status.ok()) {
      fail(io_item[k], io[k].status);
    } else {
      ops[io_item[k]].data_file = io[k].file;  // synced by the commit, together with other requests'
    }
  }
  std::vector<CommitOp> live_ops;
  std::vector<size_t> live_index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!active[i]) continue;
    live_ops.push_back(std::move(ops[i]));
    live_index.push_back(i);
  }
  if (!live_ops.empty()) commit(live_ops);
  for (size_t k = 0; k < live_ops.size(); ++k) {
    const CommitOp& op = live_ops[k];
    WriteResult& r = results[live_index[k]];
    r.status =
        op.status.ok() ? Status() : op.status.with_context(fmt::format("write '{}'", printable_id(op.id)));
    r.version = op.version;
    r.existed = op.existed;
    r.duplicate = op.duplicate;
    if (r.status.ok() && !op.skip) {
      counters_.writes.fetch_add(1, std::memory_order_relaxed);
      counters_.write_bytes.fetch_add(op.meta.length, std::memory_order_relaxed);
    }
  }
}

Status ChunkEngine::write(std::string_view id, std::string_view data, WriteMode mode, uint8_t flags,
                          uint32_t ttl_s) {
  if (data.size() > kMaxChunkBytes) {
    return invalid_argument("chunk '{}' of {} bytes is larger than the {}-byte limit", printable_id(id),
                            data.size(), kMaxChunkBytes);
  }
  const WriteItem item{.id = id,
                       .data = reinterpret_cast<const uint8_t*>(data.data()),
                       .length = static_cast<uint32_t>(data.size()),
                       .mode = mode,
                       .flags = flags,
                       .ttl_s = ttl_s};
  WriteResult r;
  write_batch(std::span(&item, 1), WriteTag{}, std::span(&r, 1));
  return r.status;
}

Status ChunkEngine::remove_batch(std::span<const std::string_view> ids, std::span<bool> existed) {
  CHECK(ids.size() == existed.size());
  std::vector<CommitOp> ops(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ops[i].is_put = false;
    ops[i].id = ids[i];
    ops[i].reason = DeleteReason::kRemove;
  }
  commit(ops);
  Status first;
  for (size_t i = 0; i < ids.size(); ++i) {
    existed[i] = ops[i].existed && ops[i].status.ok();
    if (!ops[i].status.ok() && first.ok())
      first = ops[i].status.with_context(fmt::format("remove '{}'", printable_id(ids[i])));
    if (existed[i]) counters_.removes.fetch_add(1, std::memory_order_relaxed);
  }
  return first;
}

// ---------------------------------------------------------------------------------------------
// Group commit: the first thread to find no commit running becomes the leader, takes every queued
// group and writes them as one synced RocksDB batch; the others wait for their group to be done.

void ChunkEngine::commit(std::span<CommitOp> ops) {
  CommitGroup me{ops};
  std::unique_lock lock(commit_mu_);
  commit_queue_.push_back(&me);
  while (!me.done && committing_) commit_cv_.wait(lock);
  if (me.done) return;
  committing_ = true;
  std::vector<CommitGroup*> groups;
  groups.swap(commit_queue_);
  lock.unlock();
  run_commit(groups);
  lock.lock();
  for (CommitGroup* g : groups) g->done = true;
  committing_ = false;
  commit_cv_.notify_all();
}

void ChunkEngine::run_commit(std::vector<CommitGroup*>& groups) {
  // Data first: one fdatasync per data file for every put of these groups (requests that finished
  // their I/O while the previous commit ran share it), then the metadata. A put whose file fails
  // to sync is not committed and gets the error.
  std::map<int, Status> synced;
  for (CommitGroup* g : groups) {
    for (const CommitOp& op : g->ops) {
      if (op.is_put && op.data_file >= 0) synced.emplace(op.data_file, Status());
    }
  }
  for (auto& [file, status] : synced) status = files_->sync(file);
  for (CommitGroup* g : groups) {
    for (CommitOp& op : g->ops) {
      if (!op.is_put || op.data_file < 0) continue;
      if (const Status& st = synced[op.data_file]; !st.ok()) {
        op.status = st;
        op.skip = true;  // its slot is freed below, like a put that found its key taken
      }
    }
  }
  std::vector<MetaWrite> writes;
  {
    std::unordered_map<std::string_view, Pending> overlay;
    std::lock_guard lock(mu_);
    const int64_t now = now_ms();
    for (CommitGroup* g : groups) {
      for (CommitOp& op : g->ops) {
        if (!op.skip) decide_locked(op, overlay, now, writes);
      }
    }
  }
  Status s;
  if (!writes.empty()) {
    s = meta_->commit(writes);
    counters_.commits.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard lock(mu_);
  for (CommitGroup* g : groups) {
    for (CommitOp& op : g->ops) {
      if (!s.ok() && !op.skip) op.status = s;
      apply_locked(op, s.ok());
    }
  }
}

void ChunkEngine::decide_locked(CommitOp& op, std::unordered_map<std::string_view, Pending>& overlay,
                                int64_t now, std::vector<MetaWrite>& writes) {
  Pending cur;
  const Entry* entry = nullptr;
  if (auto it = index_.find(op.id); it != index_.end()) entry = &it->second;
  if (auto o = overlay.find(op.id); o != overlay.end()) {
    cur = o->second;
  } else if (entry != nullptr) {
    cur = Pending{true, entry->meta};
  }
  if (op.is_put) {
    if (cur.exists && live(cur.meta, now)) {
      const bool same_tag = op.tag.client != 0 && cur.meta.writer_client == op.tag.client &&
                            cur.meta.writer_request == op.tag.request;
      if (same_tag || op.mode == WriteMode::kCreate) {
        op.duplicate = same_tag;
        op.existed = true;
        op.version = cur.meta.version;
        op.skip = true;
        return;
      }
    }
    op.meta.version = cur.exists ? cur.meta.version + 1 : 1;
    op.version = op.meta.version;
    writes.push_back(MetaWrite{chunk_key(op.id), encode_chunk_meta(op.meta)});
    overlay[op.id] = Pending{true, op.meta};
    return;
  }
  if (!cur.exists) {
    op.skip = true;
    return;
  }
  if (op.reason != DeleteReason::kRemove) {
    const bool changed = op.expect_version && cur.meta.version != *op.expect_version;
    const bool leased = entry != nullptr && entry->lease_until_ms > now;
    if (changed || leased ||
        (entry != nullptr && pins_.count(Slot{entry->meta.size_class, entry->meta.offset}.key()))) {
      op.skip = true;
      return;
    }
  }
  op.existed = true;
  writes.push_back(MetaWrite{chunk_key(op.id), std::nullopt});
  overlay[op.id] = Pending{false, {}};
}

void ChunkEngine::apply_locked(CommitOp& op, bool committed) {
  const Slot new_slot{op.meta.size_class, op.meta.offset};
  if (op.is_put && op.skip) {
    free_slot_locked(new_slot);
    return;
  }
  if (op.skip) return;
  if (!committed) {
    // The record may still have reached the WAL (a failed sync is not a failed write), so the
    // new slot stays allocated until a restart decides from RocksDB; the old chunk is untouched.
    if (op.is_put) ++quarantined_slots_;
    return;
  }
  auto it = index_.find(op.id);
  if (op.is_put) {
    if (it != index_.end()) free_slot_locked(Slot{it->second.meta.size_class, it->second.meta.offset});
    index_put_locked(op.id, op.meta, op.meta.created_ms);
    return;
  }
  CHECK(it != index_.end());
  free_slot_locked(Slot{it->second.meta.size_class, it->second.meta.offset});
  index_erase_locked(it);
  if (op.reason == DeleteReason::kEvict) counters_.evictions.fetch_add(1, std::memory_order_relaxed);
  if (op.reason == DeleteReason::kExpire) counters_.expirations.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace fathom::storage
