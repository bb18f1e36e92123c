// Every layer's backward against float64 central differences (train_test_util.h), on fresh
// random inputs and weights: loss = sum(upstream * layer output) (+ the MoE balance loss), so the
// analytic input/weight gradients of *_backward_input / *_backward_weight are checked directly.
#include <gtest/gtest.h>

#include <set>

#include "train/train_test_util.h"

namespace fathom::train {
namespace {

using testing::expect_grad;
using testing::fill_uniform;
using Vec = std::vector<double>;

double dot(const Vec& a, const double* b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Random weights with non-trivial norms and routing biases (init_params sets norms to 1).
void randomize(ModelParams<double>& p, Rng& rng) {
  init_params(p, rng.next_u64(), 1.5);
  for (const ParamInfo& info : p.layout->params) {
    double* v = p.at(info);
    if (info.role == WeightRole::kNorm)
      for (int64_t i = 0; i < info.size; ++i) v[i] = 1.0 + 0.3 * (2 * rng.uniform() - 1);
    if (info.role == WeightRole::kBias)
      for (int64_t i = 0; i < info.size; ++i) v[i] = 0.1 * (2 * rng.uniform() - 1);
  }
}

// FD-checks the trainable weights of `layer` whose logical weight is in `which` (empty: all).
void expect_param_grads(const std::string& what, ModelParams<double>& p, const ModelParams<double>& g,
                        int64_t layer, const std::set<LayerWeight>& which,
                        const std::function<double()>& loss, Rng& rng) {
  int checked = 0;
  for (const ParamInfo& info : p.layout->params) {
    if (info.layer != layer || !info.trainable || (!which.empty() && !which.count(info.weight))) continue;
    expect_grad(what + " " + info.name, loss, p.at(info), g.at(info), info.size, 3, rng);
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

TEST(TrainLayers, LinearBackwardMatchesFiniteDifferences) {
  Rng rng(testing::fresh_seed("Linear"));
  const int64_t m = 5, in = 7, out = 3;
  Vec x(m * in), w(out * in), r(m * out), y(m * out), dx(m * in), dw(out * in, 0.0);
  fill_uniform(x, rng);
  fill_uniform(w, rng);
  fill_uniform(r, rng);
  auto loss = [&] {
    linear_forward(x.data(), w.data(), m, in, out, y.data());
    return dot(r, y.data());
  };
  linear_backward_input(r.data(), w.data(), m, in, out, dx.data(), false);
  linear_backward_weight(r.data(), x.data(), m, in, out, dw.data());
  expect_grad("dx", loss, x.data(), dx.data(), m * in, 64, rng);
  expect_grad("dW", loss, w.data(), dw.data(), out * in, 64, rng);
}

TEST(TrainLayers, EmbeddingRmsNormAndCrossEntropyBackwardsMatchFiniteDifferences) {
  Rng rng(testing::fresh_seed("Elementary"));
  const int64_t vocab = 9, dim = 6, n = 7;
  std::vector<int32_t> tokens = {3, 0, 8, 3, 5, 3, 1};
  Vec table(vocab * dim), r(n * dim), y(n * dim), dtable(vocab * dim, 0.0);
  fill_uniform(table, rng);
  fill_uniform(r, rng);
  embedding_backward_weight(r.data(), dim, std::span<const int32_t>(tokens), dtable.data());
  expect_grad(
      "dtable",
      [&] {
        embedding_forward(table.data(), dim, std::span<const int32_t>(tokens), y.data());
        return dot(r, y.data());
      },
      table.data(), dtable.data(), vocab * dim, 64, rng);

  Vec x(n * dim), g(dim), dx(n * dim), dg(dim, 0.0);
  fill_uniform(x, rng, 2.0);
  fill_uniform(g, rng);
  RmsNormContext<double> ctx;
  auto norm_loss = [&] {
    RmsNormContext<double> c2;
    rmsnorm_forward(x.data(), g.data(), n, dim, 1e-6, y.data(), c2);
    return dot(r, y.data());
  };
  rmsnorm_forward(x.data(), g.data(), n, dim, 1e-6, y.data(), ctx);
  rmsnorm_backward_input(ctx, g.data(), r.data(), dx.data(), false);
  rmsnorm_backward_weight(ctx, r.data(), dg.data());
  expect_grad("rmsnorm dx", norm_loss, x.data(), dx.data(), n * dim, 64, rng);
  expect_grad("rmsnorm dg", norm_loss, g.data(), dg.data(), dim, 64, rng);

  std::vector<int32_t> targets = {2, -1, 8, 0, -1, 4, 4};
  Vec logits(n * vocab), dlogits(n * vocab);
  fill_uniform(logits, rng, 3.0);
  const double scale = 0.7;
  const double loss0 =
      cross_entropy_forward_backward<double>(logits.data(), n, vocab, targets, scale, dlogits.data());
  EXPECT_GT(loss0, 0.0);
  expect_grad(
      "dlogits",
      [&] {
        return scale * cross_entropy_forward_backward<double>(logits.data(), n, vocab, targets, 1.0, nullptr);
      },
      logits.data(), dlogits.data(), n * vocab, 200, rng);
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(dlogits[vocab + v], 0.0) << "ignored target row";
}

TEST(TrainLayers, SwigluBackwardMatchesFiniteDifferences) {
  Rng rng(testing::fresh_seed("SwiGLU"));
  const int64_t m = 4, hd = 5, inter = 7;
  Vec x(m * hd), wg(inter * hd), wu(inter * hd), wd(hd * inter), r(m * hd), y(m * hd), dx(m * hd);
  for (Vec* v : {&x, &wg, &wu, &wd, &r}) fill_uniform(*v, rng, 1.5);
  Vec dwg(wg.size(), 0.0), dwu(wu.size(), 0.0), dwd(wd.size(), 0.0);
  SwigluContext<double> ctx;
  auto loss = [&] {
    SwigluContext<double> c2;
    swiglu_forward(x.data(), wg.data(), wu.data(), wd.data(), m, hd, inter, y.data(), c2);
    return dot(r, y.data());
  };
  swiglu_forward(x.data(), wg.data(), wu.data(), wd.data(), m, hd, inter, y.data(), ctx);
  swiglu_backward_input(ctx, wg.data(), wu.data(), wd.data(), r.data(), dx.data(), false);
  swiglu_backward_weight(ctx, dwg.data(), dwu.data(), dwd.data());
  expect_grad("dx", loss, x.data(), dx.data(), m * hd, 64, rng);
  expect_grad("dWg", loss, wg.data(), dwg.data(), inter * hd, 64, rng);
  expect_grad("dWu", loss, wu.data(), dwu.data(), inter * hd, 64, rng);
  expect_grad("dWd", loss, wd.data(), dwd.data(), inter * hd, 64, rng);
}

void check_mla(bool q_lora) {
  Rng rng(testing::fresh_seed(q_lora ? "MLA q LoRA" : "MLA q_proj"));
  auto layout = make_param_layout(testing::tiny_config(q_lora), false);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  const ModelConfig& c = layout->config;
  auto p = make_params<double>(*layout);
  auto g = make_params<double>(*layout);
  randomize(p, rng);
  const SeqShape shape{2, 6};
  const int64_t n = shape.tokens(), hd = c.hidden_size;
  Vec x(n * hd), r(n * hd), y(n * hd), dx(n * hd);
  fill_uniform(x, rng, 1.5);
  fill_uniform(r, rng);
  auto loss = [&] {
    MlaContext<double> c2;
    mla_forward(c, p.layers[0], shape, x.data(), y.data(), c2);
    return dot(r, y.data());
  };
  MlaContext<double> ctx;
  mla_forward(c, p.layers[0], shape, x.data(), y.data(), ctx);
  mla_backward_input(c, p.layers[0], r.data(), dx.data(), ctx);
  mla_backward_weight(c, ctx, g.layers[0]);
  expect_grad("MLA dx", loss, x.data(), dx.data(), n * hd, 48, rng);
  expect_param_grads("MLA", p, g, 0,
                     {LayerWeight::kQA, LayerWeight::kQANorm, LayerWeight::kQB, LayerWeight::kQ,
                      LayerWeight::kKvA, LayerWeight::kKvANorm, LayerWeight::kKvB, LayerWeight::kO},
                     loss, rng);
  // Causality: the output of the first token of each sequence depends on nothing after it.
  loss();  // y of the unperturbed weights (the checks above left y at a perturbed point)
  const Vec y0 = y;
  x[static_cast<size_t>(5 * hd)] += 1.0;  // last token of sequence 0
  loss();
  for (int64_t t = 0; t < n; ++t) {
    bool changed = false;
    for (int64_t d = 0; d < hd; ++d)
      changed |= y[static_cast<size_t>(t * hd + d)] != y0[static_cast<size_t>(t * hd + d)];
    EXPECT_EQ(changed, t == 5) << "token " << t;  // only the perturbed token's own output moves
  }
}

TEST(TrainLayers, MlaWithQLoraBackwardMatchesFiniteDifferences) {
  check_mla(true);
}
TEST(TrainLayers, MlaWithQProjBackwardMatchesFiniteDifferences) {
  check_mla(false);
}

// --prev-token-heads: at initialisation the chosen heads of layer 0 put nearly all their weight on
// the previous position, for random tokens anywhere in a long sequence, with q LoRA or q_proj;
// the other heads, and every head without the option, do not.
void check_prev_token_heads(bool q_lora) {
  Rng rng(testing::fresh_seed(q_lora ? "previous-token heads, q LoRA" : "previous-token heads, q_proj"));
  ModelConfig c = testing::tiny_config(q_lora);  // then the tiny preset's attention shape
  testing::default_attention_shape(c, q_lora);
  c.vocab_size = 512;
  c.num_hidden_layers = 1;
  auto layout = make_param_layout(c, false);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  const SeqShape shape{1, 384};
  const int64_t S = shape.seq_len, hd = c.hidden_size, H = c.num_attention_heads;
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(c.vocab_size));
  for (const int heads : {0, 2}) {
    auto p = make_params<float>(*layout);
    init_params(p, rng.next_u64(), 1.0, heads);
    std::vector<float> x(static_cast<size_t>(S * hd)), y(x.size());
    for (int64_t i = 0; i < S; ++i) {  // the input RMSNorm (weight 1) of the embedding rows
      const float* e = p.embed + tokens[static_cast<size_t>(i)] * hd;
      double sq = 0;
      for (int64_t k = 0; k < hd; ++k) sq += double(e[k]) * e[k];
      const double inv = 1.0 / std::sqrt(sq / double(hd) + c.rms_norm_eps);
      for (int64_t k = 0; k < hd; ++k) x[static_cast<size_t>(i * hd + k)] = static_cast<float>(e[k] * inv);
    }
    MlaContext<float> ctx;
    mla_forward(c, p.layers[0], shape, x.data(), y.data(), ctx);
    for (int64_t h = 0; h < H; ++h) {
      double mean = 0, worst = 1;
      for (int64_t i = 1; i < S; ++i) {
        const double w = ctx.p[static_cast<size_t>((h * S + i) * S + i - 1)];
        mean += w / double(S - 1);
        worst = std::min(worst, w);
      }
      if (h < heads) {
        EXPECT_GT(mean, 0.98) << "head " << h;
        EXPECT_GT(worst, 0.95) << "head " << h;
      } else {
        EXPECT_LT(mean, 0.5) << "head " << h << " of " << heads << " seeded";
      }
    }
  }
}

TEST(TrainLayers, PrevTokenHeadsAttendToThePreviousPositionAtInitialisation) {
  check_prev_token_heads(true);
  check_prev_token_heads(false);
}

TEST(TrainLayers, MoeBackwardWithBalanceLossMatchesFiniteDifferences) {
  Rng rng(testing::fresh_seed("MoE"));
  for (bool norm_topk : {true, false}) {
    ModelConfig cfg = testing::tiny_config();
    cfg.norm_topk_prob = norm_topk;
    auto layout = make_param_layout(cfg, false);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    const ModelConfig& c = layout->config;
    auto p = make_params<double>(*layout);
    auto g = make_params<double>(*layout);
    randomize(p, rng);
    const LayerParams<double>& L = p.layers[1];
    ASSERT_TRUE(L.moe);
    const SeqShape shape{2, 5};
    const int64_t n = shape.tokens(), hd = c.hidden_size;
    const double alpha = 0.05, loss_scale = 1.3;  // a visible balance term
    Vec x(n * hd), r(n * hd), y(n * hd), dx(n * hd);
    fill_uniform(x, rng, 1.5);
    fill_uniform(r, rng);
    auto loss = [&] {
      MoeContext<double> c2;
      moe_forward(c, L, shape, alpha, x.data(), y.data(), c2);
      return dot(r, y.data()) + loss_scale * c2.balance_loss;
    };
    MoeContext<double> ctx;
    moe_forward(c, L, shape, alpha, x.data(), y.data(), ctx);
    EXPECT_GT(ctx.balance_loss, 0.0);
    int64_t routed = 0;
    for (int64_t l : ctx.load) routed += l;
    EXPECT_EQ(routed, n * c.num_experts_per_tok);
    moe_backward_input(c, L, r.data(), loss_scale, dx.data(), ctx);
    moe_backward_weight(c, ctx, g.layers[1]);
    expect_grad("MoE dx", loss, x.data(), dx.data(), n * hd, 40, rng);
    expect_param_grads("MoE", p, g, 1, {}, loss, rng);
  }
}

TEST(TrainLayers, MoeSelectionIsGroupLimitedAndUsesTheBiasForSelectionOnly) {
  ModelConfig c = testing::tiny_config();  // 8 experts, 4 groups of 2, top-2 groups, top-2 experts
  const double scores[8] = {0.9, 0.1, 0.5, 0.5, 0.8, 0.0, 0.3, 0.95};
  double bias[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t ids[2];
  // Group sums: g0 1.0, g1 1.0, g2 0.8, g3 1.25 -> groups 3 and 0 (stable) -> experts 7, 0.
  moe_select(c, scores, bias, ids);
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 0);
  bias[5] = 1.0;  // lifts group 2 (sum 1.8) and expert 5 to the top
  moe_select(c, scores, bias, ids);
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 7);
  // The bias chose expert 5, but its gate weight comes from its raw score (0.0 here).
  auto layout = make_param_layout(c, false);
  ASSERT_TRUE(layout.ok());
  std::vector<double> b = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t load[8] = {5, 0, 1, 2, 2, 2, 3, 1};  // mean 2
  moe_update_bias<double>(b.data(), load, 0.001);
  EXPECT_EQ(b, (std::vector<double>{-0.001, 0.001, 0.001, 0, 0, 0, -0.001, 0.001}));
}

void check_block(int64_t layer) {
  Rng rng(testing::fresh_seed(layer == 0 ? "Block dense" : "Block MoE"));
  auto layout = make_param_layout(testing::tiny_config(), true);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  const ModelConfig& c = layout->config;
  auto p = make_params<double>(*layout);
  auto g = make_params<double>(*layout);
  randomize(p, rng);
  const SeqShape shape{2, 4};
  const TrainOptions options{.balance_alpha = 0.02};
  const int64_t n = shape.tokens(), hd = c.hidden_size;
  Vec x(n * hd), r(n * hd);
  fill_uniform(x, rng, 1.5);
  fill_uniform(r, rng);
  const LayerParams<double>& L = p.layers[static_cast<size_t>(layer)];
  auto loss = [&] {
    BlockContext<double> c2;
    Vec y = x;
    block_forward(*layout, L, layer, shape, options, y.data(), c2);
    return dot(r, y.data()) + (c2.moe ? c2.moe_ctx.balance_loss : 0.0);
  };
  BlockContext<double> ctx;
  Vec y = x;
  block_forward(*layout, L, layer, shape, options, y.data(), ctx);
  Vec dx = r;
  block_backward_input(*layout, L, 1.0, dx.data(), ctx);
  block_backward_weight(*layout, ctx, g.layers[static_cast<size_t>(layer)]);
  expect_grad("block dx", loss, x.data(), dx.data(), n * hd, 40, rng);
  expect_param_grads("block", p, g, layer, {}, loss, rng);
}

TEST(TrainLayers, DenseBlockBackwardMatchesFiniteDifferences) {
  check_block(0);
}
TEST(TrainLayers, MoeBlockBackwardMatchesFiniteDifferences) {
  check_block(1);
}
TEST(TrainLayers, MtpLayerBlockBackwardMatchesFiniteDifferences) {
  check_block(2);
}

// DualPipe runs W (weight gradients) later than B: deferring every W to after all B must give
// bit-identical gradients to running each W right after its B.
TEST(TrainLayers, DeferredWeightGradientsAreBitIdentical) {
  Rng rng(testing::fresh_seed("B/W split"));
  auto layout = make_param_layout(testing::tiny_config(), false);
  ASSERT_TRUE(layout.ok());
  auto p = make_params<float>(*layout);
  init_params(p, rng.next_u64());
  const SeqShape shape{1, 7};
  const int64_t n = shape.tokens(), hd = layout->config.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * hd)), r(x.size());
  for (float& v : x) v = rng.uniform_f(-1, 1);
  for (float& v : r) v = rng.uniform_f(-1, 1);
  auto run = [&](bool deferred) {
    auto g = make_params<float>(*layout);
    std::vector<BlockContext<float>> ctx(2);
    std::vector<float> y = x, dx = r;
    for (int64_t l = 0; l < 2; ++l) block_forward(*layout, p.layers[l], l, shape, {}, y.data(), ctx[l]);
    for (int64_t l = 1; l >= 0; --l) {
      block_backward_input(*layout, p.layers[l], 1.0, dx.data(), ctx[l]);
      if (!deferred) block_backward_weight(*layout, ctx[l], g.layers[l]);
    }
    if (deferred) {
      for (int64_t l = 0; l < 2; ++l) block_backward_weight(*layout, ctx[l], g.layers[l]);
    }
    return std::make_pair(std::move(g.data), dx);
  };
  const auto a = run(false), b = run(true);
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);
}

// A pipeline stage's slab holds only its layers, and a block computes the same on it.
TEST(TrainLayers, StageSlabsHoldTheirLayersAndComputeTheSame) {
  Rng rng(testing::fresh_seed("stage slab"));
  auto full = make_param_layout(testing::tiny_config(), true);
  ASSERT_TRUE(full.ok());
  auto stage = stage_param_layout(*full, {.layer_begin = 1, .layer_end = 3, .head = true});
  ASSERT_TRUE(stage.ok()) << stage.status().to_string();
  EXPECT_FALSE(stage_param_layout(*full, {.layer_begin = 2, .layer_end = 4}).ok());
  auto pf = make_params<double>(*full);
  randomize(pf, rng);
  auto ps = make_params<double>(*stage);
  int64_t copied = 0;
  for (const ParamInfo& info : stage->params) {
    const ParamInfo* f = full->find(info.name);
    ASSERT_NE(f, nullptr);
    std::copy_n(pf.at(*f), f->size, ps.at(info));
    copied += info.size;
  }
  EXPECT_EQ(copied, stage->total);
  EXPECT_EQ(ps.embed, nullptr);
  EXPECT_NE(ps.head, nullptr);
  EXPECT_EQ(ps.layers[0].attn_norm, nullptr);
  EXPECT_NE(ps.layers[2].eh_proj, nullptr);
  const SeqShape shape{1, 5};
  std::vector<double> x(static_cast<size_t>(shape.tokens() * full->config.hidden_size));
  fill_uniform(x, rng);
  std::vector<double> a = x, b = x;
  BlockContext<double> ca, cb;
  block_forward(*full, pf.layers[1], 1, shape, {}, a.data(), ca);
  block_forward(*stage, ps.layers[1], 1, shape, {}, b.data(), cb);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace fathom::train
