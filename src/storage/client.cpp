// StorageClient core: a pool of connections per server, the chain table learned at connect time
// (hello), placement by jump consistent hash of XXH3, request planning, and calls retried with
// the same request id after a broken connection (the server answers a retried write from its
// idempotency table instead of applying it twice).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "base/log.h"
#include "storage/client_impl.h"
#include "storage/io.h"

namespace fathom::storage {
namespace {

// Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm": adding a target moves
// only 1/n of the keys.
uint32_t jump_hash(uint64_t key, uint32_t buckets) {
  int64_t b = -1, j = 0;
  while (j < static_cast<int64_t>(buckets)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(int64_t{1} << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<uint32_t>(b);
}

bool transport_error(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimeout ||
         s.code() == StatusCode::kIoError;
}

}  // namespace

Result<std::unique_ptr<StorageClient>> StorageClient::connect(ClientParams params) {
  auto c = std::make_unique<ClientImpl>(std::move(params));
  TRY(c->init());
  return std::unique_ptr<StorageClient>(std::move(c));
}

ClientImpl::~ClientImpl() {
  for (auto& s : servers_) {
    for (Conn& c : s->idle) close_conn(c);
  }
}

size_t ClientImpl::place(std::string_view id) const {
  return jump_hash(XXH3_64bits(id.data(), id.size()), static_cast<uint32_t>(targets_.size()));
}

Status ClientImpl::init() {
  if (params_.servers.empty()) return invalid_argument("storage client: no server given");
  client_id_ = params_.client_id;
  while (client_id_ == 0) client_id_ = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  // Request ids start at a random point, so a restarted process reusing a configured client id
  // never collides with the idempotency records of its previous life.
  next_request_ = ((uint64_t{std::random_device{}()} << 32 | std::random_device{}()) >> 1) + 1;
  std::vector<std::pair<TargetInfo, size_t>> all;
  for (const std::string& addr : params_.servers) {
    auto s = std::make_unique<ServerConn>();
    s->where = TRY(net::parse_host_port(addr));
    s->name = addr;
    servers_.push_back(std::move(s));
    Call c{.msg = static_cast<uint16_t>(wire::MsgId::kHello),
           .request_id = next_request(),
           .meta = wire::encode_hello_req(wire::HelloReq{"fathom"})};
    const std::string meta = TRY(call(servers_.size() - 1, c, nullptr));
    auto hello = wire::decode_hello_resp(meta);
    if (!hello.ok()) return hello.status().with_context(fmt::format("hello to {}", addr));
    servers_.back()->max_request_bytes = hello->max_request_bytes;
    servers_.back()->max_batch_items = hello->max_batch_items;
    if (hello->targets.empty()) return failed_precondition("storage server {} serves no target", addr);
    for (TargetInfo t : hello->targets) {
      t.server = addr;
      all.emplace_back(t, servers_.size() - 1);
    }
  }
  // The table is ordered by target uuid, so every client reaching the same targets places every
  // key alike, whatever the servers' addresses or the order they were named in.
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first.uuid < b.first.uuid; });
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].first.uuid == all[i - 1].first.uuid) {
      return invalid_argument("target {} is reached through both {} and {} (a server named twice?)",
                              all[i].first.uuid, all[i - 1].first.server, all[i].first.server);
    }
  }
  for (const auto& [info, server] : all) {
    targets_.push_back(info);
    target_server_.push_back(server);
  }
  return {};
}

Result<Conn> ClientImpl::take_connection(ServerConn& s) {
  {
    std::lock_guard lock(s.mu);
    if (!s.idle.empty()) {
      const Conn c = s.idle.back();
      s.idle.pop_back();
      return c;
    }
  }
  Conn c;
  c.fd = TRY(net::connect_tcp(s.where, params_.connect_timeout_ms));
  if (Status st = net::configure(c.fd, params_.io_timeout_ms); !st.ok()) {
    close_conn(c);
    return st;
  }
  if (params_.shm_bytes > 0 && !s.shm_refused) attach_shm(s, c);
  return c;
}

void ClientImpl::close_conn(Conn& c) {
  if (c.fd >= 0) ::close(c.fd);
  if (c.shm != nullptr) ::munmap(c.shm, c.shm_bytes);
  c = Conn{};
}

void ClientImpl::give_back(ServerConn& s, Conn c) {
  std::lock_guard lock(s.mu);
  if (static_cast<int>(s.idle.size()) < params_.idle_connections) {
    s.idle.push_back(c);
  } else {
    close_conn(c);
  }
}

// Creates a segment, writes a random token at its start and asks the server to map it by name;
// the name is unlinked as soon as the server answered (both sides keep their mappings), so a
// crash leaves nothing in /dev/shm past that moment.
void ClientImpl::attach_shm(ServerConn& s, Conn& conn) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const std::string name = fmt::format("{}{}-{}-{:08x}", wire::kShmPrefix, ::getpid(), counter.fetch_add(1),
                                       static_cast<uint32_t>(rd()));
  const size_t bytes = align_up(params_.shm_bytes);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return;
  }
  std::string token(16, '\0');
  for (size_t i = 0; i < token.size(); i += 4) {
    const uint32_t v = rd();
    std::memcpy(token.data() + i, &v, 4);
  }
  std::memcpy(p, token.data(), token.size());
  Call c{.msg = static_cast<uint16_t>(wire::MsgId::kAttachShm),
         .request_id = next_request(),
         .meta = wire::encode_attach_shm_req(wire::AttachShmReq{name, bytes, token})};
  auto meta = call_once(s, conn, c, nullptr);
  ::shm_unlink(name.c_str());
  Status st = meta.ok() ? wire::decode_status_resp(*meta) : meta.status();
  if (st.ok()) {
    conn.shm = static_cast<uint8_t*>(p);
    conn.shm_bytes = bytes;
    return;
  }
  ::munmap(p, bytes);
  if (st.code() == StatusCode::kFailedPrecondition) s.shm_refused = true;  // another host
  log_debug("storage client: {}: no shared memory ({})", s.name, st.to_string());
}

uint64_t ClientImpl::request_limit(const ServerConn& s) const {
  if (params_.shm_bytes == 0 || s.shm_refused) return s.max_request_bytes;
  return std::min<uint64_t>(s.max_request_bytes, align_up(params_.shm_bytes));
}

Result<std::string> ClientImpl::call_once(ServerConn& s, const Conn& conn, Call& c, const DataSink& sink) {
  if (c.build) c.build(c, conn);
  wire::Header h{.msg = c.msg, .client_id = client_id_, .request_id = c.request_id, .flags = c.flags};
  for (const iovec& v : c.data) h.data_bytes += v.iov_len;
  uint8_t header[wire::kHeaderBytes];
  wire::encode_header(h, c.meta, header);
  std::vector<iovec> iov;
  iov.reserve(c.data.size() + 2);
  iov.push_back(iovec{header, sizeof(header)});
  iov.push_back(iovec{c.meta.data(), c.meta.size()});
  iov.insert(iov.end(), c.data.begin(), c.data.end());
  TRY(net::send_all(conn.fd, iov, s.name));
  uint8_t rh[wire::kHeaderBytes];
  TRY(net::recv_exact(conn.fd, rh, sizeof(rh), s.name));
  const wire::Header resp = TRY(wire::decode_header(rh));
  if (resp.msg != (c.msg | wire::kResponseBit) || resp.request_id != c.request_id) {
    return corrupt("{}: got a {} response to request {} (sent {} request {})", s.name,
                   wire::msg_name(resp.msg), resp.request_id, wire::msg_name(c.msg), c.request_id);
  }
  if ((resp.flags & wire::kFlagShm) && conn.shm == nullptr) {
    return corrupt("{}: a shared-memory response on a connection without shared memory", s.name);
  }
  std::string meta(resp.meta_bytes, '\0');
  TRY(net::recv_exact(conn.fd, meta.data(), meta.size(), s.name));
  TRY(wire::verify_meta(rh, meta, resp.meta_crc));
  if (resp.data_bytes > 0 && !sink) {
    return corrupt("{}: unexpected data in a {} response", s.name, wire::msg_name(resp.msg));
  }
  if (sink) {
    std::vector<iovec> dest = TRY(sink(resp, meta, conn));
    for (const iovec& v : dest) TRY(net::recv_exact(conn.fd, v.iov_base, v.iov_len, s.name));
  }
  return meta;
}

Result<std::string> ClientImpl::call(size_t server, Call& c, const DataSink& sink) {
  ServerConn& s = *servers_[server];
  Status last;
  for (int attempt = 0; attempt <= params_.retries; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10 << std::min(attempt, 6)));
    auto conn = take_connection(s);
    if (!conn.ok()) {
      last = conn.status();
      if (!transport_error(last)) return last;
      continue;
    }
    auto meta = call_once(s, *conn, c, sink);
    if (meta.ok()) {
      give_back(s, *conn);
      return meta;
    }
    close_conn(*conn);
    last = meta.status();
    if (!transport_error(last)) return last;
    log_debug("storage client: {} (attempt {}); resending request {}", last.to_string(), attempt + 1,
              c.request_id);
  }
  return last.with_context(fmt::format("{} attempts", params_.retries + 1));
}

Plan ClientImpl::plan(const std::vector<size_t>& target_of, const std::vector<bool>& ok,
                      const std::function<uint64_t(size_t)>& bytes_of) const {
  std::vector<std::vector<size_t>> by_server(servers_.size());
  for (size_t i = 0; i < target_of.size(); ++i) {
    if (ok[i]) by_server[target_server_[target_of[i]]].push_back(i);
  }
  Plan out;
  for (size_t s = 0; s < by_server.size(); ++s) {
    const ServerConn& sc = *servers_[s];
    uint64_t limit = request_limit(sc);
    if (params_.request_split_bytes > 0) limit = std::min(limit, params_.request_split_bytes);
    std::vector<size_t> cur;
    uint64_t bytes = 0;
    for (size_t i : by_server[s]) {
      const uint64_t b = bytes_of(i);
      if (!cur.empty() && (bytes + b > limit || cur.size() >= sc.max_batch_items)) {
        out.emplace_back(s, std::move(cur));
        cur.clear();
        bytes = 0;
      }
      cur.push_back(i);
      bytes += b;
    }
    if (!cur.empty()) out.emplace_back(s, std::move(cur));
  }
  return out;
}

void ClientImpl::run_all(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  // At most kMaxParallelRequests at once (threads and connections): a 64-page batch split into
  // 2 MiB requests takes 8 connections, not 64 freshly opened ones.
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(n, kMaxParallelRequests); ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
}

Result<size_t> ClientImpl::target_for(std::string_view id, std::optional<size_t> named) const {
  if (id.empty() || id.size() > wire::kMaxIdBytes) {
    return invalid_argument("chunk id of {} bytes (expected 1..{})", id.size(), wire::kMaxIdBytes);
  }
  if (!named) return place(id);
  if (*named >= targets_.size()) {
    return out_of_range("target {} for '{}' (the chain table has {} targets)", *named, id, targets_.size());
  }
  return *named;
}

}  // namespace fathom::storage
