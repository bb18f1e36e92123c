// StorageServer + StorageClient in one process over real TCP: batched chunk operations over
// several targets, the KV-cache and file APIs, idempotent retries, the per-client in-flight
// bound, disconnects mid-request, malformed frames, and graceful shutdown.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/fs.h"
#include "storage/crc32c.h"
#include "storage/net.h"
#include "storage/protocol.h"
#include "storage/storage.h"
#include "storage/test_util.h"

namespace fathom::storage {
namespace {

using testing::payload;
using testing::TempDir;

std::span<const uint8_t> bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

struct Cluster {
  TempDir dir;
  std::unique_ptr<StorageServer> server;
  std::unique_ptr<StorageClient> client;

  explicit Cluster(int targets = 2, uint64_t capacity = 0, int max_inflight = 16,
                   uint64_t shm_bytes = 64u << 20) {
    start(targets, capacity, max_inflight, shm_bytes);
  }
  void start(int targets, uint64_t capacity, int max_inflight, uint64_t shm_bytes) {
    ServerParams p;
    for (int t = 0; t < targets; ++t)
      p.targets.push_back(TargetParams{dir.sub("t" + std::to_string(t)), capacity});
    p.listen = "127.0.0.1:0";
    p.group_bytes = 1u << 20;
    p.max_inflight_per_client = max_inflight;
    p.maintenance_interval_ms = 100;
    auto s = StorageServer::start(p);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server = std::move(*s);
    auto c = StorageClient::connect(ClientParams{.servers = {server->address()}, .shm_bytes = shm_bytes});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    client = std::move(*c);
  }
};

// Chunk bytes over TCP (0), through a shared segment smaller than some batches (1 MiB: those go
// over TCP), and through a large segment.
class Transports : public ::testing::TestWithParam<uint64_t> {};
INSTANTIATE_TEST_SUITE_P(Shm, Transports, ::testing::Values(0, 1u << 20, 64u << 20),
                         [](const auto& info) { return "shm" + std::to_string(info.param >> 20) + "MiB"; });

// Waits (without a time limit in the assertion sense) until cond holds or 30 s pass.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 3000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

TEST_P(Transports, BatchesOfChunksRoundTripOverSeveralTargets) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  Cluster c(3, 0, 16, GetParam());
  ASSERT_EQ(c.client->targets().size(), 3u);
  std::vector<std::string> ids, data;
  for (int i = 0; i < 40; ++i) {  // some larger than the 1 MiB segment of one variant
    ids.push_back("chunk/" + std::to_string(i));
    data.push_back(payload(rng.next_u64(), rng.below(4) == 0 ? rng.below(3u << 19) : rng.below(20000)));
  }
  std::vector<ChunkWrite> w;
  for (size_t i = 0; i < ids.size(); ++i) w.push_back(ChunkWrite{.id = ids[i], .data = bytes(data[i])});
  std::vector<ChunkWriteResult> wr(w.size());
  c.client->write(w, wr);
  for (auto& r : wr) ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  std::vector<ChunkRead> rd;
  for (auto& id : ids) rd.push_back(ChunkRead{.id = id});
  rd.push_back(ChunkRead{.id = "missing"});
  std::vector<ChunkReadResult> rr(rd.size());
  c.client->read(rd, rr);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(rr[i].status.ok()) << rr[i].status.to_string();
    EXPECT_EQ(std::string(rr[i].data.begin(), rr[i].data.end()), data[i]) << ids[i];
  }
  EXPECT_EQ(rr.back().status.code(), StatusCode::kNotFound);
  // Partial reads, checked against the same CRC machinery.
  const ChunkRead part{.id = ids[0], .offset = 3, .length = 5};
  ChunkReadResult pr;
  c.client->read(std::span(&part, 1), std::span(&pr, 1));
  if (data[0].size() >= 8) {
    EXPECT_EQ(std::string(pr.data.begin(), pr.data.end()), data[0].substr(3, 5));
  }
  // Every target got some, and listing a target returns exactly what placement put there.
  size_t listed = 0;
  for (size_t t = 0; t < 3; ++t) {
    bool more = false;
    auto l = c.client->list(t, "chunk/", "", 1000, &more);
    ASSERT_TRUE(l.ok());
    EXPECT_GT(l->size(), 0u);
    for (auto& e : *l) EXPECT_EQ(c.client->place(e.id), t);
    listed += l->size();
  }
  EXPECT_EQ(listed, ids.size());
  auto health = c.client->health(0);
  ASSERT_TRUE(health.ok());
  EXPECT_TRUE(health->ready);
  if (GetParam() == 0) {
    EXPECT_EQ(health->shm_requests, 0u);
  } else {
    EXPECT_GT(health->shm_requests, 0u);
  }
  uint64_t chunks = 0;
  for (auto& t : health->targets) chunks += t.chunks;
  EXPECT_EQ(chunks, ids.size());
  std::vector<std::string_view> views(ids.begin(), ids.end());
  std::unique_ptr<bool[]> existed(new bool[views.size()]());
  ASSERT_TRUE(c.client->remove(views, std::span(existed.get(), views.size())).ok());
  for (size_t i = 0; i < views.size(); ++i) EXPECT_TRUE(existed[i]);
}

// A batch larger than request_split_bytes goes out as several requests at once (counted by the
// server) and every chunk still lands and reads back; with splitting off it is one request each way.
TEST(StorageService, LargeBatchesSplitIntoConcurrentRequests) {
  Rng rng(testing::test_seed());
  Cluster c(1);
  std::vector<std::string> ids, data;
  for (int i = 0; i < 12; ++i) {
    ids.push_back("split/" + std::to_string(i));
    data.push_back(payload(rng.next_u64(), (1u << 20) - rng.below(4096)));
  }
  for (const uint64_t split : {uint64_t{2} << 20, uint64_t{0}}) {
    auto client =
        StorageClient::connect(ClientParams{.servers = {c.server->address()}, .request_split_bytes = split});
    ASSERT_TRUE(client.ok()) << client.status().to_string();
    std::vector<ChunkWrite> w;
    for (size_t i = 0; i < ids.size(); ++i) w.push_back(ChunkWrite{.id = ids[i], .data = bytes(data[i])});
    std::vector<ChunkWriteResult> wr(w.size());
    // Requests whose bytes went through shared memory: the reads and writes, not the handshakes.
    const uint64_t before = (*client)->health(0)->shm_requests;
    (*client)->write(w, wr);
    for (auto& r : wr) ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    const uint64_t after_write = (*client)->health(0)->shm_requests;
    std::vector<ChunkRead> rd;
    for (auto& id : ids) rd.push_back(ChunkRead{.id = id});
    std::vector<ChunkReadResult> rr(rd.size());
    (*client)->read(rd, rr);
    const uint64_t after_read = (*client)->health(0)->shm_requests;
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(rr[i].status.ok()) << rr[i].status.to_string();
      EXPECT_EQ(std::string(rr[i].data.begin(), rr[i].data.end()), data[i]) << ids[i];
    }
    const uint64_t expected = split > 0 ? 6 : 1;  // 12 chunks of just under 1 MiB, two per 2 MiB
    EXPECT_EQ(after_write - before, expected) << "split " << split;
    EXPECT_EQ(after_read - after_write, expected) << "split " << split;
  }
  // One request per chunk: 12 requests, but at most 8 at once, so at most 8 connections (plus
  // the first client's, still open) reach the server.
  auto one_each = StorageClient::connect(ClientParams{.servers = {c.server->address()}, .request_split_bytes = 1});
  ASSERT_TRUE(one_each.ok());
  std::vector<ChunkRead> rd;
  for (auto& id : ids) rd.push_back(ChunkRead{.id = id});
  std::vector<ChunkReadResult> rr(rd.size());
  const uint64_t before = c.client->health(0)->connections;
  (*one_each)->read(rd, rr);
  for (auto& r : rr) ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_LE(c.client->health(0)->connections, before + 8);
}

TEST_P(Transports, KvPutGetBatchExistsPrefixRemove) {
  Cluster c(2, 0, 16, GetParam());
  KvCache kv(*c.client);
  std::vector<KvKey> keys(10);
  for (size_t i = 0; i < keys.size(); ++i) keys[i].fill(static_cast<uint8_t>(i + 1));
  const std::string page = payload(1, 40000);
  ASSERT_TRUE(kv.put(keys[0], bytes(page)).ok());
  auto got = kv.get(keys[0]);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(std::string((*got)->begin(), (*got)->end()), page);
  EXPECT_FALSE(kv.get(keys[9])->has_value());
  // A chain with the first six pages cached.
  std::vector<std::string> pages;
  for (int i = 0; i < 6; ++i) pages.push_back(payload(100 + i, 40000));
  std::vector<std::span<const uint8_t>> values;
  for (auto& p : pages) values.push_back(bytes(p));
  for (Status s : kv.batch_put(std::span(keys).subspan(0, 6), values)) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(*kv.longest_prefix(keys), 6u);
  EXPECT_EQ(*kv.longest_prefix(std::span(keys).subspan(6)), 0u);
  // Block 0 was already cached: the second put kept the first bytes (blocks are immutable).
  const std::vector<uint8_t> again = kv.get(keys[0]).value().value();
  EXPECT_EQ(std::string(again.begin(), again.end()), page);
  // batch_get straight into page buffers; a short buffer is an error, a miss is kNotFound.
  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(40000));
  bufs[2].resize(100);
  const KvKey want[] = {keys[1], keys[8], keys[2]};
  std::vector<std::span<uint8_t>> dests;
  for (auto& b : bufs) dests.push_back(b);
  auto res = kv.batch_get(want, dests);
  EXPECT_TRUE(res[0].status.ok());
  EXPECT_EQ(res[0].length, 40000u);
  EXPECT_EQ(std::string(bufs[0].begin(), bufs[0].end()), pages[1]);
  EXPECT_EQ(res[1].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(res[2].status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*kv.remove(std::span(keys).subspan(0, 3)), 3u);
  EXPECT_EQ(*kv.longest_prefix(keys), 0u);
  auto e = kv.exists(keys);
  EXPECT_EQ(std::count(e->begin(), e->end(), true), 3);
  EXPECT_EQ(parse_kv_key(kv_key_hex(keys[4])).value(), keys[4]);
  EXPECT_FALSE(parse_kv_key("xyz").ok());
}

TEST(KvCacheApi, ConcurrentPutsOfOneKeyLeaveOneCopy) {
  Cluster c(1);
  KvCache kv(*c.client);
  KvKey key{};
  key.fill(7);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const std::string v = payload(t, 100000);
      for (int i = 0; i < 5; ++i) ok += kv.put(key, bytes(v)).ok() ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 30);
  auto h = c.client->health(0);
  EXPECT_EQ(h->targets[0].chunks, 1u);
  EXPECT_EQ(h->targets[0].writes, 1u);  // the other 29 found it there
  EXPECT_EQ(h->targets[0].used_slot_bytes, 128u * 1024);
}

TEST(FileApi, PutGetListStatRemoveAndReplace) {
  Cluster c(3);
  FileStore files(*c.client, FileStoreParams{.chunk_bytes = 64 * 1024, .parallel = 3, .batch = 2});
  const std::string a = payload(1, 1000000), b = payload(2, 64 * 1024), empty;
  ASSERT_TRUE(files.put_bytes(bytes(a), "data/a.bin").ok());
  ASSERT_TRUE(files.put_bytes(bytes(b), "data/b.bin").ok());
  ASSERT_TRUE(files.put_bytes(bytes(empty), "empty").ok());
  auto got = files.get_bytes("data/a.bin");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::string(got->begin(), got->end()), a);
  EXPECT_TRUE(files.get_bytes("empty")->empty());
  auto st = files.stat("data/a.bin");
  EXPECT_EQ(st->size, a.size());
  EXPECT_EQ(st->chunks, 16u);
  EXPECT_EQ(st->crc32c, crc32c(a.data(), a.size()));
  auto ls = files.list("data/");
  ASSERT_EQ(ls->size(), 2u);
  EXPECT_EQ((*ls)[0].path, "data/a.bin");
  EXPECT_EQ(files.list("")->size(), 3u);
  // Replacing a file removes the old version's chunks.
  auto chunks = [&] {
    uint64_t n = 0;
    const ServerHealth h = c.client->health(0).value();
    for (auto& t : h.targets) n += t.chunks;
    return n;
  };
  const uint64_t before = chunks();
  ASSERT_TRUE(files.put_bytes(bytes(b), "data/a.bin").ok());
  EXPECT_EQ(chunks(), before - 16 + 1);
  EXPECT_EQ(*files.get_bytes("data/a.bin"), std::vector<uint8_t>(b.begin(), b.end()));
  // Local files, with the download renamed into place only when verified.
  TempDir local;
  {
    FILE* f = std::fopen(local.sub("in").c_str(), "wb");
    std::fwrite(a.data(), 1, a.size(), f);
    std::fclose(f);
  }
  ASSERT_TRUE(files.put(local.sub("in"), "local").ok());
  ASSERT_TRUE(files.get("local", local.sub("out")).ok());
  EXPECT_EQ(*read_file(local.sub("out")), a);
  EXPECT_EQ(files.get("nope", local.sub("x")).code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(local.sub("x.fathom-part")));
  ASSERT_TRUE(files.remove("data/a.bin").ok());
  EXPECT_EQ(files.stat("data/a.bin").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(files.remove("data/a.bin").code(), StatusCode::kNotFound);
  EXPECT_EQ(files.put_bytes(bytes(a), "").code(), StatusCode::kInvalidArgument);
}

// ---- raw protocol ----

struct RawConn {
  int fd = -1;
  explicit RawConn(const std::string& addr) { fd = *net::connect_tcp(*net::parse_host_port(addr), 5000); }
  ~RawConn() {
    if (fd >= 0) ::close(fd);
  }
  Status send(wire::MsgId msg, uint64_t client, uint64_t request, const std::string& meta,
              const std::string& data, size_t data_sent = SIZE_MAX, uint32_t flags = 0) {
    wire::Header h{.msg = static_cast<uint16_t>(msg),
                   .client_id = client,
                   .request_id = request,
                   .flags = flags,
                   .data_bytes = data.size()};
    uint8_t header[wire::kHeaderBytes];
    wire::encode_header(h, meta, header);
    iovec iov[3] = {{header, sizeof(header)},
                    {const_cast<char*>(meta.data()), meta.size()},
                    {const_cast<char*>(data.data()), std::min(data_sent, data.size())}};
    return net::send_all(fd, iov, "server");
  }
  Result<std::string> receive() {
    uint8_t header[wire::kHeaderBytes];
    TRY(net::recv_exact(fd, header, sizeof(header), "server"));
    const wire::Header h = TRY(wire::decode_header(header));
    std::string meta(h.meta_bytes, '\0');
    TRY(net::recv_exact(fd, meta.data(), meta.size(), "server"));
    TRY(net::discard(fd, h.data_bytes, "server"));
    return meta;
  }
};

std::string write_meta(uint32_t chain, const std::string& id, const std::string& data) {
  return wire::encode_write_req({wire::WriteReqItem{.chain_id = chain,
                                                    .id = id,
                                                    .length = static_cast<uint32_t>(data.size()),
                                                    .crc32c = crc32c(data.data(), data.size())}});
}

TEST(StorageService, ARetriedWriteIsAnsweredNotAppliedTwice) {
  Cluster c(1);
  const std::string data = payload(3, 5000);
  RawConn conn(c.server->address());
  ASSERT_TRUE(conn.send(wire::MsgId::kWrite, 42, 1, write_meta(0, "x", data), data).ok());
  auto first = wire::decode_write_resp(*conn.receive());
  ASSERT_TRUE(first.ok() && (*first)[0].status.ok());
  EXPECT_EQ((*first)[0].version, 1u);
  // The same (client, request) again, on a new connection, as after a lost response.
  RawConn again(c.server->address());
  ASSERT_TRUE(again.send(wire::MsgId::kWrite, 42, 1, write_meta(0, "x", data), data).ok());
  auto second = wire::decode_write_resp(*again.receive());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].version, 1u);
  auto h = c.client->health(0);
  EXPECT_EQ(h->replayed_requests, 1u);
  EXPECT_EQ(h->targets[0].writes, 1u);
  // A new request id is a new write.
  ASSERT_TRUE(again.send(wire::MsgId::kWrite, 42, 2, write_meta(0, "x", data), data).ok());
  EXPECT_EQ((*wire::decode_write_resp(*again.receive()))[0].version, 2u);
  // An unknown chain is a per-item error.
  ASSERT_TRUE(again.send(wire::MsgId::kWrite, 42, 3, write_meta(9, "y", data), data).ok());
  EXPECT_EQ((*wire::decode_write_resp(*again.receive()))[0].status.code(), StatusCode::kNotFound);
}

TEST(StorageService, AClientThatDisconnectsMidPutLeavesNoReservation) {
  Cluster c(1, 8u << 20);
  auto before = *c.client->health(0);
  for (int i = 0; i < 5; ++i) {
    const std::string data = payload(i, 2u << 20);
    RawConn conn(c.server->address());
    ASSERT_TRUE(conn.send(wire::MsgId::kWrite, 77, 1 + i, write_meta(0, "big" + std::to_string(i), data),
                          data, data.size() / 2)
                    .ok());
  }  // closed mid-data
  ASSERT_TRUE(eventually([&] { return c.client->health(0)->connections == 1; }));
  auto after = *c.client->health(0);
  EXPECT_EQ(after.targets[0].chunks, before.targets[0].chunks);
  EXPECT_EQ(after.targets[0].used_slot_bytes, before.targets[0].used_slot_bytes);
  EXPECT_EQ(after.targets[0].reserved_bytes, before.targets[0].reserved_bytes);
  // The whole capacity is still there for complete puts.
  for (int i = 0; i < 4; ++i) {
    const std::string d = payload(i, 2u << 20);
    const std::string id = "ok" + std::to_string(i);
    const ChunkWrite w{.id = id, .data = bytes(d)};
    ChunkWriteResult r;
    c.client->write(std::span(&w, 1), std::span(&r, 1));
    EXPECT_TRUE(r.status.ok()) << r.status.to_string();
  }
}

TEST(StorageService, MalformedFramesCloseTheConnectionAndTheServerCarriesOn) {
  Cluster c(1);
  {
    RawConn conn(c.server->address());
    const std::string junk = payload(1, 4096);
    iovec iov{const_cast<char*>(junk.data()), junk.size()};
    (void)net::send_all(conn.fd, std::span(&iov, 1), "server");
    EXPECT_FALSE(conn.receive().ok());  // closed without an answer
  }
  {
    RawConn conn(c.server->address());
    ASSERT_TRUE(conn.send(static_cast<wire::MsgId>(99), 1, 1, "", "").ok());
    auto meta = conn.receive();
    ASSERT_TRUE(meta.ok());
    EXPECT_EQ(wire::decode_stat_resp(*meta).status().code(), StatusCode::kUnimplemented);
  }
  {
    RawConn conn(c.server->address());
    ASSERT_TRUE(conn.send(wire::MsgId::kRead, 1, 1, "\x05\x00", "").ok());  // truncated read request
    EXPECT_EQ(wire::decode_read_resp(*conn.receive(), 0).status().code(), StatusCode::kCorrupt);
  }
  const std::string d = payload(2, 100);
  const ChunkWrite w{.id = "still-works", .data = bytes(d)};
  ChunkWriteResult r;
  c.client->write(std::span(&w, 1), std::span(&r, 1));
  EXPECT_TRUE(r.status.ok());
}

TEST(StorageService, SharedMemoryNeedsTheRightTokenAndInBoundsOffsets) {
  Cluster c(1);
  RawConn conn(c.server->address());
  // Shared-memory flags before attaching are a protocol error: the connection is dropped.
  const std::string data = payload(1, 100);
  ASSERT_TRUE(
      conn.send(wire::MsgId::kRead, 5, 1, wire::encode_read_req({}), "", SIZE_MAX, wire::kFlagShm).ok());
  EXPECT_FALSE(conn.receive().ok());
  RawConn conn2(c.server->address());
  // A name outside the prefix, and a segment holding another token, are refused.
  ASSERT_TRUE(conn2
                  .send(wire::MsgId::kAttachShm, 5, 2,
                        wire::encode_attach_shm_req({"/etc-passwd", 4096, std::string(16, 'x')}), "")
                  .ok());
  EXPECT_EQ(wire::decode_status_resp(*conn2.receive()).code(), StatusCode::kInvalidArgument);
  const std::string name = std::string(wire::kShmPrefix) + "test-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  ::close(fd);
  ASSERT_TRUE(conn2
                  .send(wire::MsgId::kAttachShm, 5, 3,
                        wire::encode_attach_shm_req({name, 1 << 20, std::string(16, 'y')}), "")
                  .ok());
  EXPECT_EQ(wire::decode_status_resp(*conn2.receive()).code(), StatusCode::kFailedPrecondition);
  // With the right token the segment is attached; a write item outside it is rejected.
  {
    const int f = ::shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_EQ(::pwrite(f, std::string(16, 'y').data(), 16, 0), 16);
    ::close(f);
  }
  ASSERT_TRUE(conn2
                  .send(wire::MsgId::kAttachShm, 5, 4,
                        wire::encode_attach_shm_req({name, 1 << 20, std::string(16, 'y')}), "")
                  .ok());
  EXPECT_TRUE(wire::decode_status_resp(*conn2.receive()).ok());
  ::shm_unlink(name.c_str());
  const std::string meta = wire::encode_write_req(
      {wire::WriteReqItem{.id = "x", .length = 8192, .crc32c = 0, .shm_offset = (1 << 20) - 4096}}, true);
  ASSERT_TRUE(conn2.send(wire::MsgId::kWrite, 5, 5, meta, "", SIZE_MAX, wire::kFlagShm).ok());
  EXPECT_EQ(wire::decode_write_resp(*conn2.receive()).status().code(), StatusCode::kInvalidArgument);
}

TEST(StorageService, RequestsOfOneClientInFlightAtOnceAreBounded) {
  Cluster c(1, 0, 2);
  // One client (one client id) used by six threads: its pool opens several connections, and the
  // bound is per client, not per connection.
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const std::string d = payload(t * 10 + i, 4u << 20);
        const std::string id = "c" + std::to_string(t) + "_" + std::to_string(i);
        const ChunkWrite w{.id = id, .data = bytes(d)};
        ChunkWriteResult r;
        c.client->write(std::span(&w, 1), std::span(&r, 1));
        EXPECT_TRUE(r.status.ok()) << r.status.to_string();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto h = c.client->health(0);
  std::printf("most requests in flight at once: %u, waits for the bound: %llu\n", h->inflight_max_seen,
              static_cast<unsigned long long>(h->inflight_waits));
  EXPECT_LE(h->inflight_max_seen, 2u);
  EXPECT_GE(h->inflight_max_seen, 1u);
  EXPECT_EQ(h->targets[0].chunks, 24u);
}

TEST(StorageService, GracefulShutdownKeepsEveryAcknowledgedWrite) {
  const uint64_t seed = testing::test_seed();
  Cluster c(2);
  std::atomic<bool> stop{false};
  std::vector<std::vector<std::string>> acked(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const std::string id = "g" + std::to_string(t) + "_" + std::to_string(i);
        const std::string d = payload(seed + t * 1000 + i, 50000 + i);
        const ChunkWrite w{.id = id, .data = bytes(d)};
        ChunkWriteResult r;
        c.client->write(std::span(&w, 1), std::span(&r, 1));
        if (!r.status.ok()) break;
        acked[t].push_back(id);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c.server->stop();  // while writes are in flight
  stop = true;
  for (auto& t : threads) t.join();
  const std::string t0 = c.dir.sub("t0"), t1 = c.dir.sub("t1");
  c.client.reset();
  c.server.reset();
  ServerParams p{.targets = {TargetParams{t0}, TargetParams{t1}}, .listen = "127.0.0.1:0"};
  auto server = StorageServer::start(p);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto client = StorageClient::connect(ClientParams{.servers = {(*server)->address()}}).value();
  size_t checked = 0;
  for (int t = 0; t < 4; ++t) {
    for (size_t i = 0; i < acked[t].size(); ++i) {
      const ChunkRead rd{.id = acked[t][i]};
      ChunkReadResult r;
      client->read(std::span(&rd, 1), std::span(&r, 1));
      ASSERT_TRUE(r.status.ok()) << acked[t][i] << ": " << r.status.to_string();
      EXPECT_EQ(std::string(r.data.begin(), r.data.end()), payload(seed + t * 1000 + i, 50000 + i));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace
}  // namespace fathom::storage
