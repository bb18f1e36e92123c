// The whole-model training path: gradients of the full objective (cross-entropy + weighted MTP
// loss + balance losses) against float64 finite differences, float vs double agreement, the
// forward against the runtime (the float64 reference and the fast Model, on the same synthesized
// checkpoint), the bias update, and the error paths.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>

#include "base/fs.h"
#include "model/model.h"
#include "model/reference.h"
#include "model/synth.h"
#include "model/weights.h"
#include "train/train_test_util.h"

namespace fathom::train {
namespace {

struct Batch {
  SeqShape shape;
  std::vector<int32_t> tokens, targets;
};

// Random sequences; targets are the next tokens, the last of each sequence has none (-1).
Batch random_batch(const ModelConfig& c, SeqShape shape, Rng& rng) {
  Batch b{shape, {}, {}};
  for (int64_t s = 0; s < shape.n_seq; ++s) {
    std::vector<int32_t> seq(static_cast<size_t>(shape.seq_len + 1));
    for (auto& t : seq) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
    for (int64_t t = 0; t < shape.seq_len; ++t) {
      b.tokens.push_back(seq[static_cast<size_t>(t)]);
      b.targets.push_back(t + 1 < shape.seq_len ? seq[static_cast<size_t>(t + 1)] : -1);
    }
  }
  return b;
}

TEST(TrainModel, WholeModelGradientsMatchFiniteDifferences) {
  Rng rng(testing::fresh_seed("Model FD"));
  for (bool q_lora : {true, false}) {
    auto layout = make_param_layout(testing::tiny_config(q_lora), true);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    auto p = make_params<double>(*layout);
    auto g = make_params<double>(*layout);
    init_params(p, rng.next_u64(), 1.5);
    for (const ParamInfo& info : layout->params) {
      if (info.role == WeightRole::kNorm || info.role == WeightRole::kBias) {
        for (int64_t i = 0; i < info.size; ++i) p.at(info)[i] += 0.2 * (2 * rng.uniform() - 1);
      }
    }
    const Batch b = random_batch(layout->config, {2, 5}, rng);
    const TrainOptions options{.mtp_weight = 0.3, .balance_alpha = 0.01};
    auto ctx = make_model_context<double>();
    auto loss = [&] {
      auto c2 = make_model_context<double>();
      auto r = model_forward(p, b.shape, b.tokens, b.targets, options, *c2);
      EXPECT_TRUE(r.ok());
      return 0.5 * r->total;
    };
    auto r = model_forward(p, b.shape, b.tokens, b.targets, options, *ctx);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GT(r->ce, 0.0);
    EXPECT_GT(r->mtp_ce, 0.0);
    EXPECT_GT(r->balance, 0.0);
    EXPECT_EQ(r->n_targets, 8);
    EXPECT_NEAR(r->total, r->ce + 0.3 * r->mtp_ce + r->balance, 1e-12);
    model_backward(p, *ctx, 0.5, g);
    int checked = 0;
    for (const ParamInfo& info : layout->params) {
      if (!info.trainable) continue;
      testing::expect_grad(info.name, loss, p.at(info), g.at(info), info.size, 2, rng);
      ++checked;
    }
    EXPECT_GT(checked, 30);
    // Gradients accumulate: a second backward of the same forward doubles them.
    std::vector<double> once = g.data;
    model_backward(p, *ctx, 0.5, g);
    for (size_t i = 0; i < once.size(); i += 97)
      EXPECT_NEAR(g.data[i], 2 * once[i], 1e-12 + 1e-12 * std::abs(once[i]));
  }
}

TEST(TrainModel, FloatAndDoubleInstantiationsAgree) {
  Rng rng(testing::fresh_seed("float vs double"));
  auto layout = make_param_layout(testing::tiny_config(), true);
  ASSERT_TRUE(layout.ok());
  const uint64_t seed = rng.next_u64();
  auto pf = make_params<float>(*layout);
  auto pd = make_params<double>(*layout);
  init_params(pf, seed);
  init_params(pd, seed);
  for (size_t i = 0; i < pd.data.size(); ++i) pd.data[i] = static_cast<double>(pf.data[i]);  // same values
  auto gf = make_params<float>(*layout);
  auto gd = make_params<double>(*layout);
  const Batch b = random_batch(layout->config, {3, 9}, rng);
  auto cf = make_model_context<float>();
  auto cd = make_model_context<double>();
  auto lf = model_forward(pf, b.shape, b.tokens, b.targets, {}, *cf);
  auto ld = model_forward(pd, b.shape, b.tokens, b.targets, {}, *cd);
  ASSERT_TRUE(lf.ok() && ld.ok());
  // Same routing (a near-tie flip would make this comparison meaningless; report it).
  for (int64_t l = 0; l <= layout->config.num_hidden_layers; ++l) {
    const auto a = model_routing(*cf, l), d = model_routing(*cd, l);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), d.begin(), d.end())) << "routing differs at layer " << l;
  }
  EXPECT_NEAR(lf->total, ld->total, 1e-5 * std::abs(ld->total));
  model_backward(pf, *cf, 1.0, gf);
  model_backward(pd, *cd, 1.0, gd);
  double num = 0, den = 0;
  for (size_t i = 0; i < gd.data.size(); ++i) {
    num += (gf.data[i] - gd.data[i]) * (gf.data[i] - gd.data[i]);
    den += gd.data[i] * gd.data[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

TEST(TrainModel, RouterBiasMovesTowardBalance) {
  Rng rng(testing::fresh_seed("bias update"));
  auto layout = make_param_layout(testing::tiny_config(), true);
  ASSERT_TRUE(layout.ok());
  auto p = make_params<float>(*layout);
  init_params(p, rng.next_u64());
  const Batch b = random_batch(layout->config, {2, 8}, rng);
  auto ctx = make_model_context<float>();
  const TrainOptions options{.bias_update_speed = 0.01};
  ASSERT_TRUE(model_forward(p, b.shape, b.tokens, b.targets, options, *ctx).ok());
  const auto loads = model_expert_loads(*ctx);
  ASSERT_EQ(loads.size(), 3u);  // dense layer (empty), MoE layer, MTP layer
  EXPECT_TRUE(loads[0].empty());
  std::vector<float> before(p.layers[1].router_bias, p.layers[1].router_bias + 8);
  model_update_router_bias(p, *ctx, options);
  double mean = 0;
  for (int64_t l : loads[1]) mean += static_cast<double>(l) / 8.0;
  for (size_t e = 0; e < 8; ++e) {
    const float delta = p.layers[1].router_bias[e] - before[e];
    const double l = static_cast<double>(loads[1][e]);
    EXPECT_FLOAT_EQ(delta, l < mean ? 0.01f : l > mean ? -0.01f : 0.0f) << "expert " << e;
  }
}

// --induction-heads: at initialisation the model already copies. A random span followed by the same
// span again: in the repeat, the next token is the argmax of the logits nearly everywhere (the
// first token of the repeat has no earlier occurrence of its predecessor's successor to find, so
// it is not scored). A plain initialisation, or a previous-token head alone, copies nothing.
// Shapes of the default model (docs/MODEL.md), with q LoRA and with q_proj.
double induction_copy_rate(bool q_lora, int mode, uint64_t seed) {
  ModelConfig c = testing::tiny_config(q_lora);
  testing::default_attention_shape(c, q_lora);
  c.vocab_size = 8192;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  auto layout = make_param_layout(c, false);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_TRUE(check_induction_shape(c).ok());
  auto p = make_params<float>(*layout);
  Rng rng(seed);
  init_params(p, rng.next_u64(), 1.0, mode > 0 ? 1 : 0);
  if (mode == 2) seed_induction_circuit(p, rng.next_u64());
  const int64_t span = 300, n = 1 + 2 * span;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n), -1);
  tokens[0] = 0;
  for (int64_t i = 1; i <= span; ++i)
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(2 + rng.below(8190));
  for (int64_t i = 1; i <= span; ++i) tokens[static_cast<size_t>(span + i)] = tokens[static_cast<size_t>(i)];
  auto ctx = make_model_context<float>();
  const TrainOptions options{.all_logits = true};
  EXPECT_TRUE(model_forward(p, {1, n}, tokens, targets, options, *ctx).ok());
  const auto logits = model_logits(*ctx);
  int64_t right = 0, scored = 0;
  for (int64_t i = span + 1; i + 1 < n; ++i) {
    const float* row = logits.data() + i * c.vocab_size;
    const int64_t best = std::max_element(row, row + c.vocab_size) - row;
    right += best == tokens[static_cast<size_t>(i + 1)];
    ++scored;
  }
  return static_cast<double>(right) / static_cast<double>(scored);
}

TEST(TrainModel, InductionHeadsCopyAtInitialisation) {
  for (bool q_lora : {true, false}) {
    const uint64_t seed = testing::fresh_seed(q_lora ? "induction, q LoRA" : "induction, q_proj");
    EXPECT_LT(induction_copy_rate(q_lora, 0, seed), 0.05) << "plain initialisation";
    EXPECT_LT(induction_copy_rate(q_lora, 1, seed), 0.05) << "a previous-token head alone";
    const double rate = induction_copy_rate(q_lora, 2, seed);
    EXPECT_GT(rate, 0.8) << "the induction circuit";
  }
}

TEST(TrainModel, InductionHeadsNeedRoomInTheShape) {
  ModelConfig c = testing::tiny_config();  // hidden 12, kv_lora_rank 8: far too small
  const Status s = check_induction_shape(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("8 or more dimensions"), std::string::npos) << s.to_string();
  c.num_hidden_layers = 1;
  EXPECT_NE(check_induction_shape(c).message().find("at least 2 layers"), std::string::npos);
}

TEST(TrainModel, BadInputIsRejectedWithAClearError) {
  auto layout = make_param_layout(testing::tiny_config(), true);
  ASSERT_TRUE(layout.ok());
  auto p = make_params<float>(*layout);
  init_params(p, 1);
  auto ctx = make_model_context<float>();
  std::vector<int32_t> tokens = {1, 2, 3, 99}, targets = {2, 3, 4, -1};
  auto r = model_forward(p, {1, 4}, tokens, targets, {}, *ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 99 at index 3"), std::string::npos) << r.status().to_string();
  tokens[3] = 4;
  targets[0] = -2;
  r = model_forward(p, {1, 4}, tokens, targets, {}, *ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("target -2"), std::string::npos) << r.status().to_string();
  r = model_forward(p, {2, 4}, tokens, targets, {}, *ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs 8 tokens"), std::string::npos) << r.status().to_string();

  std::vector<int32_t> long_seq(65, 1);
  r = model_forward(p, {1, 65}, long_seq, long_seq, {}, *ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_position_embeddings 64"), std::string::npos)
      << r.status().to_string();

  ModelConfig c = testing::tiny_config();
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGreedy;
  auto bad = make_param_layout(c, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("scoring_func"), std::string::npos);
  c = testing::tiny_config();
  c.num_nextn_predict_layers = 0;
  bad = make_param_layout(c, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_nextn_predict_layers"), std::string::npos);
  c = testing::tiny_config();
  c.num_attention_heads = 0;
  EXPECT_FALSE(make_param_layout(c, false).ok());
}

// The training forward against the runtime on the same weights: a synthesized f32 checkpoint of
// the tiny preset (V3 shapes at small widths, YaRN, MTP) loaded into the slab.
class TrainRuntimeTest : public ::testing::Test {
 protected:
  static std::string dir() { return ::testing::TempDir() + "/train_test"; }
  static std::string ckpt() { return dir() + "/tiny-f32-mtp"; }
  static void SetUpTestSuite() {
    std::filesystem::create_directories(dir());
    // ctest runs each TEST in its own process, possibly in parallel: one writes, others wait.
    const int lock = open((dir() + "/.lock").c_str(), O_CREAT | O_RDWR, 0644);
    ASSERT_GE(lock, 0);
    ASSERT_EQ(flock(lock, LOCK_EX), 0);
    if (!path_exists(ckpt() + ".done")) {
      std::filesystem::remove_all(ckpt());
      SynthOptions o;
      o.preset = "tiny";
      o.layers = 3;
      o.dtype = DType::kF32;
      o.out = ckpt();
      o.seed = 7;
      o.mtp = true;
      o.progress = false;
      auto r = synthesize(o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ASSERT_TRUE(write_file_atomic(ckpt() + ".done", "").ok());
    }
    flock(lock, LOCK_UN);
    close(lock);
  }
};

double rel_err(std::span<const float> a, std::span<const double> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

TEST_F(TrainRuntimeTest, ForwardMatchesTheRuntimeOnTheSameWeights) {
  ModelOptions mo;
  mo.progress = false;
  mo.max_batch_tokens = 64;
  mo.max_context = 256;
  auto model = Model::load(ckpt(), mo);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const ModelConfig& c = (*model)->config();
  auto layout = make_param_layout(c, true);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  auto p = make_params<float>(*layout);
  ASSERT_TRUE(load_params_hf(p, ckpt()).ok());

  Rng rng(testing::fresh_seed("vs runtime"));
  const int64_t n = 24;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n), -1);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
  for (int64_t t = 0; t + 1 < n; ++t) targets[static_cast<size_t>(t)] = tokens[static_cast<size_t>(t + 1)];
  auto ctx = make_model_context<float>();
  // The runtime's KV cache stores bf16; every row's logits (the targets here are all -1).
  const TrainOptions options{.round_latent_bf16 = true, .all_logits = true};
  ASSERT_TRUE(model_forward(p, {1, n}, tokens, targets, options, *ctx).ok());

  // Replay our routing in both runtime paths (router near-ties would otherwise dominate).
  RoutingTrace trace;
  trace.replay = true;
  for (int64_t l = 0; l <= c.num_hidden_layers; ++l) {
    const auto ids = model_routing(*ctx, l);
    const int64_t rows = l < c.num_hidden_layers ? n : n - 1;
    for (int64_t t = 0; t < rows && !ids.empty(); ++t) {
      trace.ids[{l, t}] = std::vector<int32_t>(ids.begin() + t * c.num_experts_per_tok,
                                               ids.begin() + (t + 1) * c.num_experts_per_tok);
    }
  }
  ReferenceOptions ro;
  ro.with_mtp = true;
  ro.routing = &trace;
  auto ref = reference_forward((*model)->weights(), tokens, ro);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_GT(ref->routing_decisions, 0);
  EXPECT_LE(ref->routing_disagreements * 20, ref->routing_decisions);
  const double e_ref = rel_err(model_logits(*ctx), ref->logits);
  const double e_mtp = rel_err(model_mtp_logits(*ctx), ref->mtp_logits);
  std::printf("rel err vs float64 reference: logits %.2e, MTP logits %.2e\n", e_ref, e_mtp);
  // fp32 vs float64 over 3 layers + MTP (the runtime's own model test allows 2e-4 here).
  EXPECT_LT(e_ref, 2e-3);
  EXPECT_LT(e_mtp, 2e-3);

  (*model)->set_routing_trace(&trace);
  auto fast = run_sequence_logits(**model, tokens, RunMode::kPrefill);
  (*model)->set_routing_trace(nullptr);
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  const auto ours = model_logits(*ctx);
  std::vector<double> ours_d(ours.begin(), ours.end());
  const double e_fast = rel_err(*fast, ours_d);
  std::printf("rel err vs Model prefill: %.2e\n", e_fast);
  // Same fp32 kernels (~1e-6); a latent whose fp32 value differs by an ulp can round to the
  // other bf16 neighbour, which moves logits by up to ~1e-4.
  EXPECT_LT(e_fast, 2e-3);
}

TEST_F(TrainRuntimeTest, LoadingAMismatchedCheckpointNamesTheTensor) {
  auto cfg = load_hf_config(ckpt() + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ModelConfig c = *cfg;
  c.kv_lora_rank = 32;  // the checkpoint has 64
  auto layout = make_param_layout(c, true);
  ASSERT_TRUE(layout.ok());
  auto p = make_params<float>(*layout);
  const Status s = load_params_hf(p, ckpt());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv_a_proj_with_mqa.weight' has shape"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace fathom::train
