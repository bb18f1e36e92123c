// The MLP stage's hand-written backward against central finite differences (double), the split
// backward against the reference order, slots holding micro-batches independently, and the matrix
// products against naive loops. Inputs are random with a printed seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "base/rng.h"
#include "base/timer.h"
#include "pipeline/executor_impl.h"
#include "pipeline/mlp_kernels.h"
#include "pipeline/trainer.h"

namespace fathom::pipeline {
namespace {

uint64_t seed_for(const char* name) {
  const uint64_t seed = now_ns();
  std::printf("%s seed %llu\n", name, static_cast<unsigned long long>(seed));
  return seed;
}

std::vector<double> random_vector(Rng& rng, size_t n, double scale = 1) {
  std::vector<double> v(n);
  for (double& x : v) x = scale * (2 * rng.uniform() - 1);
  return v;
}

// L = sum(output * r) for a fixed random r, so d L / d output = r.
double probe_loss(StageModule<double>& m, const std::vector<double>& x, const std::vector<double>& r) {
  std::vector<double> y(x.size());
  m.forward(0, x.data(), y.data());
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += y[i] * r[i];
  m.backward_input(0, r.data(), nullptr);  // frees nothing; keep the slot consistent
  m.backward_weight(0);
  return l;
}

TEST(PipelineMlpStage, GradientsMatchFiniteDifferences) {
  Rng rng(seed_for("mlp finite differences"));
  const MlpConfig c{.tokens = 3, .hidden = 5, .ffn = 7, .blocks_per_stage = 2, .seed = rng.next_u64()};
  auto m = make_mlp_stage<double>(c, 1);
  ASSERT_TRUE(m->reserve(1).ok());
  const auto x = random_vector(rng, size_t(c.tokens * c.hidden));
  const auto r = random_vector(rng, x.size());
  std::vector<double> y(x.size()), dx(x.size());
  std::fill(m->gradients().begin(), m->gradients().end(), 0.0);
  m->forward(0, x.data(), y.data());
  m->backward_input(0, r.data(), dx.data());
  m->backward_weight(0);
  const std::vector<double> grads(m->gradients().begin(), m->gradients().end());
  const double eps = 1e-6;
  // Input gradient.
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += eps;
    xm[i] -= eps;
    const double fd = (probe_loss(*m, xp, r) - probe_loss(*m, xm, r)) / (2 * eps);
    EXPECT_NEAR(dx[i], fd, 1e-7 * std::max(1.0, std::abs(fd))) << "input " << i;
  }
  // Every parameter (gamma, Wg, Wu, Wd of both blocks).
  std::span<double> p = m->parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + eps;
    const double lp = probe_loss(*m, x, r);
    p[i] = keep - eps;
    const double lm = probe_loss(*m, x, r);
    p[i] = keep;
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(grads[i], fd, 1e-7 * std::max(1.0, std::abs(fd))) << "parameter " << i;
  }
}

// Two micro-batches in two slots, backwards in the other order and interleaved with the weight
// passes: the same gradients as one after the other (up to the order of two additions).
TEST(PipelineMlpStage, SlotsHoldMicroBatchesIndependently) {
  Rng rng(seed_for("mlp slots"));
  const MlpConfig c{.tokens = 4, .hidden = 8, .ffn = 12, .blocks_per_stage = 2, .seed = rng.next_u64()};
  auto a = make_mlp_stage<double>(c, 0), b = make_mlp_stage<double>(c, 0);
  ASSERT_TRUE(a->reserve(2).ok());
  ASSERT_TRUE(b->reserve(1).ok());
  const size_t n = size_t(c.tokens * c.hidden);
  const auto x0 = random_vector(rng, n), x1 = random_vector(rng, n), g0 = random_vector(rng, n),
             g1 = random_vector(rng, n);
  std::vector<double> y(n), dx0(n), dx1(n), ref_dx0(n), ref_dx1(n), y0(n), y1(n), ref_y0(n), ref_y1(n);
  std::fill(a->gradients().begin(), a->gradients().end(), 0.0);
  std::fill(b->gradients().begin(), b->gradients().end(), 0.0);
  a->forward(0, x0.data(), y0.data());
  a->forward(1, x1.data(), y1.data());
  a->backward_input(1, g1.data(), dx1.data());
  a->backward_input(0, g0.data(), dx0.data());
  a->backward_weight(1);
  a->backward_weight(0);
  b->forward(0, x0.data(), ref_y0.data());
  b->backward_input(0, g0.data(), ref_dx0.data());
  b->backward_weight(0);
  b->forward(0, x1.data(), ref_y1.data());
  b->backward_input(0, g1.data(), ref_dx1.data());
  b->backward_weight(0);
  EXPECT_EQ(y0, ref_y0);
  EXPECT_EQ(y1, ref_y1);
  EXPECT_EQ(dx0, ref_dx0);
  EXPECT_EQ(dx1, ref_dx1);
  for (size_t i = 0; i < a->gradients().size(); ++i) {
    EXPECT_NEAR(a->gradients()[i], b->gradients()[i], 1e-13 * std::max(1.0, std::abs(b->gradients()[i])));
  }
}

TEST(PipelineMlpStage, SameStageIndexGivesIdenticalCopies) {
  const MlpConfig c{.tokens = 2, .hidden = 4, .ffn = 4, .blocks_per_stage = 1, .seed = 7};
  auto a = make_mlp_stage<float>(c, 3), b = make_mlp_stage<float>(c, 3), d = make_mlp_stage<float>(c, 2);
  EXPECT_TRUE(std::equal(a->parameters().begin(), a->parameters().end(), b->parameters().begin()));
  EXPECT_FALSE(std::equal(a->parameters().begin(), a->parameters().end(), d->parameters().begin()));
  EXPECT_FALSE(check_mlp_config({.tokens = 0}).ok());
  EXPECT_NE(check_mlp_config({.blocks_per_stage = 0}).message().find("blocks per stage"), std::string::npos);
}

template <typename T>
void check_gemms(Rng& rng, double tol) {
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = 1 + int64_t(rng.below(19)), k = 1 + int64_t(rng.below(37)),
                  m = 1 + int64_t(rng.below(29));
    auto rnd = [&](int64_t count) {
      std::vector<T> v(static_cast<size_t>(count));
      for (T& x : v) x = static_cast<T>(2 * rng.uniform() - 1);
      return v;
    };
    const auto a = rnd(n * k), bnn = rnd(k * m), bnt = rnd(m * k), atn = rnd(n * k), btn = rnd(n * m);
    std::vector<T> c(size_t(n * m)), ctn = rnd(k * m);
    const std::vector<T> ctn0 = ctn;
    gemm_nn(n, k, m, a.data(), bnn.data(), c.data(), false);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) ref += double(a[size_t(i * k + p)]) * double(bnn[size_t(p * m + j)]);
        EXPECT_NEAR(c[size_t(i * m + j)], ref, tol) << "nn " << n << "x" << k << "x" << m;
      }
    }
    gemm_nt(n, k, m, a.data(), bnt.data(), c.data(), false);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) ref += double(a[size_t(i * k + p)]) * double(bnt[size_t(j * k + p)]);
        EXPECT_NEAR(c[size_t(i * m + j)], ref, tol) << "nt " << n << "x" << k << "x" << m;
      }
    }
    gemm_tn_acc(n, k, m, atn.data(), btn.data(), ctn.data());
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double ref = ctn0[size_t(i * m + j)];
        for (int64_t t = 0; t < n; ++t)
          ref += double(atn[size_t(t * k + i)]) * double(btn[size_t(t * m + j)]);
        EXPECT_NEAR(ctn[size_t(i * m + j)], ref, tol) << "tn " << n << "x" << k << "x" << m;
      }
    }
  }
}

TEST(PipelineMlpStage, MatrixProductsMatchNaiveLoops) {
  Rng rng(seed_for("mlp gemm"));
  check_gemms<double>(rng, 1e-12);
  check_gemms<float>(rng, 2e-5);
}

TEST(PipelineAdamW, OneStepMatchesTheFormula) {
  AdamW<double> opt(2);
  std::vector<double> p = {1.0, -2.0};
  const std::vector<double> g = {0.5, -0.25};
  const AdamWParams a{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01};
  opt.step(a, p, g);
  for (int i = 0; i < 2; ++i) {
    const double p0 = i == 0 ? 1.0 : -2.0;
    const double m = 0.1 * g[size_t(i)], v = 0.01 * g[size_t(i)] * g[size_t(i)];
    const double mhat = m / (1 - 0.9), vhat = v / (1 - 0.99);
    const double want = p0 * (1 - 0.1 * 0.01) - 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(p[size_t(i)], want, 1e-12);
  }
  EXPECT_EQ(opt.steps(), 1);
}

}  // namespace
}  // namespace fathom::pipeline
