// The JSON automaton against nlohmann's parser on valid and invalid documents and random byte
// strings (every prefix of a valid document must be accepted, and the automaton must never accept
// a complete document the parser rejects).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/rng.h"
#include "engine/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

bool accepts(std::string_view s, bool* complete = nullptr) {
  JsonMatcher m;
  for (char c : s) {
    if (!m.feed(static_cast<uint8_t>(c))) return false;
  }
  if (complete) *complete = m.complete();
  return true;
}

TEST(JsonMatcher, AcceptsValidObjectsByteByByte) {
  const char* docs[] = {
      R"({})", R"( { "a" : 1 } )", R"({"a":[],"b":{},"c":[1,2.5,-3e+2,0.0,-0E1],"d":"x\"\\\/\b\f\n\r\tq\u00e9"})",
      R"({"k":true,"l":false,"m":null,"n":[[[]]],"o":{"p":{"q":[{"r":"s"}]}}})", "{\"utf8\":\"é中😀\"}",
  };
  for (const char* d : docs) {
    ASSERT_NO_THROW(nlohmann::json::parse(d)) << d;
    bool complete = false;
    EXPECT_TRUE(accepts(d, &complete)) << d;
    EXPECT_TRUE(complete) << d;
    const std::string s(d);
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      bool c = true;
      EXPECT_TRUE(accepts(s.substr(0, i), &c)) << d << " prefix " << i;
    }
  }
}

TEST(JsonMatcher, RejectsInvalidJsonAtTheFirstBadByte) {
  const char* bad[] = {R"([1])", R"("x")", R"({a:1})", R"({"a":01})", R"({"a":1,})", R"({"a":[1,]})", R"({"a":.5})",
                       R"({"a":tru})", R"({"a":"\x"})", "{\"a\":\"\x01\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
                       R"({"a":1}})", R"({"a" 1})", R"({"a":1 "b":2})", R"({"a":-})", R"({"a":1e})"};
  for (const char* b : bad) {
    bool complete = false;
    const bool ok = accepts(b, &complete);
    EXPECT_FALSE(ok && complete) << b;
  }
}

TEST(JsonMatcher, NeverAcceptsWhatTheParserRejects) {
  Rng rng(99);
  const std::string alphabet = "{}[]\":,0123456789.-+eEtrufalsn \\u\"ab";
  int complete_docs = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    JsonMatcher m;
    const int len = 1 + static_cast<int>(rng.below(40));
    for (int k = 0; k < len; ++k) {
      // Mostly pick bytes the matcher takes, to reach deep states.
      for (int tries = 0; tries < 8; ++tries) {
        const char c = alphabet[rng.below(alphabet.size())];
        if (m.feed(static_cast<uint8_t>(c))) {
          s.push_back(c);
          break;
        }
      }
    }
    if (m.complete()) {
      ++complete_docs;
      EXPECT_NO_THROW(nlohmann::json::parse(s)) << s;
    }
  }
  EXPECT_GT(complete_docs, 10);
}

// UTF-16 surrogates in \u escapes only as a high-low pair: a lone one is JSON syntax that strict
// parsers (nlohmann's among them) refuse, so constrained decoding must not emit it. Each refusal
// comes at the first byte that decides it (found by the json_schema fuzzer: a schema-constrained
// string with "\uDDDD" that nlohmann::json::parse rejected).
TEST(JsonMatcher, TakesSurrogateEscapesOnlyInPairs) {
  for (const char* d :
       {R"({"a":"\uD83D\uDE00"})", R"({"a":"x\ud83d\ude00y"})", R"({"a":"\uDBFF\uDFFF\uE000\uD7FF"})"}) {
    ASSERT_NO_THROW(nlohmann::json::parse(d)) << d;
    bool complete = false;
    EXPECT_TRUE(accepts(d, &complete)) << d;
    EXPECT_TRUE(complete) << d;
  }
  // Each bad document with the length of the prefix the matcher takes.
  const std::pair<const char*, size_t> bad[] = {
      {R"({"a":"\uDE00"})", 9},         // a low half alone: refused at its second digit
      {R"({"a":"\uD83D"})", 12},        // a high half, then the string ends
      {R"({"a":"\uD83Dx"})", 12},       // ... then a plain character
      {R"({"a":"\uD83D\n"})", 13},      // ... then another escape
      {R"({"a":"\uD83D\u0041"})", 14},  // ... then an escape that is no low half
      {R"({"a":"\uD83D\uD83D"})", 15},  // ... then a second high half
  };
  for (const auto& [d, taken] : bad) {
    EXPECT_TRUE(nlohmann::json::parse(d, nullptr, false).is_discarded()) << d;
    const std::string s(d);
    EXPECT_TRUE(accepts(s.substr(0, taken))) << d;
    EXPECT_FALSE(accepts(s.substr(0, taken + 1))) << d;
  }
  // A matcher inside a plain string takes string-safe tokens; after a high half it is not plain.
  JsonMatcher m;
  ASSERT_TRUE(m.feed(std::string_view(R"({"a":"\uD83D)")));
  EXPECT_TRUE(m.in_string());
  EXPECT_FALSE(m.in_plain_string());
  ASSERT_TRUE(m.feed(std::string_view(R"(\uDE00)")));
  EXPECT_TRUE(m.in_plain_string());
}

TEST(JsonMatcher, LimitsNesting) {
  std::string deep = "{\"a\":";
  for (int i = 0; i < JsonMatcher::kMaxDepth - 1; ++i) deep += "[";
  EXPECT_TRUE(accepts(deep));
  EXPECT_FALSE(accepts(deep + "["));
}

// A tool call's arguments: the fence, one object, the closing fence, nothing after; a malformed
// object (the default model's `{"path":"x":"V"}`) is refused at its first bad byte.
TEST(ToolArgsMatcher, AcceptsTheFenceOneObjectAndTheClosingFence) {
  ToolArgsMatcher m;
  EXPECT_FALSE(m.feed(std::string_view("``json")));  // all or nothing: nothing taken
  EXPECT_TRUE(m.feed(std::string_view("```json\n{\"city\": \"Oslo\", \"days\": [1, 2]")));
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.feed(std::string_view(":")));
  EXPECT_TRUE(m.feed(std::string_view("}")));
  EXPECT_TRUE(m.object_closed());
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.feed(std::string_view("<｜")));  // the closing fence comes first
  EXPECT_TRUE(m.feed(std::string_view("\n```")));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('\n')));  // then nothing: <｜tool▁call▁end｜> is a control token
  ToolArgsMatcher bad;
  EXPECT_TRUE(bad.feed(std::string_view("```json\n{\"path\":\"tmp driving directions\"")));
  EXPECT_FALSE(bad.feed(static_cast<uint8_t>(':')));
  EXPECT_TRUE(bad.feed(static_cast<uint8_t>(',')));
  ToolArgsMatcher spaces;  // whitespace outside strings: up to kMaxSpaceRun in a row
  ASSERT_TRUE(spaces.feed(std::string_view("```json\n{\"a\":")));
  EXPECT_TRUE(spaces.feed(std::string(ToolArgsMatcher::kMaxSpaceRun, ' ')));
  EXPECT_FALSE(spaces.feed(static_cast<uint8_t>('\n')));
  EXPECT_TRUE(spaces.feed(std::string_view("\"" + std::string(40, ' ') + "\",\n  \"b\": 1}")));
  ToolArgsMatcher array;  // the arguments are an object, not any value
  EXPECT_TRUE(array.feed(std::string_view("```json\n")));
  EXPECT_FALSE(array.feed(static_cast<uint8_t>('[')));
}

// The built-in tokenizer and its JSON trie, built once.
const std::pair<std::unique_ptr<Tokenizer>, std::unique_ptr<JsonVocab>>& builtin_vocab() {
  static const auto v = [] {
    auto tok = Tokenizer::from_builtin();
    EXPECT_TRUE(tok.ok());
    auto vocab = JsonVocab::create(**tok, (*tok)->vocab_size());
    EXPECT_TRUE(vocab.ok());
    return std::make_pair(std::move(*tok), std::move(*vocab));
  }();
  return v;
}

// The built-in vocabulary plus merges that leave one string and open the next (`","`, `", "`,
// `":"`), which tokenizers trained on JSON-heavy text have (the default model's does) and the
// built-in one lacks: their bytes end inside a string, yet they are not string-safe.
const std::pair<std::unique_ptr<Tokenizer>, std::unique_ptr<JsonVocab>>& json_merges_vocab() {
  static const auto v = [] {
    auto base = Tokenizer::from_builtin();
    EXPECT_TRUE(base.ok());
    VocabData data = *(*base)->vocab_data();
    // In the vocabulary's byte-level form: U+0120 stands for the space.
    for (const char* t : {"\",\"", "\",\u0120\"", "\":\""}) {
      data.tokens.push_back(t);
      data.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    }
    auto tok = Tokenizer::from_vocab_data(data);
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    auto vocab = JsonVocab::create(**tok, (*tok)->vocab_size());
    EXPECT_TRUE(vocab.ok());
    return std::make_pair(std::move(*tok), std::move(*vocab));
  }();
  return v;
}

// JSON mode's mask (JsonMatcher) allows exactly the tokens the automaton takes, inside strings
// (where a precomputed mask of string-safe tokens stands in for most of the walk), at keys,
// numbers and after a complete object (EOS alone).
TEST(JsonVocab, MaskAllowsExactlyTheTokensTheAutomatonTakes) {
  const auto& [tok, vocab] = json_merges_vocab();
  const int32_t V = tok->vocab_size();
  std::vector<uint64_t> allowed(vocab->mask_words());
  for (const char* prefix :
       {"", "{\"a", "{\"a\": \"x y", "{\"a\": \"\\", "{\"a\": \"\xc3", "{\"a\": 1", "{\"a\": [tr", "{}"}) {
    JsonMatcher state;
    ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
    vocab->mask(state, allowed.data());
    for (int32_t id = 0; id < V; ++id) {
      const bool got = (allowed[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
      bool want;
      if (state.complete()) {
        want = id == tok->eos_id();
      } else {
        const auto bytes = tok->token_bytes(id);
        const TokenType type = tok->token_type(id);
        JsonMatcher m = state;
        want = type != TokenType::kControl && type != TokenType::kUnused && !tok->is_special(id) &&
               bytes.ok() && !bytes->empty() && m.feed(*bytes);
      }
      ASSERT_EQ(got, want) << "prefix '" << prefix << "', token " << id;
    }
  }
}

// heal_string_close(): inside a string, refused tokens that begin with the closing quote (`"}`,
// `",`) give their probability to the quote token alone; nothing else moves, and nothing moves
// when the quote itself is refused.
TEST(JsonVocab, ARefusedClosingMergeCountsForTheQuote) {
  const auto& [tok, vocab] = builtin_vocab();
  const int32_t V = tok->vocab_size();
  const auto quote = tok->token_to_id("\"");
  const auto x = tok->token_to_id("x");
  ASSERT_TRUE(quote.has_value() && x.has_value());
  std::vector<int32_t> merges;  // tokens of 2+ bytes that begin with a quote
  for (int32_t id = 0; id < V; ++id) {
    const auto b = tok->token_bytes(id);
    if (b.ok() && b->size() >= 2 && (*b)[0] == '"' && !tok->is_special(id)) merges.push_back(id);
  }
  ASSERT_GE(merges.size(), 2u);
  std::vector<float> logits(static_cast<size_t>(V), -std::numeric_limits<float>::infinity());
  logits[static_cast<size_t>(*quote)] = 0.0f;
  logits[static_cast<size_t>(*x)] = 3.0f;
  logits[static_cast<size_t>(merges[0])] = 5.0f;      // refused
  logits[static_cast<size_t>(merges[1])] = 1.0f;      // allowed: keeps its own mass
  logits[static_cast<size_t>(tok->eos_id())] = 4.0f;  // refused, not a quote merge
  std::vector<uint64_t> allowed(vocab->mask_words(), 0);
  for (const int32_t id : {*quote, *x, merges[1]})
    allowed[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  std::vector<float> healed = logits;
  vocab->heal_string_close(allowed.data(), healed.data());
  EXPECT_NEAR(healed[static_cast<size_t>(*quote)], std::log(1.0 + std::exp(5.0)), 1e-5);
  for (int32_t id = 0; id < V; ++id) {
    if (id != *quote) {
      EXPECT_EQ(healed[static_cast<size_t>(id)], logits[static_cast<size_t>(id)]) << id;
    }
  }
  allowed[static_cast<size_t>(*quote) / 64] &= ~(uint64_t{1} << (*quote % 64));  // the quote refused too
  healed = logits;
  vocab->heal_string_close(allowed.data(), healed.data());
  EXPECT_EQ(healed, logits);
}

// With the tool's schema: keys are the schema's properties, none twice; the object closes only
// with every required one; values (nested objects included) are free; from_json_schema reads
// properties and required and declines schemas it cannot use.
TEST(ToolArgsMatcher, SchemaKeysAndRequiredPropertiesAreEnforced) {
  const auto schema = ToolArgsSchema::from_json_schema(
      R"({"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},"mode":{},)"
      R"("n":{"type":"integer"},"opts":{"type":"object"}},)"
      R"("required":["path","content","nope"]})");
  ASSERT_TRUE(schema.has_value());
  EXPECT_EQ(schema->keys,
            (std::vector<std::string>{"path", "content", "mode", "n", "opts"}));  // the schema's order
  ASSERT_NE(schema->compiled, nullptr);
  ToolArgsMatcher m(&*schema);
  ASSERT_TRUE(m.feed(std::string_view("```json\n{ ")));
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('}')));  // path and content are required
  EXPECT_TRUE(m.feed(std::string_view("\"pa")));
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('x')));  // no key starts "pax"
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('"')));  // "pa" is not a key
  EXPECT_TRUE(m.feed(std::string_view("th\": ")));
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('1')));  // "path" is a string
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('t')));
  EXPECT_TRUE(m.feed(std::string_view("\"a/b{\\\"free\\\": [1]}\"")));  // string contents are free
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('}')));
  EXPECT_TRUE(m.feed(std::string_view(", \"")));
  EXPECT_FALSE(m.feed(std::string_view("path")));  // not twice
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('\\')));
  EXPECT_TRUE(m.feed(std::string_view("content\":\"x\"")));
  EXPECT_TRUE(m.feed(std::string_view(",\"mode\":-7")));
  EXPECT_TRUE(m.feed(std::string_view(", \"opts\": ")));
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('[')));
  EXPECT_TRUE(
      m.feed(std::string_view("{\"x\": \"y\", \"path\": [true]}, \"n\": ")));  // nested values are free
  EXPECT_FALSE(m.feed(static_cast<uint8_t>('"')));
  EXPECT_TRUE(m.feed(std::string_view("42")));
  EXPECT_FALSE(m.feed(static_cast<uint8_t>(',')));  // every key is used (the comma also ends the number)
  EXPECT_TRUE(m.feed(std::string_view(" }")));
  EXPECT_TRUE(m.object_closed());
  // A string value, then a comma when no key is left (the default model's `","` merge).
  const auto path_only = ToolArgsSchema::from_json_schema(
      R"({"type":"object","properties":{"path":{"type":"string"}},"required":["path"]})");
  ASSERT_TRUE(path_only.has_value());
  ToolArgsMatcher one(&*path_only);
  ASSERT_TRUE(one.feed(std::string_view("```json\n{\"path\":\"notes/main.py")));
  EXPECT_FALSE(one.feed(std::string_view("\",\"")));
  EXPECT_TRUE(one.feed(static_cast<uint8_t>('"')));
  EXPECT_FALSE(one.feed(static_cast<uint8_t>(',')));
  EXPECT_TRUE(one.feed(static_cast<uint8_t>('}')));
  const auto q_only = ToolArgsSchema::from_json_schema(R"({"properties":{"q":{}}})");
  ASSERT_TRUE(q_only.has_value());
  ToolArgsMatcher early(&*schema);  // a number's end and the close in one byte: still needs "required"
  ASSERT_TRUE(early.feed(std::string_view("```json\n{\"path\":\"p\", \"n\":12")));
  EXPECT_FALSE(early.feed(static_cast<uint8_t>('}')));
  ToolArgsMatcher optional(&*q_only);
  EXPECT_TRUE(optional.feed(std::string_view("```json\n{}")));
  EXPECT_TRUE(optional.object_closed());
  EXPECT_FALSE(ToolArgsSchema::from_json_schema(R"({"properties":{"a\"b":{}}})").has_value());
  EXPECT_FALSE(ToolArgsSchema::from_json_schema(R"({"properties":{}})").has_value());
  EXPECT_FALSE(ToolArgsSchema::from_json_schema("not json").has_value());
  EXPECT_FALSE(ToolArgsSchema::from_json_schema(R"({"type":"object"})").has_value());
}

// The mask from a ToolArgsMatcher state allows exactly the tokens whose bytes the matcher takes,
// checked over the whole built-in vocabulary at states in the fence, in keys, values, nesting,
// numbers and the closing fence, with and without a schema.
TEST(ToolArgsMatcher, MaskAllowsExactlyTheTokensTheMatcherTakes) {
  const auto& [tok, vocab] = json_merges_vocab();
  const int32_t V = tok->vocab_size();
  std::vector<uint64_t> allowed(vocab->mask_words());
  const auto schema = ToolArgsSchema::from_json_schema(
      R"({"properties":{"path":{},"pattern":{},"a":{},"n":{},"content":{},"s":{"type":"string"}},)"
      R"("required":["path"]})");
  ASSERT_TRUE(schema.has_value());
  for (const ToolArgsSchema* sc : {static_cast<const ToolArgsSchema*>(nullptr), &*schema})
    for (const char* prefix :
         {"", "``", "```json\n", "```json\n{", "```json\n{\"pa",
          "```json\n{\"path\":", "```json\n{\"path\": \"a b", "```json\n{\"a\": {\"b\": [1, 2",
          "```json\n{\"n\": -1.5e", "```json\n{\"path\": \"x\"", "```json\n{\"path\": 1, \"",
          "```json\n{\"a\": 1", "```json\n{\"path\": 1}", "```json\n{\"path\": 1}\n`",
          "```json\n{\"path\":               ", "```json\n{\"path\": 12", "```json\n{\"s\":",
          "```json\n{\"s\": ", "```json\n{\"path\": 1, \"content\": 2, \"n\": 3, \"a\": 4, \"pattern\": 5",
          // inside a string value with every key used: `","` would open a key no schema allows
          "```json\n{\"path\": 1, \"content\": 2, \"n\": 3, \"a\": 4, \"pattern\": 5, \"s\": \"v"}) {
      ToolArgsMatcher state(sc);
      ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
      const auto t0 = std::chrono::steady_clock::now();
      vocab->mask(state, allowed.data());
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (std::string_view(prefix) == "```json\n{\"path\": \"a b")
        std::printf("vocabulary %d, mask inside a string value: %.2f ms\n", V, ms);
      int n_allowed = 0;
      for (int32_t id = 0; id < V; ++id) {
        const bool got = (allowed[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
        n_allowed += got;
        const TokenType type = tok->token_type(id);
        const auto bytes = tok->token_bytes(id);
        bool want = false;
        if (type != TokenType::kControl && type != TokenType::kUnused && !tok->is_special(id) && bytes.ok() &&
            !bytes->empty()) {
          ToolArgsMatcher m = state;
          want = true;
          for (char c : *bytes) {
            if (!m.feed(static_cast<uint8_t>(c))) {
              want = false;
              break;
            }
          }
        }
        ASSERT_EQ(got, want) << "prefix '" << prefix << "', token " << id << " '" << bytes.value_or("?")
                             << "'" << (sc != nullptr ? " (schema)" : "");
      }
      EXPECT_GT(n_allowed, 0) << prefix;
    }
}

}  // namespace
}  // namespace fathom
