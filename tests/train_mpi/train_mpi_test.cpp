// `mpirun -np 2 fathom pipeline train --model deepseek` end to end: DeepSeek-V3 layers (MLA, MoE
// with the balance loss and the router bias rule, the MTP module on the last stage with its
// embedding copy) on 1F1B, DualPipe and DualPipeV equal a single-process model_forward /
// model_backward run: first-step losses bit-identical, gradients, parameters and later losses
// within the bound (1e-10 in f64), DualPipe's copies and the embedding copies bit-identical.
// Random delays change nothing; shapes that do not split fail before any work.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mpi_run.h"

namespace fathom::train {
namespace {

using pipeline::testing::MpiRun;
using pipeline::testing::mpirun;
using pipeline::testing::temp_path;

// A DeepSeek-V3-shaped config at toy widths: q LoRA, YaRN, one dense layer then MoE (noaux_tc
// groups, a shared expert), one MTP module. `layers` decoder layers.
std::string write_config(int layers, int width = 0) {
  nlohmann::json c = {{"architectures", {"DeepseekV3ForCausalLM"}},
                            {"model_type", "deepseek_v3"},
                            {"vocab_size", 96},
                            {"hidden_size", 32},
                            {"intermediate_size", 48},
                            {"moe_intermediate_size", 16},
                            {"num_hidden_layers", layers},
                            {"num_nextn_predict_layers", 1},
                            {"num_attention_heads", 2},
                            {"num_key_value_heads", 2},
                            {"n_shared_experts", 1},
                            {"n_routed_experts", 8},
                            {"num_experts_per_tok", 2},
                            {"n_group", 4},
                            {"topk_group", 2},
                            {"first_k_dense_replace", 1},
                            {"moe_layer_freq", 1},
                            {"q_lora_rank", 16},
                            {"kv_lora_rank", 16},
                            {"qk_nope_head_dim", 8},
                            {"qk_rope_head_dim", 8},
                            {"v_head_dim", 8},
                            {"scoring_func", "sigmoid"},
                            {"topk_method", "noaux_tc"},
                            {"norm_topk_prob", true},
                            {"routed_scaling_factor", 2.5},
                            {"max_position_embeddings", 256},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000.0},
                            {"rope_scaling",
                             {{"type", "yarn"},
                              {"factor", 4.0},
                              {"original_max_position_embeddings", 64},
                              {"beta_fast", 32},
                              {"beta_slow", 1},
                              {"mscale", 1.0},
                              {"mscale_all_dim", 1.0}}}};
  if (width > 0) {  // every summed dimension a multiple of 64 (the shapes AMX tiles take)
    for (const char* k : {"hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank"})
      c[k] = width;
    c["num_attention_heads"] = c["num_key_value_heads"] = width / 16;
    c["qk_nope_head_dim"] = c["qk_rope_head_dim"] = c["v_head_dim"] = 8;
  }
  const std::string path =
      temp_path("config_" + std::to_string(layers) + (width > 0 ? "_w" + std::to_string(width) : "") + ".json");
  std::ofstream(path) << c.dump();
  return path;
}

MpiRun run_deepseek(int ranks, const std::string& args) {
  return mpirun(ranks, "--model deepseek " + args);
}

struct Case {
  const char* schedule;
  const char* dtype;
  int layers;
  const char* extra = "";
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.schedule << " " << c.dtype << ", " << c.layers << " layers";
}

class TrainMpiVerify : public ::testing::TestWithParam<Case> {};

TEST_P(TrainMpiVerify, MatchesTheSingleProcessRun) {
  const Case c = GetParam();
  const std::string config = write_config(c.layers);
  const MpiRun r = run_deepseek(
      2, std::string("--config ") + config + " --schedule " + c.schedule + " --dtype " + c.dtype +
             " --microbatches 4 --steps 3 --n-seq 2 --seq-len 8 --verify --json " + c.extra);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  const auto& v = r.json.at("verify");
  EXPECT_TRUE(v.at("passed").get<bool>()) << v.dump();
  EXPECT_TRUE(v.at("first_step_losses_identical").get<bool>());
  EXPECT_TRUE(v.at("replicas_identical").get<bool>());
  const double bound = std::string(c.dtype) == "f64" ? 1e-10 : 1e-5;
  EXPECT_LE(v.at("grad_rel_err").get<double>(), bound);
  EXPECT_LE(v.at("later_loss_rel_err").get<double>(), bound);
  EXPECT_LE(v.at("param_rel_err").get<double>(), bound);
  ASSERT_EQ(r.json.at("losses").size(), 3u);
  for (const auto& step : r.json.at("losses")) {
    ASSERT_EQ(step.size(), 4u);
    for (const auto& l : step) {
      EXPECT_GT(l.at("ce").get<double>(), 0);
      EXPECT_GT(l.at("mtp_ce").get<double>(), 0);  // the MTP module ran on the last stage
      EXPECT_GT(l.at("balance").get<double>(), 0);
    }
  }
  for (const auto& m : r.json.at("measured")) {
    EXPECT_GE(m.at("bubble_fraction").get<double>(), 0);
    EXPECT_LE(m.at("bubble_fraction").get<double>(), 1);
    EXPECT_GT(m.at("grad_norm").get<double>(), 0);
    EXPECT_EQ(m.at("idle_ms").size(), 2u);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, TrainMpiVerify,
                         ::testing::Values(Case{"1f1b", "f64", 2}, Case{"dualpipe", "f64", 4},
                                           Case{"dualpipev", "f64", 4}, Case{"dualpipe", "f32", 2},
                                           Case{"zb1p", "f32", 4, "--stage-layers 3,1"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.schedule) + "_" + info.param.dtype +
                                  (*info.param.extra ? "_split" : "");
                         });

// The op order fixes every floating-point operation: sleeping before ops changes nothing.
TEST(TrainMpi, RandomDelaysChangeNothing) {
  const std::string args =
      "--config " + write_config(2) +
      " --schedule dualpipe --dtype f32 --microbatches 4 --steps 2 --n-seq 1 --seq-len 8 --json";
  const MpiRun plain = run_deepseek(2, args);
  const MpiRun delayed = run_deepseek(2, args + " --delay-ms 2");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_EQ(delayed.rc, 0) << delayed.err;
  EXPECT_EQ(plain.json.at("losses"), delayed.json.at("losses"));
  EXPECT_EQ(plain.json.at("params_digest"), delayed.json.at("params_digest"));
}

// The verify mode catches what it should: a dropped weight gradient (losses of the first step
// still identical, gradients not) and a corrupted activation (first-step losses differ).
TEST(TrainMpi, InjectedFaultsFailVerification) {
  const std::string base = "--config " + write_config(2) +
                           " --dtype f64 --microbatches 4 --steps 2 --n-seq 1 --seq-len 8 --verify --json";
  const MpiRun dropped = run_deepseek(2, base + " --schedule zb1p --inject-fault drop-weight-grad");
  EXPECT_EQ(dropped.rc, 1);
  ASSERT_TRUE(dropped.json.is_object()) << dropped.out << dropped.err;
  EXPECT_FALSE(dropped.json.at("verify").at("passed").get<bool>());
  EXPECT_TRUE(dropped.json.at("verify").at("first_step_losses_identical").get<bool>());
  EXPECT_GT(dropped.json.at("verify").at("grad_rel_err").get<double>(), 1e-6);
  EXPECT_NE(dropped.err.find("differs from the single-process run"), std::string::npos) << dropped.err;
  const MpiRun corrupted = run_deepseek(2, base + " --schedule dualpipe --inject-fault corrupt-activation");
  EXPECT_EQ(corrupted.rc, 1);
  ASSERT_TRUE(corrupted.json.is_object()) << corrupted.out << corrupted.err;
  EXPECT_FALSE(corrupted.json.at("verify").at("first_step_losses_identical").get<bool>());
}

TEST(TrainMpi, ShapesThatDoNotSplitFailBeforeAnyWork) {
  // 3 layers on the 2 stages of 1F1B on 2 ranks.
  const MpiRun layers = run_deepseek(2, "--config " + write_config(3) + " --schedule 1f1b --steps 1 --json");
  EXPECT_EQ(layers.rc, 1);
  EXPECT_NE(layers.err.find("num_hidden_layers 3 does not split into 2 pipeline stages"), std::string::npos)
      << layers.err;
  // DualPipeV on 2 ranks has 4 stages.
  const MpiRun v = run_deepseek(2, "--config " + write_config(2) + " --schedule dualpipev --steps 1 --json");
  EXPECT_EQ(v.rc, 1);
  EXPECT_NE(v.err.find("does not split into 4 pipeline stages"), std::string::npos) << v.err;
  // DualPipe needs an even number of ranks.
  const MpiRun odd = run_deepseek(3, "--config " + write_config(3) + " --schedule dualpipe --steps 1 --json");
  EXPECT_EQ(odd.rc, 1);
  EXPECT_NE(odd.err.find("even"), std::string::npos) << odd.err;
  // A sequence longer than the model's positions.
  const MpiRun longer =
      run_deepseek(2, "--config " + write_config(2) + " --schedule 1f1b --seq-len 300 --steps 1 --json");
  EXPECT_EQ(longer.rc, 1);
  EXPECT_NE(longer.err.find("max_position_embeddings"), std::string::npos) << longer.err;
}

// `fathom train` on a token directory: the same run in one process and pipelined on 2 ranks.
class TrainMpiTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_path("trainer");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/data");
    std::vector<uint32_t> train, val;  // counting documents, bos 1 / eos 2, vocab 96
    uint32_t a = 0;
    for (int d = 0; d < 240; ++d) {
      auto& t = d < 200 ? train : val;
      t.push_back(1);
      for (int i = 0; i < 20 + d % 17; ++i) t.push_back(4 + (a++ % 64));
      t.push_back(2);
    }
    write_u32(dir_ + "/data/train.bin", train);
    write_u32(dir_ + "/data/val.bin", val);
    std::ofstream(dir_ + "/data/meta.json") << nlohmann::json{{"format", "fathom-tokens-v1"},
                                                              {"vocab_size", 96},
                                                              {"bos_id", 1},
                                                              {"eos_id", 2},
                                                              {"n_train_tokens", train.size()},
                                                              {"n_val_tokens", val.size()}}
                                                   .dump();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static void write_u32(const std::string& path, const std::vector<uint32_t>& v) {
    std::ofstream out(path, std::ios::binary);
    for (uint32_t x : v) out.write(reinterpret_cast<const char*>(&x), 4);  // little-endian host
  }
  // `fathom cpu --json`: whether matmuls run on AMX tiles in this process, and so on.
  static nlohmann::json fathom_cpu_json() {
    const std::string bin = std::getenv("FATHOM_BIN") ? std::getenv("FATHOM_BIN") : "fathom";
    const std::string out = temp_path("cpu.json");
    if (std::system((bin + " cpu --json > " + out).c_str()) != 0) return nlohmann::json::object();
    std::ifstream in(out);
    return nlohmann::json::parse(in, nullptr, false);
  }
  // Runs `[mpirun -np N] fathom train ...`; returns the exit code, stderr in *err.
  int train(int ranks, const std::string& args, std::string* err, const std::string& config = "") const {
    const std::string bin = std::getenv("FATHOM_BIN") ? std::getenv("FATHOM_BIN") : "fathom";
    if (ranks > 0) fathom::testing::use_mpi_test_env(FATHOM_LSAN_OPENMPI_SUPP);
    const std::string err_path = dir_ + "/stderr";
    const std::string launcher =
        ranks > 0 ? "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " : "";
    const std::string cmd = "timeout 240 " + launcher + bin +
                            " train --threads 1 --no-peak --data " + dir_ + "/data --config " +
                            (config.empty() ? write_config(2) : config) +
                            " --mtp --seq-len 16 --batch 2 --micro-batches 4 --warmup 2 --eval-every 3 " +
                            args + " >/dev/null 2>" + err_path;
    const int status = std::system(cmd.c_str());
    std::ifstream e(err_path);
    err->assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::vector<nlohmann::json> log(const std::string& run) const {
    std::vector<nlohmann::json> rows;
    std::ifstream in(dir_ + "/" + run + "/log.jsonl");
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
  }
  std::string dir_;
};

TEST_F(TrainMpiTrainer, PipelinedRunGivesTheSingleProcessLosses) {
  std::string err;
  ASSERT_EQ(train(0, "--steps 5 --out " + dir_ + "/one", &err), 0) << err;
  for (const char* schedule : {"dualpipe", "1f1b"}) {
    const std::string run = std::string("pp_") + schedule;
    ASSERT_EQ(train(2, std::string("--steps 5 --schedule ") + schedule + " --out " + dir_ + "/" + run, &err),
              0)
        << err;
    const auto want = log("one"), got = log(run);
    ASSERT_EQ(got.size(), 5u);
    ASSERT_EQ(want.size(), 5u);
    // Step 1: the per-micro-batch losses are bit-identical, and so is their mean.
    EXPECT_EQ(got[0].at("loss").get<double>(), want[0].at("loss").get<double>()) << schedule;
    EXPECT_EQ(got[0].at("ce").get<double>(), want[0].at("ce").get<double>()) << schedule;
    EXPECT_EQ(got[0].at("mtp_ce").get<double>(), want[0].at("mtp_ce").get<double>()) << schedule;
    for (size_t k = 1; k < got.size(); ++k) {  // then within float rounding of the gradient sums
      const double a = got[k].at("loss").get<double>(), b = want[k].at("loss").get<double>();
      EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(b)) << schedule << " step " << k + 1;
    }
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + run + "/checkpoint.bin"));
  }
}

// --bf16: with the GEMMs on AMX tiles in bf16 (a width-64 model, 64-token micro-batches), a
// pipelined run still gives the single-process run's first-step losses bit for bit: the bf16
// products do not depend on the thread count or the process. On a CPU with AMX the losses also
// differ from the fp32 run's (the bf16 path ran).
TEST_F(TrainMpiTrainer, Bf16GemmsKeepPipelinedAndSingleProcessLossesIdentical) {
  std::string err;
  const std::string config = write_config(2, 64);
  const std::string common = "--steps 2 --batch 4 ";
  ASSERT_EQ(train(0, common + "--out " + dir_ + "/f32", &err, config), 0) << err;
  ASSERT_EQ(train(0, common + "--bf16 --out " + dir_ + "/one", &err, config), 0) << err;
  ASSERT_EQ(train(2, common + "--bf16 --schedule 1f1b --out " + dir_ + "/pp", &err, config), 0) << err;
  const auto f32 = log("f32"), want = log("one"), got = log("pp");
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].at("loss").get<double>(), want[0].at("loss").get<double>());
  EXPECT_EQ(got[0].at("ce").get<double>(), want[0].at("ce").get<double>());
  if (fathom_cpu_json().value("amx_matmul", false)) {
    EXPECT_NE(want[0].at("loss").get<double>(), f32[0].at("loss").get<double>()) << "the bf16 path did not run";
  } else {
    EXPECT_EQ(want[0].at("loss").get<double>(), f32[0].at("loss").get<double>()) << "no AMX: fp32 throughout";
  }
  // A resume must keep the precision the run started with.
  EXPECT_EQ(train(0, "--steps 3 --batch 4 --resume --out " + dir_ + "/one", &err, config), 1) << err;
  EXPECT_NE(err.find("gemm_precision"), std::string::npos) << err;
}

TEST_F(TrainMpiTrainer, ShapesThatDoNotSplitFailOnEveryRank) {
  std::string err;
  EXPECT_EQ(train(2, "--steps 2 --schedule dualpipev --out " + dir_ + "/v", &err), 1) << err;
  EXPECT_NE(err.find("does not split into 4 pipeline stages"), std::string::npos) << err;
  EXPECT_EQ(train(2, "--steps 2 --schedule 1f1b --stage-layers 1,2 --out " + dir_ + "/s", &err), 1) << err;
  EXPECT_NE(err.find("summing to 3 layers"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/v/checkpoint.bin"));
}

}  // namespace
}  // namespace fathom::train
