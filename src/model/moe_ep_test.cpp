// Expert-parallel loading without MPI: each EP rank holds exactly its contiguous share of routed
// experts (as ep::Placement places them), everything else on every rank, and a rank count that
// does not divide the experts is a clear error. The multi-process forward is tested under mpirun
// in tests/model_ep/.
#include <gtest/gtest.h>

#include <filesystem>

#include "base/fs.h"
#include "model/synth.h"
#include "model/weights.h"

namespace fathom {
namespace {

std::string ckpt(CheckpointFormat format) {
  const std::string d = testing::TempDir() + "/moe_ep_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(d);
  SynthOptions o;
  o.preset = "tiny";
  o.layers = 2;
  o.format = format;
  o.dtype = DType::kBF16;
  o.out = d + (format == CheckpointFormat::kGguf ? "/m.gguf" : "/hf");
  o.seed = 7;
  o.progress = false;
  auto r = synthesize(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return o.out;
}

void expect_contiguous_share(const std::string& path) {
  for (int size : {2, 4}) {
    for (int rank = 0; rank < size; ++rank) {
      auto w = load_weights(path, {.load_mtp = false, .progress = false, .ep_rank = rank, .ep_size = size});
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      const int64_t E = (*w)->config.n_routed_experts, per = E / size;
      int moe_layers = 0;
      for (const LayerWeights& L : (*w)->layers) {
        if (!L.moe) continue;
        ++moe_layers;
        ASSERT_EQ(static_cast<int64_t>(L.experts.size()), E);
        for (int64_t e = 0; e < E; ++e) {
          const bool mine = e >= rank * per && e < (rank + 1) * per;
          const ExpertWeights& x = L.experts[static_cast<size_t>(e)];
          EXPECT_EQ(x.gate.data != nullptr, mine)
              << path << " rank " << rank << "/" << size << " expert " << e;
          EXPECT_EQ(x.up.data != nullptr, mine);
          EXPECT_EQ(x.down.data != nullptr, mine);
        }
        EXPECT_NE(L.router.data, nullptr);  // routing, shared experts: on every rank
        EXPECT_NE(L.sh_gate.data, nullptr);
      }
      EXPECT_GT(moe_layers, 0);
    }
  }
}

TEST(MoeEpLoad, EachRankHoldsItsContiguousShareOfExpertsHf) {
  expect_contiguous_share(ckpt(CheckpointFormat::kHf));
}

TEST(MoeEpLoad, EachRankHoldsItsContiguousShareOfExpertsGguf) {
  expect_contiguous_share(ckpt(CheckpointFormat::kGguf));
}

TEST(MoeEpLoad, RankCountNotDividingTheExpertsIsAClearError) {
  const std::string path = ckpt(CheckpointFormat::kHf);
  auto w = load_weights(path, {.load_mtp = false, .progress = false, .ep_rank = 0, .ep_size = 3});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().to_string().find("--ep 3 does not divide n_routed_experts 16"), std::string::npos)
      << w.status().to_string();
  auto bad = load_weights(path, {.load_mtp = false, .progress = false, .ep_rank = 2, .ep_size = 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("rank 2 of 2 is invalid"), std::string::npos)
      << bad.status().to_string();
}

}  // namespace
}  // namespace fathom
