// GEMMs for the backward passes (see gemm.h). float: OpenBLAS (blas.h) for dX = dY.W and
// dW += dY^T.X, the runtime's fp32 matmul kernel (kernels/matmul.h) for Y = X.W^T. double: plain blocked loops
// (the panel sizes keep a K-block of B rows in L2 while each row of C reuses it).
#include "train/gemm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "train/blas.h"

namespace fathom::train {
namespace {

constexpr int64_t kBlockK = 64;
constexpr int64_t kBlockN = 512;

// c[0..n) += s * b[0..n)
template <class T>
inline void axpy(int64_t n, T s, const T* __restrict b, T* __restrict c) {
  for (int64_t j = 0; j < n; ++j) c[j] += s * b[j];
}

template <class T>
inline T dot(int64_t n, const T* __restrict a, const T* __restrict b) {
  // Four partial sums: a vectorisable reduction without -ffast-math.
  T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

int64_t grain_rows(int64_t n, int64_t k) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n * k / 64));
}

template <class T>
void gemm_nn_blocked(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  // a: [m, k]  b: [k, n]  c: [m, n]
  default_pool().parallel_for(m, grain_rows(n, k), [&](int64_t i0, int64_t i1, int) {
    if (!accumulate) std::memset(c + i0 * n, 0, static_cast<size_t>((i1 - i0) * n) * sizeof(T));
    for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
      const int64_t nb = std::min(kBlockN, n - j0);
      for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
        const int64_t p1 = std::min(k, p0 + kBlockK);
        for (int64_t i = i0; i < i1; ++i) {
          T* ci = c + i * n + j0;
          for (int64_t p = p0; p < p1; ++p) axpy(nb, a[i * k + p], b + p * n + j0, ci);
        }
      }
    }
  });
}

template <class T>
void gemm_tn_blocked(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  // a: [k, m]  b: [k, n]  c: [m, n] (accumulated)
  default_pool().parallel_for(m, grain_rows(n, k), [&](int64_t i0, int64_t i1, int) {
    for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
      const int64_t nb = std::min(kBlockN, n - j0);
      for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
        const int64_t p1 = std::min(k, p0 + kBlockK);
        for (int64_t i = i0; i < i1; ++i) {
          T* ci = c + i * n + j0;
          for (int64_t p = p0; p < p1; ++p) {
            const T s = a[p * m + i];
            if (s != T(0)) axpy(nb, s, b + p * n + j0, ci);
          }
        }
      }
    }
  });
}

template <class T>
void gemm_nt_blocked(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  // a: [m, k]  b: [n, k]  c: [m, n]
  default_pool().parallel_for(m, grain_rows(n, k), [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const T v = dot(k, a + i * k, b + j * k);
        c[i * n + j] = accumulate ? c[i * n + j] + v : v;
      }
    }
  });
}

// y[m, w_rows] (+)= x[m, w_cols] . W^T on the runtime's fp32 matmul (AVX-512 / AVX2 / scalar).
void runtime_matmul(const float* w, int64_t w_rows, int64_t w_cols, const float* x, int64_t m, float* y,
                    bool accumulate) {
  const WeightView view{.dtype = DType::kF32, .rows = w_rows, .cols = w_cols, .data = w};
  matmul(view, x, m, y, default_pool(), {.accumulate = accumulate});
}

// Degenerate shapes the matmul kernel does not take (it needs a positive weight shape).
template <class T>
bool trivial(int64_t m, int64_t n, int64_t k, T* c, bool accumulate) {
  if (m == 0 || n == 0) return true;
  if (k > 0) return false;
  if (!accumulate) std::memset(c, 0, static_cast<size_t>(m * n) * sizeof(T));
  return true;
}

}  // namespace

// float: OpenBLAS with the transposes folded into the call (no copies), rows of C split over the
// pool; Y = X.W^T on the runtime's kernel. double (the tests' instantiation): the blocked loops.
template <class T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  if (trivial(m, n, k, c, accumulate)) return;
  if constexpr (std::is_same_v<T, float>) {
    blas_gemm_rows<float>(false, false, m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, c, n);
  } else {
    gemm_nn_blocked(m, n, k, a, b, c, accumulate);
  }
}

template <class T>
void gemm_tn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  if (trivial(m, n, k, c, true)) return;
  if constexpr (std::is_same_v<T, float>) {
    blas_gemm_rows<float>(true, false, m, n, k, 1.0f, a, m, b, n, 1.0f, c, n);
  } else {
    gemm_tn_blocked(m, n, k, a, b, c);
  }
}

template <class T>
void gemm_nt(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  if (trivial(m, n, k, c, accumulate)) return;
  if constexpr (std::is_same_v<T, float>) {
    runtime_matmul(b, n, k, a, m, c, accumulate);
  } else {
    gemm_nt_blocked(m, n, k, a, b, c, accumulate);
  }
}

template <class T>
void gemm_nn_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * n + j] += static_cast<double>(a[i * k + p]) * static_cast<double>(b[p * n + j]);
}

template <class T>
void gemm_tn_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * n + j] += static_cast<double>(a[p * m + i]) * static_cast<double>(b[p * n + j]);
}

template <class T>
void gemm_nt_ref(int64_t m, int64_t n, int64_t k, const T* a, const T* b, double* c) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * n + j] += static_cast<double>(a[i * k + p]) * static_cast<double>(b[j * k + p]);
}

#define FATHOM_GEMM_INSTANTIATE(T)                                                      \
  template void gemm_nn<T>(int64_t, int64_t, int64_t, const T*, const T*, T*, bool);    \
  template void gemm_tn<T>(int64_t, int64_t, int64_t, const T*, const T*, T*);          \
  template void gemm_nt<T>(int64_t, int64_t, int64_t, const T*, const T*, T*, bool);    \
  template void gemm_nn_ref<T>(int64_t, int64_t, int64_t, const T*, const T*, double*); \
  template void gemm_tn_ref<T>(int64_t, int64_t, int64_t, const T*, const T*, double*); \
  template void gemm_nt_ref<T>(int64_t, int64_t, int64_t, const T*, const T*, double*);
FATHOM_GEMM_INSTANTIATE(float)
FATHOM_GEMM_INSTANTIATE(double)
#undef FATHOM_GEMM_INSTANTIATE

}  // namespace fathom::train
