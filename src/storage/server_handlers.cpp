// StorageServer request handlers: write (idempotent, data received straight into aligned
// buffers), read (pinned, CRC-verified, sent from the read buffers without a copy), remove,
// stat, list. Items name their chain; each target gets its items as one engine batch.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <cstring>
#include <map>

#include "base/check.h"
#include "storage/crc32c.h"
#include "storage/net.h"
#include "storage/server_impl.h"

namespace fathom::storage {
namespace {

// Items of one request grouped by the engine that serves them, in request order.
template <typename Item>
std::map<ChunkEngine*, std::vector<size_t>> group_by_engine(
    const std::vector<Item>& items, std::vector<Status>& status,
    const std::function<Result<ChunkEngine*>(const Item&)>& route) {
  std::map<ChunkEngine*, std::vector<size_t>> groups;
  for (size_t i = 0; i < items.size(); ++i) {
    auto e = route(items[i]);
    if (!e.ok()) {
      status[i] = e.status();
      continue;
    }
    groups[*e].push_back(i);
  }
  return groups;
}

}  // namespace

Status ServerImpl::handle_write(Connection* c, const wire::Header& h, Response& resp) {
  const bool shm = (h.flags & wire::kFlagShm) != 0;
  auto items = wire::decode_write_req(c->meta, h.data_bytes, shm);
  for (size_t i = 0; shm && items.ok() && i < items->size(); ++i) {
    const auto& it = (*items)[i];
    if (it.shm_offset % kIoAlign != 0 || it.shm_offset > c->shm_bytes ||
        align_up(it.length) > c->shm_bytes - it.shm_offset) {
      items =
          invalid_argument("item {} at shared-memory offset {} (+{} bytes) is outside the {}-byte segment", i,
                           it.shm_offset, it.length, c->shm_bytes);
    }
  }
  if (!items.ok()) {
    TRY(net::discard(c->fd, h.data_bytes, c->peer));
    resp.meta = wire::encode_error_resp(items.status());
    return {};
  }
  if (auto cached = replay_.begin(h.client_id, h.request_id)) {
    TRY(net::discard(c->fd, h.data_bytes, c->peer));
    replayed_.fetch_add(1, std::memory_order_relaxed);
    resp.meta = std::move(*cached);
    return {};
  }
  // Each item's data lands 4096-aligned and zero padded, ready for O_DIRECT (in shared memory the
  // client put it so).
  std::vector<uint8_t*> at(items->size());
  uint64_t total = 0;
  for (size_t i = 0; !shm && i < items->size(); ++i) total += align_up((*items)[i].length);
  memory_.acquire(total);
  Status s = c->buffer.reserve(total);
  for (size_t i = 0, off = 0; s.ok() && i < items->size(); ++i) {
    const uint32_t len = (*items)[i].length;
    if (shm) {
      at[i] = c->shm + (*items)[i].shm_offset;
      continue;
    }
    at[i] = c->buffer.data() + off;
    off += align_up(len);
    s = net::recv_exact(c->fd, at[i], len, c->peer);
    if (s.ok()) std::memset(at[i] + len, 0, align_up(len) - len);
  }
  if (shm) shm_requests_.fetch_add(1, std::memory_order_relaxed);
  if (!s.ok()) {  // the client went away mid-request: nothing was reserved on disk
    memory_.release(total);
    replay_.abandon(h.client_id, h.request_id);
    return s;
  }
  std::vector<Status> route_status(items->size());
  std::vector<wire::WriteRespItem> out(items->size());
  auto groups = group_by_engine<wire::WriteReqItem>(
      *items, route_status, [&](const wire::WriteReqItem& it) { return route(it.chain_id, it.chain_ver); });
  for (auto& [engine, idx] : groups) {
    std::vector<WriteItem> batch;
    for (size_t i : idx) {
      const auto& it = (*items)[i];
      batch.push_back(WriteItem{.id = it.id,
                                .data = at[i],
                                .length = it.length,
                                .data_padded = true,
                                .mode = static_cast<WriteMode>(it.mode),
                                .flags = static_cast<uint8_t>(it.flags & kChunkEvictable),
                                .ttl_s = it.ttl_s,
                                .chain_ver = it.chain_ver,
                                .expected_crc = it.crc32c});
    }
    std::vector<WriteResult> results(batch.size());
    engine->write_batch(batch, WriteTag{h.client_id, h.request_id}, results);
    for (size_t k = 0; k < idx.size(); ++k) {
      out[idx[k]] = wire::WriteRespItem{results[k].status, results[k].version, results[k].existed,
                                        results[k].duplicate};
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!route_status[i].ok()) out[i].status = route_status[i];
  }
  memory_.release(total);
  resp.meta = wire::encode_write_resp(out);
  replay_.finish(h.client_id, h.request_id, resp.meta);
  return {};
}

Status ServerImpl::handle_read(Connection* c, const wire::Header& h, Response& resp) {
  auto items = wire::decode_read_req(c->meta);
  if (!items.ok()) {
    resp.meta = wire::encode_error_resp(items.status());
    return {};
  }
  const size_t n = items->size();
  std::vector<Status> route_status(n);
  std::vector<ReadPin> pins(n);
  std::vector<ChunkEngine*> engine_of(n, nullptr);
  auto groups = group_by_engine<wire::ReadReqItem>(
      *items, route_status, [&](const wire::ReadReqItem& it) { return route(it.chain_id, it.chain_ver); });
  std::vector<std::vector<ReadPin>> group_pins;
  for (auto& [engine, idx] : groups) {
    std::vector<ReadItem> batch;
    for (size_t i : idx) {
      const auto& it = (*items)[i];
      batch.push_back(
          ReadItem{.id = it.id, .offset = it.offset, .length = it.length, .lease_ms = it.lease_ms});
    }
    std::vector<ReadPin> p(batch.size());
    engine->pin(batch, p);
    for (size_t k = 0; k < idx.size(); ++k) {
      pins[idx[k]] = p[k];
      engine_of[idx[k]] = engine;
    }
  }
  // Space per pinned chunk, in request order: the client's shared segment when it asked for it and
  // everything fits there, else the connection buffer up to the response limit.
  uint64_t all = 0;
  for (size_t i = 0; i < n; ++i) all += pins[i].status.ok() ? align_up(pins[i].meta.length) : 0;
  const bool shm = (h.flags & wire::kFlagShm) != 0 && all <= c->shm_bytes;
  const uint64_t limit = shm ? c->shm_bytes : params_.max_request_bytes;
  std::vector<uint64_t> at(n, 0);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!pins[i].status.ok()) continue;
    const uint64_t need = align_up(pins[i].meta.length);
    if (total + need > limit) {
      pins[i].status =
          resource_exhausted("read batch exceeds the {}-byte response limit (split the batch)", limit);
      continue;
    }
    at[i] = total;
    total += need;
  }
  Status s;
  uint8_t* base = c->shm;
  if (!shm) {
    memory_.acquire(total);
    resp.budget_bytes = total;
    s = c->buffer.reserve(total);
    base = c->buffer.data();
  }
  for (auto& [engine, idx] : groups) {
    std::vector<ReadPin> p;
    std::vector<uint8_t*> bufs;
    for (size_t i : idx) {
      if (!s.ok() && pins[i].status.ok()) pins[i].status = s;
      p.push_back(pins[i]);
      bufs.push_back(base + at[i]);
    }
    engine->read_pinned(p, bufs);
    engine->unpin(p);
    for (size_t k = 0; k < idx.size(); ++k) pins[idx[k]].status = p[k].status;
    // p carried the pins; the copies in `pins` are no longer pinned.
    for (size_t i : idx) pins[i].pinned = false;
  }
  std::vector<wire::ReadRespItem> out(n);
  for (size_t i = 0; i < n; ++i) {
    wire::ReadRespItem& r = out[i];
    r.status = route_status[i].ok() ? pins[i].status : route_status[i];
    if (!r.status.ok()) continue;
    const ReadPin& p = pins[i];
    r.version = p.meta.version;
    r.chunk_length = p.meta.length;
    r.data_length = p.length;
    const uint8_t* data = base + at[i] + p.offset;
    r.crc32c = (p.offset == 0 && p.length == p.meta.length) ? p.meta.crc32c : crc32c(data, p.length);
    r.shm_offset = at[i] + p.offset;
    if (p.length > 0 && !shm) resp.data.push_back(iovec{const_cast<uint8_t*>(data), p.length});
  }
  resp.meta = wire::encode_read_resp(out, shm);
  if (shm) shm_requests_.fetch_add(1, std::memory_order_relaxed);
  resp.flags = shm ? wire::kFlagShm : 0;
  return {};
}

Status ServerImpl::handle_remove(Connection* c, const wire::Header& h, Response& resp) {
  auto items = wire::decode_id_req(c->meta, false);
  if (!items.ok()) {
    resp.meta = wire::encode_error_resp(items.status());
    return {};
  }
  if (auto cached = replay_.begin(h.client_id, h.request_id)) {
    replayed_.fetch_add(1, std::memory_order_relaxed);
    resp.meta = std::move(*cached);
    return {};
  }
  std::vector<Status> route_status(items->size());
  std::vector<wire::RemoveRespItem> out(items->size());
  auto groups = group_by_engine<wire::IdReqItem>(
      *items, route_status, [&](const wire::IdReqItem& it) { return route(it.chain_id, it.chain_ver); });
  for (auto& [engine, idx] : groups) {
    std::vector<std::string_view> ids;
    for (size_t i : idx) ids.push_back((*items)[i].id);
    std::unique_ptr<bool[]> existed(new bool[ids.size()]());
    Status s = engine->remove_batch(ids, std::span(existed.get(), ids.size()));
    for (size_t k = 0; k < idx.size(); ++k) out[idx[k]] = wire::RemoveRespItem{s, existed[k]};
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!route_status[i].ok()) out[i].status = route_status[i];
  }
  resp.meta = wire::encode_remove_resp(out);
  replay_.finish(h.client_id, h.request_id, resp.meta);
  return {};
}

Status ServerImpl::handle_stat(Connection* c, const wire::Header& /*h*/, Response& resp) {
  auto items = wire::decode_id_req(c->meta, true);
  if (!items.ok()) {
    resp.meta = wire::encode_error_resp(items.status());
    return {};
  }
  std::vector<wire::StatRespItem> out(items->size());
  for (size_t i = 0; i < items->size(); ++i) {
    const auto& it = (*items)[i];
    auto engine = route(it.chain_id, it.chain_ver);
    if (!engine.ok()) {
      out[i].status = engine.status();
      continue;
    }
    auto m = (*engine)->stat(it.id, it.lease_ms);
    if (!m.ok()) {
      out[i].status = m.status();
      continue;
    }
    out[i] = wire::StatRespItem{.version = m->version,
                                .length = m->length,
                                .crc32c = m->crc32c,
                                .chain_ver = m->chain_ver,
                                .flags = m->flags,
                                .created_ms = m->created_ms,
                                .expire_ms = m->expire_ms};
  }
  resp.meta = wire::encode_stat_resp(out);
  return {};
}

Status ServerImpl::handle_list(Connection* c, const wire::Header& /*h*/, Response& resp) {
  auto req = wire::decode_list_req(c->meta);
  if (!req.ok()) {
    resp.meta = wire::encode_error_resp(req.status());
    return {};
  }
  auto engine = route(req->chain_id, 0);
  if (!engine.ok()) {
    resp.meta = wire::encode_error_resp(engine.status());
    return {};
  }
  const uint32_t limit = std::min<uint32_t>(req->limit == 0 ? 1000 : req->limit, wire::kMaxBatchItems);
  auto listed = (*engine)->list(req->prefix, req->start_after, limit);
  if (!listed.ok()) {
    resp.meta = wire::encode_error_resp(listed.status());
    return {};
  }
  wire::ListResp out;
  out.more = listed->size() == limit;
  for (const ChunkInfo& ci : *listed) {
    out.items.push_back(wire::ListRespItem{.id = ci.id,
                                           .length = ci.meta.length,
                                           .version = ci.meta.version,
                                           .flags = ci.meta.flags,
                                           .created_ms = ci.meta.created_ms,
                                           .expire_ms = ci.meta.expire_ms});
  }
  resp.meta = wire::encode_list_resp(out);
  return {};
}

}  // namespace fathom::storage

namespace fathom::storage {

// A same-host client offers a POSIX shared-memory segment for this connection's chunk bytes:
// reads land there straight from the disk (O_DIRECT into the shared pages) and writes go to disk
// straight from it, so no byte crosses the socket. The segment must start with the token the
// client sent, which a different host's /dev/shm cannot.
Status ServerImpl::handle_attach_shm(Connection* c, Response& resp) {
  auto req = wire::decode_attach_shm_req(c->meta);
  Status s = req.status();
  if (s.ok() && (req->name.rfind(wire::kShmPrefix, 0) != 0 || req->name.find('/', 1) != std::string::npos)) {
    s = invalid_argument("shared memory name '{}' (expected {}...)", req->name, wire::kShmPrefix);
  }
  if (s.ok() && (req->bytes == 0 || req->bytes % kIoAlign != 0 || req->bytes > wire::kMaxShmBytes ||
                 req->token.size() != 16)) {
    s = invalid_argument("shared memory segment of {} bytes / token of {} bytes", req->bytes,
                         req->token.size());
  }
  uint8_t* map = nullptr;
  if (s.ok()) {
    const int fd = ::shm_open(req->name.c_str(), O_RDWR | O_CLOEXEC, 0);
    struct stat st {};
    if (fd < 0) {
      s = failed_precondition("shared memory '{}' is not visible here ({}): not the same host", req->name,
                              std::strerror(errno));
    } else if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < req->bytes) {
      s = failed_precondition("shared memory '{}' is smaller than {} bytes", req->name, req->bytes);
    } else {
      void* p = ::mmap(nullptr, req->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        s = errno_status(errno, fmt::format("mmap shared memory '{}'", req->name));
      } else {
        map = static_cast<uint8_t*>(p);
      }
    }
    if (fd >= 0) ::close(fd);
  }
  if (map != nullptr && std::memcmp(map, req->token.data(), 16) != 0) {
    ::munmap(map, req->bytes);
    map = nullptr;
    s = failed_precondition("shared memory '{}' holds another token: not the same host", req->name);
  }
  if (map != nullptr) {
    if (c->shm != nullptr) ::munmap(c->shm, c->shm_bytes);
    c->shm = map;
    c->shm_bytes = req->bytes;
  }
  resp.meta = s.ok() ? wire::encode_status_resp() : wire::encode_error_resp(s);
  return {};
}

}  // namespace fathom::storage
