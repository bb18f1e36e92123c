// KvCache internals shared by kvcache.cpp (pages, sequences, prefix reuse) and kvcache_blob.cpp
// (export/import for the storage tier). Not part of the public contract.
//
// Page states: free (in free_list), used (ref > 0), cached (ref 0, published, in the LRU list).
// A page is "hashed" once its hash is known (full and written in every layer) and "published"
// when it is the one the index returns for that hash; published pages are immutable.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/kvcache.h"
#include "kvcache/page_index.h"

namespace fathom {

struct KvSequence {
  bool active = false;
  int64_t len = 0;
  int64_t n_hashed = 0;          // leading pages whose hash is known
  std::vector<int32_t> pages;    // block table; capacity max_pages, reserved at create
  std::vector<int64_t> written;  // per layer: positions [0, written) hold values
};

struct KvCache::Impl {
  KvCacheOptions o;
  int64_t page_bytes = 0;  // one layer
  int64_t n_pages = 0;
  int64_t max_pages = 0;  // per sequence
  uint8_t* pool = nullptr;
  size_t pool_bytes = 0;
  PageHash seed{};

  std::vector<int32_t> ref;
  std::vector<uint8_t> hashed, published;
  std::vector<PageHash> hash;
  std::vector<int32_t> tokens;  // [n_pages][page_tokens]
  std::vector<int32_t> free_list;
  std::vector<int32_t> lru_prev, lru_next;  // cached pages, oldest at lru_head
  int32_t lru_head = -1, lru_tail = -1;
  int64_t lru_count = 0;
  internal::PageIndex index;
  std::vector<KvSequence> seqs;
  std::vector<int32_t> free_seqs;
  KvCacheStats counters;

  explicit Impl(int64_t pages) : index(pages, &hash) {}
  ~Impl();

  uint8_t* page_ptr(int layer, int32_t id) const {
    return pool + (static_cast<int64_t>(layer) * n_pages + id) * page_bytes;
  }
  int32_t* page_tokens(int32_t id) { return tokens.data() + static_cast<int64_t>(id) * o.format.page_tokens; }
  const int32_t* page_tokens(int32_t id) const {
    return tokens.data() + static_cast<int64_t>(id) * o.format.page_tokens;
  }
  bool writable(int32_t id) const {
    return ref[static_cast<size_t>(id)] == 1 && !published[static_cast<size_t>(id)];
  }

  void lru_push(int32_t id);
  void lru_remove(int32_t id);
  // A page with ref 1: a free one, else the least recently released cached one (evicted); -1 if none.
  int32_t alloc_page();
  void acquire(int32_t id);
  void release(int32_t id);
  void publish_complete(KvSequence& s);
  Result<KvSequence*> sequence(SeqId seq, const char* what);
  Result<const KvSequence*> sequence(SeqId seq, const char* what) const;
};

}  // namespace fathom
