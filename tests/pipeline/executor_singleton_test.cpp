// The executor in one process (MPI singleton): one-rank schedules, including DualPipeV's local
// turn between its two chunks, equal the reference run; and create() rejects what cannot run.
// The multi-rank runs are in pipeline_mpi_test.cpp (mpirun).
#include <gtest/gtest.h>

#include <cstdlib>

#include "pipeline/executor.h"
#include "pipeline/trainer.h"

// Under ASan: Open MPI keeps allocations until exit and has no frame pointers; unwind fully so
// the suppressions below (the same as lsan_openmpi.supp) can see its frames.
extern "C" const char* __asan_default_options() {
  return "fast_unwind_on_malloc=0";
}
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\nleak:libopen-rte.so\nleak:libopen-pal.so\nleak:libpmix.so\nleak:libevent\n"
         "leak:libhwloc.so\nleak:mca_\n";
}

namespace fathom::pipeline {
namespace {

void ensure_mpi() {
  int done = 0;
  MPI_Initialized(&done);
  if (done) return;
  ::setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);  // symbolised leak stacks (ASan)
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  std::atexit([] { MPI_Finalize(); });
}

TEST(PipelineExecutor, OneRankSchedulesMatchTheReferenceRun) {
  ensure_mpi();
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZB1P, ScheduleKind::kDualPipeV}) {
    TrainOptions o;
    o.kind = kind;
    o.microbatches = 5;
    o.steps = 2;
    o.f64 = true;
    o.model = {.tokens = 4, .hidden = 8, .ffn = 12, .blocks_per_stage = 2, .seed = 3};
    o.verify = true;
    auto r = train(o, MPI_COMM_SELF);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(r->verification.has_value());
    EXPECT_TRUE(r->verification->passed()) << schedule_name(kind);
    EXPECT_TRUE(r->verification->first_step_losses_identical);
    EXPECT_EQ(r->losses.size(), 2u);
    EXPECT_EQ(r->timeline.n_ranks, 1);
    EXPECT_FALSE(r->params_digest.empty());
  }
}

TEST(PipelineExecutor, CreateRejectsWhatCannotRun) {
  ensure_mpi();
  const MlpConfig small{.tokens = 2, .hidden = 4, .ffn = 4, .blocks_per_stage = 1, .seed = 1};
  const MlpConfig wide{.tokens = 2, .hidden = 6, .ffn = 4, .blocks_per_stage = 1, .seed = 1};
  auto data = make_synthetic_data<float>(small);
  auto a = make_mlp_stage<float>(small, 0), b = make_mlp_stage<float>(wide, 1);

  auto two = make_schedule({.kind = ScheduleKind::kOneFOneB, .n_ranks = 2, .n_microbatches = 4});
  ASSERT_TRUE(two.ok());
  auto e1 = Executor<float>::create(*two, MPI_COMM_SELF, {a.get()}, data.get(), {});
  ASSERT_FALSE(e1.ok());
  EXPECT_NE(e1.status().message().find("the communicator has 1 processes"), std::string::npos);

  auto v = make_schedule({.kind = ScheduleKind::kDualPipeV, .n_ranks = 1, .n_microbatches = 2});
  ASSERT_TRUE(v.ok());
  auto e2 = Executor<float>::create(*v, MPI_COMM_SELF, {a.get()}, data.get(), {});
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("needs 2 chunks per rank"), std::string::npos);

  auto e3 = Executor<float>::create(*v, MPI_COMM_SELF, {a.get(), b.get()}, data.get(), {});
  ASSERT_FALSE(e3.ok());
  EXPECT_NE(e3.status().message().find("stage 0 outputs 8 values per micro-batch but stage 1 takes 12"),
            std::string::npos)
      << e3.status().message();

  auto e4 = Executor<float>::create(*v, MPI_COMM_SELF, {a.get(), nullptr}, data.get(), {});
  EXPECT_FALSE(e4.ok());
}

}  // namespace
}  // namespace fathom::pipeline
