// SpecController on made-up step timings: a way never measured is tried first (drafting not where
// a smaller batch measured it slower), the faster one is kept, the other is tried again for
// kSpecProbeSteps steps at doubling intervals, and batch-size buckets decide apart.
#include "engine/spec_controller.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

// Runs `steps` decisions for a batch of n, recording each steady step at the given rates (as the
// engine does: a step is steady when it and the step before took the same way); returns how many
// drafted.
int run(SpecController& c, int64_t n, int steps, double spec_tps, double plain_tps) {
  int drafted = 0;
  bool prev = true, have_prev = false;
  for (int i = 0; i < steps; ++i) {
    const bool d = c.want_drafts(n);
    drafted += d ? 1 : 0;
    if (have_prev && prev == d) c.record(n, d, d ? spec_tps : plain_tps);
    prev = d;
    have_prev = true;
  }
  return drafted;
}

TEST(SpecController, TriesBothWaysThenKeepsTheFasterAndProbesTheOther) {
  SpecController c;
  // Unknown: drafting first, then (drafting measured) plain steps.
  EXPECT_TRUE(c.want_drafts(1));
  EXPECT_TRUE(c.want_drafts(1));
  c.record(1, true, 10.0);
  EXPECT_FALSE(c.want_drafts(1));
  c.record(1, false, 20.0);
  EXPECT_FALSE(c.preferred(1));  // what a step of prompts alone takes, without advancing a probe
  // Plain is twice as fast: it drafts only in probes, after 64, 128, 256, ... steps (each probe
  // confirms plain, so the interval doubles).
  const int drafted = run(c, 1, 64 + 128 + 256 + 512 + 10, 10.0, 20.0);
  EXPECT_EQ(drafted, 4 * kSpecProbeSteps);
  // Drafting becomes faster (a model whose drafts are accepted): the next probe, at most
  // kSpecProbeEveryMax steps away, measures it afresh, and from then on it is kept.
  run(c, 1, kSpecProbeEveryMax + 2 * kSpecProbeSteps, 30.0, 20.0);
  const int later = run(c, 1, 500, 30.0, 20.0);
  EXPECT_GE(later, 500 - 3 * kSpecProbeSteps);  // plain again only in probes: 64, 128, 256 steps apart
}

TEST(SpecController, BatchSizeBucketsDecideApart) {
  EXPECT_EQ(SpecController::bucket(0), 0);
  EXPECT_EQ(SpecController::bucket(1), 0);
  EXPECT_EQ(SpecController::bucket(2), 1);
  EXPECT_EQ(SpecController::bucket(3), 1);
  EXPECT_EQ(SpecController::bucket(32), 5);
  EXPECT_EQ(SpecController::bucket(int64_t{1} << 40), kSpecBuckets - 1);
  SpecController c;
  EXPECT_TRUE(c.preferred(1)) << "drafting is tried first";
  run(c, 1, 300, 30.0, 10.0);   // one sequence: drafting pays
  run(c, 32, 300, 50.0, 90.0);  // 32: it does not
  EXPECT_GT(run(c, 1, 200, 30.0, 10.0), 180);
  EXPECT_LT(run(c, 32, 200, 50.0, 90.0), 20);
  EXPECT_TRUE(c.preferred(1));
  EXPECT_FALSE(c.preferred(40));
}

// Where drafting lost at a smaller batch, a larger one starts with plain steps and measures
// drafting in its first probe instead of at once; a smaller batch than any measured, or one below
// a batch where drafting won, still tries drafting first.
TEST(SpecController, LargerBatchesPresumeWhatASmallerOneMeasuredAgainstDrafting) {
  SpecController c;
  run(c, 1, 300, 10.0, 20.0);  // one sequence: drafting loses
  EXPECT_FALSE(c.preferred(16));
  EXPECT_FALSE(c.want_drafts(16));
  // 16 sequences: no drafting until the first probe, kSpecProbeEvery steps in...
  EXPECT_EQ(run(c, 16, static_cast<int>(kSpecProbeEvery) - 2, 100.0, 50.0), 0);
  // ...which measures drafting here, faster at this size (made-up rates): it is kept from then on.
  const int drafted = run(c, 16, 200, 100.0, 50.0);
  EXPECT_GE(drafted, 200 - 3 * kSpecProbeSteps);  // plain in two probes and a step before the first
  EXPECT_TRUE(c.preferred(16));
  // 32 sequences: the nearest smaller bucket with both ways measured (16) found drafting faster.
  EXPECT_TRUE(c.preferred(32));
  EXPECT_TRUE(c.want_drafts(32));

  SpecController d;
  run(d, 8, 300, 10.0, 20.0);  // 8 sequences: drafting loses
  EXPECT_TRUE(d.preferred(1)) << "nothing measured below 8: drafting is tried first";
  EXPECT_TRUE(d.want_drafts(2));
  EXPECT_FALSE(d.preferred(100));
}

}  // namespace
}  // namespace fathom
