// The blocked backward GEMMs against their float64 references on random odd shapes.
#include "train/gemm.h"

#include <gtest/gtest.h>

#include "train/train_test_util.h"

namespace fathom::train {
namespace {

template <class T>
void check_all(int64_t m, int64_t n, int64_t k, Rng& rng, double tol) {
  std::vector<T> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), bt(static_cast<size_t>(n * k));
  std::vector<T> at(static_cast<size_t>(k * m)), c(static_cast<size_t>(m * n)), c0(c.size());
  for (auto* v : {&a, &b, &bt, &at, &c0}) {
    for (T& x : *v) x = static_cast<T>(2 * rng.uniform() - 1);
  }
  auto compare = [&](const char* what, const std::vector<double>& ref) {
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_NEAR(static_cast<double>(c[i]), ref[i], tol * static_cast<double>(k + 1))
          << what << " m=" << m << " n=" << n << " k=" << k;
    }
  };
  std::vector<double> ref(c.size());
  // nn, overwrite and accumulate
  std::fill(ref.begin(), ref.end(), 0.0);
  gemm_nn_ref(m, n, k, a.data(), b.data(), ref.data());
  gemm_nn(m, n, k, a.data(), b.data(), c.data(), false);
  compare("nn", ref);
  c = c0;
  for (size_t i = 0; i < c.size(); ++i) ref[i] = static_cast<double>(c0[i]);
  gemm_nn_ref(m, n, k, a.data(), b.data(), ref.data());
  gemm_nn(m, n, k, a.data(), b.data(), c.data(), true);
  compare("nn+=", ref);
  // tn always accumulates
  c = c0;
  for (size_t i = 0; i < c.size(); ++i) ref[i] = static_cast<double>(c0[i]);
  gemm_tn_ref(m, n, k, at.data(), b.data(), ref.data());
  gemm_tn(m, n, k, at.data(), b.data(), c.data());
  compare("tn", ref);
  // nt
  std::fill(ref.begin(), ref.end(), 0.0);
  gemm_nt_ref(m, n, k, a.data(), bt.data(), ref.data());
  gemm_nt(m, n, k, a.data(), bt.data(), c.data(), false);
  compare("nt", ref);
}

TEST(TrainGemm, BlockedKernelsMatchFloat64ReferencesOnOddShapes) {
  Rng rng(testing::fresh_seed("TrainGemm"));
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {17, 130, 65},
                               {64, 513, 70}, {129, 33, 257}, {2, 1030, 3}};
  for (const auto& s : shapes) {
    check_all<float>(s[0], s[1], s[2], rng, 2e-7);
    check_all<double>(s[0], s[1], s[2], rng, 1e-15);
  }
}

TEST(TrainGemm, EmptyShapesDoNothing) {
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 7.0f);
  gemm_tn<float>(2, 2, 0, a.data(), b.data(), c.data());
  EXPECT_EQ(c[0], 7.0f);
  gemm_nn<float>(2, 2, 0, a.data(), b.data(), c.data(), false);
  EXPECT_EQ(c[0], 0.0f);
}

}  // namespace
}  // namespace fathom::train
