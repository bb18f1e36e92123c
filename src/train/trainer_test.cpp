// Tests of the trainer (train/trainer.h): learning on a small token directory written here,
// determinism, bit-identical resume, checkpoint and data validation, and export round trips
// through the runtime (HF bf16 and GGUF). Seeds are printed (FATHOM_TRAIN_SEED replays).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/fs.h"
#include "model/model.h"
#include "model/synth.h"
#include "tensor/convert.h"
#include "tokenizer/tokenizer.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

namespace fathom::train {
namespace {

namespace fs = std::filesystem;

std::string tmp_root() {
  return ::testing::TempDir() + "/trainer_test_" + std::to_string(getpid());
}

std::string tmp(const std::string& name) {
  const std::string d = tmp_root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_u32(const std::string& path, const std::vector<uint32_t>& ids) {
  std::string bytes(ids.size() * 4, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int b = 0; b < 4; ++b) bytes[i * 4 + static_cast<size_t>(b)] = static_cast<char>(ids[i] >> (8 * b));
  }
  ASSERT_TRUE(write_file_atomic(path, bytes).ok());
}

int64_t builtin_vocab() {
  auto tok = Tokenizer::from_json(builtin_tokenizer_json(), builtin_tokenizer_config_json());
  return (*tok)->vocab_size();
}

// Documents: bos, then a counting run a, a+1, ... (mod 64, offset 4) of 12..40 tokens, then eos:
// learnable, so the loss must fall.
std::vector<uint32_t> make_docs(Rng& rng, int64_t n_docs, uint32_t bos, uint32_t eos) {
  std::vector<uint32_t> t;
  for (int64_t d = 0; d < n_docs; ++d) {
    t.push_back(bos);
    uint32_t a = static_cast<uint32_t>(rng.below(64));
    const int64_t len = 12 + static_cast<int64_t>(rng.below(29));
    for (int64_t i = 0; i < len; ++i) t.push_back(4 + (a++ % 64));
    t.push_back(eos);
  }
  return t;
}

// A fathom-tokens-v1 directory with the built-in tokenizer; vocab_size = that of tiny_model().
std::string write_data(const std::string& dir, uint64_t seed) {
  Rng rng(seed);
  const int64_t vocab = (builtin_vocab() + 63) / 64 * 64;
  const uint32_t bos = 1, eos = 2;
  const auto train = make_docs(rng, 200, bos, eos), val = make_docs(rng, 20, bos, eos);
  write_u32(dir + "/train.bin", train);
  write_u32(dir + "/val.bin", val);
  const nlohmann::json meta = {
      {"format", "fathom-tokens-v1"},   {"vocab_size", vocab},       {"bos_id", bos}, {"eos_id", eos},
      {"n_train_tokens", train.size()}, {"n_val_tokens", val.size()}};
  EXPECT_TRUE(write_file_atomic(dir + "/meta.json", meta.dump()).ok());
  EXPECT_TRUE(write_file_atomic(dir + "/tokenizer.json", builtin_tokenizer_json()).ok());
  EXPECT_TRUE(write_file_atomic(dir + "/tokenizer_config.json", builtin_tokenizer_config_json()).ok());
  return dir;
}

ModelConfig tiny_model(bool mtp) {
  SynthOptions so;
  so.preset = "tiny";
  so.layers = 2;  // one dense, one MoE layer
  so.experts = 8;
  so.vocab = (builtin_vocab() + 63) / 64 * 64;
  so.mtp = mtp;
  auto c = synth_config(so, 0);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  // Narrower than the preset, every V3 feature kept (q LoRA, YaRN, MoE groups, shared expert).
  c->hidden_size = 64;
  c->intermediate_size = 128;
  c->moe_intermediate_size = 32;
  c->num_attention_heads = 4;
  c->num_key_value_heads = 4;
  c->q_lora_rank = 32;
  c->kv_lora_rank = 32;
  c->qk_nope_head_dim = 16;
  c->qk_rope_head_dim = 16;
  c->v_head_dim = 16;
  EXPECT_TRUE(c->validate().ok());
  return *c;
}

class TrainRun : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(tmp_root()); }
};

TrainerOptions small_run(const std::string& data, const std::string& out, int64_t steps) {
  TrainerOptions o;
  o.data_dir = data;
  o.out_dir = out;
  o.steps = steps;
  o.seq_len = 24;
  o.batch = 4;
  o.micro_batches = 2;
  o.schedule = {.lr = 3e-3, .min_lr = 3e-4, .warmup = 3, .steps = steps};
  o.eval_every = 5;
  o.eval_batches = 2;
  o.save_every = 0;
  o.progress = false;
  o.mtp = true;
  return o;
}

// Stops the run (through the stop flag) after n steps, as SIGINT would.
class StopAfter final : public StepComputer {
 public:
  StopAfter(int64_t n, std::atomic<bool>* stop) : inner_(make_local_step_computer({})), n_(n), stop_(stop) {}
  Result<StepResult> compute(const ModelParams<float>& p, std::span<const Batch> m,
                             ModelParams<float>& g) override {
    if (--n_ == 0) stop_->store(true);
    return inner_->compute(p, m, g);
  }
  Result<StepLoss> evaluate(const ModelParams<float>& p, const Batch& b) override {
    return inner_->evaluate(p, b);
  }

 private:
  std::unique_ptr<StepComputer> inner_;
  int64_t n_;
  std::atomic<bool>* stop_;
};

std::vector<double> logged_losses(const std::string& run) {
  std::vector<double> out;
  std::ifstream in(run + "/log.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

std::vector<float> checkpoint_params(const std::string& run, const ModelConfig& c, bool mtp) {
  auto layout = make_param_layout(c, mtp);
  std::vector<float> p(static_cast<size_t>(layout->total));
  AdamW adam(*layout, {});
  auto st = load_checkpoint(run + "/checkpoint.bin", *layout, p, adam);
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  return p;
}

TEST_F(TrainRun, LossFallsAndTheSameRunTwiceIsBitIdentical) {
  const uint64_t seed = testing::fresh_seed("trainer data");
  const std::string data = write_data(tmp("data"), seed);
  const ModelConfig c = tiny_model(true);
  auto a = train_model(c, small_run(data, tmp("run_a"), 30));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = train_model(c, small_run(data, tmp("run_b"), 30));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(a->losses.size(), 30u);
  EXPECT_EQ(a->losses, b->losses);  // bit-identical
  std::printf("loss %.4f -> %.4f, val %.4f\n", a->first_loss, a->last_loss, a->val_loss);
  EXPECT_LT(a->last_loss, a->first_loss * 0.6);
  EXPECT_GT(a->val_loss, 0);
  EXPECT_LT(a->val_loss, a->first_loss * 0.6);
  const std::string svg = *read_file(a->checkpoint.substr(0, a->checkpoint.rfind('/')) + "/loss.svg");
  EXPECT_NE(svg.find("tokens trained"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_EQ(logged_losses(a->checkpoint.substr(0, a->checkpoint.rfind('/'))), a->losses);
}

TEST_F(TrainRun, ResumeAfterAnInterruptionIsBitIdentical) {
  const uint64_t seed = testing::fresh_seed("trainer resume");
  const std::string data = write_data(tmp("data"), seed);
  const ModelConfig c = tiny_model(true);
  const std::string full = tmp("full"), part = tmp("part");
  auto a = train_model(c, small_run(data, full, 16));
  ASSERT_TRUE(a.ok()) << a.status().to_string();

  std::atomic<bool> stop{false};
  TrainerOptions o = small_run(data, part, 16);
  o.stop = &stop;
  StopAfter stopper(7, &stop);
  auto b1 = train_model(c, o, &stopper);
  ASSERT_TRUE(b1.ok()) << b1.status().to_string();
  EXPECT_TRUE(b1->interrupted);
  EXPECT_EQ(b1->step, 7);
  // Running again without --resume refuses to overwrite.
  EXPECT_EQ(train_model(c, small_run(data, part, 16)).status().code(), StatusCode::kAlreadyExists);
  TrainerOptions r = small_run(data, part, 16);
  r.resume = true;
  auto b2 = train_model(c, r);
  ASSERT_TRUE(b2.ok()) << b2.status().to_string();
  EXPECT_EQ(b2->step, 16);
  EXPECT_EQ(logged_losses(full), logged_losses(part));
  const auto pa = checkpoint_params(full, c, true), pb = checkpoint_params(part, c, true);
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 4), 0);
}

TEST_F(TrainRun, BadCheckpointsAreRejectedBeforeAnyWork) {
  const std::string data = write_data(tmp("data"), 5);
  const ModelConfig c = tiny_model(true);
  const std::string run = tmp("run");
  ASSERT_TRUE(train_model(c, small_run(data, run, 2)).ok());
  const std::string ckpt = run + "/checkpoint.bin";
  const std::string good = *read_file(ckpt);
  TrainerOptions r = small_run(data, run, 4);
  r.resume = true;
  auto expect_error = [&](const std::string& bytes, const std::string& needle, const ModelConfig& cfg) {
    ASSERT_TRUE(write_file_atomic(ckpt, bytes).ok());
    auto s = train_model(cfg, r);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.status().to_string().find(needle), std::string::npos) << s.status().to_string();
  };
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;
  expect_error(flipped, "checksum", c);
  expect_error(good.substr(0, good.size() - 100), "checksum", c);
  expect_error("short", "not a Fathom trainer checkpoint", c);
  ModelConfig other = tiny_model(true);
  other.num_hidden_layers = 3;
  expect_error(good, "fit a model", other);  // a different size
  other = tiny_model(true);
  other.rope_theta = 5000;
  expect_error(good, "rope_theta", other);  // same size, different config
  TrainerOptions seq = r;
  seq.batch = 2;
  ASSERT_TRUE(write_file_atomic(ckpt, good).ok());
  auto s = train_model(c, seq);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().to_string().find("batch"), std::string::npos) << s.status().to_string();
  fs::remove(ckpt);
  EXPECT_EQ(train_model(c, r).status().code(), StatusCode::kNotFound);
}

// --init-from: a new run starts from an exported checkpoint's weights. With a learning rate far
// below any weight's rounding step its steps leave them as they are (only the routing bias moves,
// by the balancing rule), so the new run's checkpoint holds the first run's weights exactly, not its
// own seed's; a checkpoint of another shape is refused, naming the tensor, before any work.
TEST_F(TrainRun, InitFromStartsFromAnExportedCheckpoint) {
  const std::string data = write_data(tmp("data"), testing::fresh_seed("trainer init-from"));
  const ModelConfig c = tiny_model(true);
  const std::string first = tmp("first"), hf = tmp("hf");
  ASSERT_TRUE(train_model(c, small_run(data, first, 5)).ok());
  auto e = export_model({.run_dir = first, .out = hf, .dtype = "f32", .format = "hf"});
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const std::string second = tmp("second");
  TrainerOptions o = small_run(data, second, 2);
  o.seed = 99;  // another initialisation: replaced entirely
  o.schedule = {.lr = 1e-30, .min_lr = 1e-30, .warmup = 0, .steps = 2};
  o.init_from = hf;
  auto b = train_model(c, o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const auto pa = checkpoint_params(first, c, true), pb = checkpoint_params(second, c, true);
  auto layout = make_param_layout(c, true);
  int64_t differ = 0, biases = 0;
  for (const ParamInfo& p : layout->params) {
    for (int64_t i = 0; i < p.size; ++i) {
      const size_t k = static_cast<size_t>(p.offset + i);
      (p.role == WeightRole::kBias ? biases : differ) += pa[k] != pb[k];
    }
  }
  EXPECT_EQ(differ, 0);  // seed 99's own initialisation would differ everywhere
  EXPECT_GT(biases, 0);  // the balancing rule ran: the steps were real

  ModelConfig wider = c;
  wider.moe_intermediate_size = 48;
  TrainerOptions bad = o;
  bad.out_dir = tmp("bad");
  auto s = train_model(wider, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().to_string().find("--init-from"), std::string::npos) << s.status().to_string();
  EXPECT_NE(s.status().to_string().find("has shape"), std::string::npos) << s.status().to_string();
  EXPECT_FALSE(path_exists(bad.out_dir + "/checkpoint.bin"));
  bad.init_from = tmp("nothing");
  s = train_model(c, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().to_string().find("--init-from"), std::string::npos) << s.status().to_string();
}

// A tied embedding is also the output head, so it starts at a head's scale (U(-a, a) with
// a = sqrt(3 / hidden)); an untied one at U(-1, 1).
TEST(TrainInit, TiedEmbeddingsStartAtTheScaleOfAHead) {
  for (const bool tied : {false, true}) {
    ModelConfig c = tiny_model(false);
    c.tie_word_embeddings = tied;
    auto layout = make_param_layout(c, false);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    auto params = make_params<float>(*layout);
    init_params(params, 7);
    const ParamInfo* embed = layout->find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr);
    EXPECT_EQ(layout->find("lm_head.weight") == nullptr, tied);
    float amax = 0;
    for (int64_t i = 0; i < embed->size; ++i) amax = std::max(amax, std::abs(params.at(*embed)[i]));
    const double a = tied ? std::sqrt(3.0 / static_cast<double>(c.hidden_size)) : 1.0;
    EXPECT_LE(amax, a);
    EXPECT_GT(amax, 0.95 * a);
  }
}

TEST_F(TrainRun, BadDataAndShapesAreRejectedWithClearErrors) {
  const ModelConfig c = tiny_model(false);
  auto expect_error = [&](const std::string& dir, const std::string& needle, const ModelConfig& cfg) {
    TrainerOptions o = small_run(dir, tmp("bad_run"), 2);
    o.mtp = false;
    auto s = train_model(cfg, o);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.status().to_string().find(needle), std::string::npos) << s.status().to_string();
  };
  expect_error(tmp("empty"), "meta.json is missing", c);
  std::string d = write_data(tmp("odd"), 1);
  ASSERT_TRUE(write_file_atomic(d + "/train.bin", std::string(4 * 100 + 2, '\1')).ok());
  expect_error(d, "not a whole number", c);
  d = write_data(tmp("count"), 1);
  write_u32(d + "/val.bin", {1, 5, 6});
  expect_error(d, "meta.json says", c);
  d = write_data(tmp("range"), 1);
  {
    std::string bytes = *read_file(d + "/train.bin");
    bytes[4 * 10] = static_cast<char>(0xff);
    bytes[4 * 10 + 1] = static_cast<char>(0xff);
    ASSERT_TRUE(write_file_atomic(d + "/train.bin", bytes).ok());
  }
  expect_error(d, "not below vocab_size", c);
  d = write_data(tmp("nobos"), 1);
  {
    std::string bytes = *read_file(d + "/train.bin");
    bytes[0] = 7;
    ASSERT_TRUE(write_file_atomic(d + "/train.bin", bytes).ok());
  }
  expect_error(d, "must start with bos_id", c);
  d = write_data(tmp("meta"), 1);
  ASSERT_TRUE(write_file_atomic(d + "/meta.json", R"({"format":"fathom-tokens-v1","vocab_size":"x"})").ok());
  expect_error(d, "\"vocab_size\" must be an integer", c);
  d = write_data(tmp("good"), 1);
  ModelConfig v = c;
  v.vocab_size += 64;
  expect_error(d, "differs from the config's vocab_size", v);
  ModelConfig heads = c;
  heads.n_group = 3;  // 8 experts do not split into 3 groups
  expect_error(d, "n_group", heads);
  TrainerOptions o = small_run(d, tmp("long"), 2);
  o.seq_len = 20000;
  EXPECT_NE(train_model(c, o).status().to_string().find("max_position_embeddings"), std::string::npos);
  o = small_run(d, tmp("prev"), 2);
  o.prev_token_heads = c.num_attention_heads + 1;
  EXPECT_NE(train_model(c, o).status().to_string().find("--prev-token-heads"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(tmp("prev") + "/checkpoint.bin"));
  o = small_run(d, tmp("induction"), 2);
  o.induction_heads = true;  // the tiny test shape has no room for the circuit
  const std::string err = train_model(c, o).status().to_string();
  EXPECT_NE(err.find("--induction-heads needs"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(tmp("induction") + "/checkpoint.bin"));
}

TEST_F(TrainRun, LossMasksTurnUnscoredTargetsIntoIgnoredOnes) {
  const std::string d = write_data(tmp("masked"), 4);
  auto meta = nlohmann::json::parse(*read_file(d + "/meta.json"));
  const int64_t n_train = meta["n_train_tokens"], n_val = meta["n_val_tokens"];
  // Every third token scored.
  std::string tm(static_cast<size_t>(n_train), '\0'), vm(static_cast<size_t>(n_val), '\1');
  for (int64_t i = 0; i < n_train; i += 3) tm[static_cast<size_t>(i)] = 1;
  ASSERT_TRUE(write_file_atomic(d + "/train.mask", tm).ok());
  ASSERT_TRUE(write_file_atomic(d + "/val.mask", vm).ok());
  auto unmasked = load_token_data(d, 16);
  ASSERT_TRUE(unmasked.ok());
  EXPECT_TRUE(unmasked->train_mask.empty());  // meta.json does not declare one yet
  meta["loss_mask"] = "uint8";
  ASSERT_TRUE(write_file_atomic(d + "/meta.json", meta.dump()).ok());
  auto data = load_token_data(d, 16);
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_NE(data->hash, unmasked->hash);
  Sampler sampler(*data, 16, 9);
  Batch b;
  int64_t scored = 0;
  for (int step = 0; step < 20; ++step) {
    sampler.next(3, b);
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t t = 0; t < 16; ++t) {
        const int32_t tgt = b.targets[static_cast<size_t>(i * 16 + t)];
        if (tgt >= 0) ++scored;
        // The target of position t is token t + 1 of the sequence; the same token of the data.
        if (t + 1 < 16) {
          const int32_t next = b.tokens[static_cast<size_t>(i * 16 + t + 1)];
          EXPECT_TRUE(tgt == -1 || tgt == next);
        }
      }
    }
  }
  EXPECT_GT(scored, 20 * 3 * 16 / 5);
  EXPECT_LT(scored, 20 * 3 * 16 / 2);
  // A masked run trains and validates (val all scored, so its loss is finite and positive).
  TrainerOptions o = small_run(d, tmp("masked_run"), 3);
  o.mtp = false;
  auto r = train_model(tiny_model(false), o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Bad masks: wrong size, a byte that is not 0/1, missing.
  auto expect_error = [&](const std::string& needle) {
    auto bad = load_token_data(d, 16);
    ASSERT_FALSE(bad.ok()) << needle;
    EXPECT_NE(bad.status().to_string().find(needle), std::string::npos) << bad.status().to_string();
  };
  ASSERT_TRUE(write_file_atomic(d + "/val.mask", vm.substr(1)).ok());
  expect_error("one byte per token");
  vm[5] = 2;
  ASSERT_TRUE(write_file_atomic(d + "/val.mask", vm).ok());
  expect_error("byte 5 is 2");
  std::filesystem::remove(d + "/val.mask");
  expect_error("val.mask is missing");
}

// Max |a - b| / max |b|.
double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Trains a few steps of `c` (with MTP), exports it in every format and compares the runtime's
// logits with the trainer's.
void check_export(const ModelConfig& c) {
  const uint64_t seed = testing::fresh_seed("trainer export");
  const std::string data = write_data(tmp("data"), seed);
  const std::string run = tmp("run");
  ASSERT_TRUE(train_model(c, small_run(data, run, 6)).ok());
  const std::string hf = tmp("hf"), gguf = tmp("gguf") + "/model.gguf";
  auto e1 = export_model({.run_dir = run, .out = hf, .dtype = "bf16", .format = "hf"});
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  auto e2 = export_model({.run_dir = run, .out = gguf, .dtype = "bf16", .format = "gguf"});
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  const std::string fp8_dir = tmp("fp8");
  auto e3 = export_model({.run_dir = run, .out = fp8_dir, .dtype = "fp8", .format = "hf"});
  ASSERT_TRUE(e3.ok()) << e3.status().to_string();
  EXPECT_TRUE(path_exists(hf + "/tokenizer.json") && path_exists(hf + "/config.json"));

  // The trainer's forward on its fp32 master weights and on the exported bf16 values.
  auto layout = make_param_layout(c, true);
  auto master = make_params<float>(*layout);
  const std::vector<float> trained = checkpoint_params(run, c, true);
  std::copy(trained.begin(), trained.end(), master.data.begin());  // views stay valid
  auto exported = make_params<float>(*layout);
  const Status loaded = load_params_hf(exported, hf);
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  Rng rng(seed);
  const int64_t n = 20;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n), -1);
  for (auto& t : tokens) t = static_cast<int32_t>(4 + rng.below(64));
  tokens[0] = 1;
  const TrainOptions opt{.round_latent_bf16 = true, .all_logits = true};
  auto ctx_m = make_model_context<float>(), ctx_e = make_model_context<float>();
  ASSERT_TRUE(model_forward(master, {1, n}, tokens, targets, opt, *ctx_m).ok());
  ASSERT_TRUE(model_forward(exported, {1, n}, tokens, targets, opt, *ctx_e).ok());
  // Every exported value is the master weight rounded to nearest-even bf16 (the routing bias
  // stays f32, as DeepSeek ships it).
  int64_t mismatched = 0;
  for (const ParamInfo& p : layout->params) {
    for (int64_t i = 0; i < p.size; ++i) {
      const float m = master.at(p)[i];
      mismatched += exported.at(p)[i] != (p.role == WeightRole::kBias ? m : bf16_to_f32(f32_to_bf16(m)));
    }
  }
  EXPECT_EQ(mismatched, 0);
  auto trace_of = [&](const ModelContext<float>& ctx) {
    RoutingTrace trace;
    trace.replay = true;  // router near-ties would otherwise dominate the comparison
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const auto ids = model_routing(ctx, l);
      for (int64_t t = 0; t < n && !ids.empty(); ++t) {
        trace.ids[{l, t}] = std::vector<int32_t>(ids.begin() + t * c.num_experts_per_tok,
                                                 ids.begin() + (t + 1) * c.num_experts_per_tok);
      }
    }
    return trace;
  };
  const std::string f32_dir = tmp("f32");
  auto e4 = export_model({.run_dir = run, .out = f32_dir, .dtype = "f32", .format = "hf"});
  ASSERT_TRUE(e4.ok()) << e4.status().to_string();
  RoutingTrace trace_m = trace_of(*ctx_m), trace_e = trace_of(*ctx_e);
  // f32: the master weights exactly; fp32 kernels on both sides, the bf16 KV-cache rounding
  // mirrored by round_latent_bf16 (bound as in model_test.cpp: 2e-3). bf16 (HF and GGUF): the
  // exported values; the runtime's bf16 GEMMs round activations to bf16 (2^-9 relative per
  // operand) where the trainer stays in fp32, seen 2e-3..9e-3 over 2 layers + head: bound 3e-2.
  struct Case {
    std::string path;
    RoutingTrace* trace;
    const ModelContext<float>* ctx;
    double bound;
  };
  for (const Case& k : {Case{f32_dir, &trace_m, ctx_m.get(), 2e-3}, Case{hf, &trace_e, ctx_e.get(), 3e-2},
                        Case{gguf, &trace_e, ctx_e.get(), 3e-2}}) {
    ModelOptions mo;
    mo.progress = false;
    mo.max_batch_tokens = 64;
    mo.max_context = 128;
    auto model = Model::load(k.path, mo);
    ASSERT_TRUE(model.ok()) << k.path << ": " << model.status().to_string();
    (*model)->set_routing_trace(k.trace);
    auto logits = run_sequence_logits(**model, tokens, RunMode::kPrefill);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    const double e = rel_err(*logits, model_logits(*k.ctx));
    std::printf("%s: runtime vs trainer logits: rel err %.2e (bound %.0e)\n", k.path.c_str(), e, k.bound);
    EXPECT_LT(e, k.bound);
  }
  ModelOptions mo;
  mo.progress = false;
  auto fp8 = Model::load(fp8_dir, mo);
  EXPECT_TRUE(fp8.ok()) << fp8.status().to_string();
}

TEST_F(TrainRun, ExportedCheckpointsGiveTheTrainersLogitsInTheRuntime) { check_export(tiny_model(true)); }

// A tied embedding is also the head: of the main model and of the MTP module, which in the
// exported checkpoint gets its own copy (shared_head.head), as DeepSeek's layout has one.
TEST_F(TrainRun, TiedEmbeddingsExportAndRunLikeTheTrainer) {
  ModelConfig c = tiny_model(true);
  c.tie_word_embeddings = true;
  check_export(c);
}

// A sequence starts only at a document start, so the tail of a document longer than seq_len + 1
// is never trained on; load_token_data counts those tokens so the trainer can say so.
TEST_F(TrainRun, TokensPastEveryWindowAreCounted) {
  const std::string d = tmp("unreached");
  std::filesystem::create_directories(d);
  const uint32_t bos = 1, eos = 2;
  auto docs = [&](std::initializer_list<int> lengths) {
    std::vector<uint32_t> t;
    for (const int n : lengths) {
      t.push_back(bos);
      for (int i = 1; i < n; ++i) t.push_back(static_cast<uint32_t>(3 + i % 50));
    }
    return t;
  };
  const auto train = docs({10, 30, 5, 50}), val = docs({60});
  write_u32(d + "/train.bin", train);
  write_u32(d + "/val.bin", val);
  const nlohmann::json meta = {{"format", "fathom-tokens-v1"}, {"vocab_size", 64}, {"bos_id", bos},
                               {"eos_id", eos}, {"n_train_tokens", train.size()}, {"n_val_tokens", val.size()}};
  ASSERT_TRUE(write_file_atomic(d + "/meta.json", meta.dump()).ok());
  // Windows of 16 tokens from 0, 10, 40 and 45 cover [0, 26) and [40, 61): 47 of 95.
  auto data = load_token_data(d, 15);
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->train_unreached, 95 - 47);
  EXPECT_EQ(data->longest_train_doc, 50);
  data = load_token_data(d, 49);  // windows of 50 from 0, 10, 40, 45: everything
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->train_unreached, 0);
  // Random documents against a brute-force coverage count.
  Rng rng(testing::fresh_seed("unreached tokens"));
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint32_t> t;
    const int n_docs = 1 + static_cast<int>(rng.next_u64() % 30);
    for (int k = 0; k < n_docs; ++k) {
      const int len = 1 + static_cast<int>(rng.next_u64() % 60);
      t.push_back(bos);
      for (int i = 1; i < len; ++i) t.push_back(5);
    }
    const int64_t seq_len = 1 + static_cast<int64_t>(rng.next_u64() % 40);
    write_u32(d + "/train.bin", t);
    nlohmann::json m = meta;
    m["n_train_tokens"] = t.size();
    ASSERT_TRUE(write_file_atomic(d + "/meta.json", m.dump()).ok());
    auto r = load_token_data(d, seq_len);
    if (!r.ok()) continue;  // no document start fits this seq_len
    std::vector<char> covered(t.size(), 0);
    for (size_t s = 0; s + static_cast<size_t>(seq_len) + 1 <= t.size(); ++s) {
      if (t[s] != bos) continue;
      for (int64_t j = 0; j <= seq_len; ++j) covered[s + static_cast<size_t>(j)] = 1;
    }
    EXPECT_EQ(r->train_unreached, std::count(covered.begin(), covered.end(), 0)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace fathom::train
