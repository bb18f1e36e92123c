// DeepSeek-V3 pipeline stages (stage.h) run in sequence in one process, float64: cutting the model
// into stages changes nothing. Per micro-batch the loss is bit-identical to model_forward on the
// same parameters; gradients summed over the stages (with the embedding copy's added to stage 0's)
// match model_backward to 1e-12 relative (only the order of some gradient sums differs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "train/stage.h"
#include "train/train_test_util.h"

namespace fathom::train {
namespace {

using testing::fresh_seed;
using testing::tiny_config;

using Stages = std::vector<std::unique_ptr<DeepSeekStage<double>>>;

Stages make_stages(const ParamLayout& full, int n_stages, SeqShape shape, uint64_t seed,
                   std::vector<int64_t> split = {}) {
  Stages stages;
  for (int s = 0; s < n_stages; ++s) {
    auto st = DeepSeekStage<double>::create(full, {.stage = s,
                                                   .n_stages = n_stages,
                                                   .stage_layers = split,
                                                   .shape = shape,
                                                   .seed = seed,
                                                   .init_scale = 0.5});
    EXPECT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_TRUE((*st)->reserve(2).ok());
    stages.push_back(std::move(*st));
  }
  return stages;
}

void random_batch(const ModelConfig& c, SeqShape shape, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<int32_t>& targets) {
  tokens.resize(size_t(shape.tokens()));
  targets.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(rng.below(uint64_t(c.vocab_size)));
    targets[i] = rng.below(7) == 0 ? -1 : int32_t(rng.below(uint64_t(c.vocab_size)));
  }
}

// Relative L2 difference of a stage's gradient slab against the whole model's, tensor by name.
double stage_grad_rel_err(const DeepSeekStage<double>& st, std::span<const double> stage_grads,
                          const ModelParams<double>& full_grads) {
  double diff = 0, norm = 0;
  for (const ParamInfo& p : st.layout().params) {
    const ParamInfo* q = full_grads.layout->find(p.name);
    EXPECT_NE(q, nullptr) << p.name;
    if (q == nullptr) continue;
    for (int64_t i = 0; i < p.size; ++i) {
      const double a = stage_grads[size_t(p.offset + i)], b = full_grads.data[size_t(q->offset + i)];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

void check_split(const ModelConfig& config, bool mtp, int n_stages, std::vector<int64_t> split = {}) {
  const uint64_t seed = fresh_seed("StageSplit");
  Rng rng(seed);
  auto full = make_param_layout(config, mtp);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  const SeqShape shape{2, 7};
  constexpr int kMicro = 3;
  Stages stages = make_stages(*full, n_stages, shape, seed, split);
  auto params = make_params<double>(*full), grads = make_params<double>(*full);
  init_params(params, seed, 0.5);
  for (auto& st : stages) std::fill(st->gradients().begin(), st->gradients().end(), 0.0);
  auto ctx = make_model_context<double>();
  const TrainOptions options;
  std::vector<int32_t> tokens, targets;
  for (int mb = 0; mb < kMicro; ++mb) {
    random_batch(config, shape, rng, tokens, targets);
    const double scale = 1.0 / kMicro;
    auto want = model_forward(params, shape, tokens, targets, options, *ctx);
    ASSERT_TRUE(want.ok());
    model_backward(params, *ctx, scale, grads);
    // Stages in sequence: forward, then B and W last to first.
    std::vector<std::vector<double>> acts(size_t(n_stages) + 1);
    acts[0].resize(size_t(2 * shape.tokens()));
    for (int64_t i = 0; i < shape.tokens(); ++i) {
      acts[0][size_t(i)] = tokens[size_t(i)];
      acts[0][size_t(shape.tokens() + i)] = targets[size_t(i)];
    }
    for (int s = 0; s < n_stages; ++s) {
      acts[size_t(s) + 1].resize(size_t(stages[size_t(s)]->output_elems()));
      stages[size_t(s)]->forward(mb % 2, acts[size_t(s)].data(), acts[size_t(s) + 1].data());
    }
    const StepLoss got = decode_loss_record(acts.back().data());
    EXPECT_EQ(std::memcmp(&got.total, &want->total, sizeof(double)), 0) << got.total << " vs " << want->total;
    EXPECT_EQ(got.ce, want->ce);
    EXPECT_EQ(got.mtp_ce, want->mtp_ce);
    EXPECT_EQ(got.balance, want->balance);
    EXPECT_EQ(got.n_targets, want->n_targets);
    std::vector<double> grad(size_t(kLossRecordElems), 0.0), next;
    encode_f64(scale, grad.data());
    for (int s = n_stages - 1; s >= 0; --s) {
      next.assign(size_t(stages[size_t(s)]->input_elems()), 0.0);
      stages[size_t(s)]->backward_input(mb % 2, grad.data(), s == 0 ? nullptr : next.data());
      stages[size_t(s)]->backward_weight(mb % 2);
      grad.swap(next);
    }
    // The routed loads ride in the bias gradient slots; put the reference's there too.
    const auto loads = model_expert_loads(*ctx);
    for (size_t l = 0; l < loads.size(); ++l) {
      for (size_t e = 0; e < loads[l].size(); ++e) grads.layers[l].router_bias[e] += double(loads[l][e]);
    }
  }
  // The last stage's embedding copy: its gradient belongs to the shared embedding.
  auto& first = *stages.front();
  auto& last = *stages.back();
  if (n_stages > 1 && !last.embedding_grads().empty()) {
    auto g0 = first.embedding_grads(), g1 = last.embedding_grads();
    for (size_t i = 0; i < g0.size(); ++i) g0[i] += g1[i];
    std::copy(g0.begin(), g0.end(), g1.begin());
  }
  for (auto& st : stages) {
    const double err = stage_grad_rel_err(*st, st->gradients(), grads);
    EXPECT_LE(err, 1e-12) << "stage " << st->config().stage;
  }
}

TEST(TrainStage, TwoStagesWithMtpEqualTheWholeModel) {
  check_split(tiny_config(), true, 2);
}

TEST(TrainStage, OneStageAndFourStagesEqualTheWholeModel) {
  ModelConfig c = tiny_config(false);
  c.num_hidden_layers = 4;
  check_split(c, true, 1);
  check_split(c, true, 4);
  check_split(c, false, 2);
}

TEST(TrainStage, UnevenSplitsEqualTheWholeModel) {
  ModelConfig c = tiny_config();
  c.num_hidden_layers = 4;
  check_split(c, true, 2, {3, 1});
  check_split(c, true, 3, {0, 3, 1});  // a stage may hold only the embedding
  check_split(c, true, 2, {4, 0});     // or only the head and MTP module
}

TEST(TrainStage, TiedHeadKeepsAnEmbeddingCopyOnTheLastStage) {
  ModelConfig c = tiny_config();
  c.tie_word_embeddings = true;
  check_split(c, false, 2);
}

TEST(TrainStage, RouterBiasMovesFromTheStepsSummedLoads) {
  const uint64_t seed = fresh_seed("StageBias");
  auto full = make_param_layout(tiny_config(), true);
  ASSERT_TRUE(full.ok());
  Stages stages = make_stages(*full, 1, {1, 5}, seed);
  DeepSeekStage<double>& st = *stages[0];
  std::fill(st.gradients().begin(), st.gradients().end(), 0.0);
  std::vector<double> in(10), out(static_cast<size_t>(kLossRecordElems));
  for (int i = 0; i < 5; ++i) in[size_t(i)] = in[size_t(5 + i)] = i;
  st.forward(0, in.data(), out.data());
  const ParamInfo* bias = st.layout().find("model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  double routed = 0;
  for (int64_t e = 0; e < bias->size; ++e) routed += st.gradients()[size_t(bias->offset + e)];
  EXPECT_EQ(routed, 5.0 * full->config.num_experts_per_tok);
  st.after_optimizer_step();
  int moved = 0;
  for (int64_t e = 0; e < bias->size; ++e) moved += st.parameters()[size_t(bias->offset + e)] != 0.0;
  EXPECT_EQ(moved, bias->size);  // every expert is above or below the mean load of 5*2/8
}

TEST(TrainStage, DoublesTravelExactlyInFloatMessages) {
  const uint64_t seed = fresh_seed("StageF64");
  Rng rng(seed);
  for (int i = 0; i < 1000; ++i) {
    double v = (rng.uniform() - 0.5) * std::pow(10.0, double(rng.below(40)) - 20);
    if (i == 0) v = -0.0;
    if (i == 1) v = 1.0 / 3.0;
    float f[kF64Elems];
    encode_f64(v, f);
    const double back = decode_f64(f);
    EXPECT_EQ(std::memcmp(&v, &back, sizeof v), 0) << v;
  }
}

TEST(TrainStage, ShapesThatDoNotSplitAreRejected) {
  auto full = make_param_layout(tiny_config(), true);
  ASSERT_TRUE(full.ok());
  auto three = DeepSeekStage<float>::create(*full, {.stage = 0, .n_stages = 3, .shape = {1, 4}});
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().to_string().find("num_hidden_layers 2 does not split into 3"), std::string::npos)
      << three.status().to_string();
  auto bad_stage = DeepSeekStage<float>::create(*full, {.stage = 2, .n_stages = 2, .shape = {1, 4}});
  EXPECT_FALSE(bad_stage.ok());
  auto too_long = DeepSeekStage<float>::create(*full, {.stage = 0, .n_stages = 2, .shape = {1, 65}});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().to_string().find("max_position_embeddings"), std::string::npos);
  const int64_t bad_sum[] = {1, 2};
  auto sum = DeepSeekStage<float>::create(
      *full, {.stage = 0, .n_stages = 2, .stage_layers = {1, 2}, .shape = {1, 4}});
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().to_string().find("2 stages summing to 3 layers"), std::string::npos)
      << sum.status().to_string();
  EXPECT_FALSE(check_stage_split(*full, 3, bad_sum).ok());
  ModelConfig big = tiny_config();
  big.vocab_size = (1 << 24) + 1;
  auto big_layout = make_param_layout(big, false);
  ASSERT_TRUE(big_layout.ok());
  EXPECT_FALSE(check_stage_split(*big_layout, 1).ok());
}

}  // namespace
}  // namespace fathom::train
