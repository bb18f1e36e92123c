// Helpers of the multi-process ep tests: the group options every test starts from (with the
// topology chosen by the ctest entry through FATHOM_EP_TEST_* variables), a seed agreed by all
// ranks and printed once, random routing, and references computed in double.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/rng.h"
#include "ep/ep.h"
#include "tensor/convert.h"

// ASSERT/EXPECT that a Status is ok, printing its message when it is not.
#define EP_ASSERT_OK(expr)                                         \
  do {                                                             \
    const ::fathom::Status ep_s_ = (expr);                         \
    ASSERT_TRUE(ep_s_.ok()) << #expr << ": " << ep_s_.to_string(); \
  } while (0)
#define EP_EXPECT_OK(expr)                                         \
  do {                                                             \
    const ::fathom::Status ep_s_ = (expr);                         \
    EXPECT_TRUE(ep_s_.ok()) << #expr << ": " << ep_s_.to_string(); \
  } while (0)

namespace fathom::ep::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Options of the ctest entry's topology, small enough for oversubscribed test machines.
inline EpOptions base_options() {
  EpOptions o;
  o.max_tokens_per_rank = 96;
  o.hidden = 272;  // not a multiple of 128: a partial FP8 group
  o.topk = 4;
  o.num_experts = 8 * world_size();
  o.max_dispatch_format = WireFormat::kF32;
  o.combine_format = WireFormat::kF32;
  o.ranks_per_node = env_int("FATHOM_EP_TEST_RANKS_PER_NODE", 0);
  o.hierarchical = env_int("FATHOM_EP_TEST_HIERARCHICAL", 0) != 0;
  o.timeout_ms = 60000;
  return o;
}

// A seed chosen by rank 0, the same on every rank, printed once.
inline uint64_t shared_seed(const char* test) {
  uint64_t seed = 0;
  if (world_rank() == 0) {
    seed = std::random_device{}();
    if (const char* s = std::getenv("FATHOM_EP_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
    std::printf("[%s] seed %llu (FATHOM_EP_TEST_SEED to replay)\n", test,
                static_cast<unsigned long long>(seed));
    std::fflush(stdout);
  }
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

// Every rank's verdict: true when all ranks passed their own checks (so a failure on one rank
// also fails the test on the others, and all ranks stay in step).
inline bool all_ranks(bool ok) {
  int v = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

struct Routing {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int topk = 0;
  std::vector<float> x;        // [tokens, hidden]
  std::vector<int32_t> idx;    // [tokens, topk]
  std::vector<float> weights;  // [tokens, topk]
  Tensor x_view() { return Tensor::contiguous(DType::kF32, {tokens, hidden}, x.data()); }
  DispatchInput input(WireFormat f) { return DispatchInput{x_view(), idx.data(), weights.data(), f}; }
};

// Random tokens: distinct experts per token, some slots -1, optional skew toward expert `hot`.
inline Routing random_routing(Rng& rng, int64_t tokens, int64_t hidden, int topk, int num_experts,
                              double none_prob = 0.1, double hot_prob = 0.0, int hot = 0) {
  Routing r;
  r.tokens = tokens, r.hidden = hidden, r.topk = topk;
  r.x.resize(static_cast<size_t>(tokens * hidden));
  for (auto& v : r.x) v = static_cast<float>(rng.normal());
  r.idx.assign(static_cast<size_t>(tokens * topk), -1);
  r.weights.resize(static_cast<size_t>(tokens * topk));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < topk; ++k) {
      r.weights[static_cast<size_t>(t * topk + k)] = rng.uniform_f(0.05f, 1.0f);
      if (rng.uniform() < none_prob) continue;
      int32_t e;
      bool dup;
      do {
        e = (k == 0 && rng.uniform() < hot_prob)
                ? hot
                : static_cast<int32_t>(rng.below(static_cast<uint64_t>(num_experts)));
        dup = false;
        for (int j = 0; j < k; ++j) dup |= r.idx[static_cast<size_t>(t * topk + j)] == e;
      } while (dup);
      r.idx[static_cast<size_t>(t * topk + k)] = e;
    }
  }
  return r;
}

// A received row as f32 (decoding bf16 / FP8).
inline void row_to_f32(const Tensor& x, const Tensor& scales, int64_t row, float* out) {
  const int64_t h = x.cols();
  if (x.dtype == DType::kF32) {
    for (int64_t i = 0; i < h; ++i) out[i] = x.ptr<float>()[row * h + i];
  } else if (x.dtype == DType::kBF16) {
    for (int64_t i = 0; i < h; ++i) out[i] = bf16_to_f32(x.ptr<uint16_t>()[row * h + i]);
  } else {
    per_token_cast_back(x.ptr<uint8_t>() + row * h, scales.ptr<float>() + row * scales.cols(), 1, h, out);
  }
}

// Two float vectors hold the same bits (empty ones included).
inline bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Bytes of rows [0, n) of a view are identical.
inline bool same_bytes(const Tensor& a, const Tensor& b, int64_t n) {
  if (n == 0) return true;
  if (a.data == nullptr || b.data == nullptr || a.dim(0) < n || b.dim(0) < n) return false;
  const uint64_t per_row = a.nbytes() / static_cast<uint64_t>(a.dim(0));  // bytes of index 0 slices
  return std::memcmp(a.data, b.data, static_cast<size_t>(n) * per_row) == 0;
}

}  // namespace fathom::ep::test
