// StorageServer internals shared by server.cpp (lifecycle, connections, limits) and
// server_handlers.cpp (one handler per message). Internal to storage/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/timer.h"
#include "storage/buffer.h"
#include "storage/chunk_engine.h"
#include "storage/protocol.h"
#include "storage/storage.h"

namespace fathom::storage {

// Responses of recent writes and removes by (client id, request id), so a request retried after
// a lost response is answered, not applied again. A duplicate that arrives while the original
// still runs waits for it. Bounded: the newest kPerClient requests of the newest kClients clients.
class ReplayCache {
 public:
  static constexpr size_t kPerClient = 1024;
  static constexpr size_t kClients = 4096;
  // nullopt: the caller runs the request (and must call finish or abandon); otherwise the
  // response meta of the earlier run.
  std::optional<std::string> begin(uint64_t client, uint64_t request);
  void finish(uint64_t client, uint64_t request, std::string response_meta);
  void abandon(uint64_t client, uint64_t request);

 private:
  struct Entry {
    bool done = false;
    std::string response;
  };
  struct Client {
    std::unordered_map<uint64_t, Entry> entries;
    std::deque<uint64_t> order;  // done requests, oldest first
    uint64_t last_use = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Client> clients_;
  uint64_t tick_ = 0;
};

// A counting limit that callers wait on (bytes of buffer memory, requests of a client).
class ByteBudget {
 public:
  explicit ByteBudget(uint64_t total) : free_(total) {}
  void acquire(uint64_t n);
  void release(uint64_t n);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t free_;
};

class ServerImpl;

struct Connection {
  int fd = -1;
  std::string peer;
  std::thread thread;
  std::atomic<bool> done{false};
  AlignedBuffer buffer;  // request data / read results, reused across requests
  std::string meta;
  uint8_t* shm = nullptr;  // a same-host client's shared segment (attach-shm), or null
  size_t shm_bytes = 0;
};

// A response ready to send: meta plus data ranges pointing into the connection's buffer.
struct Response {
  std::string meta;
  std::vector<iovec> data;
  uint64_t budget_bytes = 0;  // memory budget held by `data`, released once sent
  uint32_t flags = 0;         // wire::kFlagShm when the bytes were placed in shared memory
};

class ServerImpl final : public StorageServer {
 public:
  static Result<std::unique_ptr<ServerImpl>> create(ServerParams params);
  ~ServerImpl() override;
  uint16_t port() const override { return port_; }
  std::string address() const override { return address_; }
  void stop() override;
  ServerHealth health() const override;

 private:
  explicit ServerImpl(ServerParams params);
  Status open_targets();
  Status start_listening();
  void accept_loop();
  void maintenance_loop();
  void serve(Connection* c);
  // One request: reads its meta (and data), runs it, sends the response. An error return
  // closes the connection (the stream is out of sync or the peer is gone).
  Status handle_frame(Connection* c, const uint8_t* header_bytes, const wire::Header& h);
  Status send_response(Connection* c, const wire::Header& req, Response& resp);
  void acquire_client(uint64_t client);
  void release_client(uint64_t client);
  // The engine serving chain_id at chain_ver (0: any), or why not.
  Result<ChunkEngine*> route(uint32_t chain_id, uint32_t chain_ver);

  // Handlers (server_handlers.cpp); each fills resp or returns a stream-breaking error.
  Status handle_write(Connection* c, const wire::Header& h, Response& resp);
  Status handle_read(Connection* c, const wire::Header& h, Response& resp);
  Status handle_remove(Connection* c, const wire::Header& h, Response& resp);
  Status handle_stat(Connection* c, const wire::Header& h, Response& resp);
  Status handle_list(Connection* c, const wire::Header& h, Response& resp);
  Status handle_attach_shm(Connection* c, Response& resp);
  std::vector<TargetInfo> target_infos() const;

  ServerParams params_;
  std::vector<std::unique_ptr<ChunkEngine>> engines_;
  std::map<uint32_t, size_t> by_chain_;  // chain id -> engines_ index
  uint64_t server_id_ = 0;
  Timer uptime_;

  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: readable once stopping
  uint16_t port_ = 0;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;
  std::thread acceptor_;
  std::thread maintenance_;
  std::mutex maintenance_mu_;
  std::condition_variable maintenance_cv_;

  mutable std::mutex conns_mu_;
  std::list<std::unique_ptr<Connection>> conns_;

  std::mutex inflight_mu_;
  std::condition_variable inflight_cv_;
  std::unordered_map<uint64_t, int> inflight_;
  ByteBudget memory_;
  ReplayCache replay_;

  std::atomic<uint64_t> requests_{0}, replayed_{0}, inflight_waits_{0}, shm_requests_{0};
  std::atomic<uint32_t> inflight_max_seen_{0};
};

}  // namespace fathom::storage
