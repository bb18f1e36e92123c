// KvTier: the engine's link to a storage server's KV-cache API (`fathom serve --kv-store`).
//
// Full KV pages (the page blobs KvCache::export_page writes, keyed by the page's prefix hash) are
// written through to the store soon after they are published, and read back on a prefix miss in
// memory, so a restarted server (even after kill -9) starts warm. The engine thread never waits
// on the network:
//
//  - Writes: write() copies one page blob into a slot of a bounded queue (slots allocated once at
//    create) and returns; a writer thread batches the queue into batch_put calls. A full queue or
//    a store known to be down answers at once (the engine retries later or drops the page).
//  - Reads: fetch() queues the read of the longest stored prefix of a chain of page hashes; a
//    reader thread asks the store which leading keys it has (read leases keep them from eviction)
//    and batch_gets them; the engine polls take() each step while the request waits, other
//    requests keep running. Blobs are verified by KvCache::import_page (model fingerprint in the
//    hash chain, sizes, format, checksum) on the engine thread, not here.
//  - Failures (store down, slow, full, bad replies) are logged, counted and answered as misses;
//    after a transport failure calls fail fast for retry_after_ms, then the client reconnects.
//
// Thread safety: every method may be called from any thread (the engine uses one). The
// destructor writes what is queued (up to flush_timeout_ms) and stops the threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/function_ref.h"
#include "base/status.h"
#include "kvcache/kvcache.h"

namespace fathom {

struct KvTierOptions {
  std::string server;                        // HOST:PORT of `fathom store server`; empty: no tier
  uint64_t write_queue_bytes = 64ull << 20;  // page blobs waiting to be written (at least 2 pages)
  int write_batch_pages = 32;                // pages per batch_put
  int max_fetch_pages = 1024;                // pages one prefix read brings back
  int connect_timeout_ms = 1000;
  int io_timeout_ms = 5000;     // a store silent this long mid-call is treated as down
  int retry_after_ms = 2000;    // after a transport failure, calls fail fast this long
  int flush_timeout_ms = 5000;  // how long the destructor spends writing the queue
  uint32_t lease_ms = 30000;    // read lease on pages found by a prefix lookup
  uint32_t ttl_s = 0;           // 0: pages stay until the store's capacity eviction
};

struct KvTierStats {
  int64_t pages_written = 0, bytes_written = 0;  // acknowledged by the store
  int64_t pages_read = 0, bytes_read = 0;        // read back (before import checks)
  int64_t lookups = 0;                           // prefix reads completed
  int64_t hit_pages = 0;                         // pages of those reads the store had
  int64_t miss_pages = 0;                        // pages of those reads it did not have
  int64_t pages_imported = 0;  // pages that passed import into the memory cache (engine side)
  int64_t import_errors = 0;   // blobs rejected at import (engine side)
  int64_t errors = 0;          // failed connects, writes and reads
  int64_t writes_dropped = 0;  // pages not written: queue full for long, store down, shut down
  int64_t write_queue_pages = 0;
  bool connected = false;  // the last call reached the store
};

// The outcome of a fetch: the blobs of the leading pages the store had, in chain order.
struct KvFetchResult {
  Status status;  // not ok: the store could not be asked (the pages are then a miss)
  int64_t pages = 0;
  int64_t blob_bytes = 0;
  std::vector<uint8_t> blobs;  // pages * blob_bytes
  std::span<const uint8_t> blob(int64_t i) const {
    return std::span<const uint8_t>(blobs).subspan(static_cast<size_t>(i * blob_bytes),
                                                   static_cast<size_t>(blob_bytes));
  }
};

enum class KvTierWrite { kQueued, kQueueFull, kStoreDown, kFillFailed };

class KvTier {
 public:
  // blob_bytes: KvCache::export_blob_bytes(). Does not contact the store (it may come up later).
  static Result<std::unique_ptr<KvTier>> create(const KvTierOptions& options, int64_t blob_bytes);
  ~KvTier();
  KvTier(const KvTier&) = delete;
  KvTier& operator=(const KvTier&) = delete;

  // Queues one page: fill(slot) writes its blob (export_page) into a queue slot of blob_bytes.
  KvTierWrite write(const PageHash& key, FunctionRef<Status(std::span<uint8_t>)> fill);
  // Queues a read of the longest stored prefix of `chain` (at most max_fetch_pages of it).
  // Returns a ticket (> 0) for take().
  uint64_t fetch(std::span<const PageHash> chain);
  // The result once the read is done; nullopt while it is pending. Each ticket is taken once.
  std::optional<KvFetchResult> take(uint64_t ticket);
  // Forgets a ticket (its request went away); its result is discarded when it arrives.
  void cancel(uint64_t ticket);
  // Waits up to timeout_ms until the write queue is empty; false on timeout.
  bool flush(int timeout_ms);
  // Engine-side outcomes counted with the tier's own.
  void count_import(int64_t imported, int64_t rejected);
  void count_dropped(int64_t pages);

  KvTierStats stats() const;
  const KvTierOptions& options() const;
  int64_t blob_bytes() const;

  struct Impl;

 private:
  explicit KvTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
