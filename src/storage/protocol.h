// The storage wire protocol, version 1 (docs/storage.md "Wire protocol"). A frame is a 48-byte
// header, a meta section (the encoded message) and a data section (chunk bytes, concatenated in
// item order). Every integer is little-endian; strings and ids are a u16 length and the bytes.
// The header carries a CRC32C over itself and the meta section; chunk data carries its own
// CRC32C per item in the meta section. Message ids are stable: new messages get new ids, and a
// changed encoding gets a new protocol version.
//
// This file is the codec only (no sockets): encode/decode functions for each message, with every
// length and count checked against the limits below before anything is allocated, so a hostile
// frame yields a Status, never a crash or an over-read. Internal to storage/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "storage/storage.h"

namespace fathom::storage::wire {

inline constexpr uint32_t kMagic = 0x52545346;  // bytes "FSTR"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 48;
inline constexpr uint32_t kMaxMetaBytes = 8u << 20;
inline constexpr uint64_t kMaxDataBytes = 1ull << 31;
inline constexpr uint32_t kMaxBatchItems = 4096;
inline constexpr uint32_t kMaxIdBytes = 1024;
inline constexpr uint32_t kMaxMessageBytes = 4096;  // error messages are truncated to this
inline constexpr uint16_t kResponseBit = 0x8000;

enum class MsgId : uint16_t {
  kHello = 1,
  kHealth = 2,
  kWrite = 3,
  kRead = 4,
  kRemove = 5,
  kStat = 6,
  kList = 7,
  kAttachShm = 8,
};
// Header flag: the request's (write) or response's (read) chunk bytes are in the connection's
// shared-memory segment at the offsets carried per item, not in the data section.
inline constexpr uint32_t kFlagShm = 1;
inline constexpr uint64_t kMaxShmBytes = 1ull << 30;
inline constexpr char kShmPrefix[] = "/fathom-shm-";
std::string_view msg_name(uint16_t id);

struct Header {
  uint16_t version = kVersion;
  uint16_t msg = 0;  // MsgId, | kResponseBit in responses
  uint64_t client_id = 0;
  uint64_t request_id = 0;
  uint32_t meta_bytes = 0;
  uint32_t flags = 0;  // reserved, 0
  uint64_t data_bytes = 0;
  uint32_t meta_crc = 0;  // CRC32C of header bytes [0, 40) then the meta section
};

// Writes the 48 header bytes, computing meta_crc over them and `meta`.
void encode_header(const Header& h, std::string_view meta, uint8_t out[kHeaderBytes]);
// Checks magic, version and limits; meta_crc is checked by verify_meta once the meta is read.
Result<Header> decode_header(const uint8_t in[kHeaderBytes]);
Status verify_meta(const uint8_t header[kHeaderBytes], std::string_view meta, uint32_t expected_crc);

// Status on the wire: u8 code (the StatusCode numbering, fixed by docs/storage.md) + message.
uint8_t wire_code(StatusCode code);
Result<StatusCode> from_wire_code(uint8_t code);

// ---- requests ----
struct HelloReq {
  std::string client_name;
};
struct WriteReqItem {
  uint32_t chain_id = 0, chain_ver = 0;
  std::string id;
  uint8_t mode = 0, flags = 0;  // ChunkMode; bit 0: evictable
  uint32_t ttl_s = 0, length = 0, crc32c = 0;
  uint64_t shm_offset = 0;  // with kFlagShm: where the bytes are (4096-aligned, zero padded)
};
struct ReadReqItem {
  uint32_t chain_id = 0, chain_ver = 0;
  std::string id;
  uint32_t offset = 0, length = UINT32_MAX, lease_ms = 0;
};
struct IdReqItem {  // remove and stat
  uint32_t chain_id = 0, chain_ver = 0;
  std::string id;
  uint32_t lease_ms = 0;  // stat only
};
// Same-host clients hand the server a POSIX shared-memory segment for a connection's data.
struct AttachShmReq {
  std::string name;  // shm_open name, starting with kShmPrefix
  uint64_t bytes = 0;
  std::string token;  // 16 bytes the segment starts with: proof that both ends see the same one
};
struct ListReq {
  uint32_t chain_id = 0;
  std::string prefix, start_after;
  uint32_t limit = 0;
};

std::string encode_hello_req(const HelloReq& r);
std::string encode_write_req(const std::vector<WriteReqItem>& items, bool shm = false);
std::string encode_attach_shm_req(const AttachShmReq& r);
Result<AttachShmReq> decode_attach_shm_req(std::string_view meta);
std::string encode_read_req(const std::vector<ReadReqItem>& items);
std::string encode_id_req(const std::vector<IdReqItem>& items, bool with_lease);
std::string encode_list_req(const ListReq& r);
Result<HelloReq> decode_hello_req(std::string_view meta);
// data_bytes: the frame's data section, which must equal the sum of the item lengths (or be 0
// with shm, where each item carries its shm_offset).
Result<std::vector<WriteReqItem>> decode_write_req(std::string_view meta, uint64_t data_bytes,
                                                   bool shm = false);
Result<std::vector<ReadReqItem>> decode_read_req(std::string_view meta);
Result<std::vector<IdReqItem>> decode_id_req(std::string_view meta, bool with_lease);
Result<ListReq> decode_list_req(std::string_view meta);

// ---- responses: meta = status, then (if ok) the body ----
struct WriteRespItem {
  Status status;
  uint64_t version = 0;
  bool existed = false, duplicate = false;
};
struct ReadRespItem {
  Status status;
  uint64_t version = 0;
  uint32_t chunk_length = 0, crc32c = 0, data_length = 0;  // crc32c of the returned bytes
  uint64_t shm_offset = 0;                                 // with kFlagShm: where the returned bytes are
};
struct RemoveRespItem {
  Status status;
  bool existed = false;
};
struct StatRespItem {
  Status status;
  uint64_t version = 0;
  uint32_t length = 0, crc32c = 0, chain_ver = 0;
  uint8_t flags = 0;
  int64_t created_ms = 0, expire_ms = 0;
};
struct ListRespItem {
  std::string id;
  uint32_t length = 0;
  uint64_t version = 0;
  uint8_t flags = 0;
  int64_t created_ms = 0, expire_ms = 0;
};
struct ListResp {
  std::vector<ListRespItem> items;
  bool more = false;
};
struct HelloResp {
  uint64_t server_id = 0;
  uint32_t max_batch_items = 0;
  uint64_t max_request_bytes = 0;
  std::vector<TargetInfo> targets;
};

std::string encode_error_resp(const Status& status);
std::string encode_hello_resp(const HelloResp& r);
std::string encode_health_resp(const ServerHealth& h);
std::string encode_write_resp(const std::vector<WriteRespItem>& items);
std::string encode_read_resp(const std::vector<ReadRespItem>& items, bool shm = false);
std::string encode_status_resp();  // just "ok"
std::string encode_remove_resp(const std::vector<RemoveRespItem>& items);
std::string encode_stat_resp(const std::vector<StatRespItem>& items);
std::string encode_list_resp(const ListResp& r);

// Each returns the request-level error carried by the response, or the decoded body.
Result<HelloResp> decode_hello_resp(std::string_view meta);
Result<ServerHealth> decode_health_resp(std::string_view meta);
Result<std::vector<WriteRespItem>> decode_write_resp(std::string_view meta);
// data_bytes must equal the sum of data_length (0 with shm).
Result<std::vector<ReadRespItem>> decode_read_resp(std::string_view meta, uint64_t data_bytes,
                                                   bool shm = false);
Status decode_status_resp(std::string_view meta);
Result<std::vector<RemoveRespItem>> decode_remove_resp(std::string_view meta);
Result<std::vector<StatRespItem>> decode_stat_resp(std::string_view meta);
Result<ListResp> decode_list_resp(std::string_view meta);

}  // namespace fathom::storage::wire
