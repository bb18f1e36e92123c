// The model against its float64 reference, its own forms against each other, and every
// checkpoint flavour against its twins. Checkpoints come from `synth` (tiny preset, shrunk).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "base/cpu.h"
#include "base/fs.h"
#include "base/rng.h"
#include "model/model.h"
#include "model/reference.h"
#include "model/synth.h"
#include "model/weights.h"

namespace fathom {
namespace {

std::string dir() { return testing::TempDir() + "/model_test"; }

struct Ckpt {
  const char* name;
  const char* preset;
  DType dtype;
  CheckpointFormat format;
  bool fp8_twin = false;
  bool legacy = false;
  bool mtp = false;
};

const Ckpt kCkpts[] = {
    {"tiny-f32", "tiny", DType::kF32, CheckpointFormat::kHf, false, false, true},
    {"tiny-bf16", "tiny", DType::kBF16, CheckpointFormat::kHf},
    {"tiny-fp8", "tiny", DType::kF8E4M3, CheckpointFormat::kHf},
    {"tiny-fp8twin-bf16", "tiny", DType::kBF16, CheckpointFormat::kHf, true},
    {"tiny-f32.gguf", "tiny", DType::kF32, CheckpointFormat::kGguf},
    {"tiny-bf16.gguf", "tiny", DType::kBF16, CheckpointFormat::kGguf},
    {"tiny-legacy-f32.gguf", "tiny", DType::kF32, CheckpointFormat::kGguf, false, true},
    {"tiny-q8_0.gguf", "tiny", DType::kQ8_0, CheckpointFormat::kGguf},
    {"tinyv2-f32", "v2", DType::kF32, CheckpointFormat::kHf},
};

std::string path_of(const char* name) { return dir() + "/" + name; }

class ModelTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(dir());
    // ctest runs every TEST in its own process, two at a time: one writes, the others wait.
    const int lock = open((dir() + "/.lock").c_str(), O_CREAT | O_RDWR, 0644);
    ASSERT_GE(lock, 0);
    ASSERT_EQ(flock(lock, LOCK_EX), 0);
    for (const Ckpt& c : kCkpts) {
      if (path_exists(path_of(c.name) + ".done")) continue;
      std::filesystem::remove_all(path_of(c.name));
      SynthOptions o;
      o.preset = c.preset;
      o.dtype = c.dtype;
      o.format = c.format;
      o.out = path_of(c.name);
      o.seed = 42;
      o.fp8_dequantized = c.fp8_twin;
      o.gguf_legacy_kvb = c.legacy;
      o.mtp = c.mtp;
      o.progress = false;
      if (std::string(c.preset) == "v2") {
        // V2-Lite's structure (no q LoRA, softmax gating, greedy top-k without groups, unnormalised
        // weights, two shared experts) at tiny widths, so the float64 reference stays cheap.
        const std::string cfg = dir() + "/tinyv2-config.json";
        ASSERT_TRUE(write_file_atomic(cfg, R"({"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
          "vocab_size": 4096, "hidden_size": 192, "intermediate_size": 384, "moe_intermediate_size": 96,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 2,
          "n_routed_experts": 8, "routed_scaling_factor": 1.0, "kv_lora_rank": 64, "q_lora_rank": null,
          "qk_rope_head_dim": 32, "v_head_dim": 48, "qk_nope_head_dim": 48, "topk_method": "greedy", "n_group": 1,
          "topk_group": 1, "num_experts_per_tok": 3, "moe_layer_freq": 1, "first_k_dense_replace": 1,
          "norm_topk_prob": false, "scoring_func": "softmax", "hidden_act": "silu", "max_position_embeddings": 8192,
          "rms_norm_eps": 1e-06, "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4,
          "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 2048, "type": "yarn"}})").ok());
        o.config_path = cfg;
      }
      auto r = synthesize(o);
      ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().to_string();
      ASSERT_TRUE(write_file_atomic(path_of(c.name) + ".done", "").ok());
    }
    flock(lock, LOCK_UN);
    close(lock);
  }

  static std::unique_ptr<Model> load(const char* name, int max_sequences = ModelOptions{}.max_sequences) {
    ModelOptions mo;
    mo.progress = false;
    mo.max_sequences = max_sequences;
    mo.max_batch_tokens = 64;
    mo.max_context = 512;
    auto m = Model::load(path_of(name), mo);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }

  static std::vector<int32_t> prompt(const Model& m, int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& v : t) v = static_cast<int32_t>(rng.below(static_cast<uint64_t>(m.tokenizer().vocab_size())));
    return t;
  }
};

// max |a - b| / max |b| over every element
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

// Runs a sequence recording its routing (or replaying `replay`'s): comparisons of two numerics
// paths then measure everything but router near-ties, which random weights are full of.
std::vector<float> run(Model& m, const std::vector<int32_t>& tokens, RunMode mode, RoutingTrace* trace,
                       MlaKvDType kv = MlaKvDType::kBF16) {
  m.set_routing_trace(trace);
  auto r = run_sequence_logits(m, tokens, mode, kv);
  m.set_routing_trace(nullptr);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<float>{};
}

TEST_F(ModelTest, F32LogitsMatchTheFloat64ReferenceAtEveryPosition) {
  auto m = load("tiny-f32");
  ASSERT_TRUE(m);
  const auto tokens = prompt(*m, 40, 1);
  RoutingTrace trace;
  auto fast = std::make_optional(run(*m, tokens, RunMode::kPrefill, &trace));
  ReferenceOptions ro;
  ro.routing = &trace;
  auto ref = reference_forward(m->weights(), tokens, ro);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  // The reference's own routing agrees (a near-tie may flip one decision in a hundred).
  EXPECT_LE(ref->routing_disagreements * 50, ref->routing_decisions) << ref->routing_disagreements;
  EXPECT_GT(ref->routing_decisions, 0);
  // f32 weights compute with f32 activations: only summation order differs.
  EXPECT_LT(rel_err(*fast, ref->logits), 2e-4);
  // The same holds position by position, well past position 0.
  const int64_t V = m->config().vocab_size;
  for (int64_t p : {1, 17, 39}) {
    std::vector<float> a(fast->begin() + p * V, fast->begin() + (p + 1) * V);
    std::vector<double> b(ref->logits.begin() + p * V, ref->logits.begin() + (p + 1) * V);
    EXPECT_LT(rel_err(a, b), 2e-4) << "position " << p;
  }
}

// Tolerances (max |a - b| / max |b|, routing replayed): the absorbed form runs attention in the
// MLA decode kernel's BF16 arithmetic (q and probabilities rounded to bf16, as FlashMLA does), so
// decode differs from the f32 naive prefill by ~3e-3 with f32 weights and ~1e-2 with bf16 weights.
TEST_F(ModelTest, PrefillEqualsTokenByTokenDecode) {
  for (const char* name : {"tiny-bf16", "tiny-f32.gguf", "tinyv2-f32"}) {
    auto m = load(name);
    ASSERT_TRUE(m);
    const auto tokens = prompt(*m, 70, 2);  // crosses a 64-token page
    RoutingTrace trace;
    const auto pre = run(*m, tokens, RunMode::kPrefill, &trace);
    trace.replay = true;
    const auto dec = run(*m, tokens, RunMode::kTokenByToken, &trace);
    const double tol = std::string(name) == "tiny-bf16" ? 2e-2 : 1e-2;
    EXPECT_LT(rel_err(dec, pre), tol) << name << ": naive and absorbed MLA disagree";
  }
}

// A short suffix after a cached prefix (a chat turn) runs in the absorbed form, as pieces of
// kAbsorbThreshold tokens each causal up to its own last token, instead of decompressing every
// cached key: its logits equal a whole prefill's within the two forms' bf16 gap (as above), and
// the attention FLOPs the call reports are the pieces'. A fresh prompt as short stays naive. The
// pieces fit a model loaded for one sequence too (the absorbed scratch holds one suffix's pieces).
TEST_F(ModelTest, AShortSuffixAfterACachedPrefixRunsAbsorbedAndMatchesAWholePrefill) {
  for (const auto& [name, max_sequences] : {std::pair<const char*, int>{"tiny-bf16", 64}, {"tiny-fp8", 1}}) {
    auto m = load(name, max_sequences);
    ASSERT_TRUE(m);
    const ModelConfig& c = m->config();
    const int64_t V = c.vocab_size, H = c.num_attention_heads, n = 64, cached = 44;  // one naive chunk whole
    const auto tokens = prompt(*m, static_cast<int>(n), 5);
    RoutingTrace trace;
    const auto whole = run(*m, tokens, RunMode::kPrefill, &trace);
    trace.replay = true;
    m->set_routing_trace(&trace);
    KvCacheOptions ko = m->kv_cache_options(MlaKvDType::kBF16, 0, 1);
    ko.capacity_bytes =
        static_cast<uint64_t>((n / ko.format.page_tokens + 2) * ko.format.page_bytes() * ko.n_layers);
    auto cache = KvCache::create(ko);
    ASSERT_TRUE(cache.ok());
    auto seq = (*cache)->add_sequence();
    ASSERT_TRUE(seq.ok());
    std::vector<float> logits(static_cast<size_t>(n * V));
    double suffix_flops = 0;
    for (const auto& [p, k] : {std::pair<int64_t, int64_t>{0, cached}, {cached, n - cached}}) {
      const std::span<const int32_t> part(tokens.data() + p, static_cast<size_t>(k));
      ASSERT_TRUE((*cache)->append(*seq, part).ok());
      const SeqBatch b{*seq, p, k, true};
      auto r = m->forward(std::span<const SeqBatch>(&b, 1), part, **cache, logits.data() + p * V);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      suffix_flops = r->stats.attention_flops;
    }
    m->set_routing_trace(nullptr);
    std::vector<float> a(logits.begin() + cached * V, logits.end()),
        b(whole.begin() + cached * V, whole.end());
    EXPECT_LT(rel_err(a, std::vector<double>(b.begin(), b.end())), 2e-2) << name;
    double want = 0;  // the absorbed pieces: 4 query positions each over the keys up to its last
    const int64_t dqk = c.kv_lora_rank + c.qk_rope_head_dim;
    for (int64_t off = 0; off < n - cached; off += Model::kAbsorbThreshold)
      want += 2.0 * static_cast<double>(Model::kAbsorbThreshold * H) *
              static_cast<double>(cached + off + Model::kAbsorbThreshold) *
              static_cast<double>(dqk + c.kv_lora_rank);
    EXPECT_EQ(suffix_flops, want * static_cast<double>(c.num_hidden_layers))
        << name << ": the suffix ran naive";
  }
}

TEST_F(ModelTest, BF16AndQ8MatchTheirReferences) {
  for (const char* name : {"tiny-bf16", "tiny-q8_0.gguf", "tiny-fp8", "tinyv2-f32"}) {
    auto m = load(name);
    ASSERT_TRUE(m);
    const auto tokens = prompt(*m, 24, 3);
    RoutingTrace trace;
    const auto fast = run(*m, tokens, RunMode::kPrefill, &trace);
    ReferenceOptions ro;
    ro.routing = &trace;
    // BF16 and FP8 models' prefill attention runs on AMX tiles with bf16 operands where the CPU
    // has them; the reference then rounds the same operands.
    ro.bf16_attention = amx_bf16_usable() && m->attention_in_bf16();
    auto ref = reference_forward(m->weights(), tokens, ro);
    ASSERT_TRUE(ref.ok()) << name;
    EXPECT_LE(ref->routing_disagreements * 10, ref->routing_decisions) << name;
    // The reference models each weight type's activation rounding, but the two runs' activations
    // differ slightly, so bf16/int8 rounding lands differently here and there: ~5e-3..1e-2.
    EXPECT_LT(rel_err(fast, ref->logits), 2e-2) << name;
  }
}

TEST_F(ModelTest, TwinCheckpointsGiveTheSameLogits) {
  std::vector<int32_t> tokens;
  {
    auto m = load("tiny-f32");
    ASSERT_TRUE(m);
    tokens = prompt(*m, 20, 4);
  }
  // Every twin replays the routing of the first checkpoint of its pair.
  auto compare = [&](const char* a_name, const char* b_name, double tol) {
    auto a = load(a_name);
    auto b = load(b_name);
    ASSERT_TRUE(a && b);
    RoutingTrace trace;
    const auto la = run(*a, tokens, RunMode::kPrefill, &trace);
    trace.replay = true;
    const auto lb = run(*b, tokens, RunMode::kPrefill, &trace);
    EXPECT_LT(rel_err(lb, la), tol) << b_name << " vs " << a_name;
  };
  compare("tiny-f32", "tiny-f32.gguf", 1e-4);             // HF f32 vs GGUF f32 (MLA flavour)
  compare("tiny-f32.gguf", "tiny-legacy-f32.gguf", 1e-4);  // legacy attn_kv_b vs attn_k_b/attn_v_b
  compare("tiny-bf16", "tiny-bf16.gguf", 3e-2);           // GGUF keeps the router in f32
  compare("tiny-f32", "tiny-bf16", 5e-2);                 // bf16 rounding of weights and activations
  compare("tiny-fp8twin-bf16", "tiny-fp8", 3e-2);         // twin: bf16(e4m3 x scale) vs e4m3 x scale
  compare("tiny-f32.gguf", "tiny-q8_0.gguf", 1e-1);       // 8-bit weights and activations
}

TEST_F(ModelTest, MtpMatchesTheReference) {
  auto m = load("tiny-f32");
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->has_mtp());
  const auto tokens = prompt(*m, 12, 5);
  const int64_t n = static_cast<int64_t>(tokens.size()), V = m->config().vocab_size, h = m->config().hidden_size;
  KvCacheOptions ko = m->kv_cache_options(MlaKvDType::kBF16, 0, 2);
  ko.capacity_bytes = static_cast<uint64_t>(4 * ko.format.page_bytes() * ko.n_layers);
  auto cache = KvCache::create(ko);
  ASSERT_TRUE(cache.ok());
  const SeqId seq = *(*cache)->add_sequence();
  ASSERT_TRUE((*cache)->append(seq, tokens).ok());
  std::vector<float> logits(static_cast<size_t>(n * V)), hidden(static_cast<size_t>(n * h));
  const SeqBatch b{seq, 0, n, false};
  ASSERT_TRUE(m->forward(std::span<const SeqBatch>(&b, 1), tokens, **cache, logits.data(), hidden.data()).ok());
  // MTP rows 0..n-2: (hidden_i, token_{i+1}).
  std::vector<float> mtp(static_cast<size_t>((n - 1) * V));
  const SeqBatch mb{seq, 0, n - 1, true};
  auto r = m->mtp_forward(std::span<const SeqBatch>(&mb, 1), std::span<const int32_t>(tokens).subspan(1), hidden.data(),
                          **cache, mtp.data());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ReferenceOptions ro;
  ro.with_mtp = true;
  auto ref = reference_forward(m->weights(), tokens, ro);
  ASSERT_TRUE(ref.ok());
  EXPECT_LT(rel_err(mtp, ref->mtp_logits), 2e-4);
  // Without logits (no drafts wanted) the MTP step writes the same cache entries, bit for bit.
  const int mtp_layer = static_cast<int>(m->config().num_hidden_layers);
  const int64_t kvw = m->config().kv_lora_rank + m->config().qk_rope_head_dim;
  std::vector<float> full(static_cast<size_t>((n - 1) * kvw)), only(full.size());
  ASSERT_TRUE((*cache)->read(seq, mtp_layer, 0, n - 1, full).ok());
  const SeqId seq2 = *(*cache)->add_sequence();
  ASSERT_TRUE((*cache)->append(seq2, tokens).ok());
  const SeqBatch b2{seq2, 0, n, false};
  ASSERT_TRUE(
      m->forward(std::span<const SeqBatch>(&b2, 1), tokens, **cache, logits.data(), hidden.data()).ok());
  const SeqBatch mb2{seq2, 0, n - 1, false};
  auto r2 = m->mtp_forward(std::span<const SeqBatch>(&mb2, 1), std::span<const int32_t>(tokens).subspan(1),
                           hidden.data(), **cache, nullptr);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->n_logit_rows, 0);
  ASSERT_TRUE((*cache)->read(seq2, mtp_layer, 0, n - 1, only).ok());
  EXPECT_EQ(only, full);
  EXPECT_GT(std::count_if(full.begin(), full.end(), [](float v) { return v != 0.0f; }), kvw);
}

TEST_F(ModelTest, FP8CacheStaysCloseToBF16) {
  auto m = load("tiny-bf16");
  ASSERT_TRUE(m);
  const auto tokens = prompt(*m, 30, 6);
  RoutingTrace trace;
  const auto a = run(*m, tokens, RunMode::kTokenByToken, &trace, MlaKvDType::kBF16);
  trace.replay = true;
  const auto b = run(*m, tokens, RunMode::kTokenByToken, &trace, MlaKvDType::kFP8);
  // e4m3 keeps 3 mantissa bits (up to 6% per latent value); attention averages most of it out.
  EXPECT_LT(rel_err(b, a), 0.15);
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  EXPECT_GT(dot / std::sqrt(na * nb), 0.995) << "cosine similarity of the logits";
}

TEST_F(ModelTest, RejectsBadCheckpointsAndInputsWithNamedErrors) {
  // A missing tensor.
  const std::string broken = dir() + "/broken";
  std::filesystem::remove_all(broken);
  std::filesystem::copy(path_of("tiny-bf16"), broken);
  {
    // Rewrite the index so one tensor points at nothing, and drop it from the shard list.
    std::string idx = *read_file(broken + "/model.safetensors.index.json");
    const std::string victim = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight";
    ASSERT_NE(idx.find(victim), std::string::npos);
    idx.replace(idx.find(victim), victim.size(), "model.layers.1.self_attn.kv_a_proj_with_mqa.weightX");
    ASSERT_TRUE(write_file_atomic(broken + "/model.safetensors.index.json", idx).ok());
  }
  ModelOptions mo;
  mo.progress = false;
  auto bad = Model::load(broken, mo);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kv_a_proj_with_mqa"), std::string::npos) << bad.status().message();
  // A config whose shapes disagree with the weights: the error names the tensor and both shapes.
  std::filesystem::remove_all(broken);
  std::filesystem::copy(path_of("tiny-bf16"), broken);
  std::string cfg = *read_file(broken + "/config.json");
  const std::string key = "\"kv_lora_rank\": 64";
  ASSERT_NE(cfg.find(key), std::string::npos);
  cfg.replace(cfg.find(key), key.size(), "\"kv_lora_rank\": 80");
  ASSERT_TRUE(write_file_atomic(broken + "/config.json", cfg).ok());
  bad = Model::load(broken, mo);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("has shape"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("expected"), std::string::npos);
  // Prompts past the context and ids past the vocabulary.
  auto m = load("tiny-bf16");
  ASSERT_TRUE(m);
  std::vector<int32_t> longp(600, 1);
  auto r = run_sequence_logits(*m, longp, RunMode::kPrefill);
  ASSERT_FALSE(r.ok());
  std::vector<int32_t> oov = {1, static_cast<int32_t>(m->config().vocab_size)};
  r = run_sequence_logits(*m, oov, RunMode::kPrefill);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos) << r.status().message();
  EXPECT_FALSE(Model::load(dir() + "/nope", mo).ok());
}

// ForwardStats counts each routed expert a forward call selected once per MoE layer (what a
// batched step must read), whatever number of tokens chose it: checked against the router's
// choices recorded by the routing trace.
TEST_F(ModelTest, StatsCountEachSelectedExpertOncePerLayer) {
  auto m = load("tiny-bf16");
  ASSERT_TRUE(m);
  const ModelConfig& c = m->config();
  const uint64_t seed = testing::UnitTest::GetInstance()->random_seed() + 11;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const std::vector<int32_t> tokens = prompt(*m, 24, seed);
  KvCacheOptions ko = m->kv_cache_options(MlaKvDType::kBF16, 0, 1);
  ko.capacity_bytes = static_cast<uint64_t>(4 * ko.format.page_bytes() * ko.n_layers);
  auto cache = KvCache::create(ko);
  ASSERT_TRUE(cache.ok());
  auto seq = (*cache)->add_sequence();
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE((*cache)->append(*seq, tokens).ok());
  RoutingTrace trace;
  m->set_routing_trace(&trace);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const SeqBatch b{*seq, 0, static_cast<int64_t>(tokens.size()), false};
  auto r = m->forward(std::span<const SeqBatch>(&b, 1), tokens, **cache, logits.data());
  m->set_routing_trace(nullptr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::map<int64_t, std::set<int32_t>> used;  // layer -> distinct experts
  for (const auto& [key, ids] : trace.ids) used[key.first].insert(ids.begin(), ids.end());
  double expected = 0;
  for (const auto& [layer, experts] : used) expected += static_cast<double>(experts.size());
  ASSERT_EQ(static_cast<int64_t>(used.size()), c.num_hidden_layers - c.first_k_dense_replace);
  EXPECT_EQ(r->stats.experts_read, expected);
  const size_t k = static_cast<size_t>(c.num_experts_per_tok);
  const double choices = static_cast<double>(used.size() * tokens.size() * k);
  EXPECT_LT(expected, choices);  // tokens shared experts: counting per choice would be more
}

}  // namespace
}  // namespace fathom
