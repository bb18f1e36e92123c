// compute_layout (DeepEP's get_dispatch_layout) and Placement checks: per-rank, per-node and
// per-expert token counts, the token x rank membership, and each token's slot in the list of
// tokens sent to a rank (its final position among that source's rows at the receiver) and to a
// node. Sequential over tokens: slots are prefix counts in token order.
#include <algorithm>

#include "ep/group_impl.h"

namespace fathom::ep {

int Placement::num_nodes() const {
  int n = 0;
  for (int v : node_of_rank) n = std::max(n, v + 1);
  return n;
}

Status Placement::validate() const {
  if (num_ranks < 1) return invalid_argument("ep: placement needs at least one rank (got {})", num_ranks);
  if (num_experts < num_ranks || num_experts % num_ranks != 0)
    return invalid_argument("ep: {} experts do not split evenly over {} ranks", num_experts, num_ranks);
  if (static_cast<int>(node_of_rank.size()) != num_ranks)
    return invalid_argument("ep: node_of_rank has {} entries for {} ranks", node_of_rank.size(), num_ranks);
  std::vector<int> size(static_cast<size_t>(num_nodes()), 0);
  for (int r = 0; r < num_ranks; ++r) {
    const int n = node_of_rank[static_cast<size_t>(r)];
    if (n < 0) return invalid_argument("ep: rank {} has node id {}", r, n);
    size[static_cast<size_t>(n)]++;
  }
  for (size_t n = 0; n < size.size(); ++n)
    if (size[n] == 0)
      return invalid_argument("ep: node ids must be 0..{} without gaps; node {} has no rank", size.size() - 1,
                              n);
  return {};
}

namespace internal {

Status check_topk_ids(const int32_t* topk, int64_t tokens, int K, int E) {
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* ids = topk + t * K;
    for (int k = 0; k < K; ++k) {
      const int32_t e = ids[k];
      if (e == -1) continue;
      if (e < -1 || e >= E)
        return out_of_range("ep: token {} top-k slot {} selects expert {}, expected 0..{} or -1 for none", t,
                            k, e, E - 1);
      for (int j = 0; j < k; ++j)
        if (ids[j] == e)
          return invalid_argument("ep: token {} selects expert {} twice (top-k slots {} and {})", t, e, j, k);
    }
  }
  return {};
}

}  // namespace internal

Layout Layout::sized(const Placement& p, int64_t max_tokens) {
  Layout l;
  l.num_ranks = p.num_ranks;
  l.num_nodes = p.num_nodes();
  l.num_experts = p.num_experts;
  const size_t T = static_cast<size_t>(max_tokens), R = static_cast<size_t>(l.num_ranks);
  l.tokens_per_rank.assign(R, 0);
  l.tokens_per_node.assign(static_cast<size_t>(l.num_nodes), 0);
  l.tokens_per_expert.assign(static_cast<size_t>(l.num_experts), 0);
  l.token_in_rank.assign(T * R, 0);
  l.slot_in_rank.assign(T * R, -1);
  l.slot_in_node.assign(T * static_cast<size_t>(l.num_nodes), -1);
  return l;
}

Status compute_layout(const Placement& p, const int32_t* topk_idx, int64_t num_tokens, int topk, Layout* l) {
  const int R = p.num_ranks, N = p.num_nodes(), E = p.num_experts, L = p.experts_per_rank();
  if (l->num_ranks != R || l->num_nodes != N || l->num_experts != E)
    return invalid_argument("ep: layout was sized for {} ranks, {} nodes, {} experts, not {}, {}, {}",
                            l->num_ranks, l->num_nodes, l->num_experts, R, N, E);
  const int64_t capacity = R ? static_cast<int64_t>(l->token_in_rank.size()) / R : 0;
  if (num_tokens < 0 || num_tokens > capacity)
    return out_of_range("ep: {} tokens, but the layout holds at most {}", num_tokens, capacity);
  if (topk < 1) return invalid_argument("ep: topk must be >= 1 (got {})", topk);
  std::fill(l->tokens_per_rank.begin(), l->tokens_per_rank.end(), 0);
  std::fill(l->tokens_per_node.begin(), l->tokens_per_node.end(), 0);
  std::fill(l->tokens_per_expert.begin(), l->tokens_per_expert.end(), 0);
  l->num_tokens = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    uint8_t* in_rank = &l->token_in_rank[static_cast<size_t>(t * R)];
    int32_t* slot = &l->slot_in_rank[static_cast<size_t>(t * R)];
    int32_t* nslot = &l->slot_in_node[static_cast<size_t>(t * N)];
    std::fill(in_rank, in_rank + R, 0);
    std::fill(slot, slot + R, -1);
    std::fill(nslot, nslot + N, -1);
    const int32_t* ids = topk_idx + t * topk;
    for (int k = 0; k < topk; ++k) {
      const int32_t e = ids[k];
      if (e == -1) continue;
      if (e < -1 || e >= E)
        return out_of_range("ep: token {} top-k slot {} selects expert {}, expected 0..{} or -1 for none", t,
                            k, e, E - 1);
      for (int j = 0; j < k; ++j)
        if (ids[j] == e)
          return invalid_argument("ep: token {} selects expert {} twice (top-k slots {} and {})", t, e, j, k);
      l->tokens_per_expert[static_cast<size_t>(e)]++;
      in_rank[e / L] = 1;
    }
    for (int r = 0; r < R; ++r) {
      if (!in_rank[r]) continue;
      slot[r] = l->tokens_per_rank[static_cast<size_t>(r)]++;
      const int n = p.node_of_rank[static_cast<size_t>(r)];
      if (nslot[n] < 0) nslot[n] = l->tokens_per_node[static_cast<size_t>(n)]++;
    }
  }
  l->num_tokens = num_tokens;
  return {};
}

}  // namespace fathom::ep
