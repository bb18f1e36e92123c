// KvTierLink: prefix reads before admission and write-through of published pages, on the engine
// thread. See kv_tier_link.h. Eviction needs no hook of its own: every published page is written
// within a step or two of publication, long before the LRU reaches it (a page that could not be
// queued is counted as dropped).
#include "engine/kv_tier_link.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/log.h"

namespace fathom {

bool KvTierLink::ready(KvTierSeq& s, std::span<const int32_t> prefix) {
  if (s.checked) return true;
  if (s.ticket == 0) {
    const int page_tokens = cache_.format().page_tokens;
    s.hashes.clear();
    kv_hash_chain(cache_.hash_seed(), prefix, page_tokens, &s.hashes);
    const int64_t in_memory = cache_.lookup(s.hashes);
    if (in_memory >= static_cast<int64_t>(s.hashes.size())) {
      s.checked = true;
      return true;
    }
    s.fetch_from = in_memory;
    s.ticket = tier_.fetch(std::span<const PageHash>(s.hashes).subspan(static_cast<size_t>(in_memory)));
  }
  std::optional<KvFetchResult> r = tier_.take(s.ticket);
  if (!r) return false;  // still reading: the request waits, others run
  s.ticket = 0;
  s.checked = true;
  if (!r->status.ok()) return true;  // counted and logged by the tier: recompute
  import(s, *r, prefix);
  return true;
}

// Imports the fetched pages in chain order, each verified against its parent. The pages already
// in memory are pinned by a scratch sequence meanwhile when the imports would have to evict
// cached pages (free pages are taken first), so they cannot evict that prefix.
void KvTierLink::import(KvTierSeq& s, const KvFetchResult& r, std::span<const int32_t> prefix) {
  if (r.pages == 0) return;
  const int page_tokens = cache_.format().page_tokens;
  SeqId pin = -1;
  if (s.fetch_from > 0 && cache_.stats().pages_free < r.pages) {
    if (auto seq = cache_.add_sequence(); seq.ok()) {
      pin = *seq;
      (void)cache_.attach_prefix(pin, prefix.first(static_cast<size_t>(s.fetch_from * page_tokens)));
    }
  }
  int64_t imported = 0, rejected = 0;
  PageHash parent = s.fetch_from > 0 ? s.hashes[static_cast<size_t>(s.fetch_from - 1)] : cache_.hash_seed();
  for (int64_t i = 0; i < r.pages; ++i) {
    const PageHash& want = s.hashes[static_cast<size_t>(s.fetch_from + i)];
    auto got = cache_.import_page(parent, r.blob(i));
    if (!got.ok() || *got != want) {
      if (got.ok() || got.status().code() != StatusCode::kResourceExhausted) {
        ++rejected;
        log_warn("kv store: page {} rejected ({}); recomputing from there", page_hash_hex(want),
                 got.ok() ? "it holds another page" : got.status().to_string());
      }
      break;
    }
    parent = want;
    ++imported;
  }
  if (pin >= 0) (void)cache_.free_sequence(pin);
  tier_.count_import(imported, rejected);
}

void KvTierLink::attached(KvTierSeq& s, int64_t tokens) {
  s.pages_queued = std::max(s.pages_queued, tokens / cache_.format().page_tokens);
}

void KvTierLink::forget(KvTierSeq& s) {
  if (s.ticket != 0) tier_.cancel(s.ticket);
  s.ticket = 0;
}

void KvTierLink::collect(KvTierSeq& s, std::span<const int32_t> tokens, int64_t n_computed) {
  const int64_t page_tokens = cache_.format().page_tokens;
  const int64_t full = std::min<int64_t>(n_computed, static_cast<int64_t>(tokens.size())) / page_tokens;
  while (static_cast<int64_t>(s.hashes.size()) < full) {
    const size_t k = s.hashes.size();
    const PageHash parent = k == 0 ? cache_.hash_seed() : s.hashes[k - 1];
    s.hashes.push_back(kv_page_hash(
        parent, tokens.subspan(k * static_cast<size_t>(page_tokens), static_cast<size_t>(page_tokens))));
  }
  // A page is published once every layer of it is written (the MTP layer one token later).
  while (s.pages_queued < full &&
         cache_.lookup(std::span(&s.hashes[static_cast<size_t>(s.pages_queued)], 1)) == 1) {
    pending_.push_back(s.hashes[static_cast<size_t>(s.pages_queued)]);
    ++s.pages_queued;
  }
  if (pending_.size() > kMaxPending) {
    const size_t over = pending_.size() - kMaxPending;
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(over));
    tier_.count_dropped(static_cast<int64_t>(over));
  }
}

void KvTierLink::drain() {
  while (!pending_.empty()) {
    const PageHash key = pending_.front();
    const KvTierWrite w =
        tier_.write(key, [&](std::span<uint8_t> slot) { return cache_.export_page(key, slot); });
    if (w == KvTierWrite::kQueueFull) return;  // the writer is behind: retry next step
    pending_.pop_front();
    // Down: the page is dropped (the store missed it while away). Fill failed: evicted already.
    if (w == KvTierWrite::kStoreDown || w == KvTierWrite::kFillFailed) tier_.count_dropped(1);
  }
}

void KvTierLink::shutdown() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(tier_.options().flush_timeout_ms);
  while (!pending_.empty() && std::chrono::steady_clock::now() < deadline) {
    drain();
    if (!pending_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  tier_.count_dropped(static_cast<int64_t>(pending_.size()));
  pending_.clear();
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  (void)tier_.flush(static_cast<int>(std::max<int64_t>(0, left.count())));
}

}  // namespace fathom
