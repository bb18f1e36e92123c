// Tool-name constraint: greedy decoding of random logits under the mask always writes one of the
// offered names followed by "\n" (the tokenizer's merges across the "\n" included), the state
// machine starts at <｜tool▁sep｜> and ends at the "\n", and a prefix no name continues leaves the
// step unconstrained.
#include "engine/tool_name_constraint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

const Tokenizer& builtin() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::from_builtin();
    EXPECT_TRUE(t.ok());
    return std::move(*t);
  }();
  return *tok;
}

bool bit(const std::vector<uint64_t>& m, int32_t id) { return (m[static_cast<size_t>(id) / 64] >> (id % 64)) & 1; }

TEST(ToolNameConstraint, GreedyDecodingUnderTheMaskWritesAnOfferedName) {
  const Tokenizer& tok = builtin();
  const int32_t V = tok.vocab_size();
  auto vocab = ToolNameVocab::create(tok, V);
  const int32_t sep = tok.chat_tokens().tool_sep;
  ASSERT_GE(sep, 0);
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const char* parts[] = {"get", "weather", "files", "read_file", "x", "Forecast", "db", "query", "é", "ü", "-", "_", "42"};
  std::vector<uint64_t> allowed(vocab->mask_words());
  std::normal_distribution<float> normal;
  std::vector<float> logits(static_cast<size_t>(V));
  for (int iter = 0; iter < 60; ++iter) {
    std::vector<std::string> names;
    for (int n = 1 + static_cast<int>(rng() % 4); static_cast<int>(names.size()) < n;) {
      std::string name;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) name += parts[rng() % 13];
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    ToolNameState st;
    st.feed(sep, "", sep);
    ASSERT_TRUE(st.active);
    std::string written;
    for (int step = 0; st.active && step < 64; ++step) {
      ASSERT_TRUE(vocab->mask(st.prefix, names, allowed.data())) << "prefix '" << st.prefix << "'";
      for (auto& l : logits) l = normal(rng);
      int32_t best = -1;
      for (int32_t id = 0; id < V; ++id)
        if (bit(allowed, id) && (best < 0 || logits[static_cast<size_t>(id)] > logits[static_cast<size_t>(best)])) best = id;
      ASSERT_GE(best, 0);
      EXPECT_FALSE(tok.is_special(best));
      const std::string b = *tok.token_bytes(best);
      written += b;
      st.feed(best, b, sep);
    }
    ASSERT_FALSE(st.active) << "name not finished: " << written;
    const std::string name = written.substr(0, written.find('\n'));
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << "wrote '" << written << "', seed " << seed;
  }
}

TEST(ToolNameConstraint, MaskAllowsExactlyTheContinuations) {
  const Tokenizer& tok = builtin();
  auto vocab = ToolNameVocab::create(tok, tok.vocab_size());
  std::vector<uint64_t> allowed(vocab->mask_words());
  const std::vector<std::string> names = {"get_weather", "get_time"};
  ASSERT_TRUE(vocab->mask("get_", names, allowed.data()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) {
      EXPECT_FALSE(bit(allowed, id));
      continue;
    }
    const auto b = tok.token_bytes(id);
    if (!b.ok() || b->empty()) continue;
    bool want = false;
    for (const auto& n : names) {
      const std::string r = n.substr(4) + "\n";
      want =
          want || (b->size() <= r.size() ? r.compare(0, b->size(), *b) == 0
                                         : b->compare(0, r.size(), r) == 0 &&
                                               ToolArgsMatcher().feed(std::string_view(*b).substr(r.size())));
    }
    EXPECT_EQ(bit(allowed, id), want) << "token '" << *b << "'";
  }
  // A token that completes the name and runs past its "\n" into the fence is allowed; one that runs on in the
  // name is not.
  auto nl = tok.encode("\n```");
  ASSERT_TRUE(nl.ok());
  ASSERT_TRUE(vocab->mask("get_time", names, allowed.data()));
  if (nl->size() == 1) {
    EXPECT_TRUE(bit(allowed, (*nl)[0]));
  }
  // ... but not into something other than the arguments' fence ("\n{" skips it).
  auto nl_brace = tok.encode("\n{");
  ASSERT_TRUE(nl_brace.ok());
  if (nl_brace->size() == 1) {
    EXPECT_FALSE(bit(allowed, (*nl_brace)[0]));
  }
  const auto s_tok = tok.token_to_id("s");
  ASSERT_TRUE(s_tok.has_value());
  EXPECT_FALSE(bit(allowed, *s_tok));
  // No name continues the prefix: unconstrained (false), nothing set.
  EXPECT_FALSE(vocab->mask("put_", names, allowed.data()));
  EXPECT_TRUE(std::all_of(allowed.begin(), allowed.end(), [](uint64_t w) { return w == 0; }));
  // The state: inactive until <｜tool▁sep｜>, a "\n" ends the name, the next sep starts another.
  ToolNameState st;
  const int32_t sep = tok.chat_tokens().tool_sep;
  st.feed(5, "get", sep);
  EXPECT_FALSE(st.active);
  st.feed(sep, "", sep);
  st.feed(5, "get_", sep);
  EXPECT_TRUE(st.active);
  EXPECT_EQ(st.prefix, "get_");
  st.feed(6, "time\n```", sep);
  EXPECT_FALSE(st.active);
  st.feed(sep, "", sep);
  EXPECT_TRUE(st.active);
  EXPECT_EQ(st.prefix, "");
}

// After the name's "\n" the arguments are constrained until their closing fence, the rest of the
// token that ends the name included, then the call end is pending; a byte that leaves the
// template's format ends the constraint.
TEST(ToolNameConstraint, TheArgumentsFollowTheNameUntilTheirObjectCloses) {
  const int32_t sep = 99;
  ToolNameState st;
  st.feed(sep, "", sep);
  st.feed(5, "get_time\n``", sep);
  EXPECT_FALSE(st.active);
  EXPECT_EQ(st.prefix, "get_time\n");
  EXPECT_TRUE(st.args_active);
  st.feed(6, "`json\n{\"tz\"", sep);
  EXPECT_TRUE(st.args_active);
  st.feed(7, ": \"UTC\"}\n```", sep);  // the object and the closing fence: the call end is next
  EXPECT_FALSE(st.args_active);
  EXPECT_TRUE(st.end_pending);
  st.feed(8, "", sep);  // <｜tool▁call▁end｜>
  EXPECT_FALSE(st.args_active);
  EXPECT_FALSE(st.end_pending);
  // Not the template's fence: nothing is constrained.
  st.feed(sep, "", sep);
  st.feed(5, "get_time\n", sep);
  EXPECT_TRUE(st.args_active);
  st.feed(6, "<call>", sep);
  EXPECT_FALSE(st.args_active);
  // A new call starts over.
  st.feed(sep, "", sep);
  EXPECT_TRUE(st.active);
  EXPECT_FALSE(st.args_active);
  // The called tool's schema constrains the keys: get_time takes "tz" only.
  const std::vector<std::string> names = {"get_date", "get_time"};
  const std::vector<ToolArgsSchema> schemas = {
      ToolArgsSchema{}, *ToolArgsSchema::from_json_schema(R"({"properties":{"tz":{}}})")};
  st.feed(5, "get_time\n```json\n{\"", sep, names, schemas);
  EXPECT_TRUE(st.args_active);
  EXPECT_FALSE(st.args.feed(std::string_view("city")));
  EXPECT_TRUE(st.args.feed(std::string_view("tz\"")));
  st.feed(sep, "", sep, names, schemas);
  st.feed(5, "get_date\n```json\n{\"", sep, names, schemas);  // no schema: any key
  EXPECT_TRUE(st.args.feed(std::string_view("city\"")));
  // tool_choice naming get_time: the prompt ends after the fence, the reply is the arguments.
  ToolNameState named;
  named.start_args("get_time", names, schemas);
  EXPECT_TRUE(named.args_active);
  EXPECT_FALSE(named.active);
  named.feed(5, "{\"", sep, names, schemas);
  EXPECT_FALSE(named.args.feed(std::string_view("city")));
  named.feed(6, "tz\": \"UTC\"}\n```", sep, names, schemas);
  EXPECT_FALSE(named.args_active);
  EXPECT_TRUE(named.end_pending);
}

}  // namespace
}  // namespace fathom
