// Unit tests for Tokenizer: loading (and every malformed-file error), added tokens (lstrip,
// rstrip, single_word, normalized, untrusted), post-processing, decoding and its errors, the
// streaming decoder, the built-in tokenizer, the trainer and the VocabData round trip.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/rng.h"
#include "tokenizer/unicode.h"

namespace fathom {
namespace {

using nlohmann::json;

uint64_t fresh_seed() {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

json gpt2_pre_tokenizer() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
}

// A byte-level tokenizer.json: ids 0..255 are the bytes, then one token per merge (given as raw
// text), then the added tokens.
json make_json(const std::vector<std::pair<std::string, std::string>>& merges,
               const json& added = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const std::string la = tok::bytes_to_byte_level(a), lb = tok::bytes_to_byte_level(b);
    merge_list.push_back(la + " " + lb);
    if (!vocab.contains(la + lb)) vocab[la + lb] = next++;
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", gpt2_pre_tokenizer()},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
  return j;
}

json added_token(int id, const std::string& content, bool special, bool normalized, bool lstrip = false,
                 bool rstrip = false, bool single_word = false) {
  return {{"id", id},         {"content", content}, {"special", special},        {"normalized", normalized},
          {"lstrip", lstrip}, {"rstrip", rstrip},   {"single_word", single_word}};
}

std::unique_ptr<Tokenizer> load(const json& j, const json& config = nullptr) {
  auto t = Tokenizer::from_json(j.dump(), config.is_null() ? "" : config.dump());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<TokenId> bytes_of(std::string_view s) {
  std::vector<TokenId> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

std::vector<TokenId> cat(std::initializer_list<std::vector<TokenId>> parts) {
  std::vector<TokenId> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

TEST(Tokenizer, AddedTokensHonourLstripRstripSingleWordAndNormalized) {
  // Hugging Face's own example (added_vocabulary.rs, options_use_cases) with a Lowercase normalizer.
  json added =
      json::array({added_token(300, "my", false, true, true, true), added_token(301, "name", false, true),
                   added_token(302, "ony", false, true, false, false, true),
                   added_token(303, "[CLS]", true, false), added_token(304, "[SEP]", true, false)});
  json j = make_json({}, added);
  j["normalizer"] = {{"type", "Lowercase"}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  auto ids = tok->encode("[CLS] My name is Anthony [SEP]");
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  // " my " is one token (both spaces stripped into it); "ony" is not split out of "anthony".
  EXPECT_EQ(*ids, cat({{303, 300, 301}, bytes_of(" is anthony "), {304}}));
  // single_word: a standalone "ony" matches.
  EXPECT_EQ(*tok->encode("ony"), (std::vector<TokenId>{302}));
}

TEST(Tokenizer, UntrustedTextDoesNotMatchControlTokensButKeepsUserDefinedOnes) {
  json added =
      json::array({added_token(300, "<|ctl|>", true, false), added_token(301, "<｜User｜>", false, true),
                   added_token(302, "xyz", false, true)});
  auto tok = load(make_json({}, added));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->token_type(300), TokenType::kControl);
  EXPECT_EQ(tok->token_type(301), TokenType::kControl);  // not "special", but looks like a control marker
  EXPECT_EQ(tok->token_type(302), TokenType::kUserDefined);
  EXPECT_EQ(tok->token_type(65), TokenType::kNormal);
  EXPECT_EQ(tok->token_type(5000), TokenType::kUnused);
  const std::string text = "a<|ctl|>xyz<｜User｜>";
  EXPECT_EQ(*tok->encode(text), (std::vector<TokenId>{'a', 300, 302, 301}));
  EXPECT_EQ(*tok->encode(text, {.untrusted = true}),
            cat({bytes_of("a<|ctl|>"), {302}, bytes_of("<｜User｜>")}));
}

TEST(Tokenizer, PostProcessorTemplateAndConfigFlagsAddBosAndEos) {
  json added = json::array({added_token(300, "<s>", true, false), added_token(301, "</s>", true, false)});
  json j = make_json({}, added);
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {300}}}}, {"</s>", {{"id", "</s>"}, {"ids", {301}}}}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  EXPECT_EQ(*tok->encode("hi", {.add_special = true}), (std::vector<TokenId>{300, 'h', 'i', 301}));
  EXPECT_EQ(*tok->encode("hi"), (std::vector<TokenId>{'h', 'i'}));
  // tokenizer_config.json's add_bos_token/add_eos_token replace the template (as transformers does).
  json config = {{"bos_token", "<s>"},
                 {"eos_token", {{"content", "</s>"}}},
                 {"add_bos_token", true},
                 {"add_eos_token", false}};
  auto tok2 = load(j, config);
  ASSERT_TRUE(tok2);
  EXPECT_EQ(tok2->bos_id(), 300);
  EXPECT_EQ(tok2->eos_id(), 301);
  EXPECT_TRUE(tok2->add_bos());
  EXPECT_FALSE(tok2->add_eos());
  EXPECT_EQ(*tok2->encode("hi", {.add_special = true}), (std::vector<TokenId>{300, 'h', 'i'}));
}

TEST(Tokenizer, DecodeNamesIdsOutsideTheVocabularyAndSkipsSpecialOnRequest) {
  json added = json::array({added_token(300, "<s>", true, false)});
  auto tok = load(make_json({{"h", "i"}}, added));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 301);
  auto bad = tok->decode(std::vector<TokenId>{'a', 301});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("id 301 at position 1"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(tok->decode(std::vector<TokenId>{-1}).ok());
  EXPECT_EQ(*tok->decode(std::vector<TokenId>{300, 256}), "<s>hi");
  EXPECT_EQ(*tok->decode(std::vector<TokenId>{300, 256}, {.skip_special = true}), "hi");
  EXPECT_EQ(*tok->token_bytes(256), "hi");
  EXPECT_EQ(*tok->id_to_token(' '), "Ġ");
  EXPECT_EQ(tok->token_to_id("Ġ"), TokenId{' '});
  EXPECT_EQ(tok->token_to_id("<s>"), TokenId{300});
  EXPECT_FALSE(tok->token_to_id("nope").has_value());
  // Bytes that do not form UTF-8 decode to U+FFFD, as Hugging Face's decode does.
  EXPECT_EQ(*tok->decode(std::vector<TokenId>{0xE2, 0x82}), "\xEF\xBF\xBD");
}

// Every id of the tokenizer in random order and random lengths: streaming equals decode, and
// each streamed piece is complete UTF-8.
void expect_stream_equals_decode(const Tokenizer& tok, Rng& rng, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<TokenId> ids;
    const uint64_t n = rng.below(64);
    for (uint64_t i = 0; i < n; ++i) {
      TokenId id;
      do {
        id = static_cast<TokenId>(rng.below(static_cast<uint64_t>(tok.vocab_size())));
      } while (!tok.id_to_token(id).ok());
      ids.push_back(id);
    }
    StreamDecoder stream(tok);
    std::string streamed;
    for (TokenId id : ids) {
      std::string piece;
      ASSERT_TRUE(stream.push(id, &piece).ok());
      ASSERT_EQ(tok::utf8_valid_prefix(piece), piece.size()) << "streamed an incomplete character";
      streamed += piece;
    }
    std::string tail;
    stream.finish(&tail);
    streamed += tail;
    auto full = tok.decode(ids);
    ASSERT_TRUE(full.ok());
    ASSERT_EQ(streamed, *full) << "round " << round;
  }
}

TEST(StreamDecoder, EmitsOnlyCompleteUtf8AndEqualsDecode) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  Rng rng(fresh_seed());
  expect_stream_equals_decode(**tok, rng, 300);
  // An emoji split over byte tokens comes out whole, once complete.
  StreamDecoder s(**tok);
  std::string out;
  const std::string emoji = "\xF0\x9F\x99\x82";
  auto ids = (*tok)->encode(emoji);
  ASSERT_TRUE(ids.ok());
  for (size_t i = 0; i < ids->size(); ++i) {
    ASSERT_TRUE(s.push((*ids)[i], &out).ok());
    if (i + 1 < ids->size()) {
      EXPECT_TRUE(out.empty());
    }
  }
  EXPECT_EQ(out, emoji);
  EXPECT_FALSE(s.push(1 << 20, &out).ok());
}

TEST(StreamDecoder, EqualsDecodeWithMetaspaceByteFallbackDecoders) {
  // A Llama-2-style decoder chain over a vocabulary with <0xNN> byte tokens.
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
  for (const char* t : {"▁", "▁hello", "▁world", "h", "e", "l", "o", "w", "r", "d", "▁▁"}) vocab[t] = id++;
  json j = {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"byte_fallback", true}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  auto ids = tok->encode("hello world 🙂");
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*tok->decode(*ids), "hello world 🙂");
  Rng rng(fresh_seed());
  expect_stream_equals_decode(*tok, rng, 300);
}

struct BadCase {
  std::string what;
  std::function<void(json&)> mutate;
  std::string expect;
};

TEST(Tokenizer, MalformedTokenizerJsonGivesErrorsNamingTheProblem) {
  const std::vector<BadCase> cases = {
      {"missing model", [](json& j) { j.erase("model"); }, "missing 'model'"},
      {"unknown model type", [](json& j) { j["model"]["type"] = "Unigram"; },
       "model.type 'Unigram' is not supported"},
      {"unknown pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Fancy"}};
       },
       "pre_tokenizer.type 'Fancy' is not supported"},
      {"unknown nested pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Nope"}}})}};
       },
       "pre_tokenizer.pretokenizers[0].type 'Nope'"},
      {"unknown normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "BertNormalizer"}};
       },
       "normalizer.type 'BertNormalizer' is not supported"},
      {"unknown decoder",
       [](json& j) {
         j["decoder"] = {{"type", "CTC"}};
       },
       "decoder.type 'CTC'"},
      {"unknown post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "Weird"}};
       },
       "post_processor.type 'Weird'"},
      {"merge with an unknown token", [](json& j) { j["model"]["merges"].push_back("Ġ zzz"); },
       "token 'zzz' is not in the vocabulary"},
      {"merge not two tokens", [](json& j) { j["model"]["merges"].push_back("a b c"); }, "not two tokens"},
      {"bad regex",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}};
       },
       "pre_tokenizer.pattern.Regex"},
      {"bad behavior",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "a"}}}, {"behavior", "Sideways"}};
       },
       "behavior 'Sideways'"},
      {"vocab id not an integer", [](json& j) { j["model"]["vocab"]["Ġ"] = "x"; },
       "model.vocab['Ġ'] must be an integer"},
      {"vocab missing", [](json& j) { j["model"].erase("vocab"); }, "missing 'model.vocab'"},
      {"added token without content",
       [](json& j) {
         j["added_tokens"] = json::array({{{"id", 300}}});
       },
       "added_tokens[0].content"},
      {"added ids twice",
       [](json& j) {
         j["added_tokens"] =
             json::array({added_token(300, "<a>", true, false), added_token(300, "<b>", true, false)});
       },
       "id 300 is used twice"},
      {"not an object", [](json& j) { j = json::array(); }, "top level must be an object"},
      {"merge pair of one", [](json& j) { j["model"]["merges"] = json::array({json::array({"h"})}); },
       "model.merges[0] must be"},
      {"merges not an array", [](json& j) { j["model"]["merges"] = 5; }, "'model.merges' must be an array"},
      {"vocab id out of range", [](json& j) { j["model"]["vocab"]["Ġ"] = -4; }, "id -4 out of range"},
  };
  for (const BadCase& c : cases) {
    json j = make_json({{"h", "i"}});
    c.mutate(j);
    auto t = Tokenizer::from_json(j.dump());
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << t.status().to_string();
  }
  EXPECT_NE(Tokenizer::from_json("{not json").status().message().find("not valid JSON"), std::string::npos);
  auto bad_config = Tokenizer::from_json(make_json({}).dump(), R"({"bos_token": "<nope>"})");
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.status().message().find("bos_token '<nope>' is not in the vocabulary"),
            std::string::npos);
  auto missing = Tokenizer::from_files("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Tokenizer, ReadsMergesAsStringsOrPairs) {
  json strings = make_json({{"h", "i"}, {"hi", "!"}});
  json pairs = strings;
  json list = json::array();
  for (const json& m : strings["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    list.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  pairs["model"]["merges"] = list;
  auto a = load(strings), b = load(pairs);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a->encode("hi! hi!"), *b->encode("hi! hi!"));
  EXPECT_EQ(*a->encode("hi!"), (std::vector<TokenId>{256, '!'}));  // the regex splits "hi" from "!"
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  auto r = (*tok)->encode("ok\xC3(");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("invalid UTF-8 at byte offset 2"), std::string::npos)
      << r.status().message();
}

TEST(Tokenizer, EncodesTheSameFromManyThreadsAtOnce) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  Rng rng(fresh_seed());
  std::vector<std::string> texts;
  const char* parts[] = {"alpha ", "beta",  " gamma!",    "中文", "🙂",
                         "\n\n",   "12345", "<｜User｜>", "x_y",  "  "};
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (uint64_t i = 1 + rng.below(20); i > 0; --i) s += parts[rng.below(std::size(parts))];
    texts.push_back(s);
  }
  std::vector<std::vector<TokenId>> want;
  for (const auto& t : texts) want.push_back((*tok)->encode(t).value());
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 7 + static_cast<size_t>(th)) % texts.size();
          auto ids = (*tok)->encode(texts[k]);
          if (!ids.ok() || *ids != want[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT((*tok)->stats().cache_hits, 0);
}

TEST(Builtin, CarriesDeepSeekV3TokensPreTokenizerAndChatTemplate) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 4096);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(t.eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.chat_template(), deepseek_v3_chat_template());
  const ChatTokenIds& c = t.chat_tokens();
  for (TokenId id : {c.user, c.assistant, c.tool_calls_begin, c.tool_calls_end, c.tool_call_begin,
                     c.tool_call_end, c.tool_sep, c.tool_outputs_begin, c.tool_outputs_end,
                     c.tool_output_begin, c.tool_output_end, c.eot}) {
    EXPECT_NE(id, kNoToken);
    EXPECT_EQ(t.token_type(id), TokenType::kControl);
  }
  EXPECT_EQ(*t.encode("<｜User｜>Hi<｜Assistant｜>", {.add_special = true}).value().begin(), 0);
  auto data = t.vocab_data();
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->pre, "deepseek-v3");
  const std::string text = "The model routes each token to 8 experts. 深度求索 🙂 x=42;";
  auto ids = t.encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size(), text.size() / 2);  // it has learned merges
  EXPECT_EQ(*t.decode(*ids), text);
  EXPECT_EQ(&builtin_tokenizer_json(), &builtin_tokenizer_json());  // trained once per process
}

TEST(Trainer, IsDeterministicAndRespectsVocabSizeAndMinFrequency) {
  const std::string text = "low lower lowest newer newest wider widest low low lower newer\n";
  BpeTrainParams p;
  p.vocab_size = 256 + 18 + 10;
  auto a = train_bpe({text, text}, p);
  auto b = train_bpe({text, text}, p);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(a->tokenizer_json, b->tokenizer_json);
  EXPECT_EQ(a->n_merges, 10);
  auto tok = Tokenizer::from_json(a->tokenizer_json, a->tokenizer_config_json);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->vocab_size(), p.vocab_size);
  EXPECT_EQ(*(*tok)->decode((*tok)->encode(text).value()), text);
  EXPECT_LT((*tok)->encode(" lowest").value().size(), 7u);
  p.vocab_size = 100000;
  p.min_frequency = 1000;  // nothing is that frequent
  auto c = train_bpe({text}, p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->n_merges, 0);
  p.vocab_size = 10;
  EXPECT_FALSE(train_bpe({text}, p).ok());
  p.vocab_size = 1000;
  EXPECT_NE(train_bpe({"ok", "bad\xFF"}, p).status().message().find("text 1"), std::string::npos);
  BpeTrainParams q;
  q.vocab_size = 300;
  q.special_tokens = {"ab", "<eos>", "<pad>"};  // "ab" gets learned from the text itself
  auto clash = train_bpe({"ab ab ab ab ab ab"}, q);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("special token 'ab' was also learned"), std::string::npos);
  p.pre = "no-such-pre";
  EXPECT_EQ(train_bpe({text}, p).status().code(), StatusCode::kUnimplemented);
}

// fathom-isolated: a value is the same tokens after a space in a request as inside a tool call's
// JSON string, for made-up names the merges never saw whole; DeepSeek-V3's pre-tokenizer, trained
// on the same text, spells most of them differently there. The preset survives tokenizer.json and
// GGUF (VocabData) round trips, marked as not llama.cpp's.
TEST(Trainer, IsolatedPreTokenizerSpellsAValueTheSameInARequestAndInACall) {
  Rng rng(fresh_seed());
  const char* parts[] = {"lo", "ne", "ta", "ri", "ko", "sa", "mu", "de", "pi", "ve"};
  const char* ends[] = {".txt", ".csv", "/", ".sh", "", "_2", "-v1.json"};
  const char* starts[] = {"", "", "./", "-", "../", "~/"};
  auto name = [&] {
    std::string n = starts[rng.below(std::size(starts))];
    for (uint64_t i = 1 + rng.below(3); i > 0; --i) n += parts[rng.below(std::size(parts))];
    return n + ends[rng.below(std::size(ends))];
  };
  std::string text;
  for (int i = 0; i < 400; ++i) {
    const std::string n = name();
    text += "Please open " + n + " and show it.\n{\"path\": \"" + n + "\"}\n";
  }
  BpeTrainParams p;
  p.vocab_size = 700;
  auto differs = [&](const Tokenizer& t, const std::string& v) {
    auto ids = [&](const std::string& s) { return t.encode(s).value(); };
    auto cat = [](std::vector<TokenId> a, const std::vector<TokenId>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const bool request = ids(" " + v + " now") == cat(cat(ids(" "), ids(v)), ids(" now"));
    const bool call = ids("{\"path\": \"" + v + "\"}") == cat(cat(ids("{\"path\": \""), ids(v)), ids("\"}"));
    return !(request && call);
  };
  p.pre = "fathom-isolated";
  auto iso = train_bpe({text}, p);
  ASSERT_TRUE(iso.ok()) << iso.status().to_string();
  p.pre = "deepseek-v3";
  auto v3 = train_bpe({text}, p);
  ASSERT_TRUE(v3.ok()) << v3.status().to_string();
  auto ti = Tokenizer::from_json(iso->tokenizer_json, iso->tokenizer_config_json);
  auto tv = Tokenizer::from_json(v3->tokenizer_json, v3->tokenizer_config_json);
  ASSERT_TRUE(ti.ok() && tv.ok());
  int iso_differs = 0, v3_differs = 0;
  for (int k = 0; k < 200; ++k) {
    const std::string v = k % 2 ? name() : name() + " -" + parts[rng.below(std::size(parts))];
    if (differs(**ti, v)) {
      ++iso_differs;
      ADD_FAILURE() << "fathom-isolated spells '" << v << "' differently in a request and in a call";
    }
    v3_differs += differs(**tv, v);
    ASSERT_EQ(*(*ti)->decode((*ti)->encode(v).value()), v);
  }
  EXPECT_EQ(iso_differs, 0);
  EXPECT_GT(v3_differs, 150);  // the contrast: the default regex attaches the space and the quote
  // tokenizer.json -> VocabData (GGUF) -> Tokenizer keeps the preset and the encoding.
  auto data = (*ti)->vocab_data();
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  EXPECT_EQ(data->pre, "fathom-isolated");
  EXPECT_FALSE(data->pre_llama_cpp);
  EXPECT_TRUE((*tv)->vocab_data().value().pre_llama_cpp);
  auto back = Tokenizer::from_vocab_data(*data);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ((*back)->encode(text).value(), (*ti)->encode(text).value());
}

TEST(VocabData, RoundTripsAndRejectsBadInput) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  VocabData d = (*tok)->vocab_data().value();
  auto rebuilt = Tokenizer::from_vocab_data(d);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().to_string();
  Rng rng(fresh_seed());
  for (int k = 0; k < 200; ++k) {
    std::string s;
    const char* parts[] = {"hello", " world", "<｜User｜>", "123456", "\n\n",
                           "中文",  "🙂",   "  ",         "x_y",    "!!"};
    for (uint64_t i = rng.below(10); i > 0; --i) s += parts[rng.below(std::size(parts))];
    ASSERT_EQ((*tok)->encode(s, {.add_special = true}).value(),
              (*rebuilt)->encode(s, {.add_special = true}).value());
  }
  VocabData bad = d;
  bad.pre = "martian";
  EXPECT_EQ(Tokenizer::from_vocab_data(bad).status().code(), StatusCode::kUnimplemented);
  bad = d;
  bad.token_types.pop_back();
  EXPECT_FALSE(Tokenizer::from_vocab_data(bad).ok());
  bad = d;
  bad.model = "llama";
  EXPECT_FALSE(Tokenizer::from_vocab_data(bad).ok());
  bad = d;
  bad.merges.push_back("nope nada");
  EXPECT_NE(Tokenizer::from_vocab_data(bad).status().message().find("'nope' is not in the vocabulary"),
            std::string::npos);
  bad = d;
  bad.bos_id = 1 << 20;
  EXPECT_FALSE(Tokenizer::from_vocab_data(bad).ok());
}

}  // namespace
}  // namespace fathom
