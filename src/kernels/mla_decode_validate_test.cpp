// The MLA decode kernel's boundary (every bad input rejected with an error naming it, before any
// arithmetic) and its (sequence, page range) scheduler (every page covered exactly once, parts
// balanced, partial slots within the bound the decoder allocates).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_decode_impl.h"

namespace fathom {
namespace {

struct Fixture {
  MlaKvFormat f;
  std::vector<uint8_t> pool;
  std::vector<int32_t> table = {0, 1, 2, 3};  // [2, 2]
  std::vector<int32_t> lens = {100, 64};
  std::vector<float> q, out, lse;
  Fixture() {
    pool.assign(static_cast<size_t>(4 * f.page_bytes()), 0);
    q.assign(static_cast<size_t>(2 * 16 * f.d_qk()), 0.5f);
    out.resize(static_cast<size_t>(2 * 16 * f.d_latent));
    lse.resize(2 * 16);
  }
  MlaDecodeParams params() {
    return {.q = q.data(), .batch = 2, .s_q = 1, .heads = 16, .d_qk = f.d_qk(),
            .cache = {pool.data(), 4, f.page_bytes(), f}, .block_table = table.data(), .max_pages = 2,
            .cache_seqlens = lens.data(), .softmax_scale = 0.1f, .out = out.data(), .lse = lse.data()};
  }
};

void expect_error(const MlaDecodeParams& p, StatusCode code, const std::string& text) {
  const Status st = validate_mla_decode(p);
  ASSERT_FALSE(st.ok()) << "accepted; expected: " << text;
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
  auto dec = MlaDecoder::create({.format = MlaKvFormat{}, .max_batch = 4, .max_rows = 32});
  ASSERT_TRUE(dec.ok());
  EXPECT_FALSE((*dec)->decode(p).ok());
}

TEST(MlaDecodeBoundary, AcceptsAWellFormedCall) {
  Fixture fx;
  EXPECT_TRUE(validate_mla_decode(fx.params()).ok());
  auto dec = MlaDecoder::create({.format = fx.f, .max_batch = 2, .max_rows = 16});
  ASSERT_TRUE(dec.ok());
  EXPECT_TRUE((*dec)->decode(fx.params()).ok());
}

TEST(MlaDecodeBoundary, RejectsBlockTablesOutsideThePool) {
  Fixture fx;
  fx.table[1] = 4;
  expect_error(fx.params(), StatusCode::kOutOfRange, "block_table[0][1] is 4, outside the pool of 4 pages");
  fx.table[1] = -1;
  expect_error(fx.params(), StatusCode::kOutOfRange, "block_table[0][1] is -1");
  // An entry past the sequence's pages is never read, so garbage there is fine.
  fx.table[1] = 1;
  fx.table[3] = 1 << 30;
  EXPECT_TRUE(validate_mla_decode(fx.params()).ok());
}

TEST(MlaDecodeBoundary, RejectsLengthsBeyondTheTable) {
  Fixture fx;
  fx.lens[1] = 129;
  expect_error(fx.params(), StatusCode::kOutOfRange, "sequence 1 has 129 tokens, which needs 3 pages of 64");
  fx.lens[1] = -5;
  expect_error(fx.params(), StatusCode::kInvalidArgument, "cache_seqlens[1] is -5");
}

TEST(MlaDecodeBoundary, RejectsMismatchedDimsAndBadScalars) {
  Fixture fx;
  MlaDecodeParams p = fx.params();
  p.d_qk = 512;
  expect_error(p, StatusCode::kInvalidArgument, "q has head dim 512, the cache holds d_latent 512 + d_rope 64 = 576");
  p = fx.params();
  p.softmax_scale = 0;
  expect_error(p, StatusCode::kInvalidArgument, "softmax_scale");
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(p, StatusCode::kInvalidArgument, "softmax_scale");
  p = fx.params();
  p.s_q = 0;
  expect_error(p, StatusCode::kInvalidArgument, "s_q is 0");
  p = fx.params();
  p.heads = 0;
  expect_error(p, StatusCode::kInvalidArgument, "heads is 0");
  p = fx.params();
  p.cache.page_stride_bytes = 100;
  expect_error(p, StatusCode::kInvalidArgument, "stride 100 B");
  p = fx.params();
  p.cache.format.d_latent = 500;
  expect_error(p, StatusCode::kInvalidArgument, "d_latent (kv_lora_rank) is 500");
  p = fx.params();
  p.out = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "must all be set");
}

TEST(MlaDecodeBoundary, DecoderRejectsCallsBeyondItsLimitsOrFormat) {
  Fixture fx;
  auto dec = MlaDecoder::create({.format = fx.f, .max_batch = 1, .max_rows = 16});
  ASSERT_TRUE(dec.ok());
  Status st = (*dec)->decode(fx.params());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("batch 2 exceeds max_batch 1"), std::string::npos) << st.message();
  auto small = MlaDecoder::create({.format = fx.f, .max_batch = 2, .max_rows = 8});
  st = (*small)->decode(fx.params());
  EXPECT_NE(st.message().find("s_q * heads = 16 exceeds max_rows 8"), std::string::npos) << st.message();
  MlaKvFormat fp8 = fx.f;
  fp8.dtype = MlaKvDType::kFP8;
  auto other = MlaDecoder::create({.format = fp8, .max_batch = 2, .max_rows = 16});
  st = (*other)->decode(fx.params());
  EXPECT_NE(st.message().find("differs from the decoder's"), std::string::npos) << st.message();
  EXPECT_FALSE(MlaDecoder::create({.format = fx.f, .max_batch = 0}).ok());
  EXPECT_FALSE(MlaDecoder::create({.format = fx.f, .max_rows = 0}).ok());
}

TEST(MlaDecodeBoundary, EmptyBatchIsANoOp) {
  Fixture fx;
  MlaDecodeParams p = fx.params();
  p.batch = 0;
  p.q = nullptr;
  auto dec = MlaDecoder::create({.format = fx.f, .max_batch = 2, .max_rows = 16});
  EXPECT_TRUE((*dec)->decode(p).ok());
}

// ---- scheduler ----

void check_schedule(const std::vector<int32_t>& lens, int n_parts) {
  internal::MlaSchedule s;
  const internal::MlaScheduleOptions o{.n_parts = n_parts, .page_tokens = 64};
  internal::plan_mla_schedule(lens.data(), static_cast<int64_t>(lens.size()), o, &s);
  ASSERT_EQ(s.part_begin.size(), static_cast<size_t>(n_parts + 1));
  std::vector<std::vector<int>> covered(lens.size());
  for (size_t b = 0; b < lens.size(); ++b) covered[b].assign(static_cast<size_t>((lens[b] + 63) / 64), 0);
  int64_t total = 0, heaviest = 0;
  for (int part = 0; part < n_parts; ++part) {
    int64_t cost = 0;
    for (int32_t i = s.part_begin[static_cast<size_t>(part)]; i < s.part_begin[static_cast<size_t>(part + 1)]; ++i) {
      const auto& seg = s.segments[static_cast<size_t>(i)];
      ASSERT_LT(seg.page_begin, seg.page_end);
      for (int32_t pg = seg.page_begin; pg < seg.page_end; ++pg) ++covered[static_cast<size_t>(seg.seq)][static_cast<size_t>(pg)];
      cost += seg.page_end - seg.page_begin + o.fixed_cost_pages;
      const bool split = s.seq_n_slots[static_cast<size_t>(seg.seq)] > 0;
      EXPECT_EQ(seg.slot >= 0, split);
    }
    total += cost;
    heaviest = std::max(heaviest, cost);
  }
  for (const auto& pages : covered) {
    for (int c : pages) ASSERT_EQ(c, 1);
  }
  EXPECT_LE(s.n_slots, 2 * (n_parts - 1));
  // No part exceeds its share of the work (pages and segment overheads, continuations included)
  // by more than one segment overhead plus what the sliver rule keeps together (a piece under
  // min_split pages, or a sequence too short to cut in two).
  const int64_t share = (total + n_parts - 1) / n_parts;
  EXPECT_LE(heaviest, share + o.fixed_cost_pages + 2 * o.min_split_pages) << "share " << share;
}

TEST(MlaSchedule, CoversEveryPageOnceAndBalancesParts) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  check_schedule({4096}, 8);                    // one long sequence split across every part
  check_schedule({0, 0, 0}, 4);                 // nothing to do
  check_schedule({1, 1, 1, 1, 1, 1, 1, 1}, 3);  // more sequences than parts
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> lens(1 + rng.below(40));
    for (auto& l : lens) l = static_cast<int32_t>(rng.below(2) ? rng.below(200) : rng.below(20000));
    check_schedule(lens, 1 + static_cast<int>(rng.below(32)));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace fathom
