// KvTierLink: what the engine thread does with the storage tier (engine-internal; kv_tier.h is
// the transport). Per request it keeps the prompt's page-hash chain; before admission it reads
// the part of the prefix missing in memory from the store and imports it (KvCache::import_page
// verifies every blob), and after each step it queues the request's newly published full pages
// for write-through. It never blocks: a pending read keeps only its own request waiting.
//
// Thread safety: none; the engine thread owns it (the KvTier underneath is thread safe).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/kv_tier.h"
#include "kvcache/kvcache.h"

namespace fathom {

// Per-request state.
struct KvTierSeq {
  uint64_t ticket = 0;           // a store read in flight
  bool checked = false;          // the store was asked (or did not need to be) for this request
  int64_t fetch_from = 0;        // first page of the chain the read asked for
  std::vector<PageHash> hashes;  // full pages of the tokens so far, in chain order
  int64_t pages_queued = 0;      // leading pages of `hashes` already queued or known stored
};

class KvTierLink {
 public:
  KvTierLink(KvTier& tier, KvCache& cache) : tier_(tier), cache_(cache) {}

  // Before admission. True when the request can be admitted now: its prefix is in memory, or the
  // store's part of it was imported, or the store missed or failed (then it is recomputed).
  // `prefix`: the tokens attach_prefix will be given (the prompt but its last token).
  bool ready(KvTierSeq& s, std::span<const int32_t> prefix);
  // After attach_prefix: `tokens` leading tokens came from memory; they need no write.
  void attached(KvTierSeq& s, int64_t tokens);
  // The request left; a read in flight is forgotten.
  void forget(KvTierSeq& s);
  // After a step: queue the full pages of tokens[0, n_computed) published since the last call.
  void collect(KvTierSeq& s, std::span<const int32_t> tokens, int64_t n_computed);
  // Moves queued pages into the tier's write queue as far as it has room.
  void drain();
  bool has_pending() const { return !pending_.empty(); }
  // At shutdown: hands every pending page to the tier and waits for the writes (bounded by the
  // tier's flush timeout).
  void shutdown();

 private:
  void import(KvTierSeq& s, const KvFetchResult& r, std::span<const int32_t> prefix);

  KvTier& tier_;
  KvCache& cache_;
  std::deque<PageHash> pending_;  // published pages waiting for a write-queue slot
  static constexpr size_t kMaxPending = 16384;
};

}  // namespace fathom
