// The prefix-hash byte layout (docs/kvcache.md) pinned against values computed independently with
// Python's hashlib from the documented layout, plus the properties the engine relies on.
#include <gtest/gtest.h>

#include <vector>

#include "kvcache/kvcache.h"

namespace fathom {
namespace {

// Computed with hashlib.sha256 over the byte layouts written in docs/kvcache.md.
constexpr const char* kFingerprint = "81af731c9cf2dacc649f3762a259fea22130eeaa5cb27cd3645977f89f4716c5";
constexpr const char* kSeedBf16 = "1eafb174e149394743050a5482d6ba51f3c4a6e21f58a58a75465eacb7d0bc58";
constexpr const char* kSeedFp8 = "c1f515ac27e0ec5d7a75ca6205eb969283527a19dc4c52ffe6d0298e73ea23f6";
constexpr const char* kPage1 = "8e0d21a12f6a08b1654cbb341b0b6ff1141db634a0856191751835affb3e3ce3";
constexpr const char* kPage2 = "6d68b354753a592a9a9aff55664cfe68e272594aae2d7cb79883dd1d3f64d1e3";

ModelFingerprint test_model() {
  return kv_model_fingerprint(R"({"model_type":"deepseek_v3"})", "weights-sha256:abc");
}

std::vector<int32_t> two_pages() {
  std::vector<int32_t> t;
  for (int i = 0; i < 64; ++i) t.push_back(i);
  for (int i = 0; i < 63; ++i) t.push_back(100000 + i);
  t.push_back(-1);
  return t;
}

TEST(PageHash, MatchesTheDocumentedByteLayout) {
  const ModelFingerprint model = test_model();
  EXPECT_EQ(page_hash_hex(model), kFingerprint);
  MlaKvFormat f;
  const PageHash seed = kv_hash_seed(model, f);
  EXPECT_EQ(page_hash_hex(seed), kSeedBf16);
  f.dtype = MlaKvDType::kFP8;
  EXPECT_EQ(page_hash_hex(kv_hash_seed(model, f)), kSeedFp8);
  std::vector<PageHash> chain;
  const std::vector<int32_t> tokens = two_pages();
  kv_hash_chain(seed, tokens, 64, &chain);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(page_hash_hex(chain[0]), kPage1);
  EXPECT_EQ(page_hash_hex(chain[1]), kPage2);
}

TEST(PageHash, ChainCoversOnlyFullPagesAndDependsOnEveryEarlierToken) {
  const PageHash seed = kv_hash_seed(test_model(), MlaKvFormat{});
  std::vector<int32_t> tokens = two_pages();
  tokens.push_back(7);  // a partial third page is not hashed
  std::vector<PageHash> a, b;
  kv_hash_chain(seed, tokens, 64, &a);
  EXPECT_EQ(a.size(), 2u);
  tokens[3] = 4;  // change one token of the first page: both hashes change
  kv_hash_chain(seed, tokens, 64, &b);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
}

TEST(PageHash, SeedSeparatesModelsFormatsAndPageSizes) {
  const ModelFingerprint m1 = test_model(),
                         m2 = kv_model_fingerprint(R"({"model_type":"deepseek_v3"})", "other");
  MlaKvFormat f;
  const PageHash base = kv_hash_seed(m1, f);
  EXPECT_NE(base, kv_hash_seed(m2, f));
  MlaKvFormat g = f;
  g.page_tokens = 32;
  EXPECT_NE(base, kv_hash_seed(m1, g));
  g = f;
  g.d_rope = 32;
  EXPECT_NE(base, kv_hash_seed(m1, g));
  // Lengths are framed: moving bytes between config and digest changes the fingerprint.
  EXPECT_NE(kv_model_fingerprint("ab", "c"), kv_model_fingerprint("a", "bc"));
}

}  // namespace
}  // namespace fathom
