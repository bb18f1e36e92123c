// Wire protocol v1 codec: bounds-checked little-endian reader/writer and one encode/decode pair
// per message.
#include "storage/protocol.h"

#include <cstring>

#include "storage/crc32c.h"

namespace fathom::storage::wire {
namespace {

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  template <typename T>
  void num(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void str(std::string_view s, size_t max) {
    if (s.size() > max) s = s.substr(0, max);
    num<uint16_t>(static_cast<uint16_t>(s.size()));
    out_.append(s);
  }
  void status(const Status& s) {
    num<uint8_t>(wire_code(s.code()));
    str(s.message(), kMaxMessageBytes);
  }

 private:
  std::string& out_;
};

class Reader {
 public:
  Reader(std::string_view s, std::string_view what)
      : p_(s.data()), begin_(s.data()), end_(s.data() + s.size()), what_(what) {}
  template <typename T>
  T num() {
    T v{};
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) {
      fail("truncated");
      return v;
    }
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string str(size_t max) {
    const uint16_t n = num<uint16_t>();
    if (n > max) {
      fail(fmt::format("a string of {} bytes exceeds the {}-byte limit", n, max));
      return {};
    }
    if (static_cast<size_t>(end_ - p_) < n) {
      fail("truncated");
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  uint32_t count(uint32_t max) {
    const uint32_t n = num<uint32_t>();
    if (n > max) fail(fmt::format("{} items exceed the {}-item limit", n, max));
    return error_.ok() ? n : 0;
  }
  Status status() {
    const uint8_t code = num<uint8_t>();
    std::string msg = str(kMaxMessageBytes);
    if (!error_.ok()) return {};
    auto c = from_wire_code(code);
    if (!c.ok()) {
      fail(c.status().message());
      return {};
    }
    if (*c == StatusCode::kOk) return {};
    return Status(*c, std::move(msg));
  }
  void fail(std::string why) {
    if (error_.ok()) error_ = corrupt("{} message: {} at byte {}", what_, why, p_ - begin_);
  }
  bool ok() const { return error_.ok(); }
  // The error, or one for trailing bytes.
  Status finish() {
    if (error_.ok() && p_ != end_) fail(fmt::format("{} unexpected trailing bytes", end_ - p_));
    return error_;
  }

 private:
  const char* p_;
  const char* begin_;
  const char* end_;
  std::string_view what_;
  Status error_;
};

std::string ok_prefix() {
  std::string out;
  Writer w(out);
  w.status(Status());
  return out;
}

// Reads the response-level status; returns it when it is an error.
Status response_status(Reader& r) {
  Status s = r.status();
  if (!r.ok()) return r.finish();
  return s;
}

}  // namespace

std::string_view msg_name(uint16_t id) {
  switch (static_cast<MsgId>(id & ~kResponseBit)) {
    case MsgId::kHello:
      return "hello";
    case MsgId::kHealth:
      return "health";
    case MsgId::kWrite:
      return "write";
    case MsgId::kRead:
      return "read";
    case MsgId::kRemove:
      return "remove";
    case MsgId::kStat:
      return "stat";
    case MsgId::kList:
      return "list";
    case MsgId::kAttachShm:
      return "attach-shm";
  }
  return "unknown";
}

// The StatusCode numbering is part of the protocol: pin it.
static_assert(
    static_cast<int>(StatusCode::kOk) == 0 && static_cast<int>(StatusCode::kInvalidArgument) == 1 &&
    static_cast<int>(StatusCode::kNotFound) == 2 && static_cast<int>(StatusCode::kAlreadyExists) == 3 &&
    static_cast<int>(StatusCode::kOutOfRange) == 4 && static_cast<int>(StatusCode::kCorrupt) == 5 &&
    static_cast<int>(StatusCode::kIoError) == 6 && static_cast<int>(StatusCode::kUnimplemented) == 7 &&
    static_cast<int>(StatusCode::kResourceExhausted) == 8 && static_cast<int>(StatusCode::kTimeout) == 9 &&
    static_cast<int>(StatusCode::kUnavailable) == 10 &&
    static_cast<int>(StatusCode::kPermissionDenied) == 11 && static_cast<int>(StatusCode::kCancelled) == 12 &&
    static_cast<int>(StatusCode::kFailedPrecondition) == 13 && static_cast<int>(StatusCode::kInternal) == 14);

uint8_t wire_code(StatusCode code) {
  return static_cast<uint8_t>(code);
}

Result<StatusCode> from_wire_code(uint8_t code) {
  if (code > static_cast<uint8_t>(StatusCode::kInternal)) return corrupt("unknown status code {}", code);
  return static_cast<StatusCode>(code);
}

void encode_header(const Header& h, std::string_view meta, uint8_t out[kHeaderBytes]) {
  std::string s;
  Writer w(s);
  w.num<uint32_t>(kMagic);
  w.num<uint16_t>(h.version);
  w.num<uint16_t>(h.msg);
  w.num<uint64_t>(h.client_id);
  w.num<uint64_t>(h.request_id);
  w.num<uint32_t>(static_cast<uint32_t>(meta.size()));
  w.num<uint32_t>(h.flags);
  w.num<uint64_t>(h.data_bytes);
  const uint32_t crc = crc32c(meta.data(), meta.size(), crc32c(s.data(), s.size()));
  w.num<uint32_t>(crc);
  w.num<uint32_t>(0);
  std::memcpy(out, s.data(), kHeaderBytes);
}

Result<Header> decode_header(const uint8_t in[kHeaderBytes]) {
  Reader r(std::string_view(reinterpret_cast<const char*>(in), kHeaderBytes), "frame header");
  const uint32_t magic = r.num<uint32_t>();
  if (magic != kMagic) return corrupt("frame header: bad magic {:08x} (not a fathom storage peer?)", magic);
  Header h;
  h.version = r.num<uint16_t>();
  h.msg = r.num<uint16_t>();
  h.client_id = r.num<uint64_t>();
  h.request_id = r.num<uint64_t>();
  h.meta_bytes = r.num<uint32_t>();
  h.flags = r.num<uint32_t>();
  h.data_bytes = r.num<uint64_t>();
  h.meta_crc = r.num<uint32_t>();
  (void)r.num<uint32_t>();
  TRY(r.finish());
  if (h.version != kVersion) {
    return unimplemented("protocol version {} (this build speaks version {})", h.version, kVersion);
  }
  if (h.meta_bytes > kMaxMetaBytes)
    return out_of_range("meta section of {} bytes (limit {})", h.meta_bytes, kMaxMetaBytes);
  if (h.data_bytes > kMaxDataBytes)
    return out_of_range("data section of {} bytes (limit {})", h.data_bytes, kMaxDataBytes);
  return h;
}

Status verify_meta(const uint8_t header[kHeaderBytes], std::string_view meta, uint32_t expected_crc) {
  const uint32_t crc = crc32c(meta.data(), meta.size(), crc32c(header, 40));
  if (crc != expected_crc)
    return corrupt("frame checksum mismatch ({:08x}, header says {:08x})", crc, expected_crc);
  return {};
}

// ---- requests ----

std::string encode_hello_req(const HelloReq& r) {
  std::string out;
  Writer(out).str(r.client_name, 256);
  return out;
}

Result<HelloReq> decode_hello_req(std::string_view meta) {
  Reader r(meta, "hello");
  HelloReq h;
  h.client_name = r.str(256);
  TRY(r.finish());
  return h;
}

std::string encode_write_req(const std::vector<WriteReqItem>& items, bool shm) {
  std::string out;
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.num<uint32_t>(it.chain_id);
    w.num<uint32_t>(it.chain_ver);
    w.str(it.id, kMaxIdBytes);
    w.num<uint8_t>(it.mode);
    w.num<uint8_t>(it.flags);
    w.num<uint32_t>(it.ttl_s);
    w.num<uint32_t>(it.length);
    w.num<uint32_t>(it.crc32c);
    if (shm) w.num<uint64_t>(it.shm_offset);
  }
  return out;
}

Result<std::vector<WriteReqItem>> decode_write_req(std::string_view meta, uint64_t data_bytes, bool shm) {
  Reader r(meta, "write");
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<WriteReqItem> items(n);
  uint64_t total = 0;
  for (auto& it : items) {
    it.chain_id = r.num<uint32_t>();
    it.chain_ver = r.num<uint32_t>();
    it.id = r.str(kMaxIdBytes);
    it.mode = r.num<uint8_t>();
    it.flags = r.num<uint8_t>();
    it.ttl_s = r.num<uint32_t>();
    it.length = r.num<uint32_t>();
    it.crc32c = r.num<uint32_t>();
    if (shm) it.shm_offset = r.num<uint64_t>();
    if (it.mode > 1) r.fail(fmt::format("write mode {}", it.mode));
    total += it.length;
  }
  TRY(r.finish());
  if (shm && data_bytes != 0) return corrupt("write message: shared-memory items with a data section");
  if (!shm && total != data_bytes) {
    return corrupt("write message: items hold {} bytes but the data section has {}", total, data_bytes);
  }
  return items;
}

std::string encode_read_req(const std::vector<ReadReqItem>& items) {
  std::string out;
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.num<uint32_t>(it.chain_id);
    w.num<uint32_t>(it.chain_ver);
    w.str(it.id, kMaxIdBytes);
    w.num<uint32_t>(it.offset);
    w.num<uint32_t>(it.length);
    w.num<uint32_t>(it.lease_ms);
  }
  return out;
}

Result<std::vector<ReadReqItem>> decode_read_req(std::string_view meta) {
  Reader r(meta, "read");
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<ReadReqItem> items(n);
  for (auto& it : items) {
    it.chain_id = r.num<uint32_t>();
    it.chain_ver = r.num<uint32_t>();
    it.id = r.str(kMaxIdBytes);
    it.offset = r.num<uint32_t>();
    it.length = r.num<uint32_t>();
    it.lease_ms = r.num<uint32_t>();
  }
  TRY(r.finish());
  return items;
}

std::string encode_id_req(const std::vector<IdReqItem>& items, bool with_lease) {
  std::string out;
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.num<uint32_t>(it.chain_id);
    w.num<uint32_t>(it.chain_ver);
    w.str(it.id, kMaxIdBytes);
    if (with_lease) w.num<uint32_t>(it.lease_ms);
  }
  return out;
}

Result<std::vector<IdReqItem>> decode_id_req(std::string_view meta, bool with_lease) {
  Reader r(meta, with_lease ? "stat" : "remove");
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<IdReqItem> items(n);
  for (auto& it : items) {
    it.chain_id = r.num<uint32_t>();
    it.chain_ver = r.num<uint32_t>();
    it.id = r.str(kMaxIdBytes);
    if (with_lease) it.lease_ms = r.num<uint32_t>();
  }
  TRY(r.finish());
  return items;
}

std::string encode_list_req(const ListReq& q) {
  std::string out;
  Writer w(out);
  w.num<uint32_t>(q.chain_id);
  w.str(q.prefix, kMaxIdBytes);
  w.str(q.start_after, kMaxIdBytes);
  w.num<uint32_t>(q.limit);
  return out;
}

Result<ListReq> decode_list_req(std::string_view meta) {
  Reader r(meta, "list");
  ListReq q;
  q.chain_id = r.num<uint32_t>();
  q.prefix = r.str(kMaxIdBytes);
  q.start_after = r.str(kMaxIdBytes);
  q.limit = r.num<uint32_t>();
  TRY(r.finish());
  return q;
}

// ---- responses ----

std::string encode_error_resp(const Status& status) {
  std::string out;
  Writer(out).status(status.ok() ? internal_error("error response without an error") : status);
  return out;
}

namespace {

void write_target(Writer& w, const TargetInfo& t) {
  w.str(t.uuid, 64);
  w.num<uint32_t>(t.target_id);
  w.num<uint32_t>(t.chain_id);
  w.num<uint32_t>(t.chain_ver);
  w.num<uint64_t>(t.capacity_bytes);
  w.str(t.path, 4096);
}

TargetInfo read_target(Reader& r) {
  TargetInfo t;
  t.uuid = r.str(64);
  t.target_id = r.num<uint32_t>();
  t.chain_id = r.num<uint32_t>();
  t.chain_ver = r.num<uint32_t>();
  t.capacity_bytes = r.num<uint64_t>();
  t.path = r.str(4096);
  return t;
}

}  // namespace

std::string encode_hello_resp(const HelloResp& h) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint64_t>(h.server_id);
  w.num<uint32_t>(h.max_batch_items);
  w.num<uint64_t>(h.max_request_bytes);
  w.num<uint32_t>(static_cast<uint32_t>(h.targets.size()));
  for (const auto& t : h.targets) write_target(w, t);
  return out;
}

Result<HelloResp> decode_hello_resp(std::string_view meta) {
  Reader r(meta, "hello response");
  TRY(response_status(r));
  HelloResp h;
  h.server_id = r.num<uint64_t>();
  h.max_batch_items = r.num<uint32_t>();
  h.max_request_bytes = r.num<uint64_t>();
  const uint32_t n = r.count(kMaxBatchItems);
  for (uint32_t i = 0; i < n && r.ok(); ++i) h.targets.push_back(read_target(r));
  TRY(r.finish());
  return h;
}

std::string encode_health_resp(const ServerHealth& h) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint8_t>(h.ready ? 1 : 0);
  for (uint64_t v :
       {h.server_id, h.uptime_ms, h.cpu_user_us, h.cpu_system_us, uint64_t{h.connections}, h.requests,
        h.replayed_requests, uint64_t{h.inflight_max_seen}, h.inflight_waits, h.shm_requests}) {
    w.num<uint64_t>(v);
  }
  w.num<uint32_t>(static_cast<uint32_t>(h.targets.size()));
  for (const auto& t : h.targets) {
    write_target(w, t.info);
    w.str(t.io_backend, 64);
    w.num<uint8_t>(t.direct_io ? 1 : 0);
    for (uint64_t v : {t.chunks, t.live_bytes, t.used_slot_bytes, t.reserved_bytes, t.reads, t.read_bytes,
                       t.writes, t.write_bytes, t.removes, t.checksum_errors, t.evictions, t.expirations,
                       t.commits, t.quarantined_slots, t.orphan_bytes_reclaimed}) {
      w.num<uint64_t>(v);
    }
  }
  return out;
}

Result<ServerHealth> decode_health_resp(std::string_view meta) {
  Reader r(meta, "health response");
  TRY(response_status(r));
  ServerHealth h;
  h.ready = r.num<uint8_t>() != 0;
  h.server_id = r.num<uint64_t>();
  h.uptime_ms = r.num<uint64_t>();
  h.cpu_user_us = r.num<uint64_t>();
  h.cpu_system_us = r.num<uint64_t>();
  h.connections = static_cast<uint32_t>(r.num<uint64_t>());
  h.requests = r.num<uint64_t>();
  h.replayed_requests = r.num<uint64_t>();
  h.inflight_max_seen = static_cast<uint32_t>(r.num<uint64_t>());
  h.inflight_waits = r.num<uint64_t>();
  h.shm_requests = r.num<uint64_t>();
  const uint32_t n = r.count(kMaxBatchItems);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    TargetHealth t;
    t.info = read_target(r);
    t.io_backend = r.str(64);
    t.direct_io = r.num<uint8_t>() != 0;
    for (uint64_t* v :
         {&t.chunks, &t.live_bytes, &t.used_slot_bytes, &t.reserved_bytes, &t.reads, &t.read_bytes, &t.writes,
          &t.write_bytes, &t.removes, &t.checksum_errors, &t.evictions, &t.expirations, &t.commits,
          &t.quarantined_slots, &t.orphan_bytes_reclaimed}) {
      *v = r.num<uint64_t>();
    }
    h.targets.push_back(std::move(t));
  }
  TRY(r.finish());
  return h;
}

std::string encode_write_resp(const std::vector<WriteRespItem>& items) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.status(it.status);
    w.num<uint64_t>(it.version);
    w.num<uint8_t>((it.existed ? 1 : 0) | (it.duplicate ? 2 : 0));
  }
  return out;
}

Result<std::vector<WriteRespItem>> decode_write_resp(std::string_view meta) {
  Reader r(meta, "write response");
  TRY(response_status(r));
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<WriteRespItem> items(n);
  for (auto& it : items) {
    it.status = r.status();
    it.version = r.num<uint64_t>();
    const uint8_t f = r.num<uint8_t>();
    it.existed = f & 1;
    it.duplicate = f & 2;
  }
  TRY(r.finish());
  return items;
}

std::string encode_status_resp() {
  return ok_prefix();
}

Status decode_status_resp(std::string_view meta) {
  Reader r(meta, "response");
  TRY(response_status(r));
  return r.finish();
}

std::string encode_attach_shm_req(const AttachShmReq& q) {
  std::string out;
  Writer w(out);
  w.str(q.name, 255);
  w.num<uint64_t>(q.bytes);
  w.str(q.token, 64);
  return out;
}

Result<AttachShmReq> decode_attach_shm_req(std::string_view meta) {
  Reader r(meta, "attach-shm");
  AttachShmReq q;
  q.name = r.str(255);
  q.bytes = r.num<uint64_t>();
  q.token = r.str(64);
  TRY(r.finish());
  return q;
}

std::string encode_read_resp(const std::vector<ReadRespItem>& items, bool shm) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.status(it.status);
    w.num<uint64_t>(it.version);
    w.num<uint32_t>(it.chunk_length);
    w.num<uint32_t>(it.crc32c);
    w.num<uint32_t>(it.status.ok() ? it.data_length : 0);
    if (shm) w.num<uint64_t>(it.shm_offset);
  }
  return out;
}

Result<std::vector<ReadRespItem>> decode_read_resp(std::string_view meta, uint64_t data_bytes, bool shm) {
  Reader r(meta, "read response");
  TRY(response_status(r));
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<ReadRespItem> items(n);
  uint64_t total = 0;
  for (auto& it : items) {
    it.status = r.status();
    it.version = r.num<uint64_t>();
    it.chunk_length = r.num<uint32_t>();
    it.crc32c = r.num<uint32_t>();
    it.data_length = r.num<uint32_t>();
    if (shm) it.shm_offset = r.num<uint64_t>();
    if (it.data_length > it.chunk_length) r.fail("item returns more bytes than its chunk holds");
    total += it.data_length;
  }
  TRY(r.finish());
  if (shm && data_bytes != 0) return corrupt("read response: shared-memory items with a data section");
  if (!shm && total != data_bytes) {
    return corrupt("read response: items hold {} bytes but the data section has {}", total, data_bytes);
  }
  return items;
}

std::string encode_remove_resp(const std::vector<RemoveRespItem>& items) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.status(it.status);
    w.num<uint8_t>(it.existed ? 1 : 0);
  }
  return out;
}

Result<std::vector<RemoveRespItem>> decode_remove_resp(std::string_view meta) {
  Reader r(meta, "remove response");
  TRY(response_status(r));
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<RemoveRespItem> items(n);
  for (auto& it : items) {
    it.status = r.status();
    it.existed = r.num<uint8_t>() != 0;
  }
  TRY(r.finish());
  return items;
}

std::string encode_stat_resp(const std::vector<StatRespItem>& items) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(items.size()));
  for (const auto& it : items) {
    w.status(it.status);
    w.num<uint64_t>(it.version);
    w.num<uint32_t>(it.length);
    w.num<uint32_t>(it.crc32c);
    w.num<uint32_t>(it.chain_ver);
    w.num<uint8_t>(it.flags);
    w.num<int64_t>(it.created_ms);
    w.num<int64_t>(it.expire_ms);
  }
  return out;
}

Result<std::vector<StatRespItem>> decode_stat_resp(std::string_view meta) {
  Reader r(meta, "stat response");
  TRY(response_status(r));
  const uint32_t n = r.count(kMaxBatchItems);
  std::vector<StatRespItem> items(n);
  for (auto& it : items) {
    it.status = r.status();
    it.version = r.num<uint64_t>();
    it.length = r.num<uint32_t>();
    it.crc32c = r.num<uint32_t>();
    it.chain_ver = r.num<uint32_t>();
    it.flags = r.num<uint8_t>();
    it.created_ms = r.num<int64_t>();
    it.expire_ms = r.num<int64_t>();
  }
  TRY(r.finish());
  return items;
}

std::string encode_list_resp(const ListResp& l) {
  std::string out = ok_prefix();
  Writer w(out);
  w.num<uint32_t>(static_cast<uint32_t>(l.items.size()));
  for (const auto& it : l.items) {
    w.str(it.id, kMaxIdBytes);
    w.num<uint32_t>(it.length);
    w.num<uint64_t>(it.version);
    w.num<uint8_t>(it.flags);
    w.num<int64_t>(it.created_ms);
    w.num<int64_t>(it.expire_ms);
  }
  w.num<uint8_t>(l.more ? 1 : 0);
  return out;
}

Result<ListResp> decode_list_resp(std::string_view meta) {
  Reader r(meta, "list response");
  TRY(response_status(r));
  const uint32_t n = r.count(kMaxBatchItems);
  ListResp l;
  l.items.resize(n);
  for (auto& it : l.items) {
    it.id = r.str(kMaxIdBytes);
    it.length = r.num<uint32_t>();
    it.version = r.num<uint64_t>();
    it.flags = r.num<uint8_t>();
    it.created_ms = r.num<int64_t>();
    it.expire_ms = r.num<int64_t>();
  }
  l.more = r.num<uint8_t>() != 0;
  TRY(r.finish());
  return l;
}

}  // namespace fathom::storage::wire
