// libFuzzer target: every wire-protocol decoder on arbitrary bytes (must return a Status, never
// crash, over-read or allocate without bound).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "storage/protocol.h"

using namespace fathom::storage::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  if (size >= kHeaderBytes) {
    auto h = decode_header(data);
    if (h.ok()) (void)verify_meta(data, s.substr(kHeaderBytes), h->meta_crc);
  }
  const uint64_t data_bytes = size > 0 ? data[0] : 0;
  (void)decode_hello_req(s);
  (void)decode_write_req(s, data_bytes);
  (void)decode_read_req(s);
  (void)decode_id_req(s, true);
  (void)decode_id_req(s, false);
  (void)decode_list_req(s);
  (void)decode_hello_resp(s);
  (void)decode_health_resp(s);
  (void)decode_write_resp(s);
  (void)decode_read_resp(s, data_bytes);
  (void)decode_remove_resp(s);
  (void)decode_stat_resp(s);
  (void)decode_list_resp(s);
  return 0;
}
