// Wire protocol v1: every message round-trips, and truncated or corrupted input yields a
// Status (never a crash or an over-read), checked at every truncation point.
#include "storage/protocol.h"

#include <gtest/gtest.h>

#include <cstring>

#include "storage/test_util.h"

namespace fathom::storage::wire {
namespace {

std::vector<WriteReqItem> sample_writes() {
  return {WriteReqItem{.chain_id = 1,
                       .chain_ver = 1,
                       .id = "a",
                       .mode = 1,
                       .flags = 1,
                       .ttl_s = 5,
                       .length = 3,
                       .crc32c = 9},
          WriteReqItem{.chain_id = 2, .id = std::string(1024, 'z'), .length = 0}};
}

TEST(WireProtocol, HeadersRoundTripAndCarryAChecksumOverTheMeta) {
  const std::string meta = encode_write_req(sample_writes());
  Header h{.msg = static_cast<uint16_t>(MsgId::kWrite), .client_id = 7, .request_id = 99, .data_bytes = 3};
  uint8_t bytes[kHeaderBytes];
  encode_header(h, meta, bytes);
  auto back = decode_header(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->msg, h.msg);
  EXPECT_EQ(back->client_id, 7u);
  EXPECT_EQ(back->request_id, 99u);
  EXPECT_EQ(back->meta_bytes, meta.size());
  EXPECT_EQ(back->data_bytes, 3u);
  EXPECT_TRUE(verify_meta(bytes, meta, back->meta_crc).ok());
  std::string flipped = meta;
  flipped[5] ^= 1;
  EXPECT_EQ(verify_meta(bytes, flipped, back->meta_crc).code(), StatusCode::kCorrupt);
  uint8_t bad[kHeaderBytes];
  std::memcpy(bad, bytes, kHeaderBytes);
  bad[0] ^= 0xff;
  EXPECT_EQ(decode_header(bad).status().code(), StatusCode::kCorrupt);
  std::memcpy(bad, bytes, kHeaderBytes);
  bad[4] = 2;  // version 2
  EXPECT_EQ(decode_header(bad).status().code(), StatusCode::kUnimplemented);
  h.data_bytes = kMaxDataBytes + 1;
  encode_header(h, meta, bad);
  EXPECT_EQ(decode_header(bad).status().code(), StatusCode::kOutOfRange);
}

TEST(WireProtocol, RequestsRoundTrip) {
  auto w = decode_write_req(encode_write_req(sample_writes()), 3);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].id, "a");
  EXPECT_EQ((*w)[0].ttl_s, 5u);
  EXPECT_EQ((*w)[1].id.size(), 1024u);
  EXPECT_EQ(decode_write_req(encode_write_req(sample_writes()), 4).status().code(), StatusCode::kCorrupt);

  std::vector<ReadReqItem> reads = {
      ReadReqItem{.chain_id = 3, .id = "r", .offset = 10, .length = 20, .lease_ms = 30}};
  auto r = decode_read_req(encode_read_req(reads));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].offset, 10u);
  EXPECT_EQ((*r)[0].lease_ms, 30u);

  std::vector<IdReqItem> ids = {IdReqItem{4, 1, "x", 50}};
  EXPECT_EQ((*decode_id_req(encode_id_req(ids, true), true))[0].lease_ms, 50u);
  EXPECT_EQ((*decode_id_req(encode_id_req(ids, false), false))[0].id, "x");
  EXPECT_FALSE(decode_id_req(encode_id_req(ids, false), true).ok());

  auto l = decode_list_req(encode_list_req(ListReq{5, "p", "q", 7}));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->start_after, "q");
  EXPECT_EQ(decode_hello_req(encode_hello_req(HelloReq{"me"}))->client_name, "me");
}

TEST(WireProtocol, ResponsesRoundTripWithPerItemStatus) {
  std::vector<WriteRespItem> w = {{Status(), 3, true, false},
                                  {resource_exhausted("target 0 is full"), 0, false, false}};
  auto wb = decode_write_resp(encode_write_resp(w));
  ASSERT_TRUE(wb.ok());
  EXPECT_TRUE((*wb)[0].existed);
  EXPECT_EQ((*wb)[1].status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*wb)[1].status.message(), "target 0 is full");

  std::vector<ReadRespItem> r = {{Status(), 2, 100, 0xabcd, 40}, {not_found("gone"), 0, 0, 0, 0}};
  auto rb = decode_read_resp(encode_read_resp(r), 40);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ((*rb)[0].crc32c, 0xabcdu);
  EXPECT_EQ((*rb)[1].status.code(), StatusCode::kNotFound);
  EXPECT_FALSE(decode_read_resp(encode_read_resp(r), 41).ok());

  ListResp list{{ListRespItem{"id", 5, 6, 1, 7, 8}}, true};
  auto lb = decode_list_resp(encode_list_resp(list));
  ASSERT_TRUE(lb.ok());
  EXPECT_TRUE(lb->more);
  EXPECT_EQ(lb->items[0].expire_ms, 8);

  HelloResp hello{.server_id = 11,
                  .max_batch_items = 12,
                  .max_request_bytes = 13,
                  .targets = {TargetInfo{
                      .target_id = 1, .chain_id = 2, .chain_ver = 1, .capacity_bytes = 5, .path = "/t"}}};
  auto hb = decode_hello_resp(encode_hello_resp(hello));
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->targets[0].path, "/t");

  ServerHealth health{
      .ready = true, .requests = 9, .targets = {TargetHealth{.io_backend = "io_uring", .chunks = 4}}};
  auto h = decode_health_resp(encode_health_resp(health));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->targets[0].chunks, 4u);
  EXPECT_EQ(h->requests, 9u);

  auto err = decode_stat_resp(encode_error_resp(permission_denied("no")));
  EXPECT_EQ(err.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(err.status().message(), "no");
}

TEST(WireProtocol, EveryTruncationAndTrailingByteIsAnError) {
  const std::string metas[] = {
      encode_write_req(sample_writes()),
      encode_read_req({ReadReqItem{.id = "abc"}}),
      encode_write_resp({{Status(), 1, false, false}}),
      encode_health_resp(ServerHealth{.targets = {TargetHealth{}}}),
      encode_list_resp(ListResp{{ListRespItem{"x"}}, false}),
  };
  for (size_t m = 0; m < std::size(metas); ++m) {
    const std::string& full = metas[m];
    for (size_t n = 0; n < full.size(); ++n) {
      const std::string cut = full.substr(0, n);
      bool failed = false;
      switch (m) {
        case 0:
          failed = !decode_write_req(cut, 3).ok();
          break;
        case 1:
          failed = !decode_read_req(cut).ok();
          break;
        case 2:
          failed = !decode_write_resp(cut).ok();
          break;
        case 3:
          failed = !decode_health_resp(cut).ok();
          break;
        case 4:
          failed = !decode_list_resp(cut).ok();
          break;
      }
      EXPECT_TRUE(failed) << "message " << m << " truncated to " << n << " bytes decoded";
    }
    EXPECT_FALSE(decode_read_req(full + "x").ok() && m == 1);
  }
  // Counts above the limit are refused before anything is allocated for them.
  std::string huge(4, '\xff');
  EXPECT_EQ(decode_read_req(huge).status().code(), StatusCode::kCorrupt);
}

TEST(WireProtocol, RandomBytesNeverCrashTheDecoders) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  for (int i = 0; i < 3000; ++i) {
    const std::string s = testing::payload(rng.next_u64(), rng.below(200));
    (void)decode_write_req(s, rng.below(1000));
    (void)decode_read_req(s);
    (void)decode_id_req(s, i % 2 == 0);
    (void)decode_list_req(s);
    (void)decode_hello_resp(s);
    (void)decode_health_resp(s);
    (void)decode_read_resp(s, rng.below(1000));
    (void)decode_stat_resp(s);
    if (s.size() >= kHeaderBytes) (void)decode_header(reinterpret_cast<const uint8_t*>(s.data()));
  }
}

}  // namespace
}  // namespace fathom::storage::wire
