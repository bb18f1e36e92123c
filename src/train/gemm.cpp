// GEMMs for the backward passes (see gemm.h). float: OpenBLAS (blas.h) for dX = dY.W and
// dW += dY^T.X, the runtime's fp32 matmul kernel (kernels/matmul.h) for Y = X.W^T; with
// GemmPrecision::kBf16, the runtime's bf16 kernel on AMX tiles for all three where the shape runs
// there. double: plain blocked loops (the panel sizes keep a K-block of B rows in L2 while each
// row of C reuses it).
#include "train/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "base/cpu.h"
#include "base/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_impl.h"
#include "tensor/convert.h"
#include "train/blas.h"

namespace fathom::train {
namespace {

std::atomic<GemmPrecision> g_precision{GemmPrecision::kF32};

// y[m, n] (+)= x[m, k] . W^T with W given as bf16 [n, k]: the runtime's kernel (AMX for these
// shapes), which rounds x to bf16 itself.
void bf16_matmul(const uint16_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y,
                 bool accumulate) {
  const WeightView view{.dtype = DType::kBF16, .rows = n, .cols = k, .data = w};
  matmul(view, x, m, y, default_pool(), {.accumulate = accumulate});
}

// Whether a product summing over k with m rows of activations runs on AMX in bf16.
bool use_bf16(int64_t m, int64_t k) {
  return g_precision.load(std::memory_order_relaxed) == GemmPrecision::kBf16 &&
         matmul_internal::amx_wanted(DType::kBF16, simd_level(), m, k);
}

// Per-thread conversion buffers, grown as needed and kept (the shapes repeat every step).
uint16_t* bf16_buffer(int64_t n) {
  thread_local std::vector<uint16_t> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}
std::vector<float>& f32_scratch() {
  thread_local std::vector<float> buf;
  return buf;
}

// dst[c * rows + r] = convert(src[r * ld + c]) for r < rows, c < cols: a transposed copy, in 32 x 32
// tiles split over the pool by column blocks.
template <class D, class F>
void transpose_convert(const float* src, int64_t rows, int64_t cols, int64_t ld, D* dst, F convert) {
  constexpr int64_t kT = 32;
  default_pool().parallel_for((cols + kT - 1) / kT, 4, [&](int64_t b0, int64_t b1, int) {
    for (int64_t cb = b0 * kT; cb < std::min(cols, b1 * kT); cb += kT) {
      const int64_t ce = std::min(cols, cb + kT);
      for (int64_t rb = 0; rb < rows; rb += kT) {
        const int64_t re = std::min(rows, rb + kT);
        for (int64_t c = cb; c < ce; ++c)
          for (int64_t r = rb; r < re; ++r) dst[c * rows + r] = convert(src[r * ld + c]);
      }
    }
  });
}

// As a lambda, so the conversion inlines into the copy loops.
constexpr auto kToBf16 = [](float v) { return f32_to_bf16(v); };
constexpr auto kKeep = [](float v) { return v; };

// tensor/convert.h's conversion, in parts over the pool.
void to_bf16(const float* src, int64_t n, uint16_t* dst) {
  default_pool().parallel_for(n, 16384, [&](int64_t i0, int64_t i1, int) {
    (void)from_f32(DType::kBF16, src + i0, dst + i0, i1 - i0);  // bf16 never fails
  });
}

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
void set_gemm_precision(GemmPrecision p) {
  g_precision.store(p);
}
GemmPrecision gemm_precision() {
  return g_precision.load();
}

template <class T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  if (trivial(m, n, k, c, accumulate)) return;
  if constexpr (std::is_same_v<T, float>) {
    if (use_bf16(m, k)) {  // c = a . (b^T)^T: b [k, n] transposed into a bf16 weight [n, k]
      uint16_t* bt = bf16_buffer(n * k);
      transpose_convert(b, k, n, n, bt, kToBf16);
      bf16_matmul(bt, n, k, a, m, c, accumulate);
      return;
    }
    blas_gemm_rows<float>(false, false, m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, c, n);
  } else {
    gemm_nn_blocked(m, n, k, a, b, c, accumulate);
  }
}

template <class T>
void gemm_tn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  if (trivial(m, n, k, c, true)) return;
  if constexpr (std::is_same_v<T, float>) {
    // c += a^T . b with a [k, m], b [k, n]: both operands have the summed dimension outermost, so
    // both are transposed. The larger of m and n becomes the bf16 weight (2 bytes written per
    // element instead of 4); when that is a, the product comes out as c^T and is added back.
    if (use_bf16(std::min(m, n), k)) {
      std::vector<float>& f = f32_scratch();
      if (m >= n) {
        uint16_t* at = bf16_buffer(m * k);
        transpose_convert(a, k, m, m, at, kToBf16);
        if (static_cast<int64_t>(f.size()) < n * k + n * m) f.resize(static_cast<size_t>(n * k + n * m));
        float* bt = f.data();
        float* ct = f.data() + n * k;
        transpose_convert(b, k, n, n, bt, kKeep);
        bf16_matmul(at, m, k, bt, n, ct, false);  // ct[n, m] = b^T . a
        default_pool().parallel_for(m, 64, [&](int64_t i0, int64_t i1, int) {
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < n; ++j) c[i * n + j] += ct[j * m + i];
        });
      } else {
        uint16_t* bt = bf16_buffer(n * k);
        transpose_convert(b, k, n, n, bt, kToBf16);
        if (static_cast<int64_t>(f.size()) < m * k) f.resize(static_cast<size_t>(m * k));
        transpose_convert(a, k, m, m, f.data(), kKeep);
        bf16_matmul(bt, n, k, f.data(), m, c, true);
      }
      return;
    }
    blas_gemm_rows<float>(true, false, m, n, k, 1.0f, a, m, b, n, 1.0f, c, n);
  } else {
    gemm_tn_blocked(m, n, k, a, b, c);
  }
}

template <class T>
void gemm_nt(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  if (trivial(m, n, k, c, accumulate)) return;
  if constexpr (std::is_same_v<T, float>) {
    if (use_bf16(m, k)) {
      uint16_t* wb = bf16_buffer(n * k);
      to_bf16(b, n * k, wb);
      bf16_matmul(wb, n, k, a, m, c, accumulate);
      return;
    }
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
