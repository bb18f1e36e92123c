// The MoE gate against its float64 reference (independent selection code) on random logits for
// V3-, V2- and V2-Lite-shaped configs, hand-checked small cases (bias selects but never weighs,
// masked groups at -inf), and config validation.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels_test_util.h"
#include "kernels/moe.h"

namespace fathom {
namespace {

using testing::random_floats;
using testing::test_seed;

void check_against_ref(const MoeGateParams& p, const std::vector<float>& logits, int64_t T,
                       const char* what) {
  std::vector<int32_t> ids(static_cast<size_t>(T * p.top_k)), rids(ids.size());
  std::vector<float> w(ids.size());
  std::vector<double> rw(ids.size());
  moe_gate(p, logits.data(), T, ids.data(), w.data());
  moe_gate_ref(p, logits.data(), T, rids.data(), rw.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i], rids[i]) << what << " token " << i / static_cast<size_t>(p.top_k) << " slot "
                               << i % static_cast<size_t>(p.top_k);
    ASSERT_NEAR(w[i], rw[i], 2e-6 * std::fabs(rw[i]) + 1e-12) << what;
  }
}

TEST(MoeGate, MatchesReferenceForDeepSeekConfigs) {
  Rng rng(test_seed());
  const int64_t T = 300;
  std::vector<float> bias256 = random_floats(rng, 256, 0.3f);
  // V3: sigmoid, noaux_tc (top-2-sum groups), bias, normalise, routed_scaling_factor 2.5
  MoeGateParams v3{.n_experts = 256,
                   .top_k = 8,
                   .scoring = MoeScoring::kSigmoid,
                   .n_groups = 8,
                   .topk_groups = 4,
                   .group_score = MoeGroupScore::kTop2Sum,
                   .bias = bias256.data(),
                   .normalize = true,
                   .scale = 2.5f};
  check_against_ref(v3, random_floats(rng, T * 256, 2.0f), T, "v3");
  // V2: softmax, group_limited_greedy (max per group), no normalisation, scaling 16
  MoeGateParams v2{.n_experts = 160,
                   .top_k = 6,
                   .scoring = MoeScoring::kSoftmax,
                   .n_groups = 8,
                   .topk_groups = 3,
                   .group_score = MoeGroupScore::kMax,
                   .normalize = false,
                   .scale = 16.0f};
  check_against_ref(v2, random_floats(rng, T * 160, 2.0f), T, "v2");
  // V2-Lite: softmax, greedy
  MoeGateParams lite{
      .n_experts = 64, .top_k = 6, .scoring = MoeScoring::kSoftmax, .normalize = false, .scale = 1.0f};
  check_against_ref(lite, random_floats(rng, T * 64, 2.0f), T, "v2-lite");
  // odd sizes, quantised-looking logits with exact ties (lower id wins in both)
  std::vector<float> tied(static_cast<size_t>(T * 12));
  for (auto& v : tied) v = static_cast<float>(rng.below(4)) * 0.5f;
  std::vector<float> bias12(12, 0.0f);
  MoeGateParams odd{.n_experts = 12,
                    .top_k = 3,
                    .scoring = MoeScoring::kSigmoid,
                    .n_groups = 3,
                    .topk_groups = 2,
                    .group_score = MoeGroupScore::kTop2Sum,
                    .bias = bias12.data(),
                    .normalize = true,
                    .scale = 1.0f};
  check_against_ref(odd, tied, T, "ties");
}

TEST(MoeGate, HandCheckedSoftmaxGreedyAndGroups) {
  const float logits[4] = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // softmax = .1 .2 .3 .4
  int32_t ids[2];
  float w[2];
  MoeGateParams p{
      .n_experts = 4, .top_k = 2, .scoring = MoeScoring::kSoftmax, .normalize = true, .scale = 2.0f};
  moe_gate(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], 8.0 / 7.0, 1e-6);
  EXPECT_NEAR(w[1], 6.0 / 7.0, 1e-6);
  // bias picks group 0 (sums 10.3 vs 0.7) and experts 0, 1; weights stay the unbiased scores
  const float bias[4] = {10.0f, 0.0f, 0.0f, 0.0f};
  p = MoeGateParams{.n_experts = 4,
                    .top_k = 2,
                    .scoring = MoeScoring::kSoftmax,
                    .n_groups = 2,
                    .topk_groups = 1,
                    .group_score = MoeGroupScore::kTop2Sum,
                    .bias = bias,
                    .normalize = true,
                    .scale = 1.0f};
  moe_gate(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(w[1], 2.0 / 3.0, 1e-6);
}

TEST(MoeGate, MaskedGroupsAreMinusInfinityNotZero) {
  // Kept group 1 has negative biased scores; masking with 0 (as HF's modeling does) would let the
  // masked group 0 win the second slot. With -inf both slots come from group 1.
  const float logits[4] = {5.0f, 5.0f, 0.0f, 0.0f};
  const float bias[4] = {-10.0f, -10.0f, -0.7f,
                         -0.8f};  // biased: -9.0 -9.0 | -0.2 -0.3; group sums -18 vs -0.5
  MoeGateParams p{.n_experts = 4,
                  .top_k = 2,
                  .scoring = MoeScoring::kSigmoid,
                  .n_groups = 2,
                  .topk_groups = 1,
                  .group_score = MoeGroupScore::kTop2Sum,
                  .bias = bias,
                  .normalize = false,
                  .scale = 1.0f};
  int32_t ids[2];
  float w[2];
  moe_gate(p, logits, 1, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0], 0.5, 1e-6);  // sigmoid(0), bias not included
}

TEST(MoeGate, ValidationNamesTheField) {
  MoeGateParams p{.n_experts = 64, .top_k = 6};
  EXPECT_TRUE(validate_moe_gate(p).ok());
  p.top_k = 65;
  EXPECT_NE(validate_moe_gate(p).message().find("num_experts_per_tok"), std::string::npos);
  p = MoeGateParams{.n_experts = 64, .top_k = 6, .n_groups = 5};
  EXPECT_NE(validate_moe_gate(p).message().find("n_group"), std::string::npos);
  p = MoeGateParams{.n_experts = 64, .top_k = 6, .n_groups = 8, .topk_groups = 9};
  EXPECT_NE(validate_moe_gate(p).message().find("topk_group"), std::string::npos);
  p = MoeGateParams{.n_experts = 64, .top_k = 20, .n_groups = 8, .topk_groups = 2};
  EXPECT_FALSE(validate_moe_gate(p).ok());
  p = MoeGateParams{
      .n_experts = 8, .top_k = 2, .n_groups = 8, .topk_groups = 2, .group_score = MoeGroupScore::kTop2Sum};
  EXPECT_FALSE(validate_moe_gate(p).ok());
}

}  // namespace
}  // namespace fathom
