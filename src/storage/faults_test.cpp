// Crash consistency under the fault-injection layer: simulated power loss during concurrent
// writes and removes (every acknowledged operation survives, nothing torn or stale appears, no
// space leaks), and chosen failures of each I/O step (the write fails cleanly, nothing leaks,
// later writes work).
#include "storage/faults.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "storage/buffer.h"
#include "storage/chunk_engine.h"
#include "storage/io.h"
#include "storage/test_util.h"

namespace fathom::storage {
namespace {

using testing::payload;
using testing::TempDir;

EngineParams fault_params(const TempDir& dir, FaultInjector* faults) {
  EngineParams p;
  p.dir = dir.sub("target");
  p.group_bytes = 1u << 20;
  p.faults = faults;
  return p;
}

// What one key may hold after the crash: its last acknowledged state, or the state of the
// operation that was in flight (unacknowledged) when the power went.
struct KeyHistory {
  std::optional<uint64_t> acked;  // payload seed, nullopt: absent
  bool in_flight = false;
  std::optional<uint64_t> pending;  // the in-flight op's state
  size_t length = 0;
};

size_t length_for(uint64_t seed) {
  return 1000 + seed % 150000;
}

TEST(PowerLoss, EveryAcknowledgedWriteSurvivesAndNothingTornOrStaleAppears) {
  const uint64_t seed = testing::test_seed();
  Rng master(seed);
  for (int round = 0; round < 3; ++round) {
    TempDir dir;
    FaultInjector faults;
    const EngineParams p = fault_params(dir, &faults);
    auto e = ChunkEngine::open(p).value();
    constexpr int kThreads = 4, kKeysPerThread = 12;
    std::vector<std::vector<KeyHistory>> hist(kThreads, std::vector<KeyHistory>(kKeysPerThread));
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t, tseed = master.next_u64()] {
        Rng rng(tseed);
        while (!stop.load()) {
          const int k = static_cast<int>(rng.below(kKeysPerThread));
          const std::string id = "t" + std::to_string(t) + "k" + std::to_string(k);
          KeyHistory& h = hist[t][k];
          h.in_flight = true;
          Status s;
          if (rng.below(5) == 0) {
            h.pending = std::nullopt;
            const std::string_view ids[] = {id};
            bool existed = false;
            s = e->remove_batch(ids, std::span(&existed, 1));
          } else {
            const uint64_t v = rng.next_u64();
            h.pending = v;
            s = e->write(id, payload(v, length_for(v)));
          }
          if (!s.ok()) break;  // the device is gone; this op stays "in flight"
          h.acked = h.pending;
          h.in_flight = false;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + master.below(200)));
    ASSERT_TRUE(faults.power_loss().ok());
    stop = true;
    for (auto& th : threads) th.join();
    e.reset();
    faults.reset();
    auto reopened = ChunkEngine::open(p);
    ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
    e = std::move(*reopened);
    uint64_t live = 0, acked_ops = 0;
    for (int t = 0; t < kThreads; ++t) {
      for (int k = 0; k < kKeysPerThread; ++k) {
        const std::string id = "t" + std::to_string(t) + "k" + std::to_string(k);
        const KeyHistory& h = hist[t][k];
        auto got = e->read(id);
        ASSERT_TRUE(got.ok() || got.status().code() == StatusCode::kNotFound) << got.status().to_string();
        std::optional<uint64_t> state;
        if (got.ok()) {
          bool known = false;
          for (auto cand : {h.acked, h.pending}) {
            if (cand && *got == payload(*cand, length_for(*cand))) state = cand, known = true;
          }
          ASSERT_TRUE(known) << id << ": content is neither the acknowledged nor the in-flight write (round "
                             << round << ")";
          ++live;
        }
        const bool ok_state = state == h.acked || (h.in_flight && state == h.pending);
        EXPECT_TRUE(ok_state) << id << " round " << round << ": acked "
                              << (h.acked ? std::to_string(*h.acked) : "absent") << ", in flight "
                              << h.in_flight;
        acked_ops += h.acked.has_value();
      }
    }
    const EngineStats st = e->stats();
    EXPECT_EQ(st.chunks, live);
    EXPECT_TRUE(e->scrub()->empty());
    // No slot is held by anything but a live chunk: write everything again and compare usage.
    uint64_t expected_slots = 0;
    for (int t = 0; t < kThreads; ++t) {
      for (int k = 0; k < kKeysPerThread; ++k) {
        auto m = e->stat("t" + std::to_string(t) + "k" + std::to_string(k));
        if (m.ok())
          expected_slots +=
              SlotAllocator::make_classes(SlotAllocator::default_slot_sizes(), 1u << 20)[m->size_class]
                  .slot_bytes;
      }
    }
    EXPECT_EQ(st.used_slot_bytes, expected_slots);
    std::printf("round %d: %llu keys live, %llu acknowledged states checked\n", round,
                static_cast<unsigned long long>(live), static_cast<unsigned long long>(acked_ops));
  }
}

struct FailureCase {
  const char* name;
  FaultRule rule;
  StatusCode expected;
};

TEST(InjectedFailures, EachFailingStepFailsTheWriteCleanlyAndLaterWritesWork) {
  const FailureCase cases[] = {
      {"data write", FaultRule{.op = FaultOp::kDataWrite, .count = -1}, StatusCode::kIoError},
      {"data sync", FaultRule{.op = FaultOp::kDataSync, .count = -1}, StatusCode::kIoError},
      {"disk full", FaultRule{.op = FaultOp::kDataAllocate, .count = -1, .error = 28 /* ENOSPC */},
       StatusCode::kResourceExhausted},
      {"metadata write", FaultRule{.op = FaultOp::kMetaWrite, .count = -1}, StatusCode::kIoError},
      {"metadata sync", FaultRule{.op = FaultOp::kMetaSync, .count = -1}, StatusCode::kIoError},
  };
  for (const FailureCase& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    FaultInjector faults;
    const EngineParams p = fault_params(dir, &faults);
    auto e = ChunkEngine::open(p).value();
    ASSERT_TRUE(e->write("old", payload(1, 300000)).ok());
    ASSERT_TRUE(e->write("x", payload(2, 5000)).ok());
    const EngineStats before = e->stats();
    faults.add_rule(c.rule);
    // Overwrite x and create y (a new class, so disk-full hits the group reservation).
    Status s1 = e->write("x", payload(3, 5000));
    Status s2 = e->write("y", payload(4, 2u << 20));
    EXPECT_EQ(s2.code(), c.expected) << s2.to_string();
    EXPECT_GE(faults.failures_injected(), 1u);
    faults.clear_rules();
    if (c.rule.op == FaultOp::kDataAllocate) {
      EXPECT_NE(s2.message().find("full"), std::string::npos) << s2.message();
    }
    // Failed writes leave the old state readable and hold no slots (except after a failed
    // metadata commit, whose new slot waits for the restart to decide).
    auto x = e->read("x");
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    EXPECT_TRUE(*x == payload(2, 5000) || (s1.ok() && *x == payload(3, 5000)));
    const bool meta_failure = c.rule.op == FaultOp::kMetaWrite || c.rule.op == FaultOp::kMetaSync;
    if (!meta_failure) {
      EXPECT_EQ(e->stats().used_slot_bytes, before.used_slot_bytes);
    } else {
      EXPECT_GE(e->stats().quarantined_slots, 1u);
    }
    Status zs = e->write("z", payload(5, 7000));
    ASSERT_TRUE(zs.ok()) << zs.to_string();
    EXPECT_EQ(*e->read("z"), payload(5, 7000));
    e.reset();
    auto again = ChunkEngine::open(p).value();
    EXPECT_EQ(again->stats().quarantined_slots, 0u);
    EXPECT_TRUE(again->scrub()->empty());
    EXPECT_EQ(*again->read("old"), payload(1, 300000));
    auto y = again->read("y");
    EXPECT_TRUE(!y.ok() || *y == payload(4, 2u << 20));
  }
}

// A full disk first takes back the emptied groups a target keeps for reuse: a reservation that
// fails with ENOSPC punches them and tries again; if the disk is still full, the put fails as
// full with nothing kept.
TEST(InjectedFailures, AFullDiskTakesBackKeptEmptyGroupsBeforeFailing) {
  TempDir dir;
  FaultInjector faults;
  const EngineParams p = fault_params(dir, &faults);  // 1 MiB groups, 1 GiB kept by default
  auto e = ChunkEngine::open(p).value();
  const std::string small = payload(1, 256 * 1024);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(e->write("s" + std::to_string(i), small).ok());
  ASSERT_TRUE(testing::remove_numbered(*e, "s", 0, 8).ok());
  ASSERT_EQ(e->stats().empty_group_bytes, 2u << 20);
  // One ENOSPC: the kept groups go, the retry reserves the new class's group.
  faults.add_rule(FaultRule{.op = FaultOp::kDataAllocate, .count = 1, .error = 28 /* ENOSPC */});
  const std::string big = payload(2, 3u << 19);
  ASSERT_TRUE(e->write("b0", big).ok());
  EXPECT_EQ(faults.failures_injected(), 1u);
  EXPECT_EQ(e->stats().empty_group_bytes, 0u);
  EXPECT_EQ(*e->read("b0"), big);
  // Kept groups again, and a disk that stays full: the put fails as full and keeps nothing.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->write("t" + std::to_string(i), small).ok());
  ASSERT_TRUE(testing::remove_numbered(*e, "t", 0, 4).ok());
  ASSERT_EQ(e->stats().empty_group_bytes, 1u << 20);
  faults.add_rule(FaultRule{.op = FaultOp::kDataAllocate, .count = -1, .error = 28});
  const Status s = e->write("b1", big);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("full"), std::string::npos) << s.message();
  // The first try, the retry after the punch, and one more after eviction found nothing to evict.
  EXPECT_EQ(faults.failures_injected(), 4u);
  EXPECT_EQ(e->stats().empty_group_bytes, 0u);
  faults.clear_rules();
  EXPECT_TRUE(e->write("b1", big).ok());
  EXPECT_EQ(*e->read("b0"), big);
}

TEST(InjectedFailures, AFailedReadReturnsAnErrorNotData) {
  TempDir dir;
  FaultInjector faults;
  auto e = ChunkEngine::open(fault_params(dir, &faults)).value();
  ASSERT_TRUE(e->write("a", payload(1, 8192)).ok());
  faults.add_rule(FaultRule{.op = FaultOp::kDataRead, .count = 1});
  EXPECT_EQ(e->read("a").status().code(), StatusCode::kIoError);
  EXPECT_EQ(*e->read("a"), payload(1, 8192));
}

// DataFiles::run's completion callback, on both backends: called once for every op, an injected
// failure included, and only once the op is final (a read's bytes are in its buffer by then).
TEST(DataFiles, ReportsEveryOpOnceWhenItIsFinal) {
  for (IoBackend backend : {IoBackend::kUring, IoBackend::kPsync}) {
    SCOPED_TRACE(std::string(io_backend_name(backend)));
    TempDir dir;
    FaultInjector faults;
    auto files = DataFiles::open({.dir = dir.sub("data"), .backend = backend, .faults = &faults}).value();
    const int f = files->open_file("class00.dat").value();
    constexpr int kOps = 9;
    constexpr uint32_t kLen = 8192;
    ASSERT_TRUE(files->allocate(f, 0, uint64_t{kOps} * kLen).ok());
    AlignedBuffer out = AlignedBuffer::allocate(size_t{kOps} * kLen).value();
    AlignedBuffer in = AlignedBuffer::allocate(size_t{kOps} * kLen).value();
    std::vector<IoOp> ops(kOps);
    for (int i = 0; i < kOps; ++i) {
      const std::string p = payload(static_cast<uint64_t>(i) + 1, kLen);
      std::memcpy(out.data() + size_t{kLen} * i, p.data(), kLen);
      ops[i] = IoOp{.file = f, .write = true, .offset = uint64_t{kLen} * i, .buf = out.data() + size_t{kLen} * i,
                    .length = kLen};
    }
    ASSERT_TRUE(files->run(ops).ok());
    ASSERT_TRUE(files->sync(f).ok());
    for (int i = 0; i < kOps; ++i) {
      ops[i].write = false;
      ops[i].buf = in.data() + size_t{kLen} * i;
    }
    std::memset(in.data(), 0, in.size());
    faults.add_rule(FaultRule{.op = FaultOp::kDataRead, .skip = 3, .count = 1});  // the fourth read fails
    std::vector<int> calls(kOps, 0);
    const Status st = files->run(ops, [&](size_t i) {
      ++calls[i];
      if (ops[i].status.ok()) {
        EXPECT_EQ(0, std::memcmp(ops[i].buf, out.data() + size_t{kLen} * i, kLen)) << "op " << i;
      }
    });
    EXPECT_FALSE(st.ok());
    for (int i = 0; i < kOps; ++i) EXPECT_EQ(calls[i], 1) << "op " << i;
    EXPECT_EQ(std::count_if(ops.begin(), ops.end(), [](const IoOp& op) { return !op.status.ok(); }), 1);
  }
}

TEST(InjectedFailures, RulesSkipAndCountAndMatchPaths) {
  FaultInjector f;
  f.add_rule(FaultRule{.op = FaultOp::kDataWrite, .skip = 2, .count = 2, .path_contains = "class03"});
  int failed = 0;
  for (int i = 0; i < 10; ++i)
    failed += f.check(FaultOp::kDataWrite, "/t/data/class03_16384.dat").ok() ? 0 : 1;
  EXPECT_EQ(failed, 2);
  EXPECT_TRUE(f.check(FaultOp::kDataWrite, "/t/data/class04_24576.dat").ok());
  EXPECT_TRUE(f.check(FaultOp::kDataSync, "/t/data/class03_16384.dat").ok());
  ASSERT_TRUE(f.power_loss().ok());
  EXPECT_FALSE(f.check(FaultOp::kDataRead, "x").ok());
  f.reset();
  EXPECT_TRUE(f.check(FaultOp::kDataRead, "x").ok());
}

}  // namespace
}  // namespace fathom::storage
