// StorageServer request handlers: write (idempotent, data received straight into aligned
// buffers), read (pinned, CRC-verified, sent from the read buffers without a copy), remove,
// stat, list. Items name their chain; each target gets its items as one engine batch.
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
std::map<ChunkEngine*, std::vector<size_t>> group_by_engine(const std::vector<Item>& items,
                                                             std::vector<Status>& status,
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
  auto items = wire::decode_write_req(c->meta, h.data_bytes);
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
  // Each item's data lands 4096-aligned and zero padded, ready for O_DIRECT.
  std::vector<uint64_t> at(items->size());
  uint64_t total = 0;
  for (size_t i = 0; i < items->size(); ++i) {
    at[i] = total;
    total += align_up((*items)[i].length);
  }
  memory_.acquire(total);
  Status s = c->buffer.reserve(total);
  for (size_t i = 0; s.ok() && i < items->size(); ++i) {
    uint8_t* p = c->buffer.data() + at[i];
    const uint32_t len = (*items)[i].length;
    s = net::recv_exact(c->fd, p, len, c->peer);
    std::memset(p + len, 0, align_up(len) - len);
  }
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
                                .data = c->buffer.data() + at[i],
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
      out[idx[k]] = wire::WriteRespItem{results[k].status, results[k].version, results[k].existed, results[k].duplicate};
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

Status ServerImpl::handle_read(Connection* c, const wire::Header& /*h*/, Response& resp) {
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
      batch.push_back(ReadItem{.id = it.id, .offset = it.offset, .length = it.length, .lease_ms = it.lease_ms});
    }
    std::vector<ReadPin> p(batch.size());
    engine->pin(batch, p);
    for (size_t k = 0; k < idx.size(); ++k) {
      pins[idx[k]] = p[k];
      engine_of[idx[k]] = engine;
    }
  }
  // Buffer space per pinned chunk, in request order, up to the response limit.
  std::vector<uint64_t> at(n, 0);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!pins[i].status.ok()) continue;
    const uint64_t need = align_up(pins[i].meta.length);
    if (total + need > params_.max_request_bytes) {
      pins[i].status = resource_exhausted("read batch exceeds the {}-byte response limit (split the batch)",
                                          params_.max_request_bytes);
      continue;
    }
    at[i] = total;
    total += need;
  }
  memory_.acquire(total);
  resp.budget_bytes = total;
  Status s = c->buffer.reserve(total);
  for (auto& [engine, idx] : groups) {
    std::vector<ReadPin> p;
    std::vector<uint8_t*> bufs;
    for (size_t i : idx) {
      if (!s.ok() && pins[i].status.ok()) pins[i].status = s;
      p.push_back(pins[i]);
      bufs.push_back(c->buffer.data() + at[i]);
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
    const uint8_t* data = c->buffer.data() + at[i] + p.offset;
    r.crc32c = (p.offset == 0 && p.length == p.meta.length) ? p.meta.crc32c : crc32c(data, p.length);
    if (p.length > 0) resp.data.push_back(iovec{const_cast<uint8_t*>(data), p.length});
  }
  resp.meta = wire::encode_read_resp(out);
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
