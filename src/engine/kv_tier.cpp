// KvTier: a bounded write-through queue and an asynchronous prefix reader between the engine and
// a storage server's KV-cache API (storage/storage.h). See kv_tier.h. It does not verify blobs
// (KvCache::import_page does, on the engine thread) and does not decide what to write or read.
#include "engine/kv_tier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "base/log.h"
#include "storage/storage.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

bool transport_error(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimeout ||
         s.code() == StatusCode::kIoError;
}

Status check_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
    return invalid_argument("--kv-store '{}': expected HOST:PORT", s);
  }
  int64_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return invalid_argument("--kv-store '{}': port is not a number", s);
    port = port * 10 + (s[i] - '0');
    if (port > 65535) break;
  }
  if (port < 1 || port > 65535) return invalid_argument("--kv-store '{}': port must be 1..65535", s);
  return {};
}

struct Queued {
  PageHash key;
  int32_t slot;
};

struct FetchJob {
  uint64_t ticket;
  std::vector<PageHash> chain;
};

}  // namespace

struct KvTier::Impl {
  KvTierOptions o;
  int64_t blob_bytes = 0;
  std::vector<uint8_t> slab;  // n_slots * blob_bytes, allocated once

  mutable std::mutex mu;
  std::condition_variable cv_write, cv_read, cv_idle;
  std::vector<int32_t> free_slots;
  std::deque<Queued> queued;
  int64_t writing = 0;  // pages in the writer's current batch
  std::deque<FetchJob> fetches;
  std::unordered_map<uint64_t, std::optional<KvFetchResult>> results;  // a key per live ticket
  uint64_t next_ticket = 1;
  bool stopping = false;
  int64_t flush_deadline_ms = 0;
  KvTierStats st;

  std::mutex client_mu;
  std::shared_ptr<storage::StorageClient> client;
  std::atomic<int64_t> down_until_ms{0};
  std::thread writer, reader;

  uint8_t* slot_ptr(int32_t slot) { return slab.data() + static_cast<int64_t>(slot) * blob_bytes; }
  bool down() const { return now_ms() < down_until_ms.load(); }
  Result<std::shared_ptr<storage::StorageClient>> get_client();
  void on_failure(const Status& s, const char* what);
  void write_loop();
  void write_batch(std::vector<Queued>& batch);
  void read_loop();
  KvFetchResult read_prefix(std::span<const PageHash> chain);
};

Result<std::shared_ptr<storage::StorageClient>> KvTier::Impl::get_client() {
  std::lock_guard lock(client_mu);
  if (client) return client;
  if (down())
    return unavailable("kv store {} is down (retrying in {} ms)", o.server, down_until_ms.load() - now_ms());
  storage::ClientParams p;
  p.servers = {o.server};
  p.connect_timeout_ms = o.connect_timeout_ms;
  p.io_timeout_ms = o.io_timeout_ms;
  p.retries = 1;
  p.idle_connections = 4;
  p.shm_bytes = 0;
  auto c = storage::StorageClient::connect(std::move(p));
  if (!c.ok()) {
    down_until_ms.store(now_ms() + o.retry_after_ms);
    {
      std::lock_guard l(mu);
      ++st.errors;
      st.connected = false;
    }
    log_warn("kv store {}: cannot connect ({}); serving without it, retrying in {} ms", o.server,
             c.status().to_string(), o.retry_after_ms);
    return c.status();
  }
  log_info("kv store {}: connected ({} targets)", o.server, (*c)->targets().size());
  client = std::shared_ptr<storage::StorageClient>(std::move(*c));
  std::lock_guard l(mu);
  st.connected = true;
  return client;
}

// A transport failure drops the client (reconnect later, the chain table may have changed) and
// makes calls fail fast for retry_after_ms, so a dead or hung store costs the engine nothing.
void KvTier::Impl::on_failure(const Status& s, const char* what) {
  bool was_up = false;
  {
    std::lock_guard l(mu);
    ++st.errors;
    was_up = st.connected;
    if (transport_error(s)) st.connected = false;
  }
  if (!transport_error(s)) {
    log_warn("kv store {}: {} failed: {}", o.server, what, s.to_string());
    return;
  }
  {
    std::lock_guard lock(client_mu);
    client.reset();
    down_until_ms.store(now_ms() + o.retry_after_ms);
  }
  if (was_up) {
    log_warn("kv store {}: {} failed ({}); serving without it, retrying in {} ms", o.server, what,
             s.to_string(), o.retry_after_ms);
  }
}

Result<std::unique_ptr<KvTier>> KvTier::create(const KvTierOptions& options, int64_t blob_bytes) {
  TRY(check_host_port(options.server));
  if (blob_bytes <= 0 || blob_bytes > (int64_t{64} << 20)) {
    return invalid_argument("kv store: a page blob of {} B does not fit a storage chunk (at most 64 MiB)",
                            blob_bytes);
  }
  if (options.write_batch_pages < 1 || options.max_fetch_pages < 1) {
    return invalid_argument("kv store: write_batch_pages and max_fetch_pages must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->blob_bytes = blob_bytes;
  const int64_t n_slots = std::max<int64_t>(2, static_cast<int64_t>(options.write_queue_bytes) / blob_bytes);
  impl->slab.resize(static_cast<size_t>(n_slots * blob_bytes));
  impl->free_slots.reserve(static_cast<size_t>(n_slots));
  for (int64_t i = n_slots - 1; i >= 0; --i) impl->free_slots.push_back(static_cast<int32_t>(i));
  Impl* raw = impl.get();
  impl->writer = std::thread([raw] { raw->write_loop(); });
  impl->reader = std::thread([raw] { raw->read_loop(); });
  return std::unique_ptr<KvTier>(new KvTier(std::move(impl)));
}

KvTier::KvTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvTier::~KvTier() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->flush_deadline_ms = now_ms() + impl_->o.flush_timeout_ms;
  }
  impl_->cv_write.notify_all();
  impl_->cv_read.notify_all();
  impl_->writer.join();
  impl_->reader.join();
}

KvTierWrite KvTier::write(const PageHash& key, FunctionRef<Status(std::span<uint8_t>)> fill) {
  Impl& m = *impl_;
  if (m.down()) return KvTierWrite::kStoreDown;
  int32_t slot = -1;
  {
    std::lock_guard lock(m.mu);
    if (m.stopping) return KvTierWrite::kStoreDown;
    if (m.free_slots.empty()) return KvTierWrite::kQueueFull;
    slot = m.free_slots.back();
    m.free_slots.pop_back();
  }
  // The slot is ours alone until queued: fill it without the lock.
  const Status st = fill(std::span<uint8_t>(m.slot_ptr(slot), static_cast<size_t>(m.blob_bytes)));
  {
    std::lock_guard lock(m.mu);
    if (!st.ok()) {
      m.free_slots.push_back(slot);
      return KvTierWrite::kFillFailed;
    }
    m.queued.push_back(Queued{key, slot});
  }
  m.cv_write.notify_one();
  return KvTierWrite::kQueued;
}

void KvTier::Impl::write_loop() {
  std::vector<Queued> batch;
  batch.reserve(static_cast<size_t>(o.write_batch_pages));
  while (true) {
    {
      std::unique_lock lock(mu);
      cv_write.wait(lock, [&] { return stopping || !queued.empty(); });
      if (queued.empty()) break;  // stopping, nothing left
      const bool give_up = stopping && now_ms() > flush_deadline_ms;
      while (!queued.empty() && static_cast<int>(batch.size()) < o.write_batch_pages) {
        batch.push_back(queued.front());
        queued.pop_front();
      }
      writing = static_cast<int64_t>(batch.size());
      if (give_up) {
        st.writes_dropped += static_cast<int64_t>(batch.size() + queued.size());
        for (const Queued& q : queued) free_slots.push_back(q.slot);
        queued.clear();
        for (const Queued& q : batch) free_slots.push_back(q.slot);
        batch.clear();
        writing = 0;
        cv_idle.notify_all();
        continue;
      }
    }
    write_batch(batch);
    {
      std::lock_guard lock(mu);
      for (const Queued& q : batch) free_slots.push_back(q.slot);
      writing = 0;
    }
    batch.clear();
    cv_idle.notify_all();
  }
}

void KvTier::Impl::write_batch(std::vector<Queued>& batch) {
  auto c = get_client();
  if (!c.ok()) {
    std::lock_guard lock(mu);
    st.writes_dropped += static_cast<int64_t>(batch.size());
    return;
  }
  std::vector<storage::KvKey> keys(batch.size());
  std::vector<std::span<const uint8_t>> values(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    keys[i] = batch[i].key;
    values[i] = std::span<const uint8_t>(slot_ptr(batch[i].slot), static_cast<size_t>(blob_bytes));
  }
  storage::KvCache kv(**c);
  const std::vector<Status> res = kv.batch_put(keys, values, o.ttl_s);
  int64_t ok = 0;
  Status first_error;
  for (const Status& s : res) {
    if (s.ok())
      ++ok;
    else if (first_error.ok())
      first_error = s;
  }
  {
    std::lock_guard lock(mu);
    st.pages_written += ok;
    st.bytes_written += ok * blob_bytes;
    st.writes_dropped += static_cast<int64_t>(batch.size()) - ok;
  }
  if (!first_error.ok()) on_failure(first_error, "page write");
}

uint64_t KvTier::fetch(std::span<const PageHash> chain) {
  Impl& m = *impl_;
  const size_t n = std::min(chain.size(), static_cast<size_t>(m.o.max_fetch_pages));
  std::lock_guard lock(m.mu);
  const uint64_t ticket = m.next_ticket++;
  if (m.down() || m.stopping || n == 0) {  // answer at once: a miss
    KvFetchResult r;
    r.blob_bytes = m.blob_bytes;
    if (n > 0) r.status = unavailable("kv store {} is down", m.o.server);
    m.results.emplace(ticket, std::move(r));
    return ticket;
  }
  m.results.emplace(ticket, std::nullopt);
  m.fetches.push_back(
      FetchJob{ticket, std::vector<PageHash>(chain.begin(), chain.begin() + static_cast<ptrdiff_t>(n))});
  m.cv_read.notify_one();
  return ticket;
}

std::optional<KvFetchResult> KvTier::take(uint64_t ticket) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto it = m.results.find(ticket);
  if (it == m.results.end()) {  // unknown or already taken: an empty miss, never a wait forever
    KvFetchResult r;
    r.status = invalid_argument("kv store: unknown fetch ticket {}", ticket);
    return r;
  }
  if (!it->second) return std::nullopt;
  KvFetchResult r = std::move(*it->second);
  m.results.erase(it);
  return r;
}

void KvTier::cancel(uint64_t ticket) {
  std::lock_guard lock(impl_->mu);
  impl_->results.erase(ticket);
}

void KvTier::Impl::read_loop() {
  while (true) {
    FetchJob job;
    {
      std::unique_lock lock(mu);
      cv_read.wait(lock, [&] { return stopping || !fetches.empty(); });
      if (stopping) break;
      job = std::move(fetches.front());
      fetches.pop_front();
      if (!results.contains(job.ticket)) continue;  // cancelled
    }
    const int64_t t0 = now_ms();
    KvFetchResult r = read_prefix(job.chain);
    log_debug("kv store {}: prefix read of {} pages: {} hit, {} ms", o.server, job.chain.size(), r.pages, now_ms() - t0);
    std::lock_guard lock(mu);
    ++st.lookups;
    if (r.status.ok()) {
      st.hit_pages += r.pages;
      st.miss_pages += static_cast<int64_t>(job.chain.size()) - r.pages;
    }
    st.pages_read += r.pages;
    st.bytes_read += r.pages * blob_bytes;
    if (auto it = results.find(job.ticket); it != results.end()) it->second = std::move(r);
  }
}

// Which leading pages the store has (leased, so they are not evicted before the read), then
// their blobs straight into one buffer. A page that fails or comes back with the wrong size ends
// the prefix there.
KvFetchResult KvTier::Impl::read_prefix(std::span<const PageHash> chain) {
  KvFetchResult r;
  r.blob_bytes = blob_bytes;
  auto c = get_client();
  if (!c.ok()) {
    r.status = c.status();
    return r;
  }
  std::vector<storage::KvKey> keys(chain.begin(), chain.end());
  storage::KvCache kv(**c);
  auto n = kv.longest_prefix(keys, o.lease_ms);
  if (!n.ok()) {
    on_failure(n.status(), "prefix lookup");
    r.status = n.status();
    return r;
  }
  if (*n == 0) return r;
  r.blobs.resize(*n * static_cast<size_t>(blob_bytes));
  std::vector<std::span<uint8_t>> dests(*n);
  for (size_t i = 0; i < *n; ++i) {
    dests[i] = std::span<uint8_t>(r.blobs).subspan(i * static_cast<size_t>(blob_bytes),
                                                   static_cast<size_t>(blob_bytes));
  }
  const std::vector<storage::KvGetResult> got = kv.batch_get(std::span(keys).first(*n), dests, o.lease_ms);
  size_t k = 0;
  while (k < *n && got[k].status.ok() && got[k].length == static_cast<uint32_t>(blob_bytes)) ++k;
  if (k < *n) {
    const Status& s = got[k].status;
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      on_failure(s, "page read");
    } else if (s.ok()) {
      std::lock_guard lock(mu);
      ++st.errors;
      log_warn("kv store {}: page {} is {} B, a page blob of this model is {} B; recomputing from there",
               o.server, page_hash_hex(chain[k]), got[k].length, blob_bytes);
    }
  }
  r.pages = static_cast<int64_t>(k);
  r.blobs.resize(k * static_cast<size_t>(blob_bytes));
  return r;
}

bool KvTier::flush(int timeout_ms) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  return m.cv_idle.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                            [&] { return m.queued.empty() && m.writing == 0; });
}

void KvTier::count_import(int64_t imported, int64_t rejected) {
  std::lock_guard lock(impl_->mu);
  impl_->st.pages_imported += imported;
  impl_->st.import_errors += rejected;
}

void KvTier::count_dropped(int64_t pages) {
  std::lock_guard lock(impl_->mu);
  impl_->st.writes_dropped += pages;
}

KvTierStats KvTier::stats() const {
  std::lock_guard lock(impl_->mu);
  KvTierStats s = impl_->st;
  s.write_queue_pages = static_cast<int64_t>(impl_->queued.size()) + impl_->writing;
  return s;
}

const KvTierOptions& KvTier::options() const {
  return impl_->o;
}
int64_t KvTier::blob_bytes() const {
  return impl_->blob_bytes;
}

}  // namespace fathom
