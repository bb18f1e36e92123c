// The built-in tokenizer for synthetic checkpoints: byte-level BPE trained at first use on a
// corpus generated here from a fixed seed (seed sentences below, recombined with numbers,
// identifiers and chat/tool-call snippets), with DeepSeek-V3's special tokens, pre-tokenizer and
// chat template. Training takes well under a second; the result is cached for the process.
#include <mutex>

#include "base/check.h"
#include "base/rng.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

namespace {

constexpr int32_t kBuiltinVocabSize = 4096;
constexpr uint64_t kBuiltinSeed = 0x5EED'F47'0000ull;
constexpr size_t kBuiltinCorpusBytes = 320 * 1024;

const char* const kSeedSentences[] = {
    "The quick brown fox jumps over the lazy dog while the model predicts the next token.",
    "A mixture-of-experts layer routes each token to a few experts and adds the shared expert's output.",
    "Multi-head latent attention caches a compressed latent vector instead of full keys and values.",
    "We measure memory bandwidth first, then report achieved bandwidth as a fraction of it.",
    "Please summarise the following document in three short bullet points.",
    "What is the capital of France? The capital of France is Paris.",
    "The server streams tokens to the client as server-sent events until the end of the sentence.",
    "Tests use fresh random inputs, print the seed, and compare against a scalar reference.",
    "In 2024 the team trained a model with 671B parameters, of which 37B are active per token.",
    "Error: file 'model.safetensors' has 12 tensors, expected 14 (missing lm_head.weight).",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "for (int i = 0; i < n; ++i) {\n  sum += x[i] * y[i];\n}\n",
    "const result = await fetch(url, { method: \"POST\", body: JSON.stringify(data) });\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "#include <vector>\nstd::vector<float> weights(4096, 0.0f);\n",
    "SELECT name, count(*) FROM tokens WHERE id > 100 GROUP BY name ORDER BY 2 DESC;\n",
    "{\"role\": \"user\", \"content\": \"What's the weather in Paris today?\"}\n",
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}\n",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
    "\"Paris\"}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "## Results\n\n| model | tokens/s |\n|---|---|\n| tiny | 1234.5 |\n",
    "今天天气很好，我们去公园散步吧。模型的输出需要仔细检查。",
    "東京は日本の首都です。トークナイザーはテキストを分割します。",
    "안녕하세요. 오늘은 좋은 날입니다.",
    "Привет, мир! Это тестовый текст для токенизатора.",
    "مرحبا بالعالم، هذا نص تجريبي.",
    "Emoji are bytes too: 🙂 👍🏽 👨‍👩‍👧 ✅",
    "Numbers: 0 7 42 128 4096 65536 3.14159 2.71828 1e-5 -17 1,000,000",
    "  indented line\n\ttabbed line\r\nwindows line\n\n\nblank lines above",
};

const char* const kWords[] = {
    "token",     "model",   "expert",  "layer",     "cache",   "tensor",  "batch",     "request",
    "server",    "weight",  "latent",  "attention", "gate",    "router",  "kernel",    "shard",
    "buffer",    "stream",  "prefix",  "sequence",  "the",     "a",       "of",        "and",
    "to",        "in",      "is",      "for",       "with",    "on",      "that",      "by",
    "this",      "from",    "we",      "it",        "as",      "are",     "be",        "new",
    "time",      "people",  "year",    "way",       "day",     "thing",   "world",     "life",
    "hand",      "part",    "child",   "place",     "work",    "week",    "case",      "point",
    "number",    "group",   "problem", "fact",      "good",    "first",   "last",      "long",
    "great",     "little",  "own",     "other",     "old",     "right",   "big",       "high",
    "different", "small",   "large",   "next",      "early",   "young",   "important", "public",
    "bad",       "same",    "able",    "make",      "know",    "take",    "see",       "come",
    "think",     "look",    "want",    "give",      "use",     "find",    "tell",      "ask",
    "seem",      "feel",    "try",     "leave",     "call",    "should",  "would",     "could",
    "because",   "about",   "between", "through",   "during",  "without", "before",    "after",
    "under",     "around",  "among",   "function",  "return",  "value",   "string",    "integer",
    "memory",    "thread",  "process", "network",   "matrix",  "vector",  "gradient",  "training",
    "inference", "compute", "storage", "schedule",  "pipeline"};
const char* const kSyllables[] = {"ka",  "ter",  "on",  "mi",  "sta", "ble",  "ing",  "re",
                                  "pro", "tion", "al",  "de",  "com", "ex",   "ly",   "ment",
                                  "ver", "ous",  "ize", "ful", "pre", "un",   "dis",  "ar",
                                  "en",  "est",  "ic",  "ity", "man", "port", "sion", "tri"};

std::string generate_corpus() {
  Rng rng(kBuiltinSeed);
  std::string out;
  out.reserve(kBuiltinCorpusBytes + 1024);
  const size_t n_seed = sizeof(kSeedSentences) / sizeof(kSeedSentences[0]);
  const size_t n_words = sizeof(kWords) / sizeof(kWords[0]);
  for (const char* s : kSeedSentences) out += s, out += '\n';
  while (out.size() < kBuiltinCorpusBytes) {
    switch (rng.below(4)) {
      case 0:
        out += kSeedSentences[rng.below(n_seed)];
        out += '\n';
        break;
      case 1: {  // a generated sentence of real and made-up words
        const uint64_t n = 4 + rng.below(12);
        for (uint64_t k = 0; k < n; ++k) {
          std::string w;
          if (rng.below(2) == 0) {
            for (uint64_t m = 1 + rng.below(4); m > 0; --m) w += kSyllables[rng.below(std::size(kSyllables))];
          } else {
            w = kWords[rng.below(n_words)];
          }
          if (k == 0) w[0] = static_cast<char>(w[0] - 32 * (w[0] >= 'a' && w[0] <= 'z'));
          out += (k ? " " : "") + w;
        }
        out += rng.below(3) == 0 ? "?\n" : ".\n";
        break;
      }
      case 2:  // numbers and identifiers
        out += fmt::format("{}_{} = {}; // {}\n", kWords[rng.below(n_words)], rng.below(100),
                           rng.below(1000000), rng.uniform() * 1000.0);
        break;
      default:
        out += fmt::format("layer {} expert {} score {:.4f}\n", rng.below(61), rng.below(256), rng.uniform());
    }
  }
  return out;
}

struct Builtin {
  std::string tokenizer_json, config_json;
};

const Builtin& builtin() {
  static const Builtin b = [] {
    const std::string corpus = generate_corpus();
    BpeTrainParams p;
    p.vocab_size = kBuiltinVocabSize;
    auto r = train_bpe({corpus}, p);
    CHECK_OK(r);
    return Builtin{r->tokenizer_json, r->tokenizer_config_json};
  }();
  return b;
}

}  // namespace

const std::string& builtin_tokenizer_json() {
  return builtin().tokenizer_json;
}
const std::string& builtin_tokenizer_config_json() {
  return builtin().config_json;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_builtin() {
  return from_json(builtin_tokenizer_json(), builtin_tokenizer_config_json());
}

}  // namespace fathom
