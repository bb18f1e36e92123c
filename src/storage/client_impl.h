// StorageClient internals shared by client.cpp (connections, calls, planning) and
// client_ops.cpp (the batched operations). Internal to storage/.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/net.h"
#include "storage/protocol.h"
#include "storage/storage.h"

namespace fathom::storage {

// One connection: a socket and, with a same-host server, the shared segment it reads and writes
// chunk bytes through.
struct Conn {
  int fd = -1;
  uint8_t* shm = nullptr;
  size_t shm_bytes = 0;
};

struct ServerConn {
  net::HostPort where;
  std::string name;
  std::mutex mu;
  std::vector<Conn> idle;
  uint64_t max_request_bytes = 64u << 20;
  uint32_t max_batch_items = 1024;
  std::atomic<bool> shm_refused{false};  // the server cannot see our shared memory (another host)
};

// One request to one server: meta plus data ranges sent after it. `build`, when set, fills them
// for the connection the request goes out on (so it can use that connection's shared segment).
struct Call {
  uint16_t msg = 0;
  uint64_t request_id = 0;
  uint32_t flags = 0;
  std::string meta;
  std::vector<iovec> data;
  std::function<void(Call&, const Conn&)> build;
};

// Given the response header, meta and connection, where the data section goes (exactly
// data_bytes; nothing when the server answered through shared memory).
using DataSink =
    std::function<Result<std::vector<iovec>>(const wire::Header&, std::string_view meta, const Conn& conn)>;

// Requests of one batched operation: (server, item indices) each.
using Plan = std::vector<std::pair<size_t, std::vector<size_t>>>;

class ClientImpl final : public StorageClient {
 public:
  explicit ClientImpl(ClientParams p) : params_(std::move(p)) {}
  ~ClientImpl() override;

  Status init();
  const std::vector<TargetInfo>& targets() const override { return targets_; }
  size_t place(std::string_view id) const override;
  void write(std::span<const ChunkWrite> items, std::span<ChunkWriteResult> results) override;
  void read(std::span<const ChunkRead> items, std::span<ChunkReadResult> results) override;
  void stat(std::span<const std::string_view> ids, std::span<ChunkStat> results, uint32_t lease_ms,
            std::span<const size_t> targets) override;
  Status remove(std::span<const std::string_view> ids, std::span<bool> existed,
                std::span<const size_t> targets) override;
  Result<std::vector<ChunkListing>> list(size_t target, std::string_view prefix, std::string_view start_after,
                                         uint32_t limit, bool* more) override;
  Result<ServerHealth> health(size_t server) override;
  size_t server_count() const override { return servers_.size(); }
  uint64_t client_id() const override { return client_id_; }

 private:
  Result<std::string> call(size_t server, Call& c, const DataSink& sink);
  Result<std::string> call_once(ServerConn& s, const Conn& conn, Call& c, const DataSink& sink);
  Result<Conn> take_connection(ServerConn& s);
  void give_back(ServerConn& s, Conn conn);
  void close_conn(Conn& conn);
  // Offers the server a shared-memory segment for this connection (same host only).
  void attach_shm(ServerConn& s, Conn& conn);
  // Largest request worth planning for a server (its limit, or the shared segment when used).
  uint64_t request_limit(const ServerConn& s) const;
  // Items (those with ok[i]) grouped per server and split within each server's limits.
  Plan plan(const std::vector<size_t>& target_of, const std::vector<bool>& ok,
            const std::function<uint64_t(size_t)>& bytes_of) const;
  // Runs fn(r) for every request of a plan, up to kMaxParallelRequests at once.
  static constexpr size_t kMaxParallelRequests = 8;
  static void run_all(size_t n, const std::function<void(size_t)>& fn);
  // Where item i goes: its named target (checked) or its placement.
  Result<size_t> target_for(std::string_view id, std::optional<size_t> named) const;
  uint64_t next_request() { return next_request_.fetch_add(1); }

  ClientParams params_;
  uint64_t client_id_ = 0;
  std::vector<std::unique_ptr<ServerConn>> servers_;
  std::vector<TargetInfo> targets_;
  std::vector<size_t> target_server_;
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace fathom::storage
