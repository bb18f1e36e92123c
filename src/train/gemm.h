// Internal: the GEMMs of the backward passes, with float64 scalar references (gemm_test.cpp
// compares them on random odd shapes). Row-major, no aliasing between A/B and C.
//   gemm_nn: C[M, N] (+)= A[M, K] . B[K, N]      dX = dY . W
//   gemm_tn: C[M, N] +=   A[K, M]^T . B[K, N]    dW += dY^T . X
//   gemm_nt: C[M, N] (+)= A[M, K] . B[N, K]^T    Y = X . W^T (the double path; float uses kernels/)
// float: gemm_nn / gemm_tn on OpenBLAS (train/blas.h; transposes folded into the call, rows of C
// split over the default pool, results independent of the thread count); gemm_nt on the
// runtime's fp32 matmul (AVX-512 / AVX2 / scalar). With GemmPrecision::kBf16 all three run on the
// runtime's bf16 matmul (AMX) where it pays, the operands converted (and transposed) per call.
// double (used by the finite-difference tests): blocked loops, rows of C split over the pool.
// Any of m, n, k may be 0 (k = 0 writes zeros unless accumulating).
#pragma once

#include <cstdint>

namespace fathom::train {

// What the float GEMMs compute in (the double ones always use float64).
//   kF32:  fp32 products and sums (the default).
//   kBf16: where the runtime's kernel runs the shape on AMX tiles (amx_bf16_usable, the
//          summed dimension a multiple of 64, at least 4 rows), both operands are rounded to bf16
//          (round-to-nearest-even) and the products summed in fp32; other shapes stay fp32.
//          Mixed precision as in DeepSeek's and PyTorch's training: the master weights, the
//          optimizer and every non-GEMM op stay fp32. Deterministic and independent of the
//          thread count, like kF32.
enum class GemmPrecision { kF32, kBf16 };
void set_gemm_precision(GemmPrecision p);  // process-wide; set before training starts
GemmPrecision gemm_precision();

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
