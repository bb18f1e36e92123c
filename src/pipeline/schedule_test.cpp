// Schedule generators: every shape validates, bad parameters name their rule, DualPipe follows
// the reference's phase program, and DualPipe's ranks mirror each other.
#include <gtest/gtest.h>

#include <string>

#include "pipeline/pipeline.h"
#include "pipeline/schedule_impl.h"

namespace fathom::pipeline {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZB1P,
                                      ScheduleKind::kDualPipe, ScheduleKind::kDualPipeV};

std::string compute_labels(const Schedule& s, int rank) {
  std::string out;
  for (const Op& op : s.ranks[static_cast<size_t>(rank)]) {
    if (!op.is_compute()) continue;
    if (!out.empty()) out += ' ';
    out += op_label(op);
  }
  return out;
}

bool valid_params(ScheduleKind kind, int p, int m) {
  if (kind == ScheduleKind::kDualPipe) return p % 2 == 0 && m % 2 == 0 && m >= 2 * p;
  if (kind == ScheduleKind::kDualPipeV) return m >= 2 * p;
  return true;
}

TEST(PipelineSchedule, EveryKindValidatesOverManyShapes) {
  for (ScheduleKind kind : kAllKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m : {1, 2, 3, p, 2 * p, 2 * p + 1, 2 * p + 2, 3 * p + 4, 20}) {
        auto s = make_schedule({.kind = kind, .n_ranks = p, .n_microbatches = m});
        if (!valid_params(kind, p, m)) {
          EXPECT_FALSE(s.ok()) << schedule_name(kind) << " p=" << p << " m=" << m;
          continue;
        }
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        Status v = validate(*s);
        EXPECT_TRUE(v.ok()) << schedule_name(kind) << " p=" << p << " m=" << m << ": " << v.to_string();
      }
    }
  }
}

TEST(PipelineSchedule, RejectsParametersNamingTheRuleTheyBreak) {
  auto msg = [](ScheduleKind k, int p, int m) {
    auto s = make_schedule({.kind = k, .n_ranks = p, .n_microbatches = m});
    EXPECT_FALSE(s.ok());
    return s.status().message();
  };
  EXPECT_NE(msg(ScheduleKind::kDualPipe, 3, 12).find("even number of ranks"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kDualPipe, 4, 9).find("even number of micro-batches"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kDualPipe, 4, 6).find("at least 2 micro-batches per rank (8 for 4 ranks)"),
            std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kDualPipeV, 3, 5).find("at least 2 micro-batches per rank"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kOneFOneB, 0, 4).find("number of ranks"), std::string::npos);
  EXPECT_NE(msg(ScheduleKind::kZB1P, 2, 0).find("number of micro-batches"), std::string::npos);
  EXPECT_FALSE(parse_schedule_kind("zb2p").ok());
  EXPECT_EQ(*parse_schedule_kind("dualpipev"), ScheduleKind::kDualPipeV);
}

// Hand-checked against deepseek-ai/DualPipe's step(): 4 ranks, 10 micro-batches.
TEST(PipelineSchedule, DualPipeFollowsTheReferencePhases) {
  auto s = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 4, .n_microbatches = 10});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(compute_labels(*s, 0), "F0 F1 F2 f5 b5 w5 f6 F3&b6 f7&B0 F4&b7 f8&B1 bw8 f9&B2 bw9 B3 W3 B4 W4");
  EXPECT_EQ(compute_labels(*s, 1), "F0 f5 F1 f6 F2 bw5 f7&B0 F3&b6 f8&B1 F4&b7 f9&B2 bw8 BW3 b9 B4 w9 W4");
  EXPECT_EQ(compute_labels(*s, 2), "f5 F0 f6 F1 f7 BW0 F2&b5 f8&B1 F3&b6 f9&B2 F4&b7 BW3 bw8 B4 b9 W4 w9");
  EXPECT_EQ(compute_labels(*s, 3), "f5 f6 f7 F0 B0 W0 F1 f8&B1 F2&b5 f9&B2 F3&b6 BW3 F4&b7 BW4 b8 w8 b9 w9");
}

TEST(PipelineSchedule, OneFOneBWarmsUpWithOneForwardPerLaterStage) {
  auto s = make_schedule({.kind = ScheduleKind::kOneFOneB, .n_ranks = 4, .n_microbatches = 6});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(compute_labels(*s, 0), "F0 F1 F2 F3 BW0 F4 BW1 F5 BW2 BW3 BW4 BW5");
  EXPECT_EQ(compute_labels(*s, 3), "F0 BW0 F1 BW1 F2 BW2 F3 BW3 F4 BW4 F5 BW5");
  auto z = make_schedule({.kind = ScheduleKind::kZB1P, .n_ranks = 3, .n_microbatches = 4});
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(compute_labels(*z, 0), "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
  EXPECT_EQ(compute_labels(*z, 2), "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
}

// Rank r of DualPipe runs rank n-1-r's program with the directions swapped.
TEST(PipelineSchedule, DualPipeRankMirrorsItsPartner) {
  for (int p : {2, 4, 6, 8}) {
    for (int m : {2 * p, 2 * p + 4}) {
      auto s = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = p, .n_microbatches = m});
      ASSERT_TRUE(s.ok());
      auto mirror = [&](Task t) {
        t.mb = t.direction == 0 ? t.mb + m / 2 : t.mb - m / 2;
        t.direction = 1 - t.direction;
        return t;
      };
      for (int r = 0; r < p; ++r) {
        const auto& a = s->ranks[static_cast<size_t>(r)];
        const auto& b = s->ranks[static_cast<size_t>(p - 1 - r)];
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_EQ(a[i].kind, b[i].kind) << "p=" << p << " rank " << r << " op " << i;
          if (!a[i].is_compute()) continue;
          EXPECT_TRUE(mirror(a[i].task) == b[i].task) << op_label(a[i]) << " vs " << op_label(b[i]);
          if (a[i].kind == OpKind::kForwardBackward) {
            EXPECT_TRUE(mirror(a[i].task2) == b[i].task2);
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, PlacementPutsEachStageOnItsRankAndChunk) {
  auto s = make_schedule({.kind = ScheduleKind::kDualPipeV, .n_ranks = 3, .n_microbatches = 6});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->n_stages, 6);
  EXPECT_EQ(s->rank_of(0, 0), 0);
  EXPECT_EQ(s->rank_of(0, 5), 0);
  EXPECT_EQ(s->rank_of(0, 2), 2);
  EXPECT_EQ(s->rank_of(0, 3), 2);
  EXPECT_EQ(s->chunk_of(0, 4), 1);
  EXPECT_EQ(s->chunk_task(1, 1).stage, 4);
  auto d = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 4, .n_microbatches = 8});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->rank_of(1, 0), 3);
  EXPECT_EQ(d->chunk_task(0, 1).stage, 3);
  EXPECT_EQ(d->chunk_task(0, 1).direction, 1);
  EXPECT_EQ(d->direction_of(3), 0);
  EXPECT_EQ(d->direction_of(4), 1);
  // Tags are unique per message.
  EXPECT_NE(d->tag(Payload::kActivation, {0, 1, 2}), d->tag(Payload::kGradient, {0, 1, 2}));
  EXPECT_LE(d->tag(Payload::kGradient, {1, 3, 7}), d->max_tag());
}

TEST(PipelineSchedule, ReceivesArePostedOneComputeOpAheadAndSendsRightAfterTheProducer) {
  auto s = make_schedule({.kind = ScheduleKind::kOneFOneB, .n_ranks = 2, .n_microbatches = 3});
  ASSERT_TRUE(s.ok());
  // Rank 1 (last stage): F1's receive is posted before BW0, the compute op ahead of F1.
  const auto& ops = s->ranks[1];
  ASSERT_GE(ops.size(), 5u);
  EXPECT_EQ(ops[0].kind, OpKind::kRecv);
  EXPECT_EQ(ops[0].task.mb, 0);
  EXPECT_EQ(ops[1].kind, OpKind::kForward);
  EXPECT_EQ(ops[2].kind, OpKind::kRecv);
  EXPECT_EQ(ops[2].task.mb, 1);
  EXPECT_EQ(ops[3].kind, OpKind::kBackward);
  EXPECT_EQ(ops[4].kind, OpKind::kSend);
  EXPECT_EQ(ops[4].payload, Payload::kGradient);
  EXPECT_EQ(ops[4].peer, 0);
}

}  // namespace
}  // namespace fathom::pipeline
