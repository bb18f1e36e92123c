// Internal: row-major GEMM on OpenBLAS for the training path, float and double.
//   C[m, n] = alpha * op(A)[m, k] . op(B)[k, n] + beta * C, op = transpose when ta / tb.
// Leading dimensions are the row strides of A, B, C as stored (so a head's slice of an
// interleaved [tokens, heads, dim] array is a matrix with ld = heads * dim, no copy).
// OpenBLAS runs single-threaded inside each call: parallelism comes from Fathom's pool, which
// splits the output rows (blas_gemm_rows) or runs independent GEMMs per task. Each element of C
// is summed over k in the same order whatever the split, so results do not depend on the thread
// count (what makes pipelined and single-process training bit-identical).
#pragma once

#include <cstdint>

namespace fathom::train {

template <class T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc);

// The same with the rows of C split over the default pool (one single-threaded call per part).
template <class T>
void blas_gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                    const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace fathom::train
