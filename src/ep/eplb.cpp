// EPLB: replication and packing of experts (the algorithm of deepseek-ai/EPLB, re-derived in
// C++). Arithmetic is in f32 like the reference (loads are converted to float first) so ties and
// choices match it; ties go to the lowest index. Does not predict loads.
#include "ep/eplb.h"

#include <algorithm>
#include <numeric>

namespace fathom::ep {
namespace {

// Packs each row's n items into num_packs packs of n / num_packs items each, heaviest item first
// into the lightest pack that still has room. pack[i], rank_in_pack[i] per item.
void balanced_packing(const float* w, int n, int num_packs, int32_t* pack, int32_t* rank_in_pack) {
  const int per_pack = n / num_packs;
  if (per_pack == 1) {
    for (int i = 0; i < n; ++i) pack[i] = i, rank_in_pack[i] = 0;
    return;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  std::vector<float> pack_w(static_cast<size_t>(num_packs), 0.0f);
  std::vector<int> pack_n(static_cast<size_t>(num_packs), 0);
  for (int item : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_n[p] >= per_pack) continue;
      if (best < 0 || pack_w[p] < pack_w[best]) best = p;
    }
    pack[item] = best;
    rank_in_pack[item] = pack_n[best];
    pack_w[best] += w[item];
    pack_n[best] += 1;
  }
}

// Replicates num_log experts into num_phy slots, each extra slot going to the expert with the
// highest load per replica. phy2log/phy_rank: [num_phy]; logcnt: [num_log].
void replicate_experts(const float* w, int num_log, int num_phy, int32_t* phy2log, int32_t* phy_rank,
                       int32_t* logcnt) {
  for (int i = 0; i < num_log; ++i) phy2log[i] = i, phy_rank[i] = 0, logcnt[i] = 1;
  for (int i = num_log; i < num_phy; ++i) {
    int best = 0;
    float best_v = w[0] / static_cast<float>(logcnt[0]);
    for (int e = 1; e < num_log; ++e) {
      const float v = w[e] / static_cast<float>(logcnt[e]);
      if (v > best_v) best = e, best_v = v;
    }
    phy2log[i] = best;
    phy_rank[i] = logcnt[best];
    logcnt[best] += 1;
  }
}

struct Dims {
  int E, P, G, N, R;  // logical experts, physical, groups, nodes, ranks
};

// One layer of the hierarchical policy (the global policy is G = N = 1).
void rebalance_layer(const float* w, const Dims& d, int32_t* phy2log, int32_t* phy_rank, int32_t* logcnt) {
  const int group_size = d.E / d.G, groups_per_node = d.G / d.N;
  const int mlog_per_node = d.E / d.N, phy_per_node = d.P / d.N, phy_per_rank = d.P / d.R;
  // Step 1: groups onto nodes; "mlog" numbers experts node-major.
  std::vector<float> group_w(static_cast<size_t>(d.G), 0.0f);
  for (int g = 0; g < d.G; ++g)
    for (int j = 0; j < group_size; ++j) group_w[g] += w[g * group_size + j];
  std::vector<int32_t> gpack(static_cast<size_t>(d.G)), grank(static_cast<size_t>(d.G));
  balanced_packing(group_w.data(), d.G, d.N, gpack.data(), grank.data());
  std::vector<int32_t> log2mlog(static_cast<size_t>(d.E)), mlog2log(static_cast<size_t>(d.E));
  for (int g = 0; g < d.G; ++g)
    for (int j = 0; j < group_size; ++j) {
      const int m = (gpack[g] * groups_per_node + grank[g]) * group_size + j;
      log2mlog[g * group_size + j] = m;
      mlog2log[m] = g * group_size + j;
    }
  std::vector<float> mlog_w(static_cast<size_t>(mlog_per_node)), phy_w(static_cast<size_t>(phy_per_node));
  std::vector<int32_t> phy2mlog(static_cast<size_t>(phy_per_node)), prank(static_cast<size_t>(phy_per_node));
  std::vector<int32_t> mlogcnt(static_cast<size_t>(d.E));
  std::vector<int32_t> pack(static_cast<size_t>(phy_per_node)), rin(static_cast<size_t>(phy_per_node));
  for (int n = 0; n < d.N; ++n) {
    // Step 2: replicas within the node.
    for (int i = 0; i < mlog_per_node; ++i) mlog_w[i] = w[mlog2log[n * mlog_per_node + i]];
    int32_t* cnt = mlogcnt.data() + n * mlog_per_node;
    replicate_experts(mlog_w.data(), mlog_per_node, phy_per_node, phy2mlog.data(), prank.data(), cnt);
    // Step 3: the node's replicas onto its ranks.
    for (int i = 0; i < phy_per_node; ++i)
      phy_w[i] = mlog_w[phy2mlog[i]] / static_cast<float>(cnt[phy2mlog[i]]);
    balanced_packing(phy_w.data(), phy_per_node, d.R / d.N, pack.data(), rin.data());
    for (int i = 0; i < phy_per_node; ++i) {
      const int slot = n * phy_per_node + pack[i] * phy_per_rank + rin[i];
      phy2log[slot] = mlog2log[n * mlog_per_node + phy2mlog[i]];
      phy_rank[slot] = prank[i];
    }
  }
  for (int e = 0; e < d.E; ++e) logcnt[e] = mlogcnt[log2mlog[e]];
}

Status validate(int num_layers, int num_logical, const EplbParams& p, bool hierarchical) {
  if (num_layers < 1 || num_logical < 1)
    return invalid_argument("eplb: need at least one layer and one expert (got {} layers, {} experts)",
                            num_layers, num_logical);
  if (p.num_ranks < 1 || p.num_nodes < 1 || p.num_groups < 1)
    return invalid_argument("eplb: num_ranks, num_nodes and num_groups must be >= 1");
  if (p.num_physical < num_logical)
    return invalid_argument("eplb: num_physical {} is less than the {} logical experts", p.num_physical,
                            num_logical);
  if (p.num_physical % p.num_ranks != 0)
    return invalid_argument("eplb: num_physical {} is not a multiple of num_ranks {}", p.num_physical,
                            p.num_ranks);
  if (p.num_ranks % p.num_nodes != 0)
    return invalid_argument("eplb: num_ranks {} is not a multiple of num_nodes {}", p.num_ranks, p.num_nodes);
  if (hierarchical) {
    if (num_logical % p.num_groups != 0)
      return invalid_argument("eplb: {} logical experts do not split into {} groups", num_logical,
                              p.num_groups);
    if (p.num_groups % p.num_nodes != 0)
      return invalid_argument("eplb: hierarchical policy needs num_groups {} divisible by num_nodes {}",
                              p.num_groups, p.num_nodes);
  }
  return {};
}

}  // namespace

Result<EplbPlan> rebalance_experts(const double* weight, int num_layers, int num_logical,
                                   const EplbParams& p) {
  const bool hierarchical =
      p.policy == EplbPolicy::kHierarchical ||
      (p.policy == EplbPolicy::kAuto && p.num_groups > 0 && p.num_groups % p.num_nodes == 0);
  TRY(validate(num_layers, num_logical, p, hierarchical));
  for (int64_t i = 0; i < int64_t{num_layers} * num_logical; ++i)
    if (!(weight[i] >= 0))
      return invalid_argument("eplb: load [{}, {}] is {}, expected >= 0", i / num_logical, i % num_logical,
                              weight[i]);
  const Dims d = hierarchical ? Dims{num_logical, p.num_physical, p.num_groups, p.num_nodes, p.num_ranks}
                              : Dims{num_logical, p.num_physical, 1, 1, p.num_ranks};
  EplbPlan plan;
  plan.num_layers = num_layers;
  plan.num_logical = num_logical;
  plan.num_physical = p.num_physical;
  plan.hierarchical = hierarchical;
  const size_t L = static_cast<size_t>(num_layers), E = static_cast<size_t>(num_logical);
  const size_t P = static_cast<size_t>(p.num_physical);
  plan.phy2log.assign(L * P, 0);
  plan.phy_replica.assign(L * P, 0);
  plan.logcnt.assign(L * E, 0);
  std::vector<float> w(E);
  for (size_t l = 0; l < L; ++l) {
    for (size_t e = 0; e < E; ++e) w[e] = static_cast<float>(weight[l * E + e]);
    rebalance_layer(w.data(), d, &plan.phy2log[l * P], &plan.phy_replica[l * P], &plan.logcnt[l * E]);
  }
  plan.max_replicas = *std::max_element(plan.logcnt.begin(), plan.logcnt.end());
  const size_t M = static_cast<size_t>(plan.max_replicas);
  plan.log2phy.assign(L * E * M, -1);
  for (size_t l = 0; l < L; ++l)
    for (size_t q = 0; q < P; ++q) {
      const size_t e = static_cast<size_t>(plan.phy2log[l * P + q]);
      plan.log2phy[(l * E + e) * M + static_cast<size_t>(plan.phy_replica[l * P + q])] =
          static_cast<int32_t>(q);
    }
  return plan;
}

Status route_to_replicas(const EplbPlan& plan, const RouteParams& p, const int32_t* logical_topk,
                         int64_t num_tokens, int topk, int32_t* physical_topk) {
  if (p.layer < 0 || p.layer >= plan.num_layers)
    return out_of_range("eplb: layer {} out of range (plan has {} layers)", p.layer, plan.num_layers);
  if (p.num_ranks < 1 || plan.num_physical % p.num_ranks != 0)
    return invalid_argument("eplb: {} physical experts do not split over {} ranks", plan.num_physical,
                            p.num_ranks);
  if (!p.node_of_rank.empty() && static_cast<int>(p.node_of_rank.size()) != p.num_ranks)
    return invalid_argument("eplb: node_of_rank has {} entries for {} ranks", p.node_of_rank.size(),
                            p.num_ranks);
  const int per_rank = plan.num_physical / p.num_ranks, M = plan.max_replicas;
  const int32_t* cnt = &plan.logcnt[static_cast<size_t>(p.layer) * static_cast<size_t>(plan.num_logical)];
  const int32_t* l2p = &plan.log2phy[static_cast<size_t>(p.layer) * static_cast<size_t>(plan.num_logical) *
                                     static_cast<size_t>(M)];
  auto node = [&](int r) { return p.node_of_rank.empty() ? 0 : p.node_of_rank[static_cast<size_t>(r)]; };
  int32_t cand[64];
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int k = 0; k < topk; ++k) {
      const int32_t e = logical_topk[t * topk + k];
      if (e < 0) {
        physical_topk[t * topk + k] = -1;
        continue;
      }
      if (e >= plan.num_logical)
        return out_of_range("eplb: token {} selects expert {}, but there are {} logical experts", t, e,
                            plan.num_logical);
      const int32_t* reps = l2p + static_cast<int64_t>(e) * M;
      const int n = cnt[e];
      const uint64_t spin = static_cast<uint64_t>(p.token_offset + t + k);
      if (p.routing == ReplicaRouting::kRoundRobin || n == 1) {
        physical_topk[t * topk + k] = reps[spin % static_cast<uint64_t>(n)];
        continue;
      }
      int m = 0;  // nearest tier that has candidates: own rank, own node, anywhere
      for (int tier = 0; tier < 3 && m == 0; ++tier)
        for (int i = 0; i < n && m < 64; ++i) {
          const int r = reps[i] / per_rank;
          if (tier == 2 || (tier == 0 && r == p.rank) || (tier == 1 && node(r) == node(p.rank)))
            cand[m++] = reps[i];
        }
      physical_topk[t * topk + k] = cand[spin % static_cast<uint64_t>(m)];
    }
  return {};
}

double eplb_imbalance(const EplbPlan& plan, int layer, const double* weight, int num_ranks) {
  const int per_rank = plan.num_physical / num_ranks;
  std::vector<double> load(static_cast<size_t>(num_ranks), 0.0);
  const size_t base = static_cast<size_t>(layer) * static_cast<size_t>(plan.num_physical);
  const size_t lbase = static_cast<size_t>(layer) * static_cast<size_t>(plan.num_logical);
  double total = 0;
  for (int q = 0; q < plan.num_physical; ++q) {
    const int e = plan.phy2log[base + static_cast<size_t>(q)];
    const double share = weight[lbase + static_cast<size_t>(e)] / plan.logcnt[lbase + static_cast<size_t>(e)];
    load[static_cast<size_t>(q / per_rank)] += share;
    total += share;
  }
  const double mean = total / num_ranks;
  return mean > 0 ? *std::max_element(load.begin(), load.end()) / mean : 1.0;
}

}  // namespace fathom::ep
