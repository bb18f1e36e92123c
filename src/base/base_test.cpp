// Tests for base/: Status/Result/TRY, the thread pool, parsing helpers, mmap, cpu features.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "base/cpu.h"
#include "base/fs.h"
#include "base/mmap.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/strings.h"
#include "base/thread_pool.h"

namespace fathom {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value {} is not positive", v);
  return v;
}

Result<int> doubled(int v) {
  int x = TRY(parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b) {
  TRY(parse_positive(a));
  TRY(parse_positive(b));
  return {};
}

Result<std::unique_ptr<int>> make_owned(int v) {
  if (v < 0) return out_of_range("negative");
  return std::make_unique<int>(v);
}

Result<int> unwrap_owned(int v) {
  std::unique_ptr<int> p = TRY(make_owned(v));
  return *p + 1;
}

TEST(Status, TryPropagatesErrorsAndYieldsValues) {
  EXPECT_EQ(*doubled(4), 8);
  Result<int> bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "value -1 is not positive");
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(1, 0).to_string(), "invalid argument: value 0 is not positive");
  EXPECT_EQ(*unwrap_owned(41), 42);
  EXPECT_EQ(unwrap_owned(-1).status().code(), StatusCode::kOutOfRange);
}

TEST(Status, WithContextPrefixesTheMessage) {
  Status s = corrupt("bad header").with_context("model.safetensors");
  EXPECT_EQ(s.message(), "model.safetensors: bad header");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(errno_status(ENOENT, "open 'x'").code(), StatusCode::kNotFound);
  EXPECT_EQ(errno_status(ENOSPC, "write").code(), StatusCode::kResourceExhausted);
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  Result<int> r = invalid_argument("nope");
  EXPECT_DEATH((void)r.value(), "nope");
}

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  auto pool = ThreadPool::create(4);
  for (int round = 0; round < 200; ++round) {
    const int n = 1 + round * 7 % 97;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool->run(n, [&](int64_t t, int thread) {
      EXPECT_GE(thread, 0);
      EXPECT_LT(thread, 4);
      hits[static_cast<size_t>(t)].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

// Both forms run every task once on the pool's threads; run_from_both_ends_ahead also tells each
// step the task its thread runs right after it (-1 when the runner has none left: then the thread
// runs nothing more or starts another runner's first task), and a runner from the front runs
// ascending tasks, one from the back descending.
TEST(ThreadPool, RunFromBothEndsRunsEveryTaskExactlyOnceAndKnowsItsNext) {
  for (int threads : {1, 2, 3, 4}) {
    auto pool = ThreadPool::create(threads);
    for (int round = 0; round < 100; ++round) {
      const int n = round * 11 % 89;  // 0 included
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n)), hits_ahead(static_cast<size_t>(n));
      std::vector<std::vector<ThreadPool::BothEndsStep>> seen(static_cast<size_t>(threads));
      pool->run_from_both_ends(n, [&](int64_t t, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, threads);
        hits[static_cast<size_t>(t)].fetch_add(1);
      });
      pool->run_from_both_ends_ahead(n, [&](const ThreadPool::BothEndsStep& step, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits_ahead[static_cast<size_t>(step.task)].fetch_add(1);
        seen[static_cast<size_t>(thread)].push_back(step);  // only this thread touches its list
      });
      for (size_t t = 0; t < hits.size(); ++t) {
        ASSERT_EQ(hits[t].load(), 1) << threads << " threads, " << n << " tasks";
        ASSERT_EQ(hits_ahead[t].load(), 1) << threads << " threads, " << n << " tasks (ahead)";
      }
      for (const auto& list : seen) {
        for (size_t i = 0; i < list.size(); ++i) {
          const ThreadPool::BothEndsStep& st = list[i];
          if (st.next < 0) continue;
          ASSERT_LT(i + 1, list.size()) << "a next task that this thread never ran";
          EXPECT_EQ(list[i + 1].task, st.next);
          EXPECT_EQ(list[i + 1].from_front, st.from_front);
          EXPECT_EQ(st.next > st.task, st.from_front);
        }
        if (!list.empty()) {
          EXPECT_EQ(list.back().next, -1);
        }
      }
    }
  }
}

// With two threads, one claims from each end: the first task the back's runner takes is the last
// one, while the front's runner is still on task 0 (it waits there until the back has started).
TEST(ThreadPool, RunFromBothEndsStartsAtBothEnds) {
  auto pool = ThreadPool::create(2);
  std::atomic<bool> back_started{false};
  std::atomic<int64_t> first_other{-1};
  pool->run_from_both_ends(10, [&](int64_t t, int) {
    if (t == 0) {
      while (!back_started.load()) std::this_thread::yield();
    } else if (!back_started.exchange(true)) {
      first_other.store(t);
    }
  });
  EXPECT_EQ(first_other.load(), 9);
}

// A worker that saw job g but reads its function and size only once run() has published job
// g+1's must not claim a task of g+1 under g's tag: the task would run twice and count twice, and
// run() could return while a task of its job still runs. The test hook widens both sides of that
// window: a worker pauses after seeing a job, so the caller runs a 2-task job alone and is setting
// up the next, 64-task job when the worker reads; the caller pauses before opening that job.
TEST(ThreadPool, ALaggingWorkerNeverClaimsATaskOfTheNextJob) {
  struct Hook {
    Hook() {
      pool_testing::g_race_window.store(+[](int thread) {
        std::this_thread::sleep_for(std::chrono::microseconds(thread == 0 ? 40 : 10 + thread * 3));
      });
    }
    ~Hook() { pool_testing::g_race_window.store(nullptr); }
  } hook;
  auto pool = ThreadPool::create(8);
  std::vector<std::atomic<int>> hits(64);
  for (int job = 0; job < 4000; ++job) {
    const int n = job % 2 == 0 ? 2 : 64;
    for (int t = 0; t < n; ++t) hits[static_cast<size_t>(t)].store(0);
    pool->run(n, [&hits, n, job](int64_t t, int) {
      ASSERT_LT(t, n) << "job " << job;
      hits[static_cast<size_t>(t)].fetch_add(1);
    });
    for (int t = 0; t < n; ++t) ASSERT_EQ(hits[static_cast<size_t>(t)].load(), 1) << "job " << job << " task " << t;
  }
}

TEST(ThreadPool, ParallelForCoversTheRangeInChunks) {
  auto pool = ThreadPool::create(3);
  std::vector<int> v(10007, 0);
  pool->parallel_for(static_cast<int64_t>(v.size()), 100, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)] += 1;
  });
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 10007);
}

TEST(ThreadPool, NestedRunExecutesInline) {
  auto pool = ThreadPool::create(2);
  std::atomic<int> total{0};
  pool->run(4, [&](int64_t, int) { pool->run(3, [&](int64_t, int) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 12);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  auto pool = ThreadPool::create(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 100; ++i) pool->run(5, [&](int64_t, int) { total.fetch_add(1); });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 1500);
}

TEST(Strings, Utf8BoundariesNeverSplitACharacter) {
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";  // a é € 😀 z: 1+2+3+4+1 bytes
  const size_t starts[] = {0, 1, 3, 6, 10, 11};                    // character starts (and the end)
  for (size_t n = 0; n <= s.size() + 2; ++n) {
    size_t floor = 0, ceil = s.size();
    for (size_t b : starts) {
      if (b <= n) floor = b;
      if (b >= n && b < ceil) ceil = b;
    }
    EXPECT_EQ(utf8_floor(s, n), std::min(floor, s.size())) << n;
    EXPECT_EQ(utf8_ceil(s, n), n >= s.size() ? s.size() : ceil) << n;
  }
  EXPECT_EQ(utf8_floor("", 5), 0u);
  EXPECT_EQ(utf8_ceil("", 0), 0u);
}

TEST(Strings, JsonNestingDepthCountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth(""), 0u);
  EXPECT_EQ(json_nesting_depth("12"), 0u);
  EXPECT_EQ(json_nesting_depth("[]"), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[{{{"})"), 1u);              // brackets in a string
  EXPECT_EQ(json_nesting_depth(R"({"a": "\"[[[", "b": [[]]})"), 3u);  // an escaped quote
  EXPECT_EQ(json_nesting_depth(R"(["\\", [["x"]]])"), 3u);            // an escaped backslash
  EXPECT_EQ(json_nesting_depth("]]]][[]"), 2u);                        // stray closers
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(json_nesting_depth(deep, 100000), 100000u);
  EXPECT_EQ(json_nesting_depth(deep), kJsonNestingMax + 1);  // stops once past the limit
  EXPECT_EQ(json_nesting_depth(std::string(kJsonNestingMax, '{')), kJsonNestingMax);
}

TEST(Strings, ParsesNumbersStrictly) {
  EXPECT_EQ(*parse_int("-12", "n"), -12);
  EXPECT_FALSE(parse_int("12x", "n").ok());
  EXPECT_FALSE(parse_int("", "n").ok());
  EXPECT_EQ(parse_uint("-1", "--layers").status().message(), "--layers: '-1' is not a non-negative integer");
  EXPECT_DOUBLE_EQ(*parse_double("0.5", "t"), 0.5);
  EXPECT_FALSE(parse_double("nan", "t").ok());
  EXPECT_EQ(*parse_size("2M", "s"), 2u << 20);
  EXPECT_EQ(*parse_size("1.5G", "s"), 3ull << 29);
  EXPECT_EQ(*parse_size("4096", "s"), 4096u);
  auto list = parse_int_list("1, 2,3", "tokens");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

TEST(MappedFile, MapsFilesAndReportsMissingOnes) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/mapped.bin";
  ASSERT_TRUE(write_file_atomic(path, "hello").ok());
  auto m = MappedFile::open(path);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*m)->data()), 5), "hello");
  ASSERT_TRUE(write_file_atomic(dir + "/empty.bin", "").ok());
  auto e = MappedFile::open(dir + "/empty.bin");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->size(), 0u);
  auto missing = MappedFile::open(dir + "/does-not-exist");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist"), std::string::npos);
}

TEST(MappedFile, ReadModeHoldsTheSameBytesAsTheMapping) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/read-mode.bin";
  Rng rng(std::random_device{}());                      // any bytes: the check is equality
  std::string bytes((size_t{64} << 20) + 12345, '\0');  // more than one 64 MiB read piece
  for (auto& c : bytes) c = static_cast<char>(rng.next_u64());
  ASSERT_TRUE(write_file_atomic(path, bytes).ok());
  auto mapped = MappedFile::open(path, LoadMode::kMap);
  auto read = MappedFile::open(path, LoadMode::kRead);
  ASSERT_TRUE(mapped.ok() && read.ok()) << read.status().to_string();
  EXPECT_EQ((*read)->mode(), LoadMode::kRead);
  ASSERT_EQ((*read)->size(), bytes.size());
  EXPECT_EQ(0, std::memcmp((*read)->data(), (*mapped)->data(), bytes.size()));
  (*read)->advise(0, bytes.size(), MapAdvice::kWillNeed);  // no-op, not a crash
  (*read)->prefault(0, bytes.size());
  // the default mode follows set_default_load_mode; empty and missing files as in map mode
  set_default_load_mode(LoadMode::kRead);
  ASSERT_TRUE(write_file_atomic(dir + "/empty-read.bin", "").ok());
  auto e = MappedFile::open(dir + "/empty-read.bin");
  auto missing = MappedFile::open(dir + "/does-not-exist");
  set_default_load_mode(LoadMode::kMap);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->mode(), LoadMode::kRead);  // open(path) took the default
  EXPECT_EQ((*e)->size(), 0u);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto mapped_again = MappedFile::open(path);
  ASSERT_TRUE(mapped_again.ok());
  EXPECT_EQ((*mapped_again)->mode(), LoadMode::kMap);
  std::filesystem::remove(path);
}

// kRead places the requested file byte on a cache line (a format's data section) and holds the
// same bytes as the mapping wherever that puts the copy; the mapping itself starts on a page.
TEST(MappedFile, ReadModePutsTheRequestedByteOnACacheLine) {
  const std::string path = testing::TempDir() + "/aligned-read.bin";
  Rng rng(std::random_device{}());
  std::string bytes(10000 + rng.below(5000), '\0');
  for (auto& c : bytes) c = static_cast<char>(rng.next_u64());
  ASSERT_TRUE(write_file_atomic(path, bytes).ok());
  auto mapped = MappedFile::open(path, LoadMode::kMap, 56);  // the mapping ignores align_at
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*mapped)->data()) % 4096, 0u);
  for (uint64_t at : {uint64_t{0}, uint64_t{1}, uint64_t{8}, uint64_t{56}, uint64_t{63}, uint64_t{64},
                      uint64_t{4103}, rng.below(10000)}) {
    auto read = MappedFile::open(path, LoadMode::kRead, at);
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*read)->data() + at) % kCacheLine, 0u) << "align_at " << at;
    ASSERT_EQ((*read)->size(), bytes.size());
    EXPECT_EQ(0, std::memcmp((*read)->data(), bytes.data(), bytes.size())) << "align_at " << at;
  }
  std::filesystem::remove(path);
}

TEST(Cpu, LevelIsCappedAndNamed) {
  const SimdLevel supported = simd_level_supported();
  set_simd_level_cap(SimdLevel::kScalar);
  EXPECT_EQ(simd_level(), SimdLevel::kScalar);
  set_simd_level_cap(SimdLevel::kAvx512Bf16);
  EXPECT_EQ(simd_level(), supported);
  EXPECT_EQ(*parse_simd_level("avx2"), SimdLevel::kAvx2);
  EXPECT_FALSE(parse_simd_level("sse9").ok());
  EXPECT_FALSE(cpu_features().to_string().empty());
}

TEST(Rng, IsDeterministicForASeed) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) {
    uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, c.next_u64());
  }
  EXPECT_EQ(counter_uniform(1, 2, 3), counter_uniform(1, 2, 3));
  float lo = 1, hi = -1;
  for (uint64_t i = 0; i < 10000; ++i) {
    float v = counter_uniform(7, 9, i);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -1.0f);
  EXPECT_LT(hi, 1.0f);
  EXPECT_LT(lo, -0.99f);
  EXPECT_GT(hi, 0.99f);
}

}  // namespace
}  // namespace fathom
