// Helpers shared by the storage unit tests: temporary directories and deterministic payloads.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/rng.h"
#include "base/status.h"

namespace fathom::storage::testing {

// A fresh directory under $TMPDIR, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("fathom-storage-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Bytes that depend on (seed, n) only, so a reader can tell which write it is looking at.
inline std::string payload(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  Rng rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng.next_u64();
    for (size_t k = 0; k < 8 && i + k < n; ++k) s[i + k] = static_cast<char>(v >> (8 * k));
  }
  return s;
}

// A seed printed with the test so a failure can be replayed (FATHOM_TEST_SEED overrides).
inline uint64_t test_seed() {
  uint64_t seed = 0;
  if (const char* env = std::getenv("FATHOM_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    seed = std::random_device{}();
  }
  std::printf("seed %llu (FATHOM_TEST_SEED to replay)\n", static_cast<unsigned long long>(seed));
  return seed;
}

// Removes the chunks prefix + i for i in [from, to) in one batch (an engine's remove_batch).
template <class Engine>
Status remove_numbered(Engine& e, const std::string& prefix, int from, int to) {
  std::vector<std::string> ids;
  for (int i = from; i < to; ++i) ids.push_back(prefix + std::to_string(i));
  const std::vector<std::string_view> views(ids.begin(), ids.end());
  const auto existed = std::make_unique<bool[]>(views.size());
  return e.remove_batch(views, std::span(existed.get(), views.size()));
}

}  // namespace fathom::storage::testing
