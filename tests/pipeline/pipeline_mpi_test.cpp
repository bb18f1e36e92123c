// `mpirun -np N fathom pipeline train` end to end: every schedule on 2 and 4 ranks (oversubscribed)
// equals a single-process run (first-step losses bit-identical, gradients within the bound,
// DualPipe's replicas bit-identical), random delays change nothing, injected faults are caught,
// a real run writes its trace and SVG, and a bad rank count is a clear error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "mpi_run.h"
#include "pipeline/pipeline.h"

namespace fathom::pipeline {
namespace {

using testing::MpiRun;
using testing::mpirun;
using testing::temp_path;

struct Case {
  const char* schedule;
  int ranks;
  const char* dtype;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.schedule << " on " << c.ranks << " ranks, " << c.dtype;
}

class PipelineMpiVerify : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineMpiVerify, MatchesTheSingleProcessRun) {
  const Case c = GetParam();
  const MpiRun r = mpirun(c.ranks, std::string("--schedule ") + c.schedule + " --dtype " + c.dtype +
                                       " --microbatches 8 --steps 3 --verify --json");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  const auto& v = r.json.at("verify");
  EXPECT_TRUE(v.at("passed").get<bool>()) << v.dump();
  EXPECT_TRUE(v.at("first_step_losses_identical").get<bool>());
  EXPECT_LE(v.at("grad_rel_err").get<double>(), std::string(c.dtype) == "f64" ? 1e-10 : 1e-5);
  EXPECT_LE(v.at("later_loss_rel_err").get<double>(), std::string(c.dtype) == "f64" ? 1e-10 : 1e-5);
  EXPECT_TRUE(v.at("replicas_identical").get<bool>());
  ASSERT_EQ(r.json.at("losses").size(), 3u);
  for (const auto& step : r.json.at("losses")) {
    ASSERT_EQ(step.size(), 8u);
    for (const auto& l : step) EXPECT_GT(l.get<double>(), 0);
  }
  for (const auto& m : r.json.at("measured")) {
    EXPECT_GE(m.at("bubble_fraction").get<double>(), 0);
    EXPECT_LE(m.at("bubble_fraction").get<double>(), 1);
    EXPECT_EQ(m.at("idle_ms").size(), size_t(c.ranks));
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineMpiVerify,
                         ::testing::Values(Case{"gpipe", 2, "f64"}, Case{"1f1b", 2, "f64"},
                                           Case{"zb1p", 2, "f64"}, Case{"dualpipe", 2, "f64"},
                                           Case{"dualpipev", 2, "f64"}, Case{"gpipe", 4, "f32"},
                                           Case{"1f1b", 4, "f32"}, Case{"zb1p", 4, "f32"},
                                           Case{"dualpipe", 4, "f32"}, Case{"dualpipe", 4, "f64"},
                                           Case{"dualpipev", 4, "f32"}, Case{"dualpipev", 3, "f64"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = std::string(info.param.schedule) + "_" +
                                              std::to_string(info.param.ranks) + "ranks_" + info.param.dtype;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// The op order fixes every floating-point operation, so sleeping before ops changes nothing.
TEST(PipelineMpi, RandomDelaysChangeNothing) {
  for (const Case c : {Case{"dualpipe", 4, "f64"}, Case{"zb1p", 2, "f32"}}) {
    const std::string args = std::string("--schedule ") + c.schedule + " --dtype " + c.dtype +
                             " --microbatches 8 --steps 3 --json";
    const MpiRun plain = mpirun(c.ranks, args);
    const MpiRun delayed = mpirun(c.ranks, args + " --delay-ms 3");
    ASSERT_EQ(plain.rc, 0) << plain.err;
    ASSERT_EQ(delayed.rc, 0) << delayed.err;
    EXPECT_EQ(plain.json.at("losses"), delayed.json.at("losses")) << c.schedule;
    EXPECT_EQ(plain.json.at("params_digest"), delayed.json.at("params_digest")) << c.schedule;
  }
}

TEST(PipelineMpi, InjectedFaultsFailVerification) {
  const MpiRun dropped = mpirun(2,
                                "--schedule zb1p --dtype f64 --microbatches 6 --steps 2 --verify --json "
                                "--inject-fault drop-weight-grad");
  EXPECT_EQ(dropped.rc, 1);
  ASSERT_TRUE(dropped.json.is_object()) << dropped.out << dropped.err;
  EXPECT_FALSE(dropped.json.at("verify").at("passed").get<bool>());
  EXPECT_TRUE(dropped.json.at("verify").at("first_step_losses_identical").get<bool>());
  EXPECT_GT(dropped.json.at("verify").at("grad_rel_err").get<double>(), 1e-6);
  EXPECT_NE(dropped.err.find("differs from the single-process run"), std::string::npos) << dropped.err;

  const MpiRun corrupted =
      mpirun(2,
             "--schedule dualpipe --dtype f64 --microbatches 4 --steps 1 --verify --json "
             "--inject-fault corrupt-activation");
  EXPECT_EQ(corrupted.rc, 1);
  ASSERT_TRUE(corrupted.json.is_object()) << corrupted.out << corrupted.err;
  EXPECT_FALSE(corrupted.json.at("verify").at("first_step_losses_identical").get<bool>());
}

TEST(PipelineMpi, ARealRunWritesItsTraceAndSvg) {
  const std::string trace = temp_path("trace.json"), svg = temp_path("timeline.svg");
  const MpiRun r =
      mpirun(2, "--schedule dualpipev --microbatches 6 --steps 2 --json --trace " + trace + " --svg " + svg);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ifstream t(trace);
  const auto doc = nlohmann::json::parse(t, nullptr, false);
  ASSERT_TRUE(doc.is_object());
  auto s = make_schedule({.kind = ScheduleKind::kDualPipeV, .n_ranks = 2, .n_microbatches = 6});
  ASSERT_TRUE(s.ok());
  size_t compute = 0, events = 0;
  for (const auto& ops : s->ranks) {
    for (const Op& op : ops) compute += op.is_compute();
  }
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++events;
      EXPECT_GE(e.at("dur").get<double>(), 0);
    }
  }
  EXPECT_EQ(events, compute);
  std::ifstream v(svg);
  std::stringstream ss;
  ss << v.rdbuf();
  EXPECT_EQ(ss.str().rfind("<svg", 0), 0u);
  EXPECT_NE(ss.str().find("(measured)"), std::string::npos);
  std::remove(trace.c_str());
  std::remove(svg.c_str());
}

TEST(PipelineMpi, AnOddRankCountForDualPipeIsAClearError) {
  const MpiRun r = mpirun(3, "--schedule dualpipe --microbatches 12");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("dualpipe needs an even number of ranks"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fathom::pipeline
