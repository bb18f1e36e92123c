// Internal: the GEMMs of the backward passes, with float64 scalar references (gemm_test.cpp
// compares them on random odd shapes). Row-major, no aliasing between A/B and C.
//   gemm_nn: C[M, N] (+)= A[M, K] . B[K, N]      dX = dY . W
//   gemm_tn: C[M, N] +=   A[K, M]^T . B[K, N]    dW += dY^T . X
//   gemm_nt: C[M, N] (+)= A[M, K] . B[N, K]^T    Y = X . W^T (the double path; float uses kernels/)
// float: gemm_nn / gemm_tn on OpenBLAS (train/blas.h; transposes folded into the call, rows of C
// split over the default pool, results independent of the thread count); gemm_nt on the
// runtime's fp32 matmul (AVX-512 / AVX2 / scalar). double (used by the finite-difference tests):
// blocked loops, rows of C split over the pool.
// Any of m, n, k may be 0 (k = 0 writes zeros unless accumulating).
#pragma once

#include <cstdint>

namespace fathom::train {

template <class T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate);
template <class T>
void gemm_tn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c);
template <class T>
void gemm_nt(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate);

// Float64 references (plain triple loops): out = the exact product (+ c_in when accumulating).
template <class T>
void gemm_nn_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c);
template <class T>
void gemm_tn_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c);
template <class T>
void gemm_nt_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c);

}  // namespace fathom::train
