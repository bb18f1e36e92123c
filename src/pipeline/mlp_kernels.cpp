// The MLP stage's matrix products: axpy and dot-product loops the compiler vectorises, rows split
// across the thread pool. Plain C++ on purpose: this is the toy stage's compute, not a kernel the
// model path uses (kernels/ has those).
#include "pipeline/mlp_kernels.h"

#include "base/thread_pool.h"

// GCC's -O2 leaves loops with a remainder unvectorised; these loops are the stage's whole cost.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize")
#endif

namespace fathom::pipeline {

namespace {

constexpr int64_t kRowGrain = 4;

template <typename T>
inline void axpy(T* __restrict y, const T* __restrict x, T a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// Eight partial sums in a fixed order: vectorisable and deterministic.
template <typename T>
inline T dot(const T* __restrict x, const T* __restrict y, int64_t n) {
  T acc[8] = {};
  int64_t p = 0;
  for (; p + 8 <= n; p += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[p + l] * y[p + l];
  }
  for (; p < n; ++p) acc[0] += x[p] * y[p];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

template <typename T>
void gemm_nn(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c, bool accumulate) {
  default_pool().parallel_for(n, kRowGrain, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      T* ci = c + i * m;
      if (!accumulate) {
        for (int64_t j = 0; j < m; ++j) ci[j] = T(0);
      }
      for (int64_t p = 0; p < k; ++p) axpy(ci, b + p * m, a[i * k + p], m);
    }
  });
}

template <typename T>
void gemm_nt(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c, bool accumulate) {
  default_pool().parallel_for(n, kRowGrain, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const T* ai = a + i * k;
      T* ci = c + i * m;
      for (int64_t j = 0; j < m; ++j) {
        const T v = dot(ai, b + j * k, k);
        ci[j] = accumulate ? ci[j] + v : v;
      }
    }
  });
}

template <typename T>
void gemm_tn_acc(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c) {
  default_pool().parallel_for(k, kRowGrain, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      T* ci = c + i * m;
      for (int64_t t = 0; t < n; ++t) axpy(ci, b + t * m, a[t * k + i], m);
    }
  });
}

template void gemm_nn<float>(int64_t, int64_t, int64_t, const float*, const float*, float*, bool);
template void gemm_nn<double>(int64_t, int64_t, int64_t, const double*, const double*, double*, bool);
template void gemm_nt<float>(int64_t, int64_t, int64_t, const float*, const float*, float*, bool);
template void gemm_nt<double>(int64_t, int64_t, int64_t, const double*, const double*, double*, bool);
template void gemm_tn_acc<float>(int64_t, int64_t, int64_t, const float*, const float*, float*);
template void gemm_tn_acc<double>(int64_t, int64_t, int64_t, const double*, const double*, double*);

}  // namespace fathom::pipeline
