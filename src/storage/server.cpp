// StorageServer: opens the targets, accepts connections (a thread each: requests on a connection
// run one at a time, in order), bounds what each client and the whole server hold at once,
// runs TTL/eviction maintenance, and shuts down gracefully.
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "base/fs.h"
#include "base/log.h"
#include "storage/net.h"
#include "storage/server_impl.h"

namespace fathom::storage {

// ---- ReplayCache ----

std::optional<std::string> ReplayCache::begin(uint64_t client, uint64_t request) {
  if (client == 0) return std::nullopt;
  std::unique_lock lock(mu_);
  for (;;) {
    Client& c = clients_[client];
    c.last_use = ++tick_;
    auto it = c.entries.find(request);
    if (it == c.entries.end()) {
      c.entries.emplace(request, Entry{});
      return std::nullopt;
    }
    if (it->second.done) return it->second.response;
    cv_.wait(lock);  // the original is still running
  }
}

void ReplayCache::finish(uint64_t client, uint64_t request, std::string response_meta) {
  if (client == 0) return;
  std::lock_guard lock(mu_);
  Client& c = clients_[client];
  Entry& e = c.entries[request];
  e.done = true;
  e.response = std::move(response_meta);
  c.order.push_back(request);
  while (c.order.size() > kPerClient) {
    c.entries.erase(c.order.front());
    c.order.pop_front();
  }
  if (clients_.size() > kClients) {
    auto oldest = clients_.end();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      bool busy = false;
      for (auto& [id, entry] : it->second.entries) busy |= !entry.done;
      if (!busy && (oldest == clients_.end() || it->second.last_use < oldest->second.last_use)) oldest = it;
    }
    if (oldest != clients_.end()) clients_.erase(oldest);
  }
  cv_.notify_all();
}

void ReplayCache::abandon(uint64_t client, uint64_t request) {
  if (client == 0) return;
  std::lock_guard lock(mu_);
  auto c = clients_.find(client);
  if (c != clients_.end()) c->second.entries.erase(request);
  cv_.notify_all();
}

// ---- ByteBudget ----

void ByteBudget::acquire(uint64_t n) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return free_ >= n; });
  free_ -= n;
}

void ByteBudget::release(uint64_t n) {
  std::lock_guard lock(mu_);
  free_ += n;
  cv_.notify_all();
}

// ---- lifecycle ----

Result<std::unique_ptr<StorageServer>> StorageServer::start(ServerParams params) {
  auto s = TRY(ServerImpl::create(std::move(params)));
  return std::unique_ptr<StorageServer>(std::move(s));
}

ServerImpl::ServerImpl(ServerParams params) : params_(std::move(params)), memory_(params_.memory_bytes) {}

Result<std::unique_ptr<ServerImpl>> ServerImpl::create(ServerParams params) {
  if (params.targets.empty()) return invalid_argument("storage server: no --target given");
  if (params.max_request_bytes > params.memory_bytes) {
    return invalid_argument("storage server: max request bytes {} exceed the memory budget {}",
                            params.max_request_bytes, params.memory_bytes);
  }
  if (params.max_request_bytes > wire::kMaxDataBytes || params.max_request_bytes < kMaxChunkBytes) {
    return invalid_argument("storage server: max request bytes must be within [{}, {}]", kMaxChunkBytes,
                            wire::kMaxDataBytes);
  }
  if (params.max_inflight_per_client < 1 || params.max_connections < 1) {
    return invalid_argument("storage server: limits must be at least 1");
  }
  std::unique_ptr<ServerImpl> s(new ServerImpl(std::move(params)));
  s->server_id_ = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  TRY(s->open_targets());
  TRY(s->start_listening());
  s->acceptor_ = std::thread([p = s.get()] { p->accept_loop(); });
  s->maintenance_ = std::thread([p = s.get()] { p->maintenance_loop(); });
  return s;
}

Status ServerImpl::open_targets() {
  const IoBackend io = TRY(parse_io_backend(params_.io));
  std::set<std::string> dirs;
  for (TargetParams& t : params_.targets) {
    std::error_code ec;
    const auto abs = std::filesystem::absolute(t.dir, ec);
    if (!ec) t.dir = abs.lexically_normal().string();  // clients see (and fio uses) absolute paths
    if (!dirs.insert(t.dir).second) return invalid_argument("target '{}' given twice", t.dir);
  }
  // Existing targets keep their ids; new ones take the lowest free id (chain id = target id).
  std::vector<size_t> fresh;
  std::set<uint32_t> used;
  engines_.resize(params_.targets.size());
  auto open_one = [&](size_t i, uint32_t id) -> Status {
    const TargetParams& t = params_.targets[i];
    EngineParams ep{.dir = t.dir,
                    .target_id = id,
                    .chain_id = id,
                    .capacity_bytes = t.capacity_bytes,
                    .io = io,
                    .direct = params_.direct_io,
                    .faults = params_.faults,
                    .group_bytes = params_.group_bytes,
                    .keep_empty_bytes = params_.keep_empty_bytes,
                    .evict_high_water = params_.evict_high_water,
                    .evict_low_water = params_.evict_low_water};
    engines_[i] = TRY(ChunkEngine::open(std::move(ep)));
    return {};
  };
  for (size_t i = 0; i < params_.targets.size(); ++i) {
    if (!path_exists(params_.targets[i].dir + "/meta/CURRENT")) {
      fresh.push_back(i);
      continue;
    }
    TRY(open_one(i, 0));
    for (size_t k = 0; k < i; ++k) {
      if (engines_[k] && engines_[k]->uuid() == engines_[i]->uuid()) {
        return failed_precondition("targets '{}' and '{}' are the same target (uuid {}): a copied directory?",
                                   params_.targets[k].dir, params_.targets[i].dir, engines_[i]->uuid());
      }
    }
    if (!used.insert(engines_[i]->chain_id()).second) {
      return failed_precondition("target '{}' has chain id {} like another target (a copied directory?)",
                                 params_.targets[i].dir, engines_[i]->chain_id());
    }
  }
  for (size_t i : fresh) {
    uint32_t id = 0;
    while (used.count(id)) ++id;
    used.insert(id);
    TRY(open_one(i, id));
  }
  for (size_t i = 0; i < engines_.size(); ++i) {
    by_chain_[engines_[i]->chain_id()] = i;
    const EngineStats st = engines_[i]->stats();
    log_info("storage target {} '{}': {} chunks, {} live bytes, io {}{}", engines_[i]->target_id(),
             engines_[i]->dir(), st.chunks, st.live_bytes, io_backend_name(engines_[i]->io_backend()),
             engines_[i]->direct_io() ? " + O_DIRECT" : " (buffered)");
  }
  return {};
}

Status ServerImpl::start_listening() {
  const net::HostPort where = TRY(net::parse_host_port(params_.listen));
  listen_fd_ = TRY(net::listen_tcp(where, 128, &port_));
  address_ = fmt::format(
      "{}:{}", where.host.find(':') != std::string::npos ? "[" + where.host + "]" : where.host, port_);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return errno_status(errno, "eventfd");
  return {};
}

ServerImpl::~ServerImpl() {
  stop();
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void ServerImpl::stop() {
  std::call_once(stop_once_, [&] {
    stopping_ = true;
    const uint64_t one = 1;
    if (stop_fd_ >= 0) (void)!::write(stop_fd_, &one, sizeof(one));
    if (acceptor_.joinable()) acceptor_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    // Connections finish the request they are in and close; idle ones close at once.
    std::list<std::unique_ptr<Connection>> conns;
    {
      std::lock_guard lock(conns_mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) {
      if (c->thread.joinable()) c->thread.join();
    }
    {
      std::lock_guard lock(maintenance_mu_);
      maintenance_cv_.notify_all();
    }
    if (maintenance_.joinable()) maintenance_.join();
    engines_.clear();  // closes RocksDB; every acknowledged write was already synced
    log_info("storage server {} stopped", address_);
  });
}

void ServerImpl::accept_loop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log_error("storage server: poll: {}", std::strerror(errno));
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {  // reap finished connections
      if ((*it)->done) {
        (*it)->thread.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<int>(conns_.size()) >= params_.max_connections) {
      log_warn("storage server: connection refused, {} open (--max-connections)", conns_.size());
      ::close(fd);
      continue;
    }
    (void)net::configure(fd, params_.io_timeout_ms);
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    char host[256] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
    c->peer = fmt::format("client {}", host);
    Connection* raw = c.get();
    conns_.push_back(std::move(c));
    raw->thread = std::thread([this, raw] { serve(raw); });
  }
}

void ServerImpl::maintenance_loop() {
  std::unique_lock lock(maintenance_mu_);
  while (!stopping_) {
    maintenance_cv_.wait_for(lock, std::chrono::milliseconds(params_.maintenance_interval_ms));
    if (stopping_) break;
    lock.unlock();
    for (auto& e : engines_) {
      if (Status s = e->maintain(); !s.ok())
        log_warn("storage target {}: maintenance: {}", e->target_id(), s.to_string());
    }
    lock.lock();
  }
}

// ---- connections ----

void ServerImpl::serve(Connection* c) {
  for (;;) {
    pollfd p[2] = {{c->fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
      if (p[1].revents != 0) break;  // idle and stopping
      continue;
    }
    uint8_t header[wire::kHeaderBytes];
    Status s = net::recv_exact(c->fd, header, sizeof(header), c->peer);
    if (!s.ok()) {
      if (s.code() != StatusCode::kUnavailable) log_debug("storage server: {}", s.to_string());
      break;
    }
    auto h = wire::decode_header(header);
    if (!h.ok()) {
      log_warn("storage server: {}: {}; closing", c->peer, h.status().to_string());
      break;
    }
    s = handle_frame(c, header, *h);
    if (!s.ok()) {
      log_debug("storage server: {}: {}; closing", c->peer, s.to_string());
      break;
    }
    if (c->buffer.size() > (64u << 20)) c->buffer = AlignedBuffer();  // do not hoard after a big request
    if (stopping_) break;
  }
  ::shutdown(c->fd, SHUT_RDWR);
  ::close(c->fd);
  if (c->shm != nullptr) ::munmap(c->shm, c->shm_bytes);
  c->done = true;
}

Status ServerImpl::handle_frame(Connection* c, const uint8_t* header_bytes, const wire::Header& h) {
  c->meta.resize(h.meta_bytes);
  TRY(net::recv_exact(c->fd, c->meta.data(), h.meta_bytes, c->peer));
  TRY(wire::verify_meta(header_bytes, c->meta, h.meta_crc));
  requests_.fetch_add(1, std::memory_order_relaxed);
  Response resp;
  const auto msg = static_cast<wire::MsgId>(h.msg);
  if (h.data_bytes > params_.max_request_bytes) {
    resp.meta = wire::encode_error_resp(resource_exhausted(
        "request carries {} data bytes; this server takes at most {} per request (split the batch)",
        h.data_bytes, params_.max_request_bytes));
    TRY(send_response(c, h, resp));
    return out_of_range("oversized request");  // its data cannot be consumed: drop the connection
  }
  if (h.data_bytes > 0 && msg != wire::MsgId::kWrite) {
    return corrupt("{} request with a data section", wire::msg_name(h.msg));
  }
  if ((h.flags & ~wire::kFlagShm) != 0 ||
      ((h.flags & wire::kFlagShm) &&
       (c->shm == nullptr || (msg != wire::MsgId::kWrite && msg != wire::MsgId::kRead)))) {
    return corrupt("{} request with flags {:x} (shared memory needs attach-shm first)", wire::msg_name(h.msg),
                   h.flags);
  }
  acquire_client(h.client_id);
  Status s;
  switch (msg) {
    case wire::MsgId::kHello: {
      auto req = wire::decode_hello_req(c->meta);
      wire::HelloResp r{.server_id = server_id_,
                        .max_batch_items = wire::kMaxBatchItems,
                        .max_request_bytes = params_.max_request_bytes,
                        .targets = target_infos()};
      resp.meta = req.ok() ? wire::encode_hello_resp(r) : wire::encode_error_resp(req.status());
      break;
    }
    case wire::MsgId::kHealth:
      resp.meta = wire::encode_health_resp(health());
      break;
    case wire::MsgId::kWrite:
      s = handle_write(c, h, resp);
      break;
    case wire::MsgId::kRead:
      s = handle_read(c, h, resp);
      break;
    case wire::MsgId::kRemove:
      s = handle_remove(c, h, resp);
      break;
    case wire::MsgId::kStat:
      s = handle_stat(c, h, resp);
      break;
    case wire::MsgId::kList:
      s = handle_list(c, h, resp);
      break;
    case wire::MsgId::kAttachShm:
      s = handle_attach_shm(c, resp);
      break;
    default:
      resp.meta = wire::encode_error_resp(
          unimplemented("message id {} (protocol version {})", h.msg, wire::kVersion));
  }
  if (s.ok()) s = send_response(c, h, resp);
  release_client(h.client_id);
  if (resp.budget_bytes > 0) memory_.release(resp.budget_bytes);
  return s;
}

Status ServerImpl::send_response(Connection* c, const wire::Header& req, Response& resp) {
  wire::Header h{.msg = static_cast<uint16_t>(req.msg | wire::kResponseBit),
                 .client_id = req.client_id,
                 .request_id = req.request_id,
                 .flags = resp.flags,
                 .data_bytes = 0};
  for (const iovec& v : resp.data) h.data_bytes += v.iov_len;
  uint8_t header[wire::kHeaderBytes];
  wire::encode_header(h, resp.meta, header);
  std::vector<iovec> iov;
  iov.reserve(resp.data.size() + 2);
  iov.push_back(iovec{header, sizeof(header)});
  iov.push_back(iovec{resp.meta.data(), resp.meta.size()});
  iov.insert(iov.end(), resp.data.begin(), resp.data.end());
  return net::send_all(c->fd, iov, c->peer);
}

void ServerImpl::acquire_client(uint64_t client) {
  std::unique_lock lock(inflight_mu_);
  int& n = inflight_[client];
  if (n >= params_.max_inflight_per_client) {
    inflight_waits_.fetch_add(1, std::memory_order_relaxed);
    inflight_cv_.wait(lock, [&] { return inflight_[client] < params_.max_inflight_per_client; });
  }
  const int now = ++inflight_[client];
  uint32_t seen = inflight_max_seen_.load();
  while (static_cast<uint32_t>(now) > seen && !inflight_max_seen_.compare_exchange_weak(seen, now)) {
  }
}

void ServerImpl::release_client(uint64_t client) {
  std::lock_guard lock(inflight_mu_);
  if (--inflight_[client] == 0) inflight_.erase(client);
  inflight_cv_.notify_all();
}

Result<ChunkEngine*> ServerImpl::route(uint32_t chain_id, uint32_t chain_ver) {
  auto it = by_chain_.find(chain_id);
  if (it == by_chain_.end()) return not_found("chain {} is not served by {}", chain_id, address_);
  if (chain_ver != 0 && chain_ver != 1) {
    return failed_precondition(
        "chain {} is at version 1, the request was routed with version {} (refresh the chain table)",
        chain_id, chain_ver);
  }
  return engines_[it->second].get();
}

std::vector<TargetInfo> ServerImpl::target_infos() const {
  std::vector<TargetInfo> out;
  for (const auto& e : engines_) {
    out.push_back(TargetInfo{.uuid = e->uuid(),
                             .target_id = e->target_id(),
                             .chain_id = e->chain_id(),
                             .chain_ver = 1,
                             .capacity_bytes = e->stats().capacity_bytes,
                             .path = e->dir()});
  }
  std::sort(out.begin(), out.end(),
            [](const TargetInfo& a, const TargetInfo& b) { return a.chain_id < b.chain_id; });
  return out;
}

ServerHealth ServerImpl::health() const {
  ServerHealth h;
  h.ready = !stopping_;
  h.server_id = server_id_;
  h.uptime_ms = static_cast<uint64_t>(uptime_.elapsed_ms());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  h.cpu_user_us = static_cast<uint64_t>(ru.ru_utime.tv_sec) * 1000000 + ru.ru_utime.tv_usec;
  h.cpu_system_us = static_cast<uint64_t>(ru.ru_stime.tv_sec) * 1000000 + ru.ru_stime.tv_usec;
  {
    std::lock_guard lock(conns_mu_);
    for (const auto& c : conns_) h.connections += c->done ? 0 : 1;
  }
  h.requests = requests_.load();
  h.replayed_requests = replayed_.load();
  h.inflight_max_seen = inflight_max_seen_.load();
  h.inflight_waits = inflight_waits_.load();
  h.shm_requests = shm_requests_.load();
  for (const TargetInfo& info : target_infos()) {
    const ChunkEngine& e = *engines_[by_chain_.at(info.chain_id)];
    const EngineStats st = e.stats();
    TargetHealth t;
    t.info = info;
    t.io_backend = std::string(io_backend_name(e.io_backend()));
    t.direct_io = e.direct_io();
    t.chunks = st.chunks;
    t.live_bytes = st.live_bytes;
    t.used_slot_bytes = st.used_slot_bytes;
    t.reserved_bytes = st.reserved_bytes;
    t.reads = st.reads;
    t.read_bytes = st.read_bytes;
    t.writes = st.writes;
    t.write_bytes = st.write_bytes;
    t.removes = st.removes;
    t.checksum_errors = st.checksum_errors;
    t.evictions = st.evictions;
    t.expirations = st.expirations;
    t.commits = st.commits;
    t.quarantined_slots = st.quarantined_slots;
    t.orphan_bytes_reclaimed = st.orphan_bytes_reclaimed;
    h.targets.push_back(std::move(t));
  }
  return h;
}

}  // namespace fathom::storage
