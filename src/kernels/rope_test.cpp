// RoPE/YaRN: frequencies against an independent transcription of DeepSeek's precompute_freqs_cis
// (and hand-derived correction range 10..23 for the V3/V2 configs), the table-driven rotation
// against the float64 reference at late positions, inverse, and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kernels/kernels_test_util.h"
#include "kernels/rope.h"

namespace fathom {
namespace {

using testing::random_floats;
using testing::test_seed;

RopeParams v3_rope() {
  return RopeParams{.dim = 64,
                    .theta = 10000.0,
                    .factor = 40.0,
                    .original_max_positions = 4096,
                    .beta_fast = 32.0,
                    .beta_slow = 1.0,
                    .mscale = 1.0,
                    .mscale_all_dim = 1.0};
}

TEST(Rope, YarnFrequenciesFollowPrecomputeFreqsCis) {
  const RopeParams p = v3_rope();
  const std::vector<double> f = rope_inv_freq(p);
  ASSERT_EQ(f.size(), 32u);
  // corr_dim(32) = 64 ln(4096 / (64 pi)) / (2 ln 1e4) = 10.47 -> low 10; corr_dim(1) = 22.51 -> high 23
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(10000.0, -2.0 * i / 64.0);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    const double want = base / 40.0 * ramp + base * (1.0 - ramp);
    EXPECT_NEAR(f[static_cast<size_t>(i)], want, 1e-15 * base) << i;
  }
  EXPECT_DOUBLE_EQ(f[5], std::pow(10000.0, -10.0 / 64.0));          // extrapolated: unchanged
  EXPECT_DOUBLE_EQ(f[30], std::pow(10000.0, -60.0 / 64.0) / 40.0);  // interpolated: divided by factor
  // plain RoPE without scaling
  RopeParams plain = p;
  plain.factor = 1.0;
  const std::vector<double> g = rope_inv_freq(plain);
  for (int i = 0; i < 32; ++i)
    EXPECT_DOUBLE_EQ(g[static_cast<size_t>(i)], 1.0 / std::pow(10000.0, 2.0 * i / 64.0));
}

TEST(Rope, MscaleGivesDeepSeekV3SoftmaxScale) {
  const double m = yarn_mscale(40.0, 1.0);
  EXPECT_NEAR(m, 0.1 * std::log(40.0) + 1.0, 1e-15);
  EXPECT_NEAR(m * m / std::sqrt(192.0), 0.1352338, 1e-6);
  EXPECT_EQ(yarn_mscale(1.0, 1.0), 1.0);
  EXPECT_NEAR(yarn_mscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1.0, 1e-15);
}

TEST(Rope, TableRotationMatchesReferenceAtLatePositions) {
  Rng rng(test_seed());
  for (RopeParams p : {v3_rope(), RopeParams{.dim = 32, .theta = 50000.0},
                       RopeParams{.dim = 64,
                       .theta = 10000.0,
                       .factor = 4.0,
                       .original_max_positions = 512,
                       .beta_fast = 32.0,
                       .beta_slow = 1.0,
                       .mscale = 0.9,
                       .mscale_all_dim = 0.7}}) {
    const int64_t max_pos = 70000;
    auto table = RopeTable::create(p, max_pos);
    ASSERT_TRUE(table.ok()) << table.status().to_string();
    // q-like layout: [T, H, nope + rope] with rope dims at offset `nope`
    const int64_t T = 5, H = 3, nope = 16, head = nope + p.dim;
    std::vector<float> q = random_floats(rng, T * H * head);
    const std::vector<float> q0 = q;
    std::vector<int64_t> pos = {0, 1, 4095, 4096 + static_cast<int64_t>(rng.below(60000)), max_pos - 1};
    const RopeApplyParams ap{.n_tokens = T, .n_heads = H, .token_stride = H * head, .head_stride = head};
    rope_apply(*table, ap, pos.data(), q.data() + nope);
    std::vector<double> ref(static_cast<size_t>(T * H * p.dim));
    rope_apply_ref(p, ap, pos.data(), q0.data() + nope, ref.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < head; ++i) {
          const float got = q[static_cast<size_t>((t * H + h) * head + i)];
          if (i < nope) {
            ASSERT_EQ(got, q0[static_cast<size_t>((t * H + h) * head + i)]) << "nope dims must be untouched";
          } else {
            ASSERT_NEAR(got, ref[static_cast<size_t>((t * H + h) * p.dim + i - nope)], 2e-6)
                << "t " << t << " pos " << pos[static_cast<size_t>(t)];
          }
        }
      }
    }
    // position 0 is the identity (times the HF cos/sin scale, 1 here unless mscale differs)
    if (p.mscale == p.mscale_all_dim) {
      for (int64_t i = nope; i < head; ++i) EXPECT_EQ(q[static_cast<size_t>(i)], q0[static_cast<size_t>(i)]);
    }
    // the inverse rotation undoes the forward one
    if (p.mscale == p.mscale_all_dim) {
      RopeApplyParams inv = ap;
      inv.inverse = true;
      rope_apply(*table, inv, pos.data(), q.data() + nope);
      for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], q0[i], 2e-6);
    }
  }
}

TEST(Rope, SharedKeyLayoutRotatesOnlyTheRopeTail) {
  Rng rng(test_seed());
  auto table = RopeTable::create(v3_rope(), 100);
  ASSERT_TRUE(table.ok());
  const int64_t T = 3, width = 512 + 64;
  std::vector<float> kv = random_floats(rng, T * width);
  const std::vector<float> kv0 = kv;
  std::vector<int64_t> pos = {7, 99, 50};
  rope_apply(*table, RopeApplyParams{.n_tokens = T, .n_heads = 1, .token_stride = width, .head_stride = 0},
             pos.data(), kv.data() + 512);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < 512; ++i)
      ASSERT_EQ(kv[static_cast<size_t>(t * width + i)], kv0[static_cast<size_t>(t * width + i)]);
    // a rotation keeps each pair's norm
    for (int64_t i = 0; i < 32; ++i) {
      const float* a = kv.data() + t * width + 512 + 2 * i;
      const float* b = kv0.data() + t * width + 512 + 2 * i;
      EXPECT_NEAR(a[0] * a[0] + a[1] * a[1], b[0] * b[0] + b[1] * b[1], 1e-4);
    }
  }
}

TEST(Rope, BadConfigsAreRejectedWithTheField) {
  RopeParams p = v3_rope();
  p.dim = 63;
  EXPECT_NE(RopeTable::create(p, 10).status().message().find("dim"), std::string::npos);
  p = v3_rope();
  p.beta_fast = 0.5;
  EXPECT_NE(RopeTable::create(p, 10).status().message().find("beta_fast"), std::string::npos);
  p = v3_rope();
  p.theta = 1.0;
  EXPECT_FALSE(RopeTable::create(p, 10).ok());
  p = v3_rope();
  p.original_max_positions = 0;
  EXPECT_FALSE(RopeTable::create(p, 10).ok());
  EXPECT_FALSE(RopeTable::create(v3_rope(), 0).ok());
}

}  // namespace
}  // namespace fathom
