// Unit tests for the tokenizer's building blocks: UTF-8 handling, the Oniguruma -> PCRE2 regex
// translation, split behaviors and the pre-tokenizers, normalizers, and the BPE merge loop
// against a naive reference on random vocabularies.
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "base/rng.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {
namespace {

uint64_t fresh_seed() {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

std::string cp(char32_t c) {
  std::string s;
  utf8_append(&s, c);
  return s;
}

TEST(Utf8, ValidatesAndNamesTheOffsetOfTheFirstBadByte) {
  EXPECT_EQ(utf8_valid_prefix("héllo 🙂"), std::string("héllo 🙂").size());
  EXPECT_EQ(utf8_valid_prefix("ab\xC0\xAF"), 2u);         // overlong
  EXPECT_EQ(utf8_valid_prefix("a\xED\xA0\x80"), 1u);      // surrogate
  EXPECT_EQ(utf8_valid_prefix("a\xF4\x90\x80\x80"), 1u);  // above U+10FFFF
  EXPECT_EQ(utf8_valid_prefix("abc\xE2\x82"), 3u);        // truncated
  const Status s = validate_utf8("hello\xFFworld", "stdin");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("stdin: invalid UTF-8 at byte offset 5"), std::string::npos) << s.message();
}

TEST(Utf8, LossyConversionReplacesMaximalInvalidSubpartsLikeRust) {
  auto lossy = [](std::string_view s) {
    std::string out;
    utf8_append_lossy(s, &out, false);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\xE2\x82"
                  "A"),
            "a" + r + "A");                     // one U+FFFD for a cut-off sequence
  EXPECT_EQ(lossy("\xF0\x80\x80"), r + r + r);  // F0 80 is never valid: three
  EXPECT_EQ(lossy("\xE2\x82"), r);
  EXPECT_EQ(lossy("ok"), "ok");
  std::string held;
  EXPECT_EQ(utf8_append_lossy("ab\xF0\x9F\x99", &held, true), 3u);  // incomplete tail held back
  EXPECT_EQ(held, "ab");
}

TEST(ByteLevel, AlphabetMapsEveryByteToOnePrintableCharacterAndBack) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = bytes_to_byte_level(all);
  EXPECT_EQ(bytes_to_byte_level(" "), "Ġ");
  EXPECT_EQ(bytes_to_byte_level("\n"), "Ċ");
  std::string back;
  ASSERT_TRUE(byte_level_to_bytes(mapped, &back));
  EXPECT_EQ(back, all);
  std::string none;
  EXPECT_FALSE(byte_level_to_bytes("a b", &none));  // ' ' is not in the alphabet
}

std::vector<std::pair<size_t, size_t>> matches(std::string_view pattern, std::string_view text) {
  auto re = Regex::compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().to_string();
  std::vector<std::pair<size_t, size_t>> m;
  if (re.ok()) {
    EXPECT_TRUE((*re)->for_each_match(text, [&](size_t b, size_t e) { m.emplace_back(b, e); }).ok());
  }
  return m;
}

TEST(Regex, WhitespaceMeansUnicodeWhiteSpaceAsInOniguruma) {
  EXPECT_EQ(matches("\\s", cp(0x85)).size(), 1u);    // NEL: White_Space
  EXPECT_EQ(matches("\\s", cp(0x3000)).size(), 1u);  // ideographic space
  EXPECT_EQ(matches("\\s", cp(0x180E)).size(), 0u);  // not White_Space since Unicode 6.3 (PCRE2's \s has it)
  EXPECT_EQ(matches("\\s", cp(0xFEFF)).size(), 0u);  // BOM: not White_Space
  EXPECT_EQ(matches("[^\\S\\n]+", "a \t\nb").size(), 1u);
  EXPECT_EQ(matches("[^\\S\\n]+", "a \t\nb")[0], (std::pair<size_t, size_t>{1, 3}));
  EXPECT_EQ(matches("\\S+", "ab " + cp(0x180E) + "c").size(), 2u);
}

TEST(Regex, TranslatesRubySyntaxEscapes) {
  EXPECT_EQ(matches("\\h+", "xyz 0fA9 q").size(), 1u);  // Ruby's \h is a hex digit
  EXPECT_EQ(matches("\\u00e9", "café").size(), 1u);
  EXPECT_EQ(matches("\\w+", "naïve_x1 ok").size(), 2u);
  EXPECT_EQ(matches("\\s+$", "ab  \ncd  ").size(), 2u);  // $ is a line anchor in Ruby syntax
  auto bad = translate_oniguruma("[a[b]]");
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  EXPECT_FALSE(translate_oniguruma("abc\\").ok());
  EXPECT_FALSE(translate_oniguruma("[abc").ok());
  auto compile_error = Regex::compile("(unclosed");
  ASSERT_FALSE(compile_error.ok());
  EXPECT_NE(compile_error.status().message().find("(unclosed"), std::string::npos);
}

TEST(Regex, SkipsAnEmptyMatchRightAfterTheLastMatch) {
  const auto m = matches("a*", "baaac");
  const std::vector<std::pair<size_t, size_t>> want = {{0, 0}, {1, 4}, {5, 5}};
  EXPECT_EQ(m, want);
}

std::vector<std::string> pieces(const PreTokenizer& pre, std::string_view text, bool first = true) {
  std::vector<std::string> out;
  EXPECT_TRUE(pre.run(text, first,
                      [&](std::string_view p) -> Status {
                        out.emplace_back(p);
                        return {};
                      })
                  .ok());
  return out;
}

PreTokenizer split_on(std::string literal, SplitBehavior b, bool invert = false) {
  PreTokenizer pre;
  PreTokenizerStep s{};
  s.kind = PreKind::kSplit;
  s.pattern.literal = std::move(literal);
  s.behavior = b;
  s.invert = invert;
  pre.steps.push_back(std::move(s));
  return pre;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, SplitBehavesAsDocumentedByHuggingFace) {
  const std::string t = "the-final--countdown";
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kRemoved), t), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kIsolated), t),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kMergedWithPrevious), t),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kMergedWithNext), t),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kContiguous), t),
            (V{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern marks what to keep.
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kRemoved, true), t), (V{"-", "-", "-"}));
  EXPECT_EQ(pieces(split_on("-", SplitBehavior::kIsolated), ""), V{});
}

TEST(PreTokenizer, DigitsMetaspaceWhitespaceAndPunctuation) {
  PreTokenizer digits;
  digits.steps.push_back(PreTokenizerStep{PreKind::kDigits});
  EXPECT_EQ(pieces(digits, "Call 123 please"), (V{"Call ", "123", " please"}));
  digits.steps[0].individual_digits = true;
  EXPECT_EQ(pieces(digits, "Call 123 please"), (V{"Call ", "1", "2", "3", " please"}));

  PreTokenizer meta;
  meta.steps.push_back(PreTokenizerStep{PreKind::kMetaspace});
  EXPECT_EQ(pieces(meta, "Hey friend!"), (V{"▁Hey", "▁friend!"}));
  EXPECT_EQ(pieces(meta, "Hey   friend!"), (V{"▁Hey", "▁", "▁", "▁friend!"}));
  meta.steps[0].prepend_scheme = PrependScheme::kFirst;
  EXPECT_EQ(pieces(meta, "Hey", /*first=*/false), (V{"Hey"}));
  EXPECT_EQ(pieces(meta, "Hey", /*first=*/true), (V{"▁Hey"}));

  PreTokenizer ws;
  PreTokenizerStep w{PreKind::kWhitespace};
  w.pattern.regex = Regex::compile("\\w+|[^\\w\\s]+").value();
  ws.steps.push_back(std::move(w));
  EXPECT_EQ(pieces(ws, "Hey man!!  ok?"), (V{"Hey", "man", "!!", "ok", "?"}));
  PreTokenizer wss;
  wss.steps.push_back(PreTokenizerStep{PreKind::kWhitespaceSplit});
  EXPECT_EQ(pieces(wss, "Hey  man!\tx"), (V{"Hey", "man!", "x"}));
  PreTokenizer punct;
  punct.steps.push_back(PreTokenizerStep{PreKind::kPunctuation});
  EXPECT_EQ(pieces(punct, "Hey friend!     How are you?!?"),
            (V{"Hey friend", "!", "     How are you", "?", "!", "?"}));
}

TEST(PreTokenizer, ByteLevelWithRegexSplitsLikeGpt2) {
  PreTokenizer pre;
  PreTokenizerStep b{PreKind::kByteLevel};
  b.add_prefix_space = true;
  b.pattern.regex =
      Regex::compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+")
          .value();
  pre.steps.push_back(std::move(b));
  pre.byte_level = true;
  EXPECT_EQ(pieces(pre, "Hello world's 42!!  x"), (V{" Hello", " world", "'s", " 42", "!!", " ", " x"}));
}

std::string normalize(NormalizerStep step, std::string_view in) {
  Normalizer n;
  n.steps.push_back(std::move(step));
  std::string out;
  EXPECT_TRUE(n.apply(in, &out).ok());
  return out;
}

TEST(Normalizer, UnicodeFormsLowercaseReplacePrependStrip) {
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kNFKC}, "ﬁ①"), "fi1");
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kNFC}, "e\xCC\x81"), "é");
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kNFD}, "é"), "e\xCC\x81");
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kLowercase}, "ΑΒΓ Straße İ"), "αβγ straße i\xCC\x87");
  NormalizerStep rep{NormalizerKind::kReplace};
  rep.pattern.literal = " ";
  rep.content = "▁";
  EXPECT_EQ(normalize(std::move(rep), "a b  c"), "a▁b▁▁c");
  NormalizerStep rex{NormalizerKind::kReplace};
  rex.pattern.regex = Regex::compile("\\s+").value();
  rex.content = " ";
  EXPECT_EQ(normalize(std::move(rex), "a \t\n b"), "a b");
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kPrepend, {}, "▁"}, "x"), "▁x");
  EXPECT_EQ(normalize(NormalizerStep{NormalizerKind::kPrepend, {}, "▁"}, ""), "");
  NormalizerStep strip{NormalizerKind::kStrip};
  strip.strip_left = true;
  strip.strip_right = false;
  EXPECT_EQ(normalize(std::move(strip), " \u3000 a b "), "a b ");
}

// ---- BPE against a naive reference ----

// Hugging Face's rule stated directly: repeatedly merge the lowest-ranked adjacent pair, the
// leftmost one on ties, until no pair has a merge. O(n^2), obviously right.
std::vector<Id> naive_bpe(const std::vector<Id>& start,
                          const std::map<std::pair<Id, Id>, std::pair<int, Id>>& merges) {
  std::vector<Id> w = start;
  while (true) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merges.find({w[i], w[i + 1]});
      if (it != merges.end() && (best < 0 || it->second.first < best)) best = it->second.first, at = i;
    }
    if (best < 0) return w;
    w[at] = merges.at({w[at], w[at + 1]}).second;
    w.erase(w.begin() + static_cast<long>(at) + 1);
  }
}

struct RandomBpe {
  std::unique_ptr<BpeModel> model;
  std::map<std::pair<Id, Id>, std::pair<int, Id>> merges;
};

// A byte-level vocabulary over the bytes 'a'..'a'+alphabet-1 with n random merges; each merge
// produces a new token. monotone: merges only use tokens that exist before them.
RandomBpe random_bpe(Rng& rng, int alphabet, int n_merges, bool monotone) {
  RandomBpe r;
  StringIdMap vocab;
  std::vector<std::string> tokens;
  for (int i = 0; i < alphabet; ++i) {
    tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>('a' + i))));
    vocab[tokens.back()] = i;
  }
  std::vector<std::pair<std::string, std::string>> merge_list;
  std::vector<std::pair<Id, Id>> pending;  // for non-monotone vocabularies: merges listed later
  while (static_cast<int>(merge_list.size()) < n_merges) {
    const Id a = static_cast<Id>(rng.below(tokens.size())), b = static_cast<Id>(rng.below(tokens.size()));
    const std::string joined = tokens[a] + tokens[b];
    if (vocab.count(joined) || joined.size() > 24) continue;
    vocab[joined] = static_cast<Id>(tokens.size());
    tokens.push_back(joined);
    merge_list.emplace_back(tokens[a], tokens[b]);
  }
  if (!monotone) {  // shuffle ranks: later tokens may be merged before the tokens they use
    for (size_t i = merge_list.size(); i > 1; --i) std::swap(merge_list[i - 1], merge_list[rng.below(i)]);
  }
  for (size_t k = 0; k < merge_list.size(); ++k) {
    r.merges[{vocab[merge_list[k].first], vocab[merge_list[k].second]}] = {
        static_cast<int>(k), vocab[merge_list[k].first + merge_list[k].second]};
  }
  r.model = BpeModel::create(vocab, merge_list, {}, /*byte_level=*/true).value();
  return r;
}

TEST(Bpe, MergesLikeTheNaiveReferenceOnRandomVocabulariesAndWords) {
  Rng rng(fresh_seed());
  for (int round = 0; round < 30; ++round) {
    const bool monotone = round % 2 == 0;
    const int alphabet = 2 + static_cast<int>(rng.below(6));
    RandomBpe r = random_bpe(rng, alphabet, 20 + static_cast<int>(rng.below(200)), monotone);
    for (int w = 0; w < 30; ++w) {
      const size_t len = w < 25 ? 1 + rng.below(40) : 1 + rng.below(400);
      std::string word;
      std::vector<Id> start;
      for (size_t i = 0; i < len; ++i) {
        const int c = static_cast<int>(rng.below(static_cast<uint64_t>(alphabet)));
        word.push_back(static_cast<char>('a' + c));
        start.push_back(c);
      }
      const std::vector<Id> want = naive_bpe(start, r.merges);
      std::vector<Id> heap_path, bucket_path;
      r.model->encode_uncached_for_test(word, false, &heap_path);
      r.model->encode_uncached_for_test(word, true, &bucket_path);
      ASSERT_EQ(heap_path, want) << "round " << round << " word " << word.substr(0, 80);
      ASSERT_EQ(bucket_path, want) << "round " << round << " (bucket queue, monotone " << monotone << ")";
      std::vector<Id> cached;
      BpeModel::Session session(*r.model);
      session.encode_piece(word, &cached);
      session.encode_piece(word, &cached);  // second time from the cache
      ASSERT_EQ(cached.size(), 2 * want.size());
      ASSERT_TRUE(std::equal(want.begin(), want.end(), cached.begin()));
      ASSERT_TRUE(std::equal(want.begin(), want.end(), cached.begin() + static_cast<long>(want.size())));
    }
    // Words long enough for the bucket queue in production: both paths agree.
    std::string word;
    for (size_t i = 0; i < kLongWordSymbols + rng.below(4000); ++i) {
      word.push_back(static_cast<char>('a' + rng.below(static_cast<uint64_t>(alphabet))));
    }
    std::vector<Id> heap_path, bucket_path, session_path;
    r.model->encode_uncached_for_test(word, false, &heap_path);
    r.model->encode_uncached_for_test(word, true, &bucket_path);
    BpeModel::Session(*r.model).encode_piece(word, &session_path);
    ASSERT_EQ(heap_path, bucket_path) << "round " << round;
    ASSERT_EQ(session_path, heap_path) << "round " << round;
  }
}

TEST(Bpe, RejectsMergesThatNameUnknownTokens) {
  StringIdMap vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  auto bad = BpeModel::create(vocab, {{"a", "c"}}, {}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.merges[0] 'a c': token 'c' is not in the vocabulary"),
            std::string::npos)
      << bad.status().message();
  auto bad2 = BpeModel::create(vocab, {{"b", "a"}}, {}, true);
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("merged token 'ba'"), std::string::npos) << bad2.status().message();
  auto dup = BpeModel::create({{"a", 0}, {"b", 0}}, {}, {}, true);
  EXPECT_FALSE(dup.ok());
}

}  // namespace
}  // namespace fathom::tok
