// ChunkEngine: durability across reopen, a randomised comparison with a std::map (both I/O
// backends), checksum failures, capacity limits, eviction, TTL and leases, pins, idempotent and
// concurrent writes, and the allocator rebuild.
#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <thread>

#include "storage/buffer.h"
#include "storage/test_util.h"

namespace fathom::storage {
namespace {

using testing::payload;
using testing::TempDir;

EngineParams params_for(const TempDir& dir, IoBackend io = IoBackend::kAuto) {
  EngineParams p;
  p.dir = dir.sub("target");
  p.io = io;
  p.group_bytes = 1u << 20;
  return p;
}

std::unique_ptr<ChunkEngine> open_engine(const EngineParams& p) {
  auto e = ChunkEngine::open(p);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(ChunkEngine, WritesAreReadBackAfterReopen) {
  TempDir dir;
  const EngineParams p = params_for(dir);
  {
    auto e = open_engine(p);
    ASSERT_TRUE(e);
    ASSERT_TRUE(e->write("a", payload(1, 5000)).ok());
    ASSERT_TRUE(e->write("b", payload(2, 3u << 20)).ok());
    ASSERT_TRUE(e->write("empty", "").ok());
    ASSERT_TRUE(e->write("a", payload(3, 100)).ok());  // overwrite moves to a smaller class
    EXPECT_EQ(*e->read("a"), payload(3, 100));
    EXPECT_EQ(e->stat("a")->version, 2u);
  }
  auto e = open_engine(p);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e->read("a"), payload(3, 100));
  EXPECT_EQ(*e->read("b"), payload(2, 3u << 20));
  EXPECT_EQ(*e->read("empty"), "");
  EXPECT_EQ(e->read("zzz").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e->stats().chunks, 3u);
  EXPECT_EQ(e->stat("a")->version, 2u);
  EXPECT_TRUE(e->scrub()->empty());
}

TEST(ChunkEngine, RejectsOversizedChunksAndBadIds) {
  TempDir dir;
  auto e = open_engine(params_for(dir));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->write("", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->write(std::string(kMaxChunkIdBytes + 1, 'k'), "x").code(), StatusCode::kInvalidArgument);
  const std::string big(kMaxChunkBytes + 1, 'x');
  Status s = e->write("big", big);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("larger than"), std::string::npos) << s.message();
}

class EngineModel : public ::testing::TestWithParam<IoBackend> {};

TEST_P(EngineModel, RandomOperationsMatchAStdMapAcrossReopens) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  TempDir dir;
  const EngineParams p = params_for(dir, GetParam());
  auto e = open_engine(p);
  ASSERT_TRUE(e);
  std::map<std::string, std::string> model;
  for (int step = 0; step < 400; ++step) {
    const std::string id = "k" + std::to_string(rng.below(40));
    const uint64_t op = rng.below(100);
    if (op < 40) {
      const size_t len = rng.below(4) == 0 ? rng.below(300000) : rng.below(9000);
      const std::string data = payload(rng.next_u64(), len);
      const bool create = rng.below(4) == 0;
      ASSERT_TRUE(e->write(id, data, create ? WriteMode::kCreate : WriteMode::kOverwrite).ok()) << step;
      if (!create || !model.count(id)) model[id] = data;
    } else if (op < 55) {
      const std::string_view ids[] = {id};
      bool existed = false;
      ASSERT_TRUE(e->remove_batch(ids, std::span(&existed, 1)).ok());
      EXPECT_EQ(existed, model.erase(id) == 1) << step;
    } else if (op < 90) {
      auto r = e->read(id);
      if (model.count(id)) {
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_EQ(*r, model[id]) << "step " << step << " id " << id;
      } else {
        ASSERT_EQ(r.status().code(), StatusCode::kNotFound);
      }
    } else if (op < 97) {
      auto listed = e->list("k", "", 1000);
      ASSERT_TRUE(listed.ok());
      ASSERT_EQ(listed->size(), model.size());
      size_t i = 0;
      for (const auto& [k, v] : model) {
        EXPECT_EQ((*listed)[i].id, k);
        EXPECT_EQ((*listed)[i].meta.length, v.size());
        ++i;
      }
    } else {
      e.reset();
      e = open_engine(p);
      ASSERT_TRUE(e);
    }
    uint64_t bytes = 0;
    for (const auto& [k, v] : model) bytes += v.size();
    ASSERT_EQ(e->stats().chunks, model.size());
    ASSERT_EQ(e->stats().live_bytes, bytes);
  }
  e.reset();
  e = open_engine(p);
  for (const auto& [k, v] : model) EXPECT_EQ(*e->read(k), v);
  EXPECT_TRUE(e->scrub()->empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineModel, ::testing::Values(IoBackend::kUring, IoBackend::kPsync),
                         [](const auto& info) {
                           return std::string(info.param == IoBackend::kUring ? "uring" : "psync");
                         });

TEST(ChunkEngine, ListPagesInIdOrderWithinAPrefix) {
  TempDir dir;
  auto e = open_engine(params_for(dir));
  for (const char* id : {"a/1", "a/2", "a/3", "b/1", "a0"}) ASSERT_TRUE(e->write(id, id).ok());
  auto page1 = *e->list("a/", "", 2);
  ASSERT_EQ(page1.size(), 2u);
  EXPECT_EQ(page1[1].id, "a/2");
  auto page2 = *e->list("a/", page1.back().id, 2);
  ASSERT_EQ(page2.size(), 1u);
  EXPECT_EQ(page2[0].id, "a/3");
  EXPECT_TRUE(e->list("a/", "a/3", 2)->empty());
  EXPECT_EQ(e->list("", "", 100)->size(), 5u);
}

void flip_byte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c = static_cast<char>(c ^ 0x5a);
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::fsync(fd);
  ::close(fd);
}

TEST(ChunkEngine, FlippedDataBytesAreReportedAsCorruptionNotReturned) {
  TempDir dir;
  const EngineParams p = params_for(dir);
  auto e = open_engine(p);
  ASSERT_TRUE(e->write("good", payload(1, 20000)).ok());
  ASSERT_TRUE(e->write("bad", payload(2, 20000)).ok());
  auto where = *e->locate("bad");
  e.reset();
  flip_byte(where.first, where.second + 12345);
  e = open_engine(p);
  auto r = e->read("bad");
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().to_string();
  EXPECT_NE(r.status().message().find("CRC32C"), std::string::npos);
  EXPECT_EQ(*e->read("good"), payload(1, 20000));
  EXPECT_EQ(*e->scrub(), std::vector<std::string>{"bad"});
  EXPECT_EQ(e->stats().checksum_errors, 2u);
  // Rewriting the chunk heals it (copy-on-write to a fresh slot).
  ASSERT_TRUE(e->write("bad", payload(3, 20000)).ok());
  EXPECT_EQ(*e->read("bad"), payload(3, 20000));
}

TEST(ChunkEngine, FullTargetFailsDistinctlyLeaksNothingAndResumesAfterRemoval) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.capacity_bytes = 4u << 20;  // four 1 MiB groups
  auto e = open_engine(p);
  const std::string block = payload(9, 256 * 1024);
  int stored = 0;
  Status s;
  for (; stored < 100; ++stored) {
    s = e->write("f" + std::to_string(stored), block);
    if (!s.ok()) break;
  }
  EXPECT_EQ(stored, 16);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("is full"), std::string::npos) << s.message();
  const EngineStats before = e->stats();
  EXPECT_EQ(e->write("again", block).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(e->stats().used_slot_bytes, before.used_slot_bytes);
  EXPECT_EQ(e->stats().reserved_bytes, before.reserved_bytes);
  const std::string_view victim[] = {"f3"};
  bool existed = false;
  ASSERT_TRUE(e->remove_batch(victim, std::span(&existed, 1)).ok());
  EXPECT_TRUE(e->write("again", block).ok());
  EXPECT_EQ(*e->read("again"), block);
}

// Bytes the data files hold on disk (hole-punched ranges hold none).
uint64_t data_blocks_bytes(const EngineParams& p) {
  uint64_t total = 0;
  for (const auto& f : std::filesystem::directory_iterator(p.dir + "/data")) {
    struct stat st {};
    if (::stat(f.path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

TEST(ChunkEngine, EmptiedGroupsStayAllocatedUpToTheBudgetForTheNextPuts) {
  TempDir dir;
  EngineParams p = params_for(dir);  // 1 MiB groups: four 256 KiB slots each
  p.keep_empty_bytes = 2u << 20;
  const std::string block = payload(4, 256 * 1024);
  {
    auto e = open_engine(p);
    ASSERT_TRUE(e);
    for (int i = 0; i < 16; ++i) ASSERT_TRUE(e->write("k" + std::to_string(i), block).ok());
    EXPECT_EQ(e->stats().reserved_bytes, 4u << 20);
    const uint64_t full_blocks = data_blocks_bytes(p);
    EXPECT_GE(full_blocks, 4u << 20);
    ASSERT_TRUE(testing::remove_numbered(*e, "k", 0, 16).ok());
    // Two groups are kept (the budget), two were hole-punched.
    EXPECT_EQ(e->stats().chunks, 0u);
    EXPECT_EQ(e->stats().reserved_bytes, 2u << 20);
    EXPECT_EQ(e->stats().empty_group_bytes, 2u << 20);
    const uint64_t kept_blocks = data_blocks_bytes(p);
    EXPECT_EQ(full_blocks - kept_blocks, 2u << 20);
    // The next eight puts land in the kept groups: nothing new is reserved or allocated.
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->write("n" + std::to_string(i), block).ok());
    EXPECT_EQ(e->stats().reserved_bytes, 2u << 20);
    EXPECT_EQ(e->stats().empty_group_bytes, 0u);
    EXPECT_EQ(data_blocks_bytes(p), kept_blocks);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(*e->read("n" + std::to_string(i)), block);
    // Emptied again: kept again; a budget of 0 would have punched them (below).
    ASSERT_TRUE(testing::remove_numbered(*e, "n", 0, 4).ok());
    EXPECT_EQ(e->stats().empty_group_bytes, 1u << 20);
  }
  const uint64_t blocks_before_restart = data_blocks_bytes(p);
  {
    // A restart finds the kept group's blocks all written and keeps it again; puts reuse it.
    auto e = open_engine(p);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->stats().reserved_bytes, 2u << 20);
    EXPECT_EQ(e->stats().empty_group_bytes, 1u << 20);
    EXPECT_EQ(data_blocks_bytes(p), blocks_before_restart);
    for (int i = 4; i < 8; ++i) EXPECT_EQ(*e->read("n" + std::to_string(i)), block);
    EXPECT_TRUE(e->scrub()->empty());
    ASSERT_TRUE(e->write("after", block).ok());
    EXPECT_EQ(e->stats().reserved_bytes, 2u << 20);
    EXPECT_EQ(data_blocks_bytes(p), blocks_before_restart);
    const std::string_view after[] = {"after"};
    bool existed = false;
    ASSERT_TRUE(e->remove_batch(after, std::span(&existed, 1)).ok());
  }
  // Reopened with no budget, the emptied group is punched.
  p.keep_empty_bytes = 0;
  auto e = open_engine(p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().reserved_bytes, 1u << 20);
  EXPECT_EQ(e->stats().empty_group_bytes, 0u);
  EXPECT_EQ(blocks_before_restart - data_blocks_bytes(p), 1u << 20);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(*e->read("n" + std::to_string(i)), block);
}

TEST(ChunkEngine, ARestartKeepsOnlyWrittenGroupsAndPunchesReservedButUnwrittenOnes) {
  TempDir dir;
  EngineParams p = params_for(dir);
  const std::string block = payload(5, 256 * 1024);
  {
    auto e = open_engine(p);
    ASSERT_TRUE(e);
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->write("k" + std::to_string(i), block).ok());
    ASSERT_TRUE(testing::remove_numbered(*e, "k", 0, 8).ok());  // two written groups, kept
    EXPECT_EQ(e->stats().empty_group_bytes, 2u << 20);
  }
  // A third group reserved after them but never written, as a crash right after its fallocate
  // leaves it.
  std::string data_file;
  for (const auto& f : std::filesystem::directory_iterator(p.dir + "/data")) {
    if (f.path().string().ends_with("_262144.dat")) data_file = f.path().string();
  }
  ASSERT_FALSE(data_file.empty());
  const int fd = ::open(data_file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fallocate(fd, 0, 2 << 20, 1 << 20), 0);
  // Whether this filesystem reports allocated-but-unwritten blocks as a hole (ext4 and xfs do;
  // tmpfs does not, and there the group is kept like the written ones).
  const bool unwritten_is_hole = ::lseek(fd, 2 << 20, SEEK_HOLE) == (2 << 20);
  ::close(fd);
  auto e = open_engine(p);
  ASSERT_TRUE(e);
  if (unwritten_is_hole) {
    EXPECT_EQ(e->stats().empty_group_bytes, 2u << 20);
    EXPECT_EQ(e->stats().orphan_bytes_reclaimed, 1u << 20);
  } else {
    EXPECT_EQ(e->stats().empty_group_bytes, 3u << 20);
  }
  EXPECT_EQ(e->stats().reserved_bytes, e->stats().empty_group_bytes);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(e->write("n" + std::to_string(i), block).ok());
  EXPECT_EQ(e->stats().reserved_bytes, 3u << 20);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(*e->read("n" + std::to_string(i)), block);
  EXPECT_TRUE(e->scrub()->empty());
}

TEST(ChunkEngine, WithNoBudgetEmptiedGroupsAreHolePunchedAtOnce) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.keep_empty_bytes = 0;
  auto e = open_engine(p);
  const std::string block = payload(6, 256 * 1024);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->write("k" + std::to_string(i), block).ok());
  const uint64_t full_blocks = data_blocks_bytes(p);
  ASSERT_TRUE(testing::remove_numbered(*e, "k", 0, 4).ok());
  EXPECT_EQ(e->stats().reserved_bytes, 1u << 20);
  EXPECT_EQ(e->stats().empty_group_bytes, 0u);
  EXPECT_EQ(full_blocks - data_blocks_bytes(p), 1u << 20);
}

TEST(ChunkEngine, KeptGroupsGiveWayWhenAnotherClassNeedsTheCapacity) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.capacity_bytes = 4u << 20;
  p.keep_empty_bytes = 4u << 20;
  auto e = open_engine(p);
  const std::string small = payload(7, 256 * 1024);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(e->write("s" + std::to_string(i), small).ok());
  ASSERT_TRUE(testing::remove_numbered(*e, "s", 0, 16).ok());
  EXPECT_EQ(e->stats().empty_group_bytes, 4u << 20);  // the whole capacity, all empty
  // 1.5 MiB chunks (a class of its own, one slot per group): two fit once the kept groups go.
  const std::string big = payload(8, 3u << 19);
  ASSERT_TRUE(e->write("b0", big).ok());
  ASSERT_TRUE(e->write("b1", big).ok());
  EXPECT_LE(e->stats().reserved_bytes, p.capacity_bytes);
  EXPECT_EQ(e->stats().empty_group_bytes, 1u << 20);
  EXPECT_EQ(*e->read("b0"), big);
  // With nothing left to give back, the cap holds.
  const Status s = e->write("b2", big);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_EQ(e->stats().empty_group_bytes, 0u);
  EXPECT_TRUE(e->write("s0", small).ok());
}

TEST(ChunkEngine, CacheBlocksAreEvictedLeastRecentlyUsedFirstWhenFull) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.capacity_bytes = 4u << 20;
  auto e = open_engine(p);
  const std::string block = payload(5, 64 * 1024);
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(e->write("kv" + std::to_string(i), block, WriteMode::kCreate, kChunkEvictable).ok());
  }
  // The first eight are read now, so they are the most recently used.
  int64_t clock = 0;
  (void)clock;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->read("kv" + std::to_string(i)).ok());
  for (int i = 64; i < 96; ++i) {
    ASSERT_TRUE(e->write("kv" + std::to_string(i), block, WriteMode::kCreate, kChunkEvictable).ok()) << i;
  }
  EXPECT_EQ(e->stats().evictions, 32u);
  EXPECT_EQ(e->stats().chunks, 64u);
  for (int i = 0; i < 8; ++i)
    EXPECT_TRUE(e->read("kv" + std::to_string(i)).ok()) << "hot block " << i << " evicted";
  for (int i = 64; i < 96; ++i) EXPECT_TRUE(e->read("kv" + std::to_string(i)).ok());
  // File data (not evictable) is never evicted: a full target of it refuses the write.
  EXPECT_TRUE(e->scrub()->empty());
}

TEST(ChunkEngine, TtlExpiresAndLeasesProtectFromExpiryAndEviction) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.capacity_bytes = 2u << 20;
  auto now = std::make_shared<int64_t>(1'000'000);
  p.clock_ms = [now] { return *now; };
  auto e = open_engine(p);
  const std::string block = payload(4, 60 * 1024);
  ASSERT_TRUE(e->write("ttl", block, WriteMode::kCreate, kChunkEvictable, 10).ok());
  ASSERT_TRUE(e->write("leased", block, WriteMode::kCreate, kChunkEvictable, 10).ok());
  *now += 9'000;
  EXPECT_TRUE(e->stat("leased", 60'000).ok());
  *now += 2'000;
  EXPECT_EQ(e->read("ttl").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(e->maintain().ok());
  EXPECT_EQ(e->stats().expirations, 1u);
  EXPECT_EQ(e->stats().chunks, 1u);  // the leased one stays (invisible: expired) until its lease ends
  *now += 60'000;
  ASSERT_TRUE(e->maintain().ok());
  EXPECT_EQ(e->stats().chunks, 0u);
  // A lease keeps a block through capacity eviction: fill past capacity with the lease held.
  ASSERT_TRUE(e->write("keep", block, WriteMode::kCreate, kChunkEvictable).ok());
  ASSERT_TRUE(e->stat("keep", 1'000'000).ok());
  for (int i = 0; i < 80; ++i) {
    ASSERT_TRUE(e->write("fill" + std::to_string(i), block, WriteMode::kCreate, kChunkEvictable).ok()) << i;
  }
  EXPECT_TRUE(e->read("keep").ok());
  EXPECT_GT(e->stats().evictions, 40u);
}

TEST(ChunkEngine, MaintainEvictsDownToTheLowWaterMark) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.capacity_bytes = 4u << 20;
  p.evict_high_water = 0.5;
  p.evict_low_water = 0.25;
  auto e = open_engine(p);
  for (int i = 0; i < 48; ++i) {
    ASSERT_TRUE(
        e->write("b" + std::to_string(i), payload(i, 64 * 1024), WriteMode::kCreate, kChunkEvictable).ok());
  }
  ASSERT_TRUE(e->maintain().ok());
  EXPECT_LE(e->stats().used_slot_bytes, 1u << 20);
  EXPECT_GE(e->stats().used_slot_bytes, (1u << 20) - 64 * 1024);
}

TEST(ChunkEngine, APinnedChunkKeepsItsSlotThroughRemoveAndReuse) {
  TempDir dir;
  auto e = open_engine(params_for(dir));
  const std::string a = payload(1, 40000), b = payload(2, 40000);
  ASSERT_TRUE(e->write("a", a).ok());
  const ReadItem item{.id = "a"};
  ReadPin pin;
  e->pin(std::span(&item, 1), std::span(&pin, 1));
  ASSERT_TRUE(pin.status.ok());
  const std::string_view ids[] = {"a"};
  bool existed = false;
  ASSERT_TRUE(e->remove_batch(ids, std::span(&existed, 1)).ok());
  ASSERT_TRUE(e->write("b", b).ok());  // must not land in a's slot while it is pinned
  EXPECT_NE(e->locate("b")->second, pin.meta.offset);
  auto buf = AlignedBuffer::allocate(align_up(pin.meta.length));
  uint8_t* const ptr = buf->data();
  e->read_pinned(std::span(&pin, 1), std::span(&ptr, 1));
  ASSERT_TRUE(pin.status.ok()) << pin.status.to_string();
  EXPECT_EQ(std::string(reinterpret_cast<char*>(ptr), pin.meta.length), a);
  e->unpin(std::span(&pin, 1));
  ASSERT_TRUE(e->write("c", b).ok());
  EXPECT_EQ(e->locate("c")->second, pin.meta.offset);  // freed on unpin, reused
}

TEST(ChunkEngine, RetriedWritesWithTheSameTagApplyOnce) {
  TempDir dir;
  auto e = open_engine(params_for(dir));
  const std::string data = payload(1, 9000);
  WriteItem item{.id = "x", .data = reinterpret_cast<const uint8_t*>(data.data()), .length = 9000};
  WriteResult r1, r2, r3;
  e->write_batch(std::span(&item, 1), WriteTag{7, 1}, std::span(&r1, 1));
  e->write_batch(std::span(&item, 1), WriteTag{7, 1}, std::span(&r2, 1));
  ASSERT_TRUE(r1.status.ok() && r2.status.ok());
  EXPECT_FALSE(r1.duplicate);
  EXPECT_TRUE(r2.duplicate);
  EXPECT_EQ(r2.version, 1u);
  e->write_batch(std::span(&item, 1), WriteTag{7, 2}, std::span(&r3, 1));
  EXPECT_EQ(r3.version, 2u);
  item.expected_crc = 12345;
  e->write_batch(std::span(&item, 1), WriteTag{7, 3}, std::span(&r3, 1));
  EXPECT_EQ(r3.status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(e->stat("x")->version, 2u);
}

TEST(ChunkEngine, ConcurrentPutsOfOneKeyConvergeToOneCopy) {
  const uint64_t seed = testing::test_seed();
  TempDir dir;
  const EngineParams p = params_for(dir);
  auto e = open_engine(p);
  for (WriteMode mode : {WriteMode::kCreate, WriteMode::kOverwrite}) {
    const std::string id = mode == WriteMode::kCreate ? "kv" : "file";
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 10; ++i) {
          EXPECT_TRUE(e->write(id, payload(seed + t * 100 + i, 70000), mode, kChunkEvictable).ok());
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_EQ(e->stats().chunks, 2u);
  EXPECT_EQ(e->stats().used_slot_bytes, 2u * 96 * 1024);  // one 96 KiB slot each, the rest freed
  for (const char* id : {"kv", "file"}) {
    const std::string got = *e->read(id);
    bool matches = false;
    for (int t = 0; t < 8 && !matches; ++t) {
      for (int i = 0; i < 10 && !matches; ++i) matches = got == payload(seed + t * 100 + i, 70000);
    }
    EXPECT_TRUE(matches) << id;
  }
  EXPECT_EQ(e->stat("kv")->version, 1u);
  EXPECT_EQ(e->stat("file")->version, 80u);
  e.reset();
  e = open_engine(p);
  EXPECT_EQ(e->stats().used_slot_bytes, 2u * 96 * 1024);
}

TEST(ChunkEngine, AReopenedTargetKeepsItsIdentityAndGeometry) {
  TempDir dir;
  EngineParams p = params_for(dir);
  p.target_id = 3;
  p.chain_id = 5;
  { ASSERT_TRUE(open_engine(p)); }
  p.target_id = 9;  // ignored for an existing target: the superblock wins
  p.group_bytes = 64u << 20;
  auto e = open_engine(p);
  EXPECT_EQ(e->target_id(), 3u);
  EXPECT_EQ(e->chain_id(), 5u);
  ASSERT_TRUE(e->write("x", payload(1, 5000)).ok());
  EXPECT_EQ(e->stats().reserved_bytes, 1u << 20);
}

}  // namespace
}  // namespace fathom::storage
