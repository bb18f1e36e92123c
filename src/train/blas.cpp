// OpenBLAS behind the training GEMMs (see blas.h).
#include "train/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "base/check.h"
#include "base/cpu.h"
#include "base/thread_pool.h"

namespace fathom::train {
namespace {

// OpenBLAS is opened on first use rather than linked: its kernels are chosen when the library
// initialises, from OPENBLAS_CORETYPE or its own CPU detection. Fathom sets OPENBLAS_CORETYPE from
// its own run-time SIMD level first (simd_level(), which --simd / FATHOM_SIMD cap), so training
// uses the same instruction set as the kernels: SkylakeX's AVX-512 kernels on AVX-512 CPUs
// (~1.5x Haswell's on the training GEMMs here), Haswell's on AVX2, OpenBLAS's choice otherwise.
// This overrides an inherited OPENBLAS_CORETYPE (this machine's environment pins Haswell).
struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
};

const Blas& blas() {
  static const Blas lib = [] {
    const SimdLevel level = simd_level();
    if (level >= SimdLevel::kAvx512) {
      setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1);
    } else if (level >= SimdLevel::kAvx2) {
      setenv("OPENBLAS_CORETYPE", "HASWELL", 1);
    }
    void* h = nullptr;
    for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    CHECK_MSG(h != nullptr, "training needs OpenBLAS (Debian package libopenblas0-pthread; "
                            "scripts/install-deps.sh installs it): {}", dlerror());
    Blas b;
    b.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(h, "cblas_sgemm"));
    b.dgemm = reinterpret_cast<decltype(&cblas_dgemm)>(dlsym(h, "cblas_dgemm"));
    auto set_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(h, "openblas_set_num_threads"));
    CHECK_MSG(b.sgemm != nullptr && b.dgemm != nullptr && set_threads != nullptr,
              "the OpenBLAS library found lacks cblas_sgemm / cblas_dgemm / openblas_set_num_threads");
    set_threads(1);  // parallelism comes from Fathom's pool
    return b;
  }();
  return lib;
}

}  // namespace

template <class T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
               int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CHECK(m > 0 && n > 0 && k >= 0 && ldc >= n);
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  // BLAS rejects ld < 1 even for k = 0
  const auto ld = [](int64_t v) { return static_cast<blasint>(std::max<int64_t>(v, 1)); };
  if constexpr (std::is_same_v<T, float>) {
    blas().sgemm(CblasRowMajor, opa, opb, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, a, ld(lda), b, ld(ldb), beta, c, ld(ldc));
  } else {
    blas().dgemm(CblasRowMajor, opa, opb, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, a, ld(lda), b, ld(ldb), beta, c, ld(ldc));
  }
}

template <class T>
void blas_gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                    const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  ThreadPool& pool = default_pool();
  // at least ~1 MFLOP per part, at most one part per thread
  const int64_t parts = std::clamp<int64_t>(m * n * std::max<int64_t>(k, 1) / (1 << 20), 1, pool.size());
  const int64_t rows = (m + parts - 1) / parts;
  pool.run(parts, [&](int64_t p, int) {
    const int64_t r0 = p * rows, r1 = std::min(m, r0 + rows);
    if (r0 >= r1) return;
    // row r of op(A) starts at a + r * lda (not transposed) or a + r (transposed: a column)
    const T* ap = ta ? a + r0 : a + r0 * lda;
    blas_gemm(ta, tb, r1 - r0, n, k, alpha, ap, lda, b, ldb, beta, c + r0 * ldc, ldc);
  });
}

#define FATHOM_BLAS_INSTANTIATE(T)                                                                       \
  template void blas_gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, \
                             T, T*, int64_t);                                                            \
  template void blas_gemm_rows<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,   \
                                  int64_t, T, T*, int64_t);
FATHOM_BLAS_INSTANTIATE(float)
FATHOM_BLAS_INSTANTIATE(double)
#undef FATHOM_BLAS_INSTANTIATE

}  // namespace fathom::train
