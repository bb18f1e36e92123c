// compute_layout against a plain reference (nested loops over tokens, ranks and nodes), on fresh
// random routings with -1 slots and odd shapes; and its errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

#include "base/rng.h"
#include "ep/ep.h"

namespace fathom::ep {
namespace {

struct Reference {
  std::vector<int32_t> per_rank, per_node, per_expert, slot, nslot;
  std::vector<uint8_t> in_rank;
};

Reference reference(const Placement& p, const std::vector<int32_t>& idx, int64_t tokens, int K) {
  const int R = p.num_ranks, N = p.num_nodes(), L = p.experts_per_rank();
  Reference ref;
  ref.per_rank.assign(static_cast<size_t>(R), 0);
  ref.per_node.assign(static_cast<size_t>(N), 0);
  ref.per_expert.assign(static_cast<size_t>(p.num_experts), 0);
  ref.in_rank.assign(static_cast<size_t>(tokens * R), 0);
  ref.slot.assign(static_cast<size_t>(tokens * R), -1);
  ref.nslot.assign(static_cast<size_t>(tokens * N), -1);
  for (int r = 0; r < R; ++r) {
    int32_t n = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      bool hit = false;
      for (int k = 0; k < K; ++k)
        hit |= idx[static_cast<size_t>(t * K + k)] >= 0 && idx[static_cast<size_t>(t * K + k)] / L == r;
      if (!hit) continue;
      ref.in_rank[static_cast<size_t>(t * R + r)] = 1;
      ref.slot[static_cast<size_t>(t * R + r)] = n++;
    }
    ref.per_rank[static_cast<size_t>(r)] = n;
  }
  for (int node = 0; node < N; ++node) {
    int32_t n = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      bool hit = false;
      for (int r = 0; r < R; ++r)
        hit |= ref.in_rank[static_cast<size_t>(t * R + r)] && p.node_of_rank[static_cast<size_t>(r)] == node;
      if (hit) ref.nslot[static_cast<size_t>(t * N + node)] = n++;
    }
    ref.per_node[static_cast<size_t>(node)] = n;
  }
  for (int32_t e : idx)
    if (e >= 0) ref.per_expert[static_cast<size_t>(e)]++;
  return ref;
}

TEST(Layout, MatchesAPlainReferenceOnRandomRoutings) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int R = 1 + static_cast<int>(rng.below(9));
    const int L = 1 + static_cast<int>(rng.below(5));
    Placement p{R * L, R, {}};
    int node = 0;
    for (int r = 0; r < R; ++r) {  // random contiguous-or-not node assignment with no gaps
      p.node_of_rank.push_back(node);
      if (rng.uniform() < 0.4) ++node;
    }
    ASSERT_TRUE(p.validate().ok());
    const int K = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(std::min(8, R * L))));
    const int64_t max_tokens = 1 + static_cast<int64_t>(rng.below(70));
    const int64_t tokens = static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_tokens + 1)));
    std::vector<int32_t> idx(static_cast<size_t>(tokens * K), -1);
    for (int64_t t = 0; t < tokens; ++t) {
      std::set<int32_t> used;
      for (int k = 0; k < K; ++k) {
        if (rng.uniform() < 0.15) continue;
        int32_t e;
        do e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(R * L)));
        while (used.count(e));
        used.insert(e);
        idx[static_cast<size_t>(t * K + k)] = e;
      }
    }
    Layout l = Layout::sized(p, max_tokens);
    ASSERT_TRUE(compute_layout(p, idx.data(), tokens, K, &l).ok());
    const Reference ref = reference(p, idx, tokens, K);
    EXPECT_EQ(l.num_tokens, tokens);
    EXPECT_EQ(l.tokens_per_rank, ref.per_rank) << "trial " << trial;
    EXPECT_EQ(l.tokens_per_node, ref.per_node) << "trial " << trial;
    EXPECT_EQ(l.tokens_per_expert, ref.per_expert) << "trial " << trial;
    EXPECT_EQ(std::vector<uint8_t>(l.token_in_rank.begin(), l.token_in_rank.begin() + tokens * R),
              ref.in_rank);
    EXPECT_EQ(std::vector<int32_t>(l.slot_in_rank.begin(), l.slot_in_rank.begin() + tokens * R), ref.slot);
    EXPECT_EQ(std::vector<int32_t>(l.slot_in_node.begin(), l.slot_in_node.begin() + tokens * p.num_nodes()),
              ref.nslot);
  }
}

TEST(Layout, RejectsBadIdsDuplicatesAndTooManyTokens) {
  Placement p{8, 2, {0, 0}};
  Layout l = Layout::sized(p, 4);
  std::vector<int32_t> bad = {0, 8, 1, 2};
  Status s = compute_layout(p, bad.data(), 2, 2, &l);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 0 top-k slot 1 selects expert 8"), std::string::npos) << s.message();
  std::vector<int32_t> dup = {0, 1, 3, 3};
  s = compute_layout(p, dup.data(), 2, 2, &l);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 1 selects expert 3 twice"), std::string::npos) << s.message();
  std::vector<int32_t> many(10, -1);
  EXPECT_EQ(compute_layout(p, many.data(), 5, 2, &l).code(), StatusCode::kOutOfRange);
  Placement gap{8, 2, {0, 2}};
  EXPECT_FALSE(gap.validate().ok());
  Placement uneven{7, 2, {0, 0}};
  EXPECT_FALSE(uneven.validate().ok());
}

}  // namespace
}  // namespace fathom::ep
