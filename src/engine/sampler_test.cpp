// Sampler: greedy, seeds, each filter and penalty against hand-computed expectations, and
// empirical frequencies against the exact distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/sampler.h"

namespace fathom {
namespace {

TEST(Sampler, GreedyPicksTheArgmaxAndReportsLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p, 4);
  const float logits[4] = {0.5f, 2.0f, -1.0f, 1.0f};
  auto r = s.sample(logits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token, 1);
  const double lse = std::log(std::exp(0.5) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.0));
  EXPECT_NEAR(r->logprob, 2.0 - lse, 1e-6);
  ASSERT_EQ(r->top.size(), 2u);
  EXPECT_EQ(r->top[1].token, 3);
}

TEST(Sampler, GreedyOverAVocabularyRowTakesTheFirstOfTiedMaxima) {
  const int32_t V = 102400;
  std::vector<float> logits(V);
  for (int32_t i = 0; i < V; ++i) logits[i] = std::sin(0.37f * static_cast<float>(i)) * 4.0f;
  logits[70001] = logits[99999] = 9.0f;
  logits[5] = NAN;  // never chosen
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, V);
  const int32_t prompt[] = {70001, 12};
  s.add_prompt(prompt);  // seen, but no penalty is set: the row is read as it is
  EXPECT_EQ(s.sample(logits.data())->token, 70001);
  p.presence_penalty = 0.5f;
  Sampler pen(p, V);
  pen.add_generated(70001);
  EXPECT_EQ(pen.sample(logits.data())->token, 99999);
}

TEST(Sampler, ChooseTakesTheBestOptionOrDrawsFromTheSoftmaxOfTheScores) {
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler g(greedy, 8);
  const double scores[4] = {-3.0, -0.5, -0.5, -7.0};
  EXPECT_EQ(g.choose(scores), 1u) << "the first of tied best options";
  const double one[1] = {-40.0};
  EXPECT_EQ(g.choose(one), 0u);
  for (const float t : {1.0f, 0.5f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = 1;  // token-level filters do not apply to whole options
    p.seed = 11;
    Sampler s(p, 8);
    const double sc[3] = {-1.0, -1.7, -2.5};
    double z = 0, expect[3];
    for (int i = 0; i < 3; ++i) z += expect[i] = std::exp(sc[i] / t);
    int counts[3] = {0, 0, 0};
    const int n = 20000;
    for (int k = 0; k < n; ++k) ++counts[s.choose(sc)];
    for (int i = 0; i < 3; ++i) {
      const double pi = expect[i] / z;
      EXPECT_NEAR(counts[i] / double(n), pi, 4 * std::sqrt(pi * (1 - pi) / n) + 1e-3)
          << "option " << i << ", T " << t;
    }
  }
}

TEST(Sampler, SameSeedSameTokensAndMatchesTheDistribution) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 1234;
  const float logits[5] = {1.0f, 0.0f, 2.0f, -0.5f, 1.5f};
  Sampler a(p, 5), b(p, 5);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits)->token, b.sample(logits)->token);
  std::map<int, int> counts;
  Sampler c(p, 5);
  const int n = 40000;
  for (int i = 0; i < n; ++i) counts[c.sample(logits)->token]++;
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (int t = 0; t < 5; ++t) {
    const double want = std::exp(logits[t] / 0.7) / z;
    EXPECT_NEAR(counts[t] / static_cast<double>(n), want, 0.01) << t;
  }
}

TEST(Sampler, TopKTopPAndMinPRemoveTheTail) {
  const float logits[5] = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f};
  auto support = [&](SamplingParams p) {
    p.seed = 7;
    Sampler s(p, 5);
    std::map<int, int> seen;
    for (int i = 0; i < 3000; ++i) seen[s.sample(logits)->token]++;
    return seen;
  };
  SamplingParams k;
  k.top_k = 2;
  auto sk = support(k);
  EXPECT_EQ(sk.size(), 2u);
  EXPECT_TRUE(sk.count(0) && sk.count(1));
  SamplingParams tp;
  tp.top_p = 0.7f;  // p = .636, .234, ... -> the first two reach 0.7
  auto sp = support(tp);
  EXPECT_EQ(sp.size(), 2u);
  SamplingParams mp;
  mp.min_p = 0.3f;  // keeps p >= 0.3 * p_max: exp(-1) = .37 kept, exp(-2) = .135 dropped
  auto sm = support(mp);
  EXPECT_EQ(sm.size(), 2u);
}

TEST(Sampler, PenaltiesFollowTheOpenAIAndHFDefinitions) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 3);
  const float logits[3] = {2.0f, 1.6f, 0.0f};
  s.add_generated(0);  // 2.0 - 1.0 - 0.5 = 0.5 < 1.6
  EXPECT_EQ(s.sample(logits)->token, 1);
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 1.5f;
  Sampler rs(r, 3);
  const int32_t prompt[] = {0};
  rs.add_prompt(prompt);  // 2.0 / 1.5 = 1.33 < 1.6
  EXPECT_EQ(rs.sample(logits)->token, 1);
}

TEST(Sampler, RespectsTheAllowedMaskAndRejectsBadParameters) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 70);
  std::vector<float> logits(70, 0.0f);
  logits[3] = 5;
  uint64_t mask[2] = {0, uint64_t{1} << 2};  // only token 66
  EXPECT_EQ(s.sample(logits.data(), mask)->token, 66);
  uint64_t none[2] = {0, 0};
  EXPECT_EQ(s.sample(logits.data(), none).status().code(), StatusCode::kNotFound);
  SamplingParams bad;
  bad.temperature = 2.5f;
  EXPECT_NE(validate_sampling(bad).message().find("temperature"), std::string::npos);
  bad = {};
  bad.top_p = 0;
  EXPECT_NE(validate_sampling(bad).message().find("top_p"), std::string::npos);
}

TEST(Sampler, LogitBiasShiftsTheLogitsBeforeSamplingButNotTheLogprobs) {
  const float logits[4] = {0.5f, 2.0f, -1.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.logit_bias = {{1, -100.0f}, {2, 2.5f}};  // ban the argmax; lift token 2 to 1.5 (argmax now 2)
  Sampler s(p, 4);
  auto r = s.sample(logits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token, 2);
  const double lse = std::log(std::exp(0.5) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.0));
  EXPECT_NEAR(r->logprob, -1.0 - lse, 1e-6);  // the model's own log-probability
  // At temperature 1, +100 makes a token all but certain; -100 all but impossible.
  SamplingParams hot;
  hot.temperature = 1;
  hot.seed = 7;
  hot.logit_bias = {{0, 100.0f}};
  Sampler h(hot, 4);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(h.sample(logits)->token, 0);
  hot.logit_bias = {{1, -100.0f}};
  Sampler b(hot, 4);
  for (int i = 0; i < 200; ++i) EXPECT_NE(b.sample(logits)->token, 1);
  // Values outside [-100, 100] and ids outside the vocabulary are errors that name the token.
  SamplingParams bad;
  bad.logit_bias = {{3, 101.0f}};
  EXPECT_NE(validate_sampling(bad).to_string().find("token 3"), std::string::npos);
  bad.logit_bias = {{9, 1.0f}};
  EXPECT_TRUE(validate_sampling(bad).ok());
  EXPECT_NE(validate_logit_bias(bad, 4).to_string().find("token 9"), std::string::npos);
  EXPECT_TRUE(validate_logit_bias(bad, 10).ok());
}

}  // namespace
}  // namespace fathom
