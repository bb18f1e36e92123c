// PageIndex: an open-addressing map from a page hash to a page id, sized once (twice the page
// count, a power of two) so inserts never allocate. Keys are SHA-256 digests, so their first 8
// bytes are already uniform; linear probing with backward-shift deletion (no tombstones).
// Internal to kvcache/.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kvcache/kvcache.h"

namespace fathom::internal {

class PageIndex {
 public:
  // `hashes` is the cache's per-page hash array: the index stores ids and compares through it.
  PageIndex(int64_t n_pages, const std::vector<PageHash>* hashes) : hashes_(hashes) {
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(n_pages) * 2) cap <<= 1;
    slots_.assign(cap, -1);
    mask_ = cap - 1;
  }

  // The page id published under `hash`, or -1.
  int32_t find(const PageHash& hash) const {
    for (uint64_t i = home(hash);; i = (i + 1) & mask_) {
      const int32_t id = slots_[i];
      if (id < 0) return -1;
      if ((*hashes_)[static_cast<size_t>(id)] == hash) return id;
    }
  }

  // Inserts page `id` (whose hash is already in the hash array); the hash must be absent.
  void insert(int32_t id) {
    CHECK(size_ < static_cast<int64_t>(mask_));
    uint64_t i = home((*hashes_)[static_cast<size_t>(id)]);
    while (slots_[i] >= 0) i = (i + 1) & mask_;
    slots_[i] = id;
    ++size_;
  }

  // Removes page `id`, which must be present.
  void erase(int32_t id) {
    uint64_t i = home((*hashes_)[static_cast<size_t>(id)]);
    while (slots_[i] != id) {
      CHECK(slots_[i] >= 0);
      i = (i + 1) & mask_;
    }
    // Backward-shift: pull later entries of the probe run into the hole.
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & mask_; slots_[j] >= 0; j = (j + 1) & mask_) {
      const uint64_t h = home((*hashes_)[static_cast<size_t>(slots_[j])]);
      // Move slots_[j] into the hole if its home is not in (hole, j] (cyclically).
      const bool in_range = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = -1;
    --size_;
  }

  int64_t size() const { return size_; }

 private:
  uint64_t home(const PageHash& h) const {
    uint64_t v;
    std::memcpy(&v, h.data(), 8);
    return v & mask_;
  }
  const std::vector<PageHash>* hashes_;
  std::vector<int32_t> slots_;
  uint64_t mask_ = 0;
  int64_t size_ = 0;
};

}  // namespace fathom::internal
