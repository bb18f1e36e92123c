// EPLB: DeepSeek's expert-parallel load balancer. Given per-expert loads (tokens routed to each
// logical expert, e.g. a moving average), it replicates hot experts into redundant physical
// slots and packs the physical experts onto ranks so every rank gets a similar load:
// - hierarchical policy (num_groups divisible by num_nodes): pack expert groups onto nodes, then
//   replicate within each node, then pack the replicas onto the node's ranks (keeps a group's
//   experts, and so group-limited routing, inside a node);
// - global policy: replicate globally and pack onto ranks, ignoring groups and nodes.
// Physical expert p lives on rank p / (num_physical / num_ranks), the placement EpGroup uses, so
// dispatch runs over physical ids after route_to_replicas() rewrote the router's logical ids.
//
// Pure functions, deterministic (ties go to the lowest index), no MPI.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace fathom::ep {

enum class EplbPolicy : uint8_t { kAuto, kHierarchical, kGlobal };  // kAuto: DeepSeek's choice

struct EplbParams {
  int num_physical = 0;  // physical expert slots, a multiple of num_ranks, >= logical experts
  int num_groups = 1;    // expert groups of the router (n_group)
  int num_nodes = 1;
  int num_ranks = 1;  // a multiple of num_nodes
  EplbPolicy policy = EplbPolicy::kAuto;
};

struct EplbPlan {
  int num_layers = 0, num_logical = 0, num_physical = 0, max_replicas = 0;
  bool hierarchical = false;         // the policy that ran
  std::vector<int32_t> phy2log;      // [layers, physical]: logical expert of each slot
  std::vector<int32_t> phy_replica;  // [layers, physical]: which replica of its expert
  std::vector<int32_t> log2phy;      // [layers, logical, max_replicas], -1 padded
  std::vector<int32_t> logcnt;       // [layers, logical]: replicas per logical expert
};

// weight: [layers, logical] loads (>= 0). Errors name the parameter that does not divide.
Result<EplbPlan> rebalance_experts(const double* weight, int num_layers, int num_logical,
                                   const EplbParams& p);

// How a token picks among an expert's replicas.
enum class ReplicaRouting : uint8_t {
  kRoundRobin,  // replica (token_offset + t + k) % count: spreads each expert's tokens evenly
  kNearest,     // a replica on this rank, else on this node, else round robin among the rest
};

struct RouteParams {
  int layer = 0;
  int rank = 0;  // the dispatching rank (for kNearest)
  int num_ranks = 1;
  std::vector<int> node_of_rank;  // [ranks] (kNearest); empty: one node
  int64_t token_offset = 0;       // global index of token 0 (spreads ranks' tokens differently)
  ReplicaRouting routing = ReplicaRouting::kRoundRobin;
};

// logical_topk: [tokens, k] logical ids (-1 kept) -> physical_topk: [tokens, k] physical ids.
Status route_to_replicas(const EplbPlan& plan, const RouteParams& p, const int32_t* logical_topk,
                         int64_t num_tokens, int topk, int32_t* physical_topk);

// Max over ranks of the load it would get / mean load, for a plan and loads (1.0 is perfect).
double eplb_imbalance(const EplbPlan& plan, int layer, const double* weight, int num_ranks);

}  // namespace fathom::ep
