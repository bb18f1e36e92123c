// StorageClient batched operations: each splits its items per server and limit (plan), sends the
// requests concurrently and maps the per-item answers back. Reads land in the caller's buffers
// and are CRC32C-checked against what the server read from disk.
#include <algorithm>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "storage/chunk_engine.h"
#include "storage/client_impl.h"
#include "storage/crc32c.h"
#include "storage/ids.h"

namespace fathom::storage {
void ClientImpl::write(std::span<const ChunkWrite> items, std::span<ChunkWriteResult> results) {
  CHECK(items.size() == results.size());
  std::vector<size_t> tgt(items.size());
  std::vector<bool> ok(items.size(), true);
  for (size_t i = 0; i < items.size(); ++i) {
    results[i] = ChunkWriteResult{};
    auto t = target_for(items[i].id, items[i].target);
    Status s = t.status();
    if (s.ok() && items[i].data.size() > kMaxChunkBytes) {
      s = invalid_argument("chunk '{}' of {} bytes is larger than the {}-byte limit",
                           printable_id(items[i].id), items[i].data.size(), kMaxChunkBytes);
    }
    if (!s.ok()) {
      results[i].status = s;
      ok[i] = false;
      continue;
    }
    tgt[i] = *t;
  }
  const Plan requests = plan(tgt, ok, [&](size_t i) { return items[i].data.size(); });
  run_all(requests.size(), [&](size_t r) {
    const auto& server = requests[r].first;
    const auto& idx = requests[r].second;
    std::vector<wire::WriteReqItem> req;
    Call c{.msg = static_cast<uint16_t>(wire::MsgId::kWrite), .request_id = next_request()};
    for (size_t i : idx) {
      const ChunkWrite& w = items[i];
      const TargetInfo& t = targets_[tgt[i]];
      req.push_back(wire::WriteReqItem{.chain_id = t.chain_id,
                                       .chain_ver = t.chain_ver,
                                       .id = std::string(w.id),
                                       .mode = static_cast<uint8_t>(w.mode),
                                       .flags = static_cast<uint8_t>(w.evictable ? 1 : 0),
                                       .ttl_s = w.ttl_s,
                                       .length = static_cast<uint32_t>(w.data.size())});
    }
    // Through the connection's shared segment when the batch fits there, else in the data section;
    // each item's CRC32C is taken as it is copied into the segment.
    c.build = [&](Call& call, const Conn& conn) {
      uint64_t total = 0;
      for (size_t i : idx) total += align_up(items[i].data.size());
      call.data.clear();
      const bool shm = conn.shm != nullptr && total <= conn.shm_bytes;
      uint64_t off = 0;
      for (size_t k = 0; k < idx.size(); ++k) {
        const std::span<const uint8_t> d = items[idx[k]].data;
        if (!shm) {
          req[k].crc32c = crc32c(d.data(), d.size());
          if (!d.empty()) call.data.push_back(iovec{const_cast<uint8_t*>(d.data()), d.size()});
          continue;
        }
        req[k].shm_offset = off;
        req[k].crc32c = crc32c_copy(conn.shm + off, d.data(), d.size());  // checksum what is sent
        std::memset(conn.shm + off + d.size(), 0, align_up(d.size()) - d.size());
        off += align_up(d.size());
      }
      call.meta = wire::encode_write_req(req, shm);
      call.flags = shm ? wire::kFlagShm : 0;
    };
    auto meta = call(server, c, nullptr);
    Result<std::vector<wire::WriteRespItem>> resp =
        meta.ok() ? wire::decode_write_resp(*meta) : meta.status();
    if (resp.ok() && resp->size() != idx.size()) {
      resp = corrupt("write response has {} items for {}", resp->size(), idx.size());
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      ChunkWriteResult& out = results[idx[k]];
      if (!resp.ok()) {
        out.status = resp.status();
        continue;
      }
      out.status = (*resp)[k].status;
      out.version = (*resp)[k].version;
      out.existed = (*resp)[k].existed;
    }
  });
}

namespace {

// One read request's answer: where each item's bytes go (the caller's buffer, a result vector,
// or scratch for an item whose buffer is too small), then the client-side CRC32C check.
struct ReadCall {
  std::span<const ChunkRead> items;
  std::span<ChunkReadResult> results;
  const std::vector<size_t>& idx;
  std::vector<wire::ReadRespItem> got;
  std::vector<std::vector<uint8_t>> scratch;
  std::vector<uint8_t*> where;
  std::vector<std::optional<uint32_t>> copied_crc;  // shared-memory reads: checksummed while copied
  bool verify;

  ReadCall(std::span<const ChunkRead> i, std::span<ChunkReadResult> r, const std::vector<size_t>& x, bool v)
      : items(i), results(r), idx(x), scratch(x.size()), where(x.size(), nullptr), copied_crc(x.size()), verify(v) {}

  Result<std::vector<iovec>> place(const wire::Header& h, std::string_view meta, const Conn& conn) {
    const bool shm = (h.flags & wire::kFlagShm) != 0;
    got = TRY(wire::decode_read_resp(meta, h.data_bytes, shm));
    if (got.size() != idx.size()) return corrupt("read response has {} items for {}", got.size(), idx.size());
    std::vector<iovec> dest;
    for (size_t k = 0; k < idx.size(); ++k) {
      const ChunkRead& in = items[idx[k]];
      ChunkReadResult& out = results[idx[k]];
      out = ChunkReadResult{.status = got[k].status,
                            .version = got[k].version,
                            .length = got[k].data_length,
                            .chunk_length = got[k].chunk_length};
      const uint32_t len = got[k].data_length;
      if (!got[k].status.ok() || len == 0) continue;
      if (shm && (got[k].shm_offset > conn.shm_bytes || len > conn.shm_bytes - got[k].shm_offset)) {
        return corrupt("read response places {} bytes at {} outside the {}-byte shared segment", len,
                       got[k].shm_offset, conn.shm_bytes);
      }
      if (!in.dest.empty() && in.dest.size() < len) {
        out.status = out_of_range("chunk '{}': {} bytes do not fit the {}-byte buffer", printable_id(in.id),
                                  len, in.dest.size());
        if (!shm) {
          scratch[k].resize(len);
          dest.push_back(iovec{scratch[k].data(), len});
        }
        continue;
      }
      if (in.dest.empty()) out.data.resize(len);
      where[k] = in.dest.empty() ? out.data.data() : in.dest.data();
      if (shm && verify) {
        copied_crc[k] = crc32c_copy(where[k], conn.shm + got[k].shm_offset, len);
      } else if (shm) {
        std::memcpy(where[k], conn.shm + got[k].shm_offset, len);
      } else {
        dest.push_back(iovec{where[k], len});
      }
    }
    return dest;
  }

  void finish(const Status& call_status) {
    for (size_t k = 0; k < idx.size(); ++k) {
      ChunkReadResult& out = results[idx[k]];
      if (!call_status.ok()) {
        out = ChunkReadResult{.status = call_status};
        continue;
      }
      if (!out.status.ok() || where[k] == nullptr || !verify) continue;
      const uint32_t crc = copied_crc[k] ? *copied_crc[k] : crc32c(where[k], out.length);
      if (crc != got[k].crc32c) {
        out.status = corrupt(
            "chunk '{}': CRC32C {:08x} of the received bytes, the server read {:08x} (corrupted "
            "in transit)",
            printable_id(items[idx[k]].id), crc, got[k].crc32c);
      }
    }
  }
};

}  // namespace

void ClientImpl::read(std::span<const ChunkRead> items, std::span<ChunkReadResult> results) {
  CHECK(items.size() == results.size());
  std::vector<size_t> tgt(items.size());
  std::vector<bool> ok(items.size(), true);
  for (size_t i = 0; i < items.size(); ++i) {
    results[i] = ChunkReadResult{};
    auto t = target_for(items[i].id, items[i].target);
    if (!t.ok()) {
      results[i].status = t.status();
      ok[i] = false;
      continue;
    }
    tgt[i] = *t;
  }
  // Responses are sized by what is read: budget by the destination size where known.
  const Plan requests = plan(tgt, ok, [&](size_t i) {
    return items[i].dest.empty() ? uint64_t{1} << 20 : static_cast<uint64_t>(items[i].dest.size());
  });
  run_all(requests.size(), [&](size_t r) {
    const auto& server = requests[r].first;
    const auto& idx = requests[r].second;
    std::vector<wire::ReadReqItem> req;
    for (size_t i : idx) {
      const TargetInfo& t = targets_[tgt[i]];
      req.push_back(wire::ReadReqItem{.chain_id = t.chain_id,
                                      .chain_ver = t.chain_ver,
                                      .id = std::string(items[i].id),
                                      .offset = items[i].offset,
                                      .length = items[i].length,
                                      .lease_ms = items[i].lease_ms});
    }
    Call c{.msg = static_cast<uint16_t>(wire::MsgId::kRead),
           .request_id = next_request(),
           .meta = wire::encode_read_req(req)};
    c.build = [](Call& call, const Conn& conn) { call.flags = conn.shm != nullptr ? wire::kFlagShm : 0; };
    ReadCall rc(items, results, idx, params_.verify_checksums);
    auto meta = call(server, c, [&](const wire::Header& h, std::string_view m, const Conn& conn) {
      return rc.place(h, m, conn);
    });
    rc.finish(meta.status());
  });
}

void ClientImpl::stat(std::span<const std::string_view> ids, std::span<ChunkStat> results, uint32_t lease_ms,
                      std::span<const size_t> targets) {
  CHECK(ids.size() == results.size());
  CHECK(targets.empty() || targets.size() == ids.size());
  std::vector<size_t> tgt(ids.size());
  std::vector<bool> ok(ids.size(), true);
  for (size_t i = 0; i < ids.size(); ++i) {
    results[i] = ChunkStat{};
    auto t = target_for(ids[i], targets.empty() ? std::nullopt : std::optional<size_t>(targets[i]));
    if (!t.ok()) {
      results[i].status = t.status();
      ok[i] = false;
      continue;
    }
    tgt[i] = *t;
  }
  const Plan requests = plan(tgt, ok, [](size_t) { return uint64_t{0}; });
  run_all(requests.size(), [&](size_t r) {
    const auto& server = requests[r].first;
    const auto& idx = requests[r].second;
    std::vector<wire::IdReqItem> req;
    for (size_t i : idx) {
      const TargetInfo& t = targets_[tgt[i]];
      req.push_back(wire::IdReqItem{t.chain_id, t.chain_ver, std::string(ids[i]), lease_ms});
    }
    Call c{.msg = static_cast<uint16_t>(wire::MsgId::kStat),
           .request_id = next_request(),
           .meta = wire::encode_id_req(req, true)};
    auto meta = call(server, c, nullptr);
    Result<std::vector<wire::StatRespItem>> resp = meta.ok() ? wire::decode_stat_resp(*meta) : meta.status();
    if (resp.ok() && resp->size() != idx.size())
      resp = corrupt("stat response has {} items for {}", resp->size(), idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
      ChunkStat& out = results[idx[k]];
      if (!resp.ok()) {
        out.status = resp.status();
        continue;
      }
      const auto& s = (*resp)[k];
      out = ChunkStat{.status = s.status,
                      .version = s.version,
                      .length = s.length,
                      .crc32c = s.crc32c,
                      .evictable = (s.flags & 1) != 0,
                      .created_ms = s.created_ms,
                      .expire_ms = s.expire_ms};
    }
  });
}

Status ClientImpl::remove(std::span<const std::string_view> ids, std::span<bool> existed,
                          std::span<const size_t> targets) {
  CHECK(ids.size() == existed.size());
  CHECK(targets.empty() || targets.size() == ids.size());
  std::vector<size_t> tgt(ids.size());
  std::vector<bool> ok(ids.size(), true);
  for (size_t i = 0; i < ids.size(); ++i) {
    existed[i] = false;
    tgt[i] = TRY(target_for(ids[i], targets.empty() ? std::nullopt : std::optional<size_t>(targets[i])));
  }
  const Plan requests = plan(tgt, ok, [](size_t) { return uint64_t{0}; });
  std::vector<Status> errors(requests.size());
  run_all(requests.size(), [&](size_t r) {
    const auto& server = requests[r].first;
    const auto& idx = requests[r].second;
    std::vector<wire::IdReqItem> req;
    for (size_t i : idx) {
      const TargetInfo& t = targets_[tgt[i]];
      req.push_back(wire::IdReqItem{t.chain_id, t.chain_ver, std::string(ids[i]), 0});
    }
    Call c{.msg = static_cast<uint16_t>(wire::MsgId::kRemove),
           .request_id = next_request(),
           .meta = wire::encode_id_req(req, false)};
    auto meta = call(server, c, nullptr);
    Result<std::vector<wire::RemoveRespItem>> resp =
        meta.ok() ? wire::decode_remove_resp(*meta) : meta.status();
    if (resp.ok() && resp->size() != idx.size())
      resp = corrupt("remove response has {} items for {}", resp->size(), idx.size());
    if (!resp.ok()) {
      errors[r] = resp.status();
      return;
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      existed[idx[k]] = (*resp)[k].existed;
      if (!(*resp)[k].status.ok() && errors[r].ok()) errors[r] = (*resp)[k].status;
    }
  });
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  return {};
}

Result<std::vector<ChunkListing>> ClientImpl::list(size_t target, std::string_view prefix,
                                                   std::string_view start_after, uint32_t limit, bool* more) {
  if (target >= targets_.size())
    return out_of_range("target {} (the chain table has {})", target, targets_.size());
  const TargetInfo& t = targets_[target];
  Call c{.msg = static_cast<uint16_t>(wire::MsgId::kList),
         .request_id = next_request(),
         .meta = wire::encode_list_req(
             wire::ListReq{t.chain_id, std::string(prefix), std::string(start_after), limit})};
  const std::string meta = TRY(call(target_server_[target], c, nullptr));
  const wire::ListResp resp = TRY(wire::decode_list_resp(meta));
  if (more != nullptr) *more = resp.more;
  std::vector<ChunkListing> out;
  for (const auto& it : resp.items) out.push_back(ChunkListing{it.id, it.length, it.version, it.created_ms});
  return out;
}

Result<ServerHealth> ClientImpl::health(size_t server) {
  if (server >= servers_.size()) return out_of_range("server {} (connected to {})", server, servers_.size());
  Call c{.msg = static_cast<uint16_t>(wire::MsgId::kHealth), .request_id = next_request()};
  const std::string meta = TRY(call(server, c, nullptr));
  auto h = wire::decode_health_resp(meta);
  if (!h.ok()) return h.status();
  for (TargetHealth& t : h->targets) t.info.server = servers_[server]->name;
  return h;
}

}  // namespace fathom::storage
