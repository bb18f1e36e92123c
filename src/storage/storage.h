// storage/: Fathom's 3FS-style storage tier. One public header for everything outside this
// folder (the CLI, the serving engine):
//
//   StorageServer  one process serving several targets (directories on local disks) over a
//                  versioned binary RPC protocol on TCP (docs/storage.md, "Wire protocol").
//   StorageClient  connects to one or more servers, learns their chain table once (hello), then
//                  places every chunk by hashing its id: no metadata round trip on the data path.
//   KvCache        the KV-cache API: immutable blocks keyed by 32-byte prefix hashes, with TTL,
//                  approximate-LRU capacity eviction and read leases.
//   FileStore      the file API for bulk data (datasets, checkpoints), files chunked over targets.
//
// Durability: a write is acknowledged only after its data is fdatasync'ed and its metadata is
// committed with a synced RocksDB write; a crash leaves every chunk old-or-new, never torn; every
// read is CRC32C-verified on the server and again in the client.
//
// Thread safety: StorageClient, KvCache and FileStore are safe to share between threads (the
// client keeps a pool of connections per server). StorageServer methods may be called from any
// thread.
//
// Engine hook (KV pages of the paged cache): call KvCache::batch_put when pages are evicted
// from memory and KvCache::longest_prefix + batch_get on a prefix lookup. Keys are the pages'
// 32-byte chained prefix hashes (kvcache/ defines them, SHA-256 based); the target is a pure
// function of the key and the chain table, so neither call asks any server where a page lives.
// batch_get writes straight into the caller's page buffers (no copy in the client).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom::storage {

class FaultInjector;

// ---------------------------------------------------------------------------------------------
// Server

struct TargetParams {
  std::string dir;
  uint64_t capacity_bytes = 0;  // cap on the data-file space of this target; 0: the disk's free space
};

struct ServerParams {
  std::vector<TargetParams> targets;
  std::string listen = "127.0.0.1:9400";  // HOST:PORT; port 0 picks a free one (see port())
  std::string io = "auto";                // auto | io_uring | psync
  bool direct_io = true;                  // O_DIRECT where the filesystem allows it
  uint64_t group_bytes = 16u << 20;       // slot-group size of newly created targets
  uint64_t keep_empty_bytes = 1u << 30;   // emptied groups kept allocated per target for new puts
  int max_connections = 512;
  int max_inflight_per_client = 16;         // requests of one client id executing at once
  uint64_t max_request_bytes = 256u << 20;  // data bytes in one request or one response
  uint64_t memory_bytes = 1u << 30;         // I/O buffers of all requests executing at once
  int io_timeout_ms = 30000;                // a peer silent this long mid-request is dropped
  int maintenance_interval_ms = 1000;       // TTL expiry and high-water eviction
  double evict_high_water = 0.95, evict_low_water = 0.90;
  FaultInjector* faults = nullptr;  // tests only; not owned
};

struct TargetInfo {
  std::string uuid;  // the target's permanent identity (32 hex digits)
  uint32_t target_id = 0;
  uint32_t chain_id = 0;
  uint32_t chain_ver = 0;
  uint64_t capacity_bytes = 0;  // 0: unbounded
  std::string path;             // the target directory on the server's machine
  std::string server;           // HOST:PORT it was reached at (filled by the client)
};

struct TargetHealth {
  TargetInfo info;
  std::string io_backend;  // io_uring | psync
  bool direct_io = false;
  uint64_t chunks = 0, live_bytes = 0, used_slot_bytes = 0, reserved_bytes = 0;
  uint64_t reads = 0, read_bytes = 0, writes = 0, write_bytes = 0, removes = 0;
  uint64_t checksum_errors = 0, evictions = 0, expirations = 0, commits = 0;
  uint64_t quarantined_slots = 0, orphan_bytes_reclaimed = 0;
};

struct ServerHealth {
  bool ready = false;  // false while draining for shutdown
  uint64_t server_id = 0;
  uint64_t uptime_ms = 0;
  uint64_t cpu_user_us = 0, cpu_system_us = 0;  // the server process's CPU time so far
  uint32_t connections = 0;
  uint64_t requests = 0;
  uint64_t replayed_requests = 0;  // retries answered from the idempotency table
  uint32_t inflight_max_seen = 0;  // most requests of one client executing at once
  uint64_t inflight_waits = 0;     // requests that waited for the per-client bound
  uint64_t shm_requests = 0;       // reads/writes whose bytes went through shared memory
  std::vector<TargetHealth> targets;
};

class StorageServer {
 public:
  // Opens every target (rebuilding its allocator and reclaiming orphans), binds and starts
  // serving. Returns once the server accepts connections.
  static Result<std::unique_ptr<StorageServer>> start(ServerParams params);
  virtual ~StorageServer() = default;
  virtual uint16_t port() const = 0;
  virtual std::string address() const = 0;  // HOST:PORT actually bound
  // Graceful shutdown: stop accepting, finish the requests in flight (every acknowledged write
  // is durable), close idle connections, close the targets. Idempotent; returns when done.
  virtual void stop() = 0;
  virtual ServerHealth health() const = 0;
};

// Offline check of a target directory (the server must not be running on it): opens it, reads
// every chunk and verifies its CRC32C.
struct TargetReport {
  uint32_t target_id = 0;
  uint64_t chunks = 0;
  uint64_t live_bytes = 0;
  uint64_t orphan_bytes_reclaimed = 0;   // released by this open
  std::vector<std::string> corrupt_ids;  // printable (non-printable bytes escaped)
};
Result<TargetReport> verify_target(const std::string& dir);

// ---------------------------------------------------------------------------------------------
// Client: chunk-level access

struct ClientParams {
  std::vector<std::string> servers;  // HOST:PORT each
  uint64_t client_id = 0;            // 0: random; identifies retried writes across connections
  int connect_timeout_ms = 5000;
  int io_timeout_ms = 60000;
  int retries = 3;               // resend after a broken connection (writes are idempotent)
  int idle_connections = 32;     // kept open per server
  bool verify_checksums = true;  // check each read's CRC32C in the client too
  // Same-host servers: a shared-memory segment of this size per connection carries the chunk
  // bytes (the server reads from disk straight into it and writes to disk straight from it), so
  // nothing crosses the socket but the messages. 0 turns it off; other hosts fall back to TCP.
  uint64_t shm_bytes = 64u << 20;
  // A batch of more bytes than this for one server goes out as several requests at once (each up
  // to this size, on its own connection). A request completes with its slowest block and syncs
  // and commits after its last, so one big request leaves the disk idle at both ends; smaller
  // requests in flight together keep its queue full. 0: only the server's limits split.
  uint64_t request_split_bytes = 2u << 20;
};

enum class ChunkMode : uint8_t { kOverwrite = 0, kCreate = 1 };  // kCreate keeps a live chunk

struct ChunkWrite {
  std::string_view id;            // 1..1024 bytes
  std::span<const uint8_t> data;  // up to 64 MiB
  ChunkMode mode = ChunkMode::kOverwrite;
  bool evictable = false;  // a cache block: TTL/LRU may remove it
  uint32_t ttl_s = 0;
  std::optional<size_t> target;  // index into targets(); default: place(id)
};

struct ChunkWriteResult {
  Status status;
  uint64_t version = 0;
  bool existed = false;  // kCreate found the chunk already there
};

struct ChunkRead {
  std::string_view id;
  uint32_t offset = 0;
  uint32_t length = UINT32_MAX;  // clipped to the chunk
  uint32_t lease_ms = 0;
  // Where the bytes go: a caller buffer (must hold the result; else kOutOfRange), or, when
  // empty, ChunkReadResult::data.
  std::span<uint8_t> dest;
  std::optional<size_t> target;  // index into targets(); default: place(id)
};

struct ChunkReadResult {
  Status status;  // kNotFound on a miss
  uint64_t version = 0;
  uint32_t length = 0;        // bytes returned
  uint32_t chunk_length = 0;  // whole chunk
  std::vector<uint8_t> data;  // when no dest was given
};

struct ChunkStat {
  Status status;
  uint64_t version = 0;
  uint32_t length = 0;
  uint32_t crc32c = 0;
  bool evictable = false;
  int64_t created_ms = 0, expire_ms = 0;
};

struct ChunkListing {
  std::string id;
  uint32_t length = 0;
  uint64_t version = 0;
  int64_t created_ms = 0;
};

class StorageClient {
 public:
  static Result<std::unique_ptr<StorageClient>> connect(ClientParams params);
  virtual ~StorageClient() = default;

  // The chain table (every target of every server, ordered by chain id).
  virtual const std::vector<TargetInfo>& targets() const = 0;
  // Placement: the index into targets() that holds `id`, a jump consistent hash of XXH3(id)
  // over the table (so adding a target moves only 1/n of the ids).
  virtual size_t place(std::string_view id) const = 0;

  // Batched chunk operations. Items go to their placed targets (or the target they name),
  // grouped into requests per server within its limits and sent concurrently; results are
  // per item.
  virtual void write(std::span<const ChunkWrite> items, std::span<ChunkWriteResult> results) = 0;
  virtual void read(std::span<const ChunkRead> items, std::span<ChunkReadResult> results) = 0;
  // targets: empty (placement) or one index into targets() per id.
  virtual void stat(std::span<const std::string_view> ids, std::span<ChunkStat> results,
                    uint32_t lease_ms = 0, std::span<const size_t> targets = {}) = 0;
  // existed[i] says whether ids[i] was there.
  virtual Status remove(std::span<const std::string_view> ids, std::span<bool> existed,
                        std::span<const size_t> targets = {}) = 0;
  // One page of ids on one target, in order, after start_after.
  virtual Result<std::vector<ChunkListing>> list(size_t target, std::string_view prefix,
                                                 std::string_view start_after, uint32_t limit,
                                                 bool* more) = 0;
  virtual Result<ServerHealth> health(size_t server) = 0;
  virtual size_t server_count() const = 0;
  virtual uint64_t client_id() const = 0;
};

// ---------------------------------------------------------------------------------------------
// KV-cache API

using KvKey = std::array<uint8_t, 32>;
std::string kv_key_hex(const KvKey& key);
Result<KvKey> parse_kv_key(std::string_view hex);  // 64 hex digits

struct KvGetResult {
  Status status;        // ok: hit; kNotFound: miss; anything else: an error (e.g. kCorrupt)
  uint32_t length = 0;  // bytes written into the destination on a hit
};

class KvCache {
 public:
  explicit KvCache(StorageClient& client) : client_(client) {}

  // Stores an immutable block (kept as is if the key is already cached). ttl_s 0: no expiry.
  Status put(const KvKey& key, std::span<const uint8_t> value, uint32_t ttl_s = 0);
  std::vector<Status> batch_put(std::span<const KvKey> keys, std::span<const std::span<const uint8_t>> values,
                                uint32_t ttl_s = 0);
  // nullopt on a miss.
  Result<std::optional<std::vector<uint8_t>>> get(const KvKey& key, uint32_t lease_ms = 0);
  // Into caller buffers (dests[i] must be large enough for the block: else kOutOfRange).
  std::vector<KvGetResult> batch_get(std::span<const KvKey> keys, std::span<const std::span<uint8_t>> dests,
                                     uint32_t lease_ms = 0);
  // Whether each key is cached; lease_ms > 0 also protects the hits from eviction that long.
  Result<std::vector<bool>> exists(std::span<const KvKey> keys, uint32_t lease_ms = 0);
  // How many leading keys of a prefix chain are cached (all looked up at once, in parallel).
  Result<size_t> longest_prefix(std::span<const KvKey> chain, uint32_t lease_ms = 0);
  // Removes the keys; returns how many were there.
  Result<size_t> remove(std::span<const KvKey> keys);

  static std::string chunk_id(const KvKey& key);  // "K" + the 32 key bytes

 private:
  StorageClient& client_;
};

// ---------------------------------------------------------------------------------------------
// File API

struct FileInfo {
  std::string path;
  uint64_t size = 0;
  uint32_t chunk_bytes = 0;
  uint64_t chunks = 0;
  uint32_t crc32c = 0;  // of the whole file
  int64_t mtime_ms = 0;
  std::string inode;  // hex id of this version of the file
};

struct FileStoreParams {
  uint32_t chunk_bytes = 4u << 20;  // up to 64 MiB
  int parallel = 4;                 // requests in flight
  int batch = 4;                    // chunks per request
};

class FileStore {
 public:
  explicit FileStore(StorageClient& client, FileStoreParams params = {}) : client_(client), params_(params) {}

  // Uploads a local file; the remote file appears (or is replaced) atomically when complete.
  Status put(const std::string& local, const std::string& remote);
  Status put_bytes(std::span<const uint8_t> data, const std::string& remote);
  // Downloads to local (written to a temporary name and renamed when verified).
  Status get(const std::string& remote, const std::string& local);
  Result<std::vector<uint8_t>> get_bytes(const std::string& remote);
  Result<std::vector<FileInfo>> list(std::string_view prefix);
  Status remove(const std::string& remote);
  Result<FileInfo> stat(const std::string& remote);

 private:
  StorageClient& client_;
  FileStoreParams params_;
};

}  // namespace fathom::storage
