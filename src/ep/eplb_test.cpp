// EPLB against DeepSeek's published example and against its invariants on random loads.
#include "ep/eplb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "base/rng.h"

namespace fathom::ep {
namespace {

// deepseek-ai/EPLB README: 2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs.
TEST(Eplb, ReproducesDeepSeeksPublishedHierarchicalExample) {
  const std::vector<double> w = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                 20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
  auto plan = rebalance_experts(w.data(), 2, 12,
                                {.num_physical = 16, .num_groups = 4, .num_nodes = 2, .num_ranks = 8});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->hierarchical);
  const std::vector<int32_t> want = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                                     7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};
  EXPECT_EQ(plan->phy2log, want);
}

// Every logical expert appears logcnt times, log2phy inverts phy2log, replicas are numbered 0..n-1.
void check_plan_consistent(const EplbPlan& plan) {
  for (int l = 0; l < plan.num_layers; ++l) {
    std::map<int, std::vector<int>> seen;
    for (int q = 0; q < plan.num_physical; ++q) {
      const size_t i = static_cast<size_t>(l * plan.num_physical + q);
      seen[plan.phy2log[i]].push_back(plan.phy_replica[i]);
      const size_t j = static_cast<size_t>((l * plan.num_logical + plan.phy2log[i]) * plan.max_replicas +
                                           plan.phy_replica[i]);
      EXPECT_EQ(plan.log2phy[j], q);
    }
    ASSERT_EQ(static_cast<int>(seen.size()), plan.num_logical);
    for (auto& [e, reps] : seen) {
      std::sort(reps.begin(), reps.end());
      EXPECT_EQ(static_cast<int>(reps.size()), plan.logcnt[static_cast<size_t>(l * plan.num_logical + e)]);
      for (size_t r = 0; r < reps.size(); ++r) EXPECT_EQ(reps[r], static_cast<int>(r));
    }
  }
}

TEST(Eplb, PlansAreConsistentAndBalanceSkewedLoadsUnderBothPolicies) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const int layers = 3, experts = 64;
  std::vector<double> w(static_cast<size_t>(layers * experts));
  for (auto& v : w) v = std::floor(std::exp(rng.normal() * 1.5) * 100);  // heavy-tailed loads
  for (EplbPolicy policy : {EplbPolicy::kHierarchical, EplbPolicy::kGlobal}) {
    EplbParams p{.num_physical = 80, .num_groups = 8, .num_nodes = 2, .num_ranks = 8, .policy = policy};
    auto plan = rebalance_experts(w.data(), layers, experts, p);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    check_plan_consistent(*plan);
    for (int l = 0; l < layers; ++l) {
      // Without EPLB: experts 8 per rank in order.
      std::vector<double> naive(8, 0.0);
      double total = 0;
      for (int e = 0; e < experts; ++e)
        naive[static_cast<size_t>(e / 8)] += w[static_cast<size_t>(l * experts + e)];
      for (double v : naive) total += v;
      const double naive_imbalance = *std::max_element(naive.begin(), naive.end()) / (total / 8);
      const double balanced = eplb_imbalance(*plan, l, w.data(), 8);
      std::printf("layer %d %s: imbalance %.3f (without EPLB %.3f)\n", l,
                  policy == EplbPolicy::kGlobal ? "global" : "hierarchical", balanced, naive_imbalance);
      EXPECT_GE(balanced, 1.0);
      EXPECT_LE(balanced, naive_imbalance + 1e-9) << "layer " << l;
      if (policy == EplbPolicy::kGlobal) {
        EXPECT_LT(balanced, 1.3) << "layer " << l;
      }
    }
    if (policy == EplbPolicy::kHierarchical) {
      // Each node holds whole groups: every replica of expert e is on the node of e's group.
      for (int l = 0; l < layers; ++l)
        for (int q = 0; q < 80; ++q) {
          const int e = plan->phy2log[static_cast<size_t>(l * 80 + q)];
          const int node = q / 40;
          int same = 0;
          for (int q2 = 0; q2 < 80; ++q2)
            if (plan->phy2log[static_cast<size_t>(l * 80 + q2)] / 8 == e / 8 && q2 / 40 == node) ++same;
          EXPECT_GE(same, 8) << "group of expert " << e << " split across nodes";
        }
    }
  }
}

TEST(Eplb, RejectsParametersThatDoNotDivide) {
  std::vector<double> w(12, 1.0);
  auto bad = rebalance_experts(w.data(), 1, 12,
                               {.num_physical = 15, .num_groups = 4, .num_nodes = 2, .num_ranks = 8});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_physical 15 is not a multiple of num_ranks 8"),
            std::string::npos);
  auto few = rebalance_experts(w.data(), 1, 12, {.num_physical = 8, .num_ranks = 8});
  ASSERT_FALSE(few.ok());
  w[3] = -1;
  auto neg = rebalance_experts(w.data(), 1, 12, {.num_physical = 16, .num_ranks = 8});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("load [0, 3]"), std::string::npos);
}

TEST(Eplb, RoundRobinRoutingSpreadsAnExpertsTokensOverItsReplicas) {
  std::vector<double> w(8, 1.0);
  w[2] = 1000;  // expert 2 is hot and gets replicas
  auto plan = rebalance_experts(w.data(), 1, 8, {.num_physical = 12, .num_ranks = 4});
  ASSERT_TRUE(plan.ok());
  const int reps = plan->logcnt[2];
  ASSERT_GE(reps, 4);
  const int64_t tokens = 4000;
  std::vector<int32_t> logical(static_cast<size_t>(tokens), 2), physical(static_cast<size_t>(tokens));
  ASSERT_TRUE(route_to_replicas(*plan, {.num_ranks = 4}, logical.data(), tokens, 1, physical.data()).ok());
  std::map<int, int> per_replica;
  for (int32_t q : physical) {
    ASSERT_EQ(plan->phy2log[static_cast<size_t>(q)], 2);
    per_replica[q]++;
  }
  ASSERT_EQ(static_cast<int>(per_replica.size()), reps);
  for (auto& [q, n] : per_replica) EXPECT_NEAR(n, tokens / reps, 1) << "replica " << q;
}

TEST(Eplb, NearestRoutingPrefersTheOwnRankThenTheOwnNode) {
  std::vector<double> w(8, 1.0);
  w[5] = 1000;
  auto plan = rebalance_experts(w.data(), 1, 8, {.num_physical = 16, .num_ranks = 4});
  ASSERT_TRUE(plan.ok());
  const std::vector<int> node_of_rank = {0, 0, 1, 1};
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<int32_t> logical = {5, -1, 0, 5}, physical(4);
    ASSERT_TRUE(
        route_to_replicas(
            *plan,
            {.rank = rank, .num_ranks = 4, .node_of_rank = node_of_rank, .routing = ReplicaRouting::kNearest},
            logical.data(), 2, 2, physical.data())
            .ok());
    EXPECT_EQ(physical[1], -1);
    for (int i : {0, 3}) {
      const int r = physical[static_cast<size_t>(i)] / 4;
      bool own_rank_has = false, own_node_has = false;
      for (int q = 0; q < 16; ++q)
        if (plan->phy2log[static_cast<size_t>(q)] == 5) {
          own_rank_has |= q / 4 == rank;
          own_node_has |= node_of_rank[static_cast<size_t>(q / 4)] == node_of_rank[static_cast<size_t>(rank)];
        }
      if (own_rank_has) {
        EXPECT_EQ(r, rank);
      } else if (own_node_has) {
        EXPECT_EQ(node_of_rank[static_cast<size_t>(r)], node_of_rank[static_cast<size_t>(rank)]);
      }
    }
  }
  std::vector<int32_t> bad = {9};
  std::vector<int32_t> out(1);
  EXPECT_FALSE(route_to_replicas(*plan, {.num_ranks = 4}, bad.data(), 1, 1, out.data()).ok());
}

}  // namespace
}  // namespace fathom::ep
