// The simulator reproduces the published bubble and activation figures exactly (integer costs, so
// double arithmetic is exact), DualPipeV equals half of DualPipe, and DualPipe's ranks mirror.
// Costs are drawn from a seeded generator; the seed is printed.
#include <gtest/gtest.h>

#include <cstdio>

#include "base/rng.h"
#include "base/timer.h"
#include "pipeline/pipeline.h"

namespace fathom::pipeline {
namespace {

uint64_t test_seed() {
  static const uint64_t seed = now_ns();
  static bool printed = false;
  if (!printed) {
    std::printf("pipeline simulate_test seed %llu\n", static_cast<unsigned long long>(seed));
    printed = true;
  }
  return seed;
}

Simulation run(ScheduleKind kind, int p, int m, const Costs& c) {
  auto s = make_schedule({.kind = kind, .n_ranks = p, .n_microbatches = m});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  auto sim = simulate(*s, c);
  EXPECT_TRUE(sim.ok()) << sim.status().to_string();
  return *sim;
}

int between(Rng& rng, int lo, int hi) {
  return lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
}

TEST(PipelineSimulate, OneFOneBAndGPipeIdleIsPpMinusOneTimesFPlusBOnEveryRank) {
  Rng rng(test_seed());
  for (int trial = 0; trial < 60; ++trial) {
    const int p = between(rng, 1, 8), m = between(rng, p, 3 * p + 3);
    const Costs c{
        .f = static_cast<double>(between(rng, 1, 9)), .b = static_cast<double>(between(rng, 1, 9)), .w = 0};
    for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
      const Simulation sim = run(kind, p, m, c);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(sim.idle[static_cast<size_t>(r)], (p - 1) * (c.f + c.b))
            << schedule_name(kind) << " p=" << p << " m=" << m << " F=" << c.f << " B=" << c.b << " rank "
            << r;
      }
      EXPECT_EQ(sim.makespan, (m + p - 1) * (c.f + c.b));
    }
  }
}

TEST(PipelineSimulate, ZB1PIdleIsPpMinusOneTimesFPlusBMinus2WOnEveryRank) {
  Rng rng(test_seed() + 1);
  for (int trial = 0; trial < 80; ++trial) {
    const int p = between(rng, 1, 8), m = between(rng, p, 3 * p + 3);
    const int f = between(rng, 1, 9), bi = between(rng, 1, 9);
    const int w = between(rng, 0, std::min(f, bi));  // the paper's setting: W <= min(F, B - W)
    const Costs c{.f = static_cast<double>(f), .b = static_cast<double>(bi + w), .w = static_cast<double>(w)};
    const Simulation sim = run(ScheduleKind::kZB1P, p, m, c);
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(sim.idle[static_cast<size_t>(r)], (p - 1) * (c.f + c.b - 2 * c.w))
          << "p=" << p << " m=" << m << " F=" << f << " B=" << c.b << " W=" << w << " rank " << r;
    }
  }
}

TEST(PipelineSimulate, ActivationsArePpForZB1PAndPpMinusRankFor1F1B) {
  for (int p = 1; p <= 8; ++p) {
    const Simulation zb = run(ScheduleKind::kZB1P, p, 3 * p, Costs{});
    const Simulation ofob = run(ScheduleKind::kOneFOneB, p, 3 * p, Costs{});
    const Simulation gp = run(ScheduleKind::kGPipe, p, 3 * p, Costs{});
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(zb.peak_activations[static_cast<size_t>(r)], p);
      EXPECT_EQ(ofob.peak_activations[static_cast<size_t>(r)], p - r);
      EXPECT_EQ(gp.peak_activations[static_cast<size_t>(r)], 3 * p);
    }
  }
}

// The DualPipe README's bubble, (PP/2-1)(F&B+B-3W), holds exactly when B-W = F, W <= F and the
// overlapped pair costs between max(F, B) and F + B; the peak is PP+1 activations on every rank.
TEST(PipelineSimulate, DualPipeBubbleAndActivationsMatchThePublishedFormulas) {
  Rng rng(test_seed() + 2);
  for (int trial = 0; trial < 80; ++trial) {
    const int p = 2 * between(rng, 1, 5), m = 2 * between(rng, p, 2 * p + 2);
    const int f = between(rng, 1, 8), w = between(rng, 0, f), b = f + w;
    const int fb = between(rng, b, f + b);
    const Costs c{.f = double(f), .b = double(b), .w = double(w), .fb = double(fb)};
    const Simulation sim = run(ScheduleKind::kDualPipe, p, m, c);
    EXPECT_EQ(sim.bubble, (p / 2 - 1) * (fb + b - 3 * w))
        << "p=" << p << " m=" << m << " F=" << f << " B=" << b << " W=" << w << " F&B=" << fb;
    for (int r = 0; r < p; ++r) EXPECT_EQ(sim.peak_activations[static_cast<size_t>(r)], p + 1);
    // DualPipeV: the same formula with PP = stages = 2 * ranks.
    const Simulation v = run(ScheduleKind::kDualPipeV, p / 2, m / 2, c);
    EXPECT_EQ(v.bubble, (p / 2 - 1) * (fb + b - 3 * w)) << "dualpipev ranks=" << p / 2 << " m=" << m / 2;
  }
}

// DualPipeV on n ranks is the first n ranks of DualPipe on 2n ranks with twice the micro-batches:
// same op kinds in the same order at the same times (without p2p latency: V's turn is local).
TEST(PipelineSimulate, DualPipeVEqualsTheFirstHalfOfDualPipe) {
  Rng rng(test_seed() + 3);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = between(rng, 1, 6), m = between(rng, 2 * n, 4 * n + 3);
    const int f = between(rng, 1, 9), w = between(rng, 0, 5);
    const Costs c{.f = double(f),
                  .b = double(between(rng, w + 1, w + 9)),
                  .w = double(w),
                  .fb = double(between(rng, 1, 20))};
    auto v = make_schedule({.kind = ScheduleKind::kDualPipeV, .n_ranks = n, .n_microbatches = m});
    auto d = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 2 * n, .n_microbatches = 2 * m});
    ASSERT_TRUE(v.ok() && d.ok());
    auto sv = simulate(*v, c);
    auto sd = simulate(*d, c);
    ASSERT_TRUE(sv.ok() && sd.ok());
    EXPECT_EQ(sv->makespan, sd->makespan);
    for (int r = 0; r < n; ++r) {
      std::vector<std::pair<OpKind, OpTime>> a, b;
      for (size_t i = 0; i < v->ranks[size_t(r)].size(); ++i) {
        if (v->ranks[size_t(r)][i].is_compute())
          a.push_back({v->ranks[size_t(r)][i].kind, sv->times[size_t(r)][i]});
      }
      for (size_t i = 0; i < d->ranks[size_t(r)].size(); ++i) {
        if (d->ranks[size_t(r)][i].is_compute())
          b.push_back({d->ranks[size_t(r)][i].kind, sd->times[size_t(r)][i]});
      }
      ASSERT_EQ(a.size(), b.size()) << "n=" << n << " rank " << r;
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].first, b[i].first);
        EXPECT_EQ(a[i].second.start, b[i].second.start)
            << "n=" << n << " m=" << m << " rank " << r << " op " << i;
        EXPECT_EQ(a[i].second.end, b[i].second.end);
      }
      EXPECT_EQ(sv->idle[size_t(r)], sd->idle[size_t(r)]);
      EXPECT_EQ(sv->peak_activations[size_t(r)], sd->peak_activations[size_t(r)]);
    }
  }
}

TEST(PipelineSimulate, DualPipeRankTimesMirrorItsPartnerEvenWithLatency) {
  Rng rng(test_seed() + 4);
  for (int trial = 0; trial < 30; ++trial) {
    const int p = 2 * between(rng, 1, 5), m = 2 * between(rng, p, 2 * p + 2);
    const int w = between(rng, 0, 4);
    const Costs c{.f = double(between(rng, 1, 9)),
                  .b = double(between(rng, w + 1, w + 9)),
                  .w = double(w),
                  .p2p = double(between(rng, 0, 3))};
    auto s = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = p, .n_microbatches = m});
    ASSERT_TRUE(s.ok());
    auto sim = simulate(*s, c);
    ASSERT_TRUE(sim.ok());
    for (int r = 0; r < p; ++r) {
      const auto& a = sim->times[size_t(r)];
      const auto& b = sim->times[size_t(p - 1 - r)];
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].start, b[i].start) << "p=" << p << " rank " << r << " op " << i;
        EXPECT_EQ(a[i].end, b[i].end);
      }
    }
  }
}

TEST(PipelineSimulate, LatencyDelaysOnlyRemoteInputs) {
  // 2 stages, 1 micro-batch: F on rank 0, latency, F and BW on rank 1, latency, BW on rank 0.
  const Simulation sim = run(ScheduleKind::kOneFOneB, 2, 1, {.f = 3, .b = 5, .w = 0, .p2p = 2});
  EXPECT_EQ(sim.makespan, 3 + 2 + 3 + 5 + 2 + 5);
  // DualPipeV's turn at the last rank is local: no latency between its two stages.
  const Simulation v1 = run(ScheduleKind::kDualPipeV, 1, 2, {.f = 1, .b = 2, .w = 1, .p2p = 100});
  EXPECT_EQ(v1.makespan, v1.busy[0]);
}

// Generic property over random schedules and costs: no compute op starts before its inputs exist.
TEST(PipelineSimulate, NoOpStartsBeforeItsInputsArrive) {
  Rng rng(test_seed() + 5);
  const ScheduleKind kinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZB1P,
                                ScheduleKind::kDualPipe, ScheduleKind::kDualPipeV};
  for (int trial = 0; trial < 40; ++trial) {
    const ScheduleKind kind = kinds[rng.below(5)];
    const int p = kind == ScheduleKind::kDualPipe ? 2 * between(rng, 1, 4) : between(rng, 1, 6);
    const int m = 2 * between(rng, p, 2 * p + 1);
    const int w = between(rng, 0, 3);
    const Costs c{.f = double(between(rng, 1, 9)),
                  .b = double(between(rng, w + 1, 9 + w)),
                  .w = double(w),
                  .p2p = double(between(rng, 0, 4))};
    auto s = make_schedule({.kind = kind, .n_ranks = p, .n_microbatches = m});
    ASSERT_TRUE(s.ok());
    auto sim = simulate(*s, c);
    ASSERT_TRUE(sim.ok());
    // end time of each task's forward and input-gradient, by (stage, mb)
    std::map<std::pair<int, int>, std::pair<double, int>> f_end, g_end;
    for (size_t r = 0; r < s->ranks.size(); ++r) {
      for (size_t i = 0; i < s->ranks[r].size(); ++i) {
        const Op& op = s->ranks[r][i];
        const double end = sim->times[r][i].end;
        if (op.kind == OpKind::kForward || op.kind == OpKind::kForwardBackward)
          f_end[{op.task.stage, op.task.mb}] = {end, int(r)};
        if (op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardInput)
          g_end[{op.task.stage, op.task.mb}] = {end, int(r)};
        if (op.kind == OpKind::kForwardBackward) g_end[{op.task2.stage, op.task2.mb}] = {end, int(r)};
      }
    }
    for (size_t r = 0; r < s->ranks.size(); ++r) {
      for (size_t i = 0; i < s->ranks[r].size(); ++i) {
        const Op& op = s->ranks[r][i];
        const double start = sim->times[r][i].start;
        auto after = [&](const std::pair<double, int>& producer) {
          const double need = producer.first + (producer.second == int(r) ? 0 : c.p2p);
          EXPECT_GE(start, need) << schedule_name(kind) << " rank " << r << " op " << op_label(op);
        };
        const Task fwd = op.task, bwd = op.kind == OpKind::kForwardBackward ? op.task2 : op.task;
        if ((op.kind == OpKind::kForward || op.kind == OpKind::kForwardBackward) && fwd.stage > 0) {
          after(f_end.at({fwd.stage - 1, fwd.mb}));
        }
        if ((op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardInput ||
             op.kind == OpKind::kForwardBackward) &&
            bwd.stage < s->n_stages - 1) {
          after(g_end.at({bwd.stage + 1, bwd.mb}));
        }
      }
    }
  }
}

TEST(PipelineSimulate, ReplayWithKindCostsEqualsSimulate) {
  const Costs c{.f = 3, .b = 5, .w = 2, .fb = 7, .p2p = 1};
  auto s = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 4, .n_microbatches = 10});
  ASSERT_TRUE(s.ok());
  std::vector<std::vector<double>> d(4);
  for (size_t r = 0; r < 4; ++r) {
    for (const Op& op : s->ranks[r]) {
      const double cost = op.kind == OpKind::kForward           ? c.f
                          : op.kind == OpKind::kBackward        ? c.b
                          : op.kind == OpKind::kBackwardInput   ? c.b - c.w
                          : op.kind == OpKind::kWeight          ? c.w
                          : op.kind == OpKind::kForwardBackward ? *c.fb
                                                                : 0;
      d[r].push_back(cost);
    }
  }
  auto a = simulate(*s, c);
  auto b = replay(*s, d, c.p2p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->makespan, b->makespan);
  EXPECT_EQ(a->idle, b->idle);
  d[1].pop_back();
  EXPECT_FALSE(replay(*s, d, 0).ok());
  // Per-rank costs: all equal gives the same; a slower rank 2 shows up as idle on the others.
  auto same = simulate_per_rank(*s, std::vector<Costs>(4, c));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->idle, a->idle);
  std::vector<Costs> slow(4, c);
  slow[2].f *= 2;
  auto uneven = simulate_per_rank(*s, slow);
  ASSERT_TRUE(uneven.ok());
  EXPECT_GT(uneven->makespan, a->makespan);
  EXPECT_LT(uneven->idle[2], uneven->idle[0]);
  EXPECT_FALSE(simulate_per_rank(*s, std::vector<Costs>(3, c)).ok());
}

TEST(PipelineSimulate, RejectsBadCosts) {
  auto s = make_schedule({.kind = ScheduleKind::kOneFOneB, .n_ranks = 2, .n_microbatches = 4});
  ASSERT_TRUE(s.ok());
  EXPECT_NE(simulate(*s, {.f = 0}).status().message().find("cost F"), std::string::npos);
  EXPECT_NE(simulate(*s, {.f = 1, .b = 2, .w = 3}).status().message().find("cost W must be in [0, B]"),
            std::string::npos);
  EXPECT_NE(simulate(*s, {.f = 1, .b = 2, .w = 1, .p2p = -1}).status().message().find("p2p"),
            std::string::npos);
}

}  // namespace
}  // namespace fathom::pipeline
