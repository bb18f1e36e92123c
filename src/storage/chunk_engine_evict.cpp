// ChunkEngine cache maintenance: TTL expiry and capacity eviction of evictable chunks. Eviction
// approximates LRU the way Redis does: compare the last access of a few random candidates and
// remove the oldest, repeatedly; leased, pinned and changed chunks are skipped (the commit
// re-checks leases, pins and versions, so a chunk read or rewritten meanwhile survives).
#include <algorithm>
#include <unordered_set>

#include "base/log.h"
#include "storage/chunk_engine_impl.h"

namespace fathom::storage {

size_t ChunkEngine::evictable_count_locked() const {
  size_t n = 0;
  for (const auto& list : evictable_) n += list.size();
  return n;
}

void ChunkEngine::choose_victims_locked(int prefer_cls, uint64_t bytes, int64_t now,
                                        std::vector<std::string>& out) {
  std::unordered_set<const std::string*> chosen;
  uint64_t freed = 0;
  size_t total = evictable_count_locked();
  int misses = 0;
  while (freed < bytes && chosen.size() < total && misses < 64) {
    // Candidates from the preferred class while it has any (freeing its slots helps directly),
    // else from every class in proportion to its size.
    const std::vector<const std::string*>* list = nullptr;
    if (prefer_cls >= 0 && evictable_[prefer_cls].size() > 0) {
      size_t in_class = 0;
      for (const std::string* s : evictable_[prefer_cls]) in_class += chosen.count(s) ? 0 : 1;
      if (in_class > 0) list = &evictable_[prefer_cls];
    }
    const std::string* best = nullptr;
    int64_t best_access = INT64_MAX;
    for (uint32_t k = 0; k < params_.evict_sample; ++k) {
      const std::string* cand = nullptr;
      if (list != nullptr) {
        cand = (*list)[rng_.below(list->size())];
      } else {
        uint64_t r = rng_.below(total);
        for (const auto& l : evictable_) {
          if (r < l.size()) {
            cand = l[r];
            break;
          }
          r -= l.size();
        }
      }
      if (cand == nullptr || chosen.count(cand)) continue;
      const Entry& e = index_.find(*cand)->second;
      if (e.lease_until_ms > now || pins_.count(Slot{e.meta.size_class, e.meta.offset}.key())) continue;
      const int64_t access = live(e.meta, now) ? e.access_ms : INT64_MIN;  // expired first
      if (access < best_access) {
        best_access = access;
        best = cand;
      }
    }
    if (best == nullptr) {
      ++misses;
      continue;
    }
    chosen.insert(best);
    out.push_back(*best);
    freed += alloc_->classes()[index_.find(*best)->second.meta.size_class].slot_bytes;
  }
}

Result<size_t> ChunkEngine::evict(int prefer_cls, uint64_t bytes) {
  std::lock_guard one_at_a_time(evict_mu_);
  std::vector<std::string> ids;
  std::vector<CommitOp> ops;
  {
    std::lock_guard lock(mu_);
    choose_victims_locked(prefer_cls, bytes, now_ms(), ids);
    for (const std::string& id : ids) {
      CommitOp op;
      op.is_put = false;
      op.reason = DeleteReason::kEvict;
      op.expect_version = index_.find(id)->second.meta.version;
      ops.push_back(std::move(op));
    }
  }
  if (ids.empty()) return size_t{0};
  for (size_t i = 0; i < ids.size(); ++i) ops[i].id = ids[i];
  commit(ops);
  size_t evicted = 0;
  for (const CommitOp& op : ops) {
    if (!op.status.ok()) return op.status.with_context("evict");
    evicted += op.existed ? 1 : 0;
  }
  log_debug("storage target {}: evicted {} of {} chosen chunks", target_id_, evicted, ids.size());
  return evicted;
}

Status ChunkEngine::maintain() {
  // Expired chunks first (a TTL is a promise to forget), in batches.
  for (;;) {
    std::vector<std::string> ids;
    std::vector<CommitOp> ops;
    {
      std::lock_guard lock(mu_);
      const int64_t now = now_ms();
      for (const auto& [id, e] : index_) {
        if (live(e.meta, now) || e.lease_until_ms > now) continue;
        ids.push_back(id);
        CommitOp op;
        op.is_put = false;
        op.reason = DeleteReason::kExpire;
        op.expect_version = e.meta.version;
        ops.push_back(std::move(op));
        if (ids.size() >= 1024) break;
      }
    }
    if (ids.empty()) break;
    for (size_t i = 0; i < ids.size(); ++i) ops[i].id = ids[i];
    commit(ops);
    size_t removed = 0;
    for (const CommitOp& op : ops) {
      if (!op.status.ok()) return op.status.with_context("expire");
      removed += op.existed ? 1 : 0;
    }
    if (removed == 0 || ids.size() < 1024) break;
  }
  if (params_.capacity_bytes == 0) return {};
  uint64_t used = 0;
  {
    std::lock_guard lock(mu_);
    used = alloc_->used_bytes();
  }
  const auto high =
      static_cast<uint64_t>(params_.evict_high_water * static_cast<double>(params_.capacity_bytes));
  const auto low =
      static_cast<uint64_t>(params_.evict_low_water * static_cast<double>(params_.capacity_bytes));
  if (used <= high) return {};
  auto evicted = evict(-1, used - low);
  if (!evicted.ok()) return evicted.status();
  return {};
}

}  // namespace fathom::storage
