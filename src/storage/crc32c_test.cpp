// CRC32C: published check values, and the hardware path against the table reference on random
// buffers of every alignment and odd lengths, including the three-way block boundaries.
#include "storage/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "storage/test_util.h"

namespace fathom::storage {
namespace {

TEST(Crc32c, MatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c_ref("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  const std::string ones(32, '\xff');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, FastPathMatchesReferenceOnRandomBuffers) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  const std::string data = testing::payload(seed, 200000);
  const size_t lengths[] = {
      0,      1,     7, 8, 9, 767, 768, 769, 3 * 256 * 2 + 5, 3 * 8192, 3 * 8192 + 1, 3 * 8192 * 4 + 100,
      100000, 199000};
  for (size_t len : lengths) {
    for (size_t align = 0; align < 8; ++align) {
      EXPECT_EQ(crc32c(data.data() + align, len), crc32c_ref(data.data() + align, len))
          << len << " +" << align;
    }
  }
  for (int i = 0; i < 200; ++i) {
    const size_t off = rng.below(1000);
    const size_t len = rng.below(data.size() - off);
    EXPECT_EQ(crc32c(data.data() + off, len), crc32c_ref(data.data() + off, len)) << off << " " << len;
  }
}

TEST(Crc32c, ExtendsAcrossSplitsLikeOneCall) {
  const std::string data = testing::payload(7, 50000);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{24576}, size_t{49999}}) {
    const uint32_t a = crc32c(data.data(), split);
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, a), whole) << split;
    EXPECT_EQ(crc32c_ref(data.data() + split, data.size() - split, crc32c_ref(data.data(), split)), whole);
  }
}

TEST(Crc32c, CopyChecksumsWhatItCopies) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  const std::string data = testing::payload(seed, 300000);  // several 64 KiB pieces
  for (size_t len : {size_t{0}, size_t{1}, size_t{65535}, size_t{65536}, size_t{65537}, data.size() - 3}) {
    std::string out(len + 2, '\x5a');
    const uint32_t seed_crc = static_cast<uint32_t>(rng.next_u64());
    EXPECT_EQ(crc32c_copy(out.data() + 1, data.data() + 3, len, seed_crc), crc32c_ref(data.data() + 3, len, seed_crc))
        << len;
    EXPECT_EQ(out.substr(1, len), data.substr(3, len)) << len;
    EXPECT_EQ(out.front(), '\x5a');  // nothing written outside [dst, dst + n)
    EXPECT_EQ(out.back(), '\x5a');
  }
}

TEST(Crc32c, CombineJoinsTwoChecksumsLikeOneCall) {
  const uint64_t seed = testing::test_seed();
  Rng rng(seed);
  const std::string data = testing::payload(seed, 300000);
  for (int i = 0; i < 50; ++i) {
    const size_t split = rng.below(data.size());
    const uint32_t a = crc32c(data.data(), split);
    const uint32_t b = crc32c(data.data() + split, data.size() - split);
    EXPECT_EQ(crc32c_combine(a, b, data.size() - split), crc32c(data.data(), data.size())) << split;
  }
  EXPECT_EQ(crc32c_combine(0x1234u, 0, 0), 0x1234u);
}

}  // namespace
}  // namespace fathom::storage
