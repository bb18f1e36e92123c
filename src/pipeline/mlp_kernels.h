// Row-major matrix products for the MLP stage, over raw pointers. Each output element is summed in
// a fixed order and rows are split across the thread pool, so results are bit-identical for any
// thread count (the pipeline and its single-process reference must agree bit for bit).
#pragma once

#include <cstdint>

namespace fathom::pipeline {

// c: [n, m] (+)= a: [n, k] . b: [k, m]
template <typename T>
void gemm_nn(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c, bool accumulate);
// c: [n, m] (+)= a: [n, k] . b: [m, k]^T
template <typename T>
void gemm_nt(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c, bool accumulate);
// c: [k, m] += a: [n, k]^T . b: [n, m]   (weight gradients: summed over the n rows in order)
template <typename T>
void gemm_tn_acc(int64_t n, int64_t k, int64_t m, const T* a, const T* b, T* c);

}  // namespace fathom::pipeline
