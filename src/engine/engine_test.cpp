// The engine against a plain greedy loop on the same model: batching, chunked prefill,
// preemption, prefix caching, speculative decoding, cancellation and stops must never change what
// a request generates (greedy), and must never lose a request.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "base/ab.h"
#include "base/fs.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

std::string model_dir() { return testing::TempDir() + "/engine_test/dense-mtp"; }

// A dense V3-style model (no routed experts): what these tests check is the engine — scheduling,
// pages, prefix reuse, speculation — and a dense model's greedy choices do not hinge on router
// near-ties, which random MoE weights are full of (one flipped expert moves logits by whole units).
constexpr const char* kDenseConfig = R"({"model_type": "deepseek_v3", "vocab_size": 4096, "hidden_size": 256,
  "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8,
  "n_routed_experts": 0, "n_shared_experts": 0, "kv_lora_rank": 64, "q_lora_rank": 128, "qk_rope_head_dim": 32,
  "v_head_dim": 32, "qk_nope_head_dim": 32, "first_k_dense_replace": 3, "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-06, "rope_theta": 10000, "hidden_act": "silu"})";

class EngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(testing::TempDir() + "/engine_test");
    const int lock = open((testing::TempDir() + "/engine_test/.lock").c_str(), O_CREAT | O_RDWR, 0644);
    ASSERT_GE(lock, 0);
    ASSERT_EQ(flock(lock, LOCK_EX), 0);
    if (!path_exists(model_dir() + ".done")) {
      const std::string cfg = testing::TempDir() + "/engine_test/dense-config.json";
      ASSERT_TRUE(write_file_atomic(cfg, kDenseConfig).ok());
      SynthOptions o;
      o.config_path = cfg;
      o.dtype = DType::kBF16;
      o.out = model_dir();
      o.seed = 9;
      o.mtp = true;
      o.progress = false;
      ASSERT_TRUE(synthesize(o).ok());
      ASSERT_TRUE(write_file_atomic(model_dir() + ".done", "").ok());
    }
    flock(lock, LOCK_UN);
    close(lock);
  }

  std::unique_ptr<Model> load() {
    ModelOptions mo;
    mo.progress = false;
    mo.max_batch_tokens = 160;
    mo.max_sequences = 9;
    mo.max_context = 1024;
    auto m = Model::load(model_dir(), mo);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // The oracle: every token the engine emitted must be a greedy choice of the model given the
  // prompt and the tokens before it, recomputed in one prefill. Different numerics paths
  // (batched or solo, decode or prefill, recomputed after preemption) differ by ~1e-2 in the
  // logits and random weights have near-ties, so "greedy" means within `eps` of the best logit;
  // a corrupt cache, a wrong position or a lost token breaks it by whole units.
  static int greedy_violations(Model& m, std::vector<int32_t> prompt, const std::vector<int32_t>& out, float eps = 0.05f) {
    if (out.empty()) return 0;
    const size_t p = prompt.size();
    prompt.insert(prompt.end(), out.begin(), out.end() - 1);
    auto logits = run_sequence_logits(m, prompt, RunMode::kPrefill);
    EXPECT_TRUE(logits.ok());
    if (!logits.ok()) return 1 << 20;
    const int64_t V = m.config().vocab_size;
    int bad = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const float* row = logits->data() + static_cast<int64_t>(p - 1 + i) * V;
      const float best = *std::max_element(row, row + V);
      if (row[out[i]] < best - eps) ++bad;
    }
    return bad;
  }

  static std::vector<int32_t> prompt(int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = static_cast<int32_t>(3 + rng.below(3000));
    return p;
  }

  struct Outcome {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason finish = FinishReason::kNone;
    Usage usage;
  };

  static Outcome drain(const std::shared_ptr<RequestStream>& s) {
    Outcome o;
    while (true) {
      auto ev = s->next(60000);
      EXPECT_TRUE(ev.has_value()) << "no event for 60 s";
      if (!ev) return o;
      o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
      o.text += ev->text;
      if (ev->finish != FinishReason::kNone) {
        o.finish = ev->finish;
        o.usage = ev->usage;
        return o;
      }
    }
  }

  // Every step the engine reports (EngineOptions::on_step runs on the engine thread).
  struct StepLog {
    std::mutex mu;
    std::vector<EngineStepReport> steps;
    // Four sequences, no prefix cache and no speculation, reporting into this log.
    EngineOptions options(int64_t prefill_chunk) {
      EngineOptions eo;
      eo.max_running = 4;
      eo.prefill_chunk = prefill_chunk;
      eo.prefix_cache = false;
      eo.speculative = false;
      eo.on_step = [this](const EngineStepReport& r) {
        std::lock_guard lock(mu);
        steps.push_back(r);
      };
      return eo;
    }
    std::vector<EngineStepReport> snapshot() {
      std::lock_guard lock(mu);
      return steps;
    }
  };

  // Four sequences, 64-token prefill chunks, 8 MiB of cache.
  static EngineOptions small_engine(bool speculative) {
    EngineOptions eo;
    eo.max_running = 4;
    eo.prefill_chunk = 64;
    eo.kv_cache_bytes = 8 << 20;
    eo.speculative = speculative;
    return eo;
  }

  static GenerationRequest greedy_request(std::vector<int32_t> p, int64_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(p);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }
};

TEST_F(EngineTest, ConcurrentRequestsUnderPreemptionMatchSoloGreedyRuns) {
  auto m = load();
  ASSERT_TRUE(m);
  EngineOptions eo;
  eo.max_running = 8;
  eo.prefill_chunk = 64;
  // Room for 14 pages of 64 tokens over all layers: 8 sequences of ~150 tokens must preempt.
  const KvCacheOptions ko = m->kv_cache_options(MlaKvDType::kBF16, 0, 1);
  eo.kv_cache_bytes = static_cast<uint64_t>(ko.format.page_bytes()) * static_cast<uint64_t>(ko.n_layers) * 14;
  auto created = Engine::create(*m, eo);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::unique_ptr<Engine> engine = std::move(created).value();
  Rng rng(77);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(greedy_request(prompt(20 + static_cast<int>(rng.below(100)), 100 + i), 40 + static_cast<int64_t>(rng.below(60))));
    auto s = engine->submit(reqs.back());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  std::vector<Outcome> got;
  for (auto& s : streams) got.push_back(drain(s));
  const EngineMetrics em = engine->metrics();
  EXPECT_GT(em.preemptions, 0) << "the cache was meant to be too small for everyone at once";
  engine.reset();  // the engine thread must be gone before the reference runs use the model
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << i;
    EXPECT_EQ(greedy_violations(*m, reqs[i].prompt, got[i].tokens), 0) << "request " << i;
    EXPECT_EQ(got[i].usage.completion_tokens, reqs[i].max_tokens);
  }
}

TEST_F(EngineTest, SpeculativeDecodingDoesNotChangeGreedyOutput) {
  auto m = load();
  ASSERT_TRUE(m && m->has_mtp());
  const auto p = prompt(40, 5);
  std::vector<int32_t> outs[2];
  for (int spec = 0; spec < 2; ++spec) {
    auto engine = Engine::create(*m, small_engine(spec == 1));
    ASSERT_TRUE(engine.ok());
    outs[spec] = drain(*(*engine)->submit(greedy_request(p, 40))).tokens;
    if (spec) {
      const EngineMetrics em = (*engine)->metrics();
      EXPECT_GT(em.spec_drafted, 10);
    }
  }
  EXPECT_EQ(outs[0].size(), 40u);
  EXPECT_EQ(outs[1].size(), 40u);
  EXPECT_EQ(greedy_violations(*m, p, outs[0]), 0) << "without speculation";
  EXPECT_EQ(greedy_violations(*m, p, outs[1]), 0) << "with speculation";
}

// Adaptive speculation switches drafting off and on between steps (SpecController: both ways are
// tried first, then probed): outputs stay exactly the greedy ones, and with drafts off the MTP
// layer still runs (its cache, no head).
TEST_F(EngineTest, AdaptiveSpeculationTriesBothWaysAndKeepsGreedyOutput) {
  auto m = load();
  ASSERT_TRUE(m && m->has_mtp());
  const auto p = prompt(30, 9);
  EngineOptions eo = small_engine(true);
  eo.speculative_adaptive = true;
  std::mutex mu;
  int64_t verify_steps = 0, plain_steps = 0, mtp_steps = 0, decode_steps = 0;
  eo.on_step = [&](const EngineStepReport& r) {
    std::lock_guard lock(mu);
    if (r.n_prefill_tokens > 0) return;
    ++decode_steps;
    (r.n_decode_tokens == 2 ? verify_steps : plain_steps) += 1;
    mtp_steps += r.mtp_seconds > 0 ? 1 : 0;
  };
  auto engine = Engine::create(*m, eo);
  ASSERT_TRUE(engine.ok());
  const Outcome got = drain(*(*engine)->submit(greedy_request(p, 160)));
  const EngineMetrics em = (*engine)->metrics();
  engine->reset();
  EXPECT_EQ(got.tokens.size(), 160u);
  EXPECT_EQ(greedy_violations(*m, p, got.tokens), 0);
  EXPECT_GE(em.spec_drafted, 2) << "drafting is tried first";
  EXPECT_GT(verify_steps, 0);
  // (always drafting leaves one: the last step, with no room for a draft's bonus token)
  EXPECT_GE(plain_steps, 3) << "steps without drafts are tried once drafting was measured";
  // (not after the last token: the finished sequence needs no cache entry)
  EXPECT_EQ(mtp_steps, decode_steps - 1) << "the MTP layer runs every step, drafting or not";
}

// ToolNameSelection::kWhole: the reply to a prompt ending with <｜tool▁sep｜> starts with the offered
// name whose call head (the tokens of "NAME\n```json\n{\"KEY" as the tokenizer spells them) has the
// highest score — the name's log-probability plus tool_head_weight times the rest's — recomputed
// here in one prefill per name; with no pages for the scoring forks it still writes an offered name
// (token by token).
class WholeNameTest : public EngineTest {
 protected:
  // A call's head as the engine scores it: the tokens of "NAME\n```json\n{\"KEY" (KEY the first
  // parameter; without one the head ends at "{"); the name's run through the token holding its "\n".
  struct Head {
    std::vector<int32_t> tokens;
    size_t n_name = 0;
  };
  static Head spell(const Tokenizer& tok, const std::string& name, const std::string& key) {
    const std::string head = name + "\n```json\n{" + (key.empty() ? "" : "\"" + key);
    auto ids = tok.encode(head + "\":");
    EXPECT_TRUE(ids.ok());
    Head h;
    std::string bytes;
    for (int32_t id : *ids) {
      const std::string b = *tok.token_bytes(id);
      if (bytes.size() + b.size() > head.size()) break;
      bytes += b;
      h.tokens.push_back(id);
      if (h.n_name == 0 && bytes.size() > name.size()) h.n_name = h.tokens.size();
    }
    EXPECT_EQ(bytes.substr(0, name.size() + 1), name + "\n");
    return h;
  }

  // Per name, the log-probabilities of its head's name tokens (through "\n") and of the rest.
  struct HeadLogProbs {
    double name = 0, rest = 0;
    double score(double weight) const { return name + weight * rest; }
  };
  static std::vector<HeadLogProbs> head_logprobs(Model& m, const std::vector<int32_t>& prompt,
                                                 const std::vector<std::string>& names,
                                                 const std::vector<std::string>& keys) {
    const int64_t V = m.config().vocab_size;
    std::vector<HeadLogProbs> out;
    for (size_t i = 0; i < names.size(); ++i) {
      const Head h = spell(m.tokenizer(), names[i], keys[i]);
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), h.tokens.begin(), h.tokens.end() - 1);
      auto logits = run_sequence_logits(m, seq, RunMode::kPrefill);
      EXPECT_TRUE(logits.ok());
      HeadLogProbs lp;
      for (size_t j = 0; j < h.tokens.size(); ++j) {
        const float* row = logits->data() + static_cast<int64_t>(prompt.size() - 1 + j) * V;
        (j < h.n_name ? lp.name : lp.rest) +=
            static_cast<double>(row[h.tokens[j]]) - log_sum_exp(row, static_cast<size_t>(V));
      }
      out.push_back(lp);
    }
    return out;
  }

  static GenerationRequest name_request(std::vector<int32_t> p, const std::vector<std::string>& names,
                                        ToolNameSelection sel, const std::vector<std::string>& keys = {},
                                        double head_weight = kDefaultToolHeadWeight) {
    GenerationRequest r = greedy_request(std::move(p), 10);
    r.tool_head_weight = head_weight;
    r.tool_names = names;
    for (const std::string& k : keys) {  // one parameter each, or none
      r.tool_schemas.push_back(
          k.empty() ? ToolArgsSchema{}
                    : *ToolArgsSchema::from_json_schema(R"({"properties": {")" + k + R"(": {}, "zz": {}}})"));
    }
    r.tool_name_first = true;
    r.tool_name_selection = sel;
    return r;
  }

  // The offered name the output starts with ("" if none).
  static std::string name_written(const Tokenizer& tok, const std::vector<int32_t>& out,
                                  const std::vector<std::string>& names) {
    std::string bytes;
    for (int32_t id : out) bytes += tok.token_bytes(id).value_or("");
    const size_t nl = bytes.find('\n');
    if (nl == std::string::npos) return "";
    const std::string name = bytes.substr(0, nl);
    return std::find(names.begin(), names.end(), name) != names.end() ? name : "";
  }
};

TEST_F(WholeNameTest, TheReplyStartsWithTheLikeliestWholeName) {
  auto m = load();
  ASSERT_TRUE(m);
  const int32_t sep = m->tokenizer().chat_tokens().tool_sep;
  ASSERT_TRUE(sep >= 0 && sep < m->config().vocab_size);
  const std::vector<std::string> names = {"get_weather", "getWeatherNow", "files_read_text", "query", "x9"};
  const std::vector<std::string> keys = {"city", "city", "path", "", "sql_text"};  // first parameters
  // The head's joint log-probability (weight 1) and the default weighting; their choices differ on
  // some prompts, so each request must follow its own weight.
  const double weights[2] = {1.0, kDefaultToolHeadWeight};
  int differs = 0;         // prompts where token-by-token selection wrote another name
  int weights_differ = 0;  // prompts where the two weights' best heads are different tools
  for (int spec = 0; spec < 2; ++spec) {
    auto engine = Engine::create(*m, small_engine(spec == 1));
    ASSERT_TRUE(engine.ok());
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      std::vector<int32_t> p = prompt(20 + static_cast<int>(seed) * 13, 100 + seed);
      p.push_back(sep);
      // All at once, so the scoring forks run beside other sequences' decode steps.
      auto whole1 = (*engine)->submit(name_request(p, names, ToolNameSelection::kWhole, keys, weights[0]));
      auto whole2 = (*engine)->submit(name_request(p, names, ToolNameSelection::kWhole, keys, weights[1]));
      auto tokens = (*engine)->submit(name_request(p, names, ToolNameSelection::kTokens));
      auto plain = (*engine)->submit(greedy_request(prompt(50, seed), 20));
      ASSERT_TRUE(whole1.ok() && whole2.ok() && tokens.ok() && plain.ok());
      const Outcome w[2] = {drain(*whole1), drain(*whole2)};
      const Outcome t = drain(*tokens);
      (void)drain(*plain);
      const std::vector<HeadLogProbs> lp = head_logprobs(*m, p, names, keys);
      std::string got[2];
      size_t best[2];
      std::vector<double> sc_of[2];
      for (int k = 0; k < 2; ++k) {
        std::vector<double>& sc = sc_of[k];
        for (const HeadLogProbs& x : lp) sc.push_back(x.score(weights[k]));
        got[k] = name_written(m->tokenizer(), w[k].tokens, names);
        ASSERT_FALSE(got[k].empty()) << "no offered name in the output, prompt " << seed << ", weight "
                                     << weights[k];
        best[k] = static_cast<size_t>(std::max_element(sc.begin(), sc.end()) - sc.begin());
        const size_t at = static_cast<size_t>(std::find(names.begin(), names.end(), got[k]) - names.begin());
        // Batched and solo numerics differ by ~1e-2 per logit: a near-tie may go either way.
        EXPECT_GE(sc[at], sc[best[k]] - 0.1 * weights[k])
            << "prompt " << seed << ", weight " << weights[k] << " chose " << got[k] << " (" << sc[at]
            << "), best " << names[best[k]] << " (" << sc[best[k]] << ")";
        const Head h = spell(m->tokenizer(), got[k], keys[at]);  // the name is emitted as the head spells it
        EXPECT_EQ(
            std::vector<int32_t>(w[k].tokens.begin(), w[k].tokens.begin() + static_cast<int64_t>(h.n_name)),
            std::vector<int32_t>(h.tokens.begin(), h.tokens.begin() + static_cast<int64_t>(h.n_name)));
        EXPECT_EQ(w[k].tokens.size(), 10u);
      }
      // Clearly different (each weight's best ahead of the other's by more than the numerics'
      // slack): the two requests must then write different names.
      if (best[0] != best[1] && sc_of[0][best[0]] - sc_of[0][best[1]] > 0.1 * weights[0] &&
          sc_of[1][best[1]] - sc_of[1][best[0]] > 0.1 * weights[1]) {
        ++weights_differ;
        EXPECT_NE(got[0], got[1]) << "prompt " << seed << ": both weights wrote " << got[0];
      }
      const std::string by_tokens = name_written(m->tokenizer(), t.tokens, names);
      EXPECT_FALSE(by_tokens.empty()) << "token by token, prompt " << seed;
      if (by_tokens != got[1]) ++differs;
    }
    EngineMetrics em;
    for (int i = 0; i < 100; ++i) {  // metrics are published at the end of the step
      em = (*engine)->metrics();
      if (em.tool_names_scored + em.tool_names_unscored >= 12) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(em.tool_names_scored, 12);
    EXPECT_EQ(em.tool_names_unscored, 0);
  }
  std::printf(
      "token-by-token selection wrote another name on %d of 12 prompts; head weights %g and %g chose "
      "different names on %d\n",
      differs, weights[0], weights[1], weights_differ);
  EXPECT_GT(differs, 0) << "the two selections never differ: is whole-name scoring on?";
  EXPECT_GT(weights_differ, 0) << "the weights never change the choice here: the test cannot tell them apart";
}

TEST_F(WholeNameTest, AHeadWeightThatIsNotFiniteAndNonNegativeIsRefused) {
  auto m = load();
  ASSERT_TRUE(m);
  auto engine = Engine::create(*m, small_engine(false));
  ASSERT_TRUE(engine.ok());
  for (double w : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto r = (*engine)->submit(name_request(prompt(10, 1), {"a", "b"}, ToolNameSelection::kWhole, {}, w));
    ASSERT_FALSE(r.ok()) << w;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("tool head weight"), std::string::npos) << r.status().message();
  }
}

TEST_F(WholeNameTest, WithoutPagesForTheForksTheNameIsChosenTokenByToken) {
  auto m = load();
  ASSERT_TRUE(m);
  const int32_t sep = m->tokenizer().chat_tokens().tool_sep;
  // Three pages: two for the 101-token prompt and the 10 tokens after it, one that the first fork
  // takes to copy the shared last page into; the second fork finds none.
  const KvCacheOptions ko = m->kv_cache_options(MlaKvDType::kBF16, 0, 1);
  const uint64_t page_bytes = static_cast<uint64_t>(ko.format.page_bytes()) * m->config().num_hidden_layers;
  EngineOptions eo;
  eo.max_running = 2;
  eo.prefill_chunk = 64;
  eo.speculative = false;
  eo.kv_cache_bytes = 3 * page_bytes;  // speculation off: no MTP layer in the cache
  auto engine = Engine::create(*m, eo);
  ASSERT_TRUE(engine.ok());
  std::vector<int32_t> p = prompt(100, 7);
  p.push_back(sep);
  const std::vector<std::string> names = {"alpha_beta", "gamma", "deltaEpsilon"};
  GenerationRequest r = name_request(p, names, ToolNameSelection::kWhole);
  r.max_tokens = 24;  // random weights under the mask may spell a name a byte at a time
  const Outcome o = drain(*(*engine)->submit(std::move(r)));
  EXPECT_FALSE(name_written(m->tokenizer(), o.tokens, names).empty()) << o.text;
  EXPECT_EQ(o.finish, FinishReason::kLength);
  EngineMetrics em;
  for (int i = 0; i < 100; ++i) {  // metrics are published at the end of the step
    em = (*engine)->metrics();
    if (em.kv.pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(em.kv.pages_used, 0) << "a fork kept its page";
  EXPECT_EQ(em.kv.pages_total, 3);
  EXPECT_EQ(em.tool_names_unscored, 1);
  EXPECT_EQ(em.tool_names_scored, 0);
}

TEST_F(EngineTest, PrefixCacheSkipsSharedPagesAndKeepsOutputs) {
  auto m = load();
  ASSERT_TRUE(m && m->has_mtp());
  // With speculation off too: an MTP checkpoint's unused MTP layer must not keep pages from
  // being published.
  for (bool spec : {true, false}) {
    SCOPED_TRACE(spec ? "speculative" : "no speculation");
    EngineOptions eo;
    eo.max_running = 4;
    eo.prefill_chunk = 64;
    eo.kv_cache_bytes = 8 << 20;
    eo.speculative = spec;
    auto engine = Engine::create(*m, eo);
    ASSERT_TRUE(engine.ok());
    const auto shared = prompt(200, 6);
    auto a_prompt = shared, b_prompt = shared;
    a_prompt.push_back(11);
    b_prompt.push_back(12);
    const Outcome a = drain(*(*engine)->submit(greedy_request(a_prompt, 6)));
    const Outcome b = drain(*(*engine)->submit(greedy_request(b_prompt, 6)));
    engine = internal_error("stopped");  // the engine thread must be gone before the reference runs
    EXPECT_EQ(a.usage.cached_tokens, 0);
    EXPECT_EQ(b.usage.cached_tokens, 192);  // three full pages of the shared 200 tokens
    EXPECT_EQ(greedy_violations(*m, b_prompt, b.tokens), 0);
  }
}

TEST_F(EngineTest, CancelledRequestsFreeTheirPages) {
  auto m = load();
  ASSERT_TRUE(m);
  EngineOptions eo;
  eo.max_running = 4;
  eo.kv_cache_bytes = 8 << 20;
  auto engine = Engine::create(*m, eo);
  ASSERT_TRUE(engine.ok());
  auto s = *(*engine)->submit(greedy_request(prompt(100, 8), 900));
  auto first = s->next(60000);
  ASSERT_TRUE(first.has_value());
  s->cancel();
  const Outcome rest = drain(s);
  EXPECT_EQ(rest.finish, FinishReason::kCancelled);
  EngineMetrics em;
  for (int i = 0; i < 100; ++i) {
    em = (*engine)->metrics();
    if (em.kv.pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(em.kv.pages_used, 0);
  EXPECT_EQ(em.requests_cancelled, 1);
}

TEST_F(EngineTest, StopStringsCutTheOutputAndSeedsReproduce) {
  auto m = load();
  ASSERT_TRUE(m);
  EngineOptions eo;
  eo.max_running = 8;
  eo.kv_cache_bytes = 8 << 20;
  auto engine = Engine::create(*m, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  GenerationRequest r = greedy_request(prompt(30, 9), 40);
  r.sampling.temperature = 0.9f;
  r.sampling.seed = 1234;
  const Outcome full = drain(*(*engine)->submit(r));
  const Outcome again = drain(*(*engine)->submit(r));
  EXPECT_EQ(full.tokens, again.tokens) << "same seed, same tokens";
  ASSERT_GT(full.text.size(), 12u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  r.stop = {stop};
  const Outcome cut = drain(*(*engine)->submit(r));
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
}

TEST_F(EngineTest, RejectsWhatCannotRun) {
  auto m = load();
  ASSERT_TRUE(m);
  EngineOptions eo;
  eo.max_running = 8;
  eo.kv_cache_bytes = 256 << 10;  // five pages of 64 tokens
  eo.max_waiting = 2;
  auto engine = Engine::create(*m, eo);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->submit(greedy_request(prompt(1024, 1), 4)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*engine)->submit(greedy_request(prompt(500, 1), 4)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*engine)->submit(greedy_request({}, 4)).status().code(), StatusCode::kInvalidArgument);
  GenerationRequest bad = greedy_request(prompt(5, 1), 4);
  bad.sampling.top_p = 0;
  EXPECT_EQ((*engine)->submit(bad).status().code(), StatusCode::kInvalidArgument);
}

// The step observer (what `fathom bench serve` builds its roofline from) accounts for every
// token: prompt tokens as prefill, every output token but each request's first (which comes from
// its last prefill chunk) as decode; and the reported forward figures are those of the batch.
TEST_F(EngineTest, StepReportsAccountForEveryPromptAndDecodeToken) {
  auto m = load();
  ASSERT_TRUE(m);
  StepLog log;
  auto engine = Engine::create(*m, log.options(48));
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Rng rng(4242);
  int64_t prompt_total = 0, gen_total = 0;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    const int n = 10 + static_cast<int>(rng.below(90));
    const int64_t gen = 3 + static_cast<int64_t>(rng.below(12));
    prompt_total += n;
    gen_total += gen;
    auto s = (*engine)->submit(greedy_request(prompt(n, 500 + i), gen));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (auto& s : streams) EXPECT_EQ(drain(s).finish, FinishReason::kLength);
  engine->reset();  // joins the engine thread: every step has been reported
  int64_t prefill = 0, decode = 0;
  for (const EngineStepReport& r : log.snapshot()) {
    prefill += r.n_prefill_tokens;
    decode += r.n_decode_tokens;
    EXPECT_GE(r.n_seqs, 1);
    EXPECT_LE(r.n_seqs, 4);
    EXPECT_LE(r.n_decode_tokens, r.n_seqs);  // one token per decoding sequence without drafts
    EXPECT_GT(r.forward.weight_bytes, 0);
    EXPECT_GT(r.forward.linear_flops, 0);
    EXPECT_GE(r.step_seconds, r.forward_seconds);
    EXPECT_EQ(r.mtp_seconds, 0);
    EXPECT_EQ(r.forward.experts_read, 0);  // a dense model
  }
  EXPECT_EQ(prefill, prompt_total);
  EXPECT_EQ(decode, gen_total - static_cast<int64_t>(streams.size()));
}

// Chunked prefill: a prompt with nobody decoding goes in prefill_chunk_idle chunks (the weights,
// a MoE model's experts above all, are read fewer times per prompt); while a stream decodes, its
// next token waits for each step, so the chunks stay at prefill_chunk. 0 turns the idle size off.
TEST_F(EngineTest, PrefillChunksGrowOnlyWhileNoStreamIsDecoding) {
  auto m = load();  // max_batch_tokens 160
  ASSERT_TRUE(m);
  for (const int64_t idle : {int64_t{64}, int64_t{0}}) {
    StepLog log;
    EngineOptions eo = log.options(16);
    eo.prefill_chunk_idle = idle;
    auto engine = Engine::create(*m, eo);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    // Alone: 150 prompt tokens in chunks of 64, 64, 22 (or ten of 16 and a 6).
    auto a = (*engine)->submit(greedy_request(prompt(150, 71), 600));
    ASSERT_TRUE(a.ok());
    auto first = (*a)->next(60000);  // A has its first token: it is decoding from now on
    ASSERT_TRUE(first.has_value());
    std::vector<int64_t> alone;  // A's prefill steps (the last one may report after its token)
    for (int wait = 0; wait < 6000; ++wait) {
      const std::vector<EngineStepReport> steps = log.snapshot();
      alone.clear();
      int64_t sum = 0;
      for (size_t i = 0; i < steps.size() && sum < 150; ++i) {
        alone.push_back(steps[i].n_prefill_tokens);
        sum += steps[i].n_prefill_tokens;
      }
      if (sum >= 150) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::vector<int64_t> want_alone = idle == 64
                                                ? std::vector<int64_t>{64, 64, 22}
                                                : std::vector<int64_t>{16, 16, 16, 16, 16, 16, 16, 16, 16, 6};
    EXPECT_EQ(alone, want_alone) << "idle " << idle;
    // B's prompt while A decodes: every step that carries A's token carries at most 16 of B's.
    auto b = (*engine)->submit(greedy_request(prompt(100, 72), 3));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(drain(*b).finish, FinishReason::kLength);
    (*a)->cancel();  // A was still decoding (600 tokens): it has done its part
    const FinishReason fa = drain(*a).finish;
    EXPECT_TRUE(fa == FinishReason::kCancelled || fa == FinishReason::kLength);
    engine->reset();
    int64_t with_decode = 0, prefill_total = 0;
    for (const EngineStepReport& r : log.snapshot()) {
      prefill_total += r.n_prefill_tokens;
      if (r.n_decode_tokens > 0 && r.n_prefill_tokens > 0) {
        ++with_decode;
        EXPECT_LE(r.n_prefill_tokens, 16) << "idle " << idle;
      }
    }
    EXPECT_GT(with_decode, 0) << "B's prefill never ran beside A's decoding";
    EXPECT_EQ(prefill_total, 250);
  }
  EngineOptions bad;
  bad.prefill_chunk_idle = -1;
  EXPECT_EQ(Engine::create(*m, bad).status().code(), StatusCode::kInvalidArgument);
}

// `bench serve --ab`: with ab_alternate the engine runs its steps on base/ab.h variants 0 and 1 in
// turn (steps that ran nothing do not count) and reports each step's variant; without it the
// variant is left alone.
TEST_F(EngineTest, AbAlternateRunsStepsOnTheTwoVariantsInTurn) {
  auto m = load();
  ASSERT_TRUE(m);
  for (bool alternate : {true, false}) {
    std::mutex mu;
    std::vector<EngineStepReport> steps;
    EngineOptions eo;
    eo.max_running = 2;
    eo.prefix_cache = false;
    eo.speculative = false;
    eo.ab_alternate = alternate;
    eo.on_step = [&](const EngineStepReport& r) {
      std::lock_guard lock(mu);
      steps.push_back(r);
    };
    ab::set_variant(alternate ? 0 : 1);
    auto engine = Engine::create(*m, eo);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 3; ++i) {
      auto s = (*engine)->submit(greedy_request(prompt(20 + 7 * i, 900 + i), 5 + i));
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      streams.push_back(*s);
    }
    for (auto& s : streams) EXPECT_EQ(drain(s).finish, FinishReason::kLength);
    engine->reset();
    ASSERT_GE(steps.size(), 6u);
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_EQ(steps[i].ab_variant, alternate ? static_cast<int>(i % 2) : 1) << "step " << i;
  }
  ab::set_variant(0);
}

}  // namespace
}  // namespace fathom
