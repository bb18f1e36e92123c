// Long exactness runs against the npm reference: thousands of random texts and a multi-megabyte
// document, for `make test-slow` (FATHOM_TOKENIZER_SLOW_TEXTS overrides the count).
#include <gtest/gtest.h>

#include <chrono>

#include "../test_util.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

TEST(TokenizerReferenceSlow, ThousandsOfRandomTextsAndABigDocumentMatchTheNpmReference) {
  ASSERT_TRUE(test::npm_reference_installed());
  auto tok = Tokenizer::from_files(test::deepseek_dir());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const size_t n = std::stoul(test::env_or("FATHOM_TOKENIZER_SLOW_TEXTS", "5000"));
  std::vector<std::string> texts = test::build_corpus(seed, n);
  std::string big;
  for (const std::string& t : texts) big += t;
  texts.push_back(big);
  const nlohmann::json ref = test::run_reference("encode", {{"texts", texts}});
  ASSERT_EQ(ref["ids"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = (*tok)->encode(texts[i]);
    ASSERT_TRUE(ids.ok());
    ASSERT_EQ(*ids, ref["ids"][i].get<std::vector<TokenId>>())
        << "text " << i << ": " << test::escape(texts[i]).substr(0, 300);
  }
}

}  // namespace
}  // namespace fathom
