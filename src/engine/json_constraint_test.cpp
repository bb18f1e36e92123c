// The JSON automaton against nlohmann's parser on valid and invalid documents and random byte
// strings (every prefix of a valid document must be accepted, and the automaton must never accept
// a complete document the parser rejects).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/rng.h"
#include "engine/json_constraint.h"

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

TEST(JsonMatcher, LimitsNesting) {
  std::string deep = "{\"a\":";
  for (int i = 0; i < JsonMatcher::kMaxDepth - 1; ++i) deep += "[";
  EXPECT_TRUE(accepts(deep));
  EXPECT_FALSE(accepts(deep + "["));
}

}  // namespace
}  // namespace fathom
