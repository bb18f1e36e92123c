// Longer pipeline runs (labels mpi, slow): 6 and 8 oversubscribed ranks, more micro-batches and
// steps, random delays, every schedule checked against the single-process run.
#include <gtest/gtest.h>

#include <string>

#include "mpi_run.h"

namespace fathom::pipeline {
namespace {

TEST(PipelineMpiSoak, EveryScheduleOnSixAndEightRanksWithDelays) {
  for (int ranks : {6, 8}) {
    for (const char* s : {"gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev"}) {
      const testing::MpiRun r =
          testing::mpirun(ranks,
                          std::string("--schedule ") + s +
                              " --dtype f64 --microbatches 24 --steps 4 --delay-ms 1 --layers 48 "
                              "--verify --json",
                          1500);
      ASSERT_EQ(r.rc, 0) << s << " on " << ranks << ": " << r.err;
      ASSERT_TRUE(r.json.is_object()) << r.out;
      EXPECT_TRUE(r.json.at("verify").at("passed").get<bool>()) << s << " on " << ranks;
    }
  }
}

}  // namespace
}  // namespace fathom::pipeline
