// The storage service as users run it: the `fathom store server` process and the CLI. Covers
// readiness and graceful SIGTERM, kill -9 during concurrent puts (every acknowledged put
// survives the restart intact; unacknowledged ones are absent or whole), bytes flipped on disk
// (reported as corruption by reads and by `store verify`), a capacity-capped target (file puts
// fail with a distinct error and resume after rm; cache blocks are evicted instead), the file
// and KV commands, and a short `store bench` run against fio.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "base/fs.h"
#include "base/rng.h"
#include "process.h"
#include "storage/storage.h"

namespace fathom::storage::e2e {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = (fs::temp_directory_path() /
             ("fathom-store-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(n_++)))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string sub(const std::string& s) const { return path_ + "/" + s; }

 private:
  static inline std::atomic<int> n_{0};
  std::string path_;
};

std::string payload(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng.next_u64());
  return s;
}

std::span<const uint8_t> bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

uint64_t seed_from_env() {
  uint64_t seed = std::random_device{}();
  if (const char* e = std::getenv("FATHOM_TEST_SEED")) seed = std::strtoull(e, nullptr, 10);
  std::printf("seed %llu (FATHOM_TEST_SEED to replay)\n", static_cast<unsigned long long>(seed));
  return seed;
}

std::unique_ptr<StorageClient> connect(const std::string& addr) {
  auto c = StorageClient::connect(ClientParams{.servers = {addr}, .retries = 2});
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(*c) : nullptr;
}

KvKey key_of(uint64_t n) {
  KvKey k{};
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = splitmix64(n * 4 + w);
    std::memcpy(k.data() + 8 * w, &v, 8);
  }
  return k;
}
size_t kv_length(uint64_t n) {
  return 4096 + (n * 7919) % 300000;
}

TEST(StoreServerProcess, SignalsReadinessAnswersHealthAndStopsGracefullyOnSigterm) {
  TempDir dir;
  ServerProcess server;
  ASSERT_TRUE(server.start({"--target", dir.sub("t0"), "--target", dir.sub("t1")})) << server.log();
  RunResult h = run({"store", "health", "--server", server.address(), "--json"});
  ASSERT_EQ(h.exit_code, 0) << h.err;
  const auto j = nlohmann::json::parse(h.out.substr(h.out.rfind('{', h.out.find("\"servers\""))));
  ASSERT_EQ(j["servers"][0]["targets"].size(), 2u);
  EXPECT_TRUE(j["servers"][0]["ready"].get<bool>());
  EXPECT_EQ(j["servers"][0]["targets"][0]["path"], fs::absolute(dir.sub("t0")).string());
  // Files and KV blocks through the CLI.
  const std::string local = dir.sub("in.bin");
  { std::ofstream(local, std::ios::binary) << payload(1, 5'000'000); }
  ASSERT_EQ(run({"store", "put", local, "models/a.bin", "--server", server.address(), "--chunk-size", "1M"})
                .exit_code,
            0);
  ASSERT_EQ(run({"store", "get", "models/a.bin", dir.sub("out.bin"), "--server", server.address()}).exit_code,
            0);
  EXPECT_EQ(*read_file(dir.sub("out.bin")), payload(1, 5'000'000));
  RunResult ls = run({"store", "ls", "models/", "--server", server.address()});
  EXPECT_NE(ls.out.find("models/a.bin"), std::string::npos);
  RunResult st = run({"store", "stat", "models/a.bin", "--server", server.address(), "--json"});
  EXPECT_NE(st.out.find("\"chunks\":5"), std::string::npos) << st.out;
  const std::string k1 = std::string(64, 'a'), k2 = std::string(64, 'b');
  ASSERT_EQ(run({"store", "kv", "put", k1, "-", "--server", server.address()}, "page-bytes").exit_code, 0);
  RunResult got = run({"store", "kv", "get", k1, "--server", server.address()});
  EXPECT_EQ(got.out, "page-bytes");
  EXPECT_EQ(run({"store", "kv", "get", k2, "--server", server.address()}).exit_code, 3);  // a miss
  EXPECT_EQ(run({"store", "kv", "prefix", k1, k2, k1, "--server", server.address()}).out, "1\n");
  RunResult bad = run({"store", "kv", "get", "xyz", "--server", server.address()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("64"), std::string::npos) << bad.err;
  EXPECT_EQ(run({"store", "rm", "models/a.bin", "--server", server.address()}).exit_code, 0);
  RunResult gone = run({"store", "stat", "models/a.bin", "--server", server.address()});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_NE(gone.err.find("not found"), std::string::npos);
  server.kill(SIGTERM);
  EXPECT_EQ(server.wait(), 0) << server.log();
  EXPECT_NE(server.log().find("stopped"), std::string::npos);
  RunResult v = run({"store", "verify", dir.sub("t0"), dir.sub("t1")});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(StoreServerProcess, KillNineDuringConcurrentPutsLosesNoAcknowledgedPut) {
  const uint64_t seed = seed_from_env();
  Rng rng(seed);
  TempDir dir;
  const std::vector<std::string> targets = {"--target", dir.sub("t0"), "--target", dir.sub("t1")};
  std::mutex mu;
  std::vector<uint64_t> acked_kv, inflight_kv;
  std::vector<std::pair<std::string, uint64_t>> acked_files, inflight_files;
  std::atomic<uint64_t> next_key{seed % 1000000 * 1000};
  for (int round = 0; round < 3; ++round) {
    ServerProcess server;
    ASSERT_TRUE(server.start(targets)) << server.log();
    auto client = connect(server.address());
    ASSERT_TRUE(client);
    KvCache kv(*client);
    FileStore files(*client, FileStoreParams{.chunk_bytes = 256 * 1024, .parallel = 2});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0;; ++i) {
          if (t == 3) {  // a file writer
            const std::string path = fmt::format("r{}/f{}", round, i);
            const uint64_t s = seed + round * 100000 + i;
            {
              std::lock_guard lock(mu);
              inflight_files.emplace_back(path, s);
            }
            if (!files.put_bytes(bytes(payload(s, 100000 + i * 37000 % 900000)), path).ok()) return;
            std::lock_guard lock(mu);
            acked_files.emplace_back(path, s);
            continue;
          }
          const uint64_t n = next_key++;
          {
            std::lock_guard lock(mu);
            inflight_kv.push_back(n);
          }
          if (!kv.put(key_of(n), bytes(payload(n, kv_length(n)))).ok()) return;
          std::lock_guard lock(mu);
          acked_kv.push_back(n);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng.below(400)));
    server.kill(SIGKILL);
    for (auto& th : threads) th.join();
  }
  ServerProcess server;
  ASSERT_TRUE(server.start(targets)) << server.log();
  auto client = connect(server.address());
  KvCache kv(*client);
  FileStore files(*client);
  std::set<uint64_t> acked(acked_kv.begin(), acked_kv.end());
  size_t present_unacked = 0;
  for (uint64_t n : inflight_kv) {
    auto v = kv.get(key_of(n));
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    if (acked.count(n)) {
      ASSERT_TRUE(v->has_value()) << "acknowledged block " << n << " lost";
    }
    if (v->has_value()) {
      ASSERT_EQ(std::string((*v)->begin(), (*v)->end()), payload(n, kv_length(n))) << "block " << n;
      present_unacked += acked.count(n) ? 0 : 1;
    }
  }
  std::set<std::string> acked_paths;
  for (auto& [path, s] : acked_files) acked_paths.insert(path);
  for (auto& [path, s] : inflight_files) {
    auto data = files.get_bytes(path);
    if (acked_paths.count(path)) {
      ASSERT_TRUE(data.ok()) << path << ": " << data.status().to_string();
    }
    if (data.ok()) {
      const size_t i = std::stoul(path.substr(path.find("/f") + 2));
      ASSERT_EQ(std::string(data->begin(), data->end()), payload(s, 100000 + i * 37000 % 900000)) << path;
    } else {
      EXPECT_EQ(data.status().code(), StatusCode::kNotFound) << path << ": " << data.status().to_string();
    }
  }
  std::printf("%zu acknowledged blocks and %zu files checked; %zu unacknowledged blocks made it\n",
              acked_kv.size(), acked_files.size(), present_unacked);
  EXPECT_GT(acked_kv.size(), 0u);
  server.kill(SIGTERM);
  EXPECT_EQ(server.wait(), 0);
  RunResult v = run({"store", "verify", dir.sub("t0"), dir.sub("t1")});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(StoreServerProcess, FlippedBytesOnDiskAreReportedAsCorruption) {
  TempDir dir;
  const std::string key(64, 'c');
  {
    ServerProcess server;
    ASSERT_TRUE(server.start({"--target", dir.sub("t0")})) << server.log();
    ASSERT_EQ(
        run({"store", "kv", "put", key, "-", "--server", server.address()}, payload(3, 100000)).exit_code, 0);
    server.kill(SIGTERM);
    ASSERT_EQ(server.wait(), 0);
  }
  // The block is the only chunk of its class, at offset 0 of that class's data file.
  std::string data_file;
  for (const auto& e : fs::directory_iterator(dir.sub("t0/data"))) {
    if (fs::file_size(e.path()) > 0 && e.path().filename().string().find("_131072") != std::string::npos)
      data_file = e.path();
  }
  ASSERT_FALSE(data_file.empty());
  {
    std::fstream f(data_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    char c = 0;
    f.get(c);
    f.seekp(5000);
    f.put(static_cast<char>(c ^ 0x01));
  }
  ServerProcess server;
  ASSERT_TRUE(server.start({"--target", dir.sub("t0")})) << server.log();
  RunResult got = run({"store", "kv", "get", key, "--server", server.address()});
  EXPECT_EQ(got.exit_code, 1);
  EXPECT_TRUE(got.out.empty()) << "corrupt data was returned";
  EXPECT_NE(got.err.find("CRC32C"), std::string::npos) << got.err;
  server.kill(SIGTERM);
  ASSERT_EQ(server.wait(), 0);
  RunResult v = run({"store", "verify", dir.sub("t0")});
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.out.find("1 corrupt"), std::string::npos) << v.out;
}

TEST(StoreServerProcess, FullTargetRefusesFilePutsDistinctlyAndEvictsCacheBlocks) {
  TempDir dir;
  {
    ServerProcess server;
    ASSERT_TRUE(server.start({"--target", dir.sub("files"), "--capacity", "8M", "--group-size", "1M"}))
        << server.log();
    const std::string local = dir.sub("one-mib");
    { std::ofstream(local, std::ios::binary) << payload(4, 1 << 20); }
    int stored = 0;
    RunResult last;
    for (; stored < 20; ++stored) {
      last = run({"store", "put", local, "f" + std::to_string(stored), "--chunk-size", "1M", "--server",
                  server.address()});
      if (last.exit_code != 0) break;
    }
    EXPECT_EQ(stored, 7);  // 7 one-MiB groups of data + 1 group of inode records
    EXPECT_EQ(last.exit_code, 1);
    EXPECT_NE(last.err.find("is full"), std::string::npos) << last.err;
    RunResult ls = run({"store", "ls", "--server", server.address()});
    EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), 7) << ls.out;  // nothing half-written
    EXPECT_EQ(run({"store", "rm", "f0", "--server", server.address()}).exit_code, 0);
    EXPECT_EQ(
        run({"store", "put", local, "again", "--chunk-size", "1M", "--server", server.address()}).exit_code,
        0);
    EXPECT_EQ(run({"store", "get", "again", dir.sub("back"), "--server", server.address()}).exit_code, 0);
    EXPECT_EQ(*read_file(dir.sub("back")), payload(4, 1 << 20));
  }
  ServerProcess server;
  ASSERT_TRUE(server.start({"--target", dir.sub("cache"), "--capacity", "4M", "--group-size", "1M"}))
      << server.log();
  auto client = connect(server.address());
  KvCache kv(*client);
  for (uint64_t n = 0; n < 40; ++n) ASSERT_TRUE(kv.put(key_of(n), bytes(payload(n, 512 * 1024))).ok()) << n;
  auto h = client->health(0);
  EXPECT_GE(h->targets[0].evictions, 32u);
  EXPECT_LE(h->targets[0].reserved_bytes, 4u << 20);
  EXPECT_TRUE(kv.get(key_of(39))->has_value());  // the newest is there
}

// A real disk-full: a small ext4 filesystem on a loop device (root only; skipped elsewhere).
TEST(StoreServerProcess, ARealFullDiskFailsPutsDistinctlyAndRemovalResumesThem) {
  if (::geteuid() != 0) GTEST_SKIP() << "a loop mount needs root";
  TempDir dir;
  const std::string image = dir.sub("disk.img"), mnt = dir.sub("mnt");
  fs::create_directories(mnt);
  const std::string setup = fmt::format(
      "truncate -s 32M {0} && mkfs.ext4 -q -F {0} >/dev/null 2>&1 && mount -o loop {0} {1}", image, mnt);
  if (std::system(setup.c_str()) != 0) GTEST_SKIP() << "loop devices are not available here";
  struct Unmount {
    std::string mnt;
    ~Unmount() { (void)!std::system(fmt::format("umount {} 2>/dev/null", mnt).c_str()); }
  } unmount{mnt};
  ServerProcess server;
  ASSERT_TRUE(server.start({"--target", mnt + "/t0", "--group-size", "1M", "--keep-empty", "1G"}))
      << server.log();
  const std::string local = dir.sub("one-mib");
  { std::ofstream(local, std::ios::binary) << payload(5, 1 << 20); }
  int stored = 0;
  RunResult last;
  for (; stored < 100; ++stored) {
    last = run({"store", "put", local, "f" + std::to_string(stored), "--chunk-size", "1M", "--server",
                server.address()});
    if (last.exit_code != 0) break;
  }
  EXPECT_GE(stored, 5);  // RocksDB preallocates its WAL and ext4 keeps a journal
  EXPECT_LT(stored, 32);
  EXPECT_EQ(last.exit_code, 1);
  EXPECT_NE(last.err.find("no space"), std::string::npos) << last.err;
  std::printf("%d files stored before: %s", stored, last.err.c_str());
  RunResult ls = run({"store", "ls", "--server", server.address()});
  EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), stored) << ls.out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(run({"store", "rm", "f" + std::to_string(i), "--server", server.address()}).exit_code, 0);
  }
  RunResult again = run({"store", "put", local, "again", "--chunk-size", "1M", "--server", server.address()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  // (ASSERT: a failed get must end the test before read_file's error is dereferenced, so the
  // server is stopped and the loop device unmounted by the destructors.)
  ASSERT_EQ(run({"store", "get", "again", dir.sub("back"), "--server", server.address()}).exit_code, 0);
  EXPECT_EQ(*read_file(dir.sub("back")), payload(5, 1 << 20));
  // The two groups the removals emptied and "again" did not reuse stay allocated for 1 MiB chunks;
  // 512 KiB chunks need a group of their own, which the full disk has room for only once the kept
  // groups are given back (fallocate fails with ENOSPC, the kept groups are punched, it retries).
  RunResult other =
      run({"store", "put", local, "halves", "--chunk-size", "512K", "--server", server.address()});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  ASSERT_EQ(run({"store", "get", "halves", dir.sub("back2"), "--server", server.address()}).exit_code, 0);
  EXPECT_EQ(*read_file(dir.sub("back2")), payload(5, 1 << 20));
  server.kill(SIGTERM);
  EXPECT_EQ(server.wait(), 0) << server.log();
  RunResult v = run({"store", "verify", mnt + "/t0"});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(StoreBench, ReportsThroughputAndRatiosAgainstFio) {
  TempDir dir;
  RunResult r =
      run({"store", "bench", "--dir", dir.sub("bench"), "--bytes", "8M", "--block-size", "1M", "--batch", "4",
           "--threads", "2", "--rand-seconds", "0.25", "--rand-bytes", "1M", "--request-split", "2M", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('{', r.out.rfind("\"block_bytes\"")));
  const auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["request_split_bytes"], 2u << 20);  // each batch of four 1 MiB blocks went as two requests
  EXPECT_GT(j["put"]["gbs"].get<double>(), 0);
  EXPECT_GT(j["get"]["gbs"].get<double>(), 0);
  EXPECT_GT(j["rand4k_get"]["iops"].get<double>(), 0);
  EXPECT_TRUE(j["fio_write"]["ok"].get<bool>()) << j["fio_write"].dump();
  EXPECT_GT(j["get_fraction_of_fio"].get<double>(), 0);
  EXPECT_GT(j["put_fraction_of_fio"].get<double>(), 0);
  EXPECT_GT(j["rand4k_iops_fraction_of_fio"].get<double>(), 0);
}

}  // namespace
}  // namespace fathom::storage::e2e
