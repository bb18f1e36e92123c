// Byte-level BPE training: count pre-tokenized words, then repeatedly merge the most frequent
// adjacent pair (ties: the smaller pair of ids), updating pair counts only in the words that
// contain the merged pair. Writes a standard tokenizer.json (+ tokenizer_config.json) that the
// Hugging Face libraries and Fathom load alike. Deterministic: same input, same output.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace fathom {

namespace {

using OrderedJson = nlohmann::ordered_json;
using Pair = uint64_t;  // (left << 32) | right

Pair make_pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
int32_t pair_left(Pair p) {
  return static_cast<int32_t>(p >> 32);
}
int32_t pair_right(Pair p) {
  return static_cast<int32_t>(uint32_t(p));
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

struct Trainer {
  std::vector<Word> words;
  std::vector<std::string> token_bytes;  // local id -> raw bytes (0..255 are the bytes)
  std::unordered_map<std::string, int32_t> bytes_to_id;
  std::unordered_map<Pair, int64_t> pair_counts;
  std::unordered_map<Pair, std::vector<int32_t>> where;  // pair -> words containing it (may repeat)
  struct Candidate {
    int64_t count;
    Pair pair;
    bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Candidate> heap;
  std::vector<std::pair<int32_t, int32_t>> merges;

  void add_pairs(int32_t w, int64_t sign) {
    const Word& word = words[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const Pair p = make_pair_key(word.symbols[i], word.symbols[i + 1]);
      int64_t& c = pair_counts[p];
      c += sign * word.count;
      if (sign > 0) where[p].push_back(w);
    }
  }

  void init() {
    for (int b = 0; b < 256; ++b) {
      token_bytes.emplace_back(1, static_cast<char>(b));
      bytes_to_id.emplace(token_bytes.back(), b);
    }
    for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) add_pairs(w, +1);
    for (const auto& [p, c] : pair_counts) heap.push({c, p});
  }

  // Merges `p` everywhere; returns false when no pair is left to merge.
  void apply(Pair p, int32_t new_id) {
    const int32_t a = pair_left(p), b = pair_right(p);
    std::vector<int32_t> ws = std::move(where[p]);
    where.erase(p);
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    std::unordered_set<Pair> touched;
    for (int32_t w : ws) {
      Word& word = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < word.symbols.size() && !has; ++i)
        has = word.symbols[i] == a && word.symbols[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
        touched.insert(make_pair_key(word.symbols[i], word.symbols[i + 1]));
      add_pairs(w, -1);
      std::vector<int32_t> next;
      next.reserve(word.symbols.size());
      for (size_t i = 0; i < word.symbols.size(); ++i) {
        if (i + 1 < word.symbols.size() && word.symbols[i] == a && word.symbols[i + 1] == b) {
          next.push_back(new_id);
          ++i;
        } else {
          next.push_back(word.symbols[i]);
        }
      }
      word.symbols.swap(next);
      add_pairs(w, +1);
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
        touched.insert(make_pair_key(word.symbols[i], word.symbols[i + 1]));
    }
    pair_counts.erase(p);
    for (Pair t : touched) {
      auto it = pair_counts.find(t);
      if (it != pair_counts.end() && it->second > 0) heap.push({it->second, t});
    }
  }

  void run(size_t target_tokens, int64_t min_frequency) {
    while (bytes_to_id.size() < target_tokens && !heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      auto it = pair_counts.find(top.pair);
      if (it == pair_counts.end() || it->second != top.count) continue;  // stale entry
      if (top.count < min_frequency) break;
      const std::string joined = token_bytes[pair_left(top.pair)] + token_bytes[pair_right(top.pair)];
      int32_t id;
      if (auto e = bytes_to_id.find(joined); e != bytes_to_id.end()) {
        id = e->second;
      } else {
        id = static_cast<int32_t>(token_bytes.size());
        token_bytes.push_back(joined);
        bytes_to_id.emplace(joined, id);
      }
      merges.emplace_back(pair_left(top.pair), pair_right(top.pair));
      apply(top.pair, id);
    }
  }
};

struct SpecialFlags {
  bool special, normalized;
};
SpecialFlags deepseek_flags(std::string_view t, size_t index) {
  if (index < 3) return {true, false};  // BOS, EOS, PAD
  if (t == "<|EOT|>") return {true, true};
  const auto ds = deepseek_v3_special_tokens();
  if (std::find(ds.begin(), ds.end(), std::string(t)) != ds.end()) return {false, true};
  return {true, false};
}

OrderedJson added_token_json(int32_t id, const std::string& content, SpecialFlags f) {
  return OrderedJson{
      {"id", id},        {"content", content},         {"single_word", false}, {"lstrip", false},
      {"rstrip", false}, {"normalized", f.normalized}, {"special", f.special}};
}

OrderedJson pre_tokenizer_json(const tok::PreTokenizerPreset& preset) {
  OrderedJson steps = OrderedJson::array();
  for (const std::string& re : preset.split_regexes) {
    steps.push_back(
        {{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  steps.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", preset.byte_level_regex}});
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

OrderedJson config_token_json(const std::string& content) {
  return {{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
          {"normalized", true},     {"rstrip", false},    {"single_word", false}};
}

}  // namespace

std::vector<std::string> deepseek_v3_special_tokens() {
  return {"<｜begin▁of▁sentence｜>",
          "<｜end▁of▁sentence｜>",
          "<｜▁pad▁｜>",
          "<｜fim▁hole｜>",
          "<｜fim▁begin｜>",
          "<｜fim▁end｜>",
          "<｜User｜>",
          "<｜Assistant｜>",
          "<|EOT|>",
          "<｜tool▁calls▁begin｜>",
          "<｜tool▁calls▁end｜>",
          "<｜tool▁call▁begin｜>",
          "<｜tool▁call▁end｜>",
          "<｜tool▁outputs▁begin｜>",
          "<｜tool▁outputs▁end｜>",
          "<｜tool▁output▁begin｜>",
          "<｜tool▁output▁end｜>",
          "<｜tool▁sep｜>"};
}

namespace {

Status validate_specials(const std::vector<std::string>& specials, int64_t vocab_size) {
  if (specials.size() < 3)
    return invalid_argument("train: at least three special tokens (BOS, EOS, PAD) are needed");
  for (size_t i = 0; i < specials.size(); ++i) {
    if (specials[i].empty()) return invalid_argument("train: special token {} is empty", i);
    TRY(tok::validate_utf8(specials[i], fmt::format("train: special token {}", i)));
    for (size_t k = 0; k < i; ++k) {
      if (specials[k] == specials[i])
        return invalid_argument("train: special token '{}' is listed twice", specials[i]);
    }
  }
  const int64_t min_vocab = 256 + static_cast<int64_t>(specials.size());
  if (vocab_size < min_vocab) {
    return invalid_argument("train: --vocab-size {} is below {} (256 byte tokens + {} special tokens)",
                            vocab_size, min_vocab, specials.size());
  }
  return {};
}

// Pre-tokenizes every text and counts the words (pieces up to max_word_bytes); sorted, so that
// hash-map order never leaks into token ids.
Status count_words(const std::vector<std::string_view>& texts, const tok::PreTokenizer& pre,
                   int64_t max_word_bytes, Trainer* tr, BpeTrainResult* result) {
  std::unordered_map<std::string, int64_t> counts;
  for (size_t t = 0; t < texts.size(); ++t) {
    TRY(tok::validate_utf8(texts[t], fmt::format("train: text {}", t)));
    TRY(pre.run(texts[t], true, [&](std::string_view piece) -> Status {
      ++result->n_words;
      if (static_cast<int64_t>(piece.size()) <= max_word_bytes) ++counts[std::string(piece)];
      return {};
    }));
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  for (auto& [w, c] : sorted) {
    Word word;
    word.count = c;
    for (unsigned char b : w) word.symbols.push_back(b);
    tr->words.push_back(std::move(word));
  }
  result->n_unique_words = static_cast<int64_t>(sorted.size());
  return {};
}

OrderedJson post_processor_json(const std::vector<std::string>& specials, bool add_bos) {
  if (!add_bos)
    return {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  const OrderedJson bos = {{"SpecialToken", {{"id", specials[0]}, {"type_id", 0}}}};
  const OrderedJson a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const OrderedJson b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  return {
      {"type", "TemplateProcessing"},
      {"single", {bos, a}},
      {"pair", {bos, a, bos, b}},
      {"special_tokens", {{specials[0], {{"id", specials[0]}, {"ids", {0}}, {"tokens", {specials[0]}}}}}}};
}

// Final ids: BOS, EOS, PAD, the 256 bytes, the merged tokens, the other special tokens.
Result<std::string> tokenizer_json(const Trainer& tr, const std::vector<std::string>& specials,
                                   const tok::PreTokenizerPreset& preset, bool add_bos) {
  auto final_id = [](int32_t local) { return local + 3; };
  OrderedJson vocab = OrderedJson::object();
  for (int i = 0; i < 3; ++i) vocab[specials[i]] = i;
  std::vector<std::string> level(tr.token_bytes.size());
  for (size_t local = 0; local < tr.token_bytes.size(); ++local) {
    level[local] = tok::bytes_to_byte_level(tr.token_bytes[local]);
    if (std::find(specials.begin(), specials.end(), level[local]) != specials.end()) {
      return invalid_argument(
          "train: special token '{}' was also learned as an ordinary token; choose a special "
          "token the pre-tokenizer splits (like <|...|>)",
          level[local]);
    }
    vocab[level[local]] = final_id(static_cast<int32_t>(local));
  }
  OrderedJson merges = OrderedJson::array();
  for (auto [a, b] : tr.merges) merges.push_back(level[a] + " " + level[b]);
  OrderedJson added = OrderedJson::array();
  const int32_t n_model = final_id(static_cast<int32_t>(tr.token_bytes.size()));
  for (size_t i = 0; i < specials.size(); ++i) {
    const int32_t id = i < 3 ? static_cast<int32_t>(i) : n_model + static_cast<int32_t>(i - 3);
    added.push_back(added_token_json(id, specials[i], deepseek_flags(specials[i], i)));
  }
  OrderedJson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = pre_tokenizer_json(preset);
  j["post_processor"] = post_processor_json(specials, add_bos);
  j["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", preset.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(1) + "\n";
}

std::string config_json(const std::vector<std::string>& specials, bool add_bos) {
  OrderedJson c;
  c["add_bos_token"] = add_bos;
  c["add_eos_token"] = false;
  c["bos_token"] = config_token_json(specials[0]);
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = config_token_json(specials[1]);
  c["legacy"] = true;
  c["model_max_length"] = 131072;
  c["pad_token"] = config_token_json(specials[1]);
  c["tokenizer_class"] = "LlamaTokenizerFast";
  c["unk_token"] = nullptr;
  c["chat_template"] = deepseek_v3_chat_template();
  return c.dump(2) + "\n";
}

}  // namespace

Result<BpeTrainResult> train_bpe(const std::vector<std::string_view>& texts, const BpeTrainParams& params) {
  const tok::PreTokenizerPreset* preset = TRY(tok::find_pre_tokenizer_preset(params.pre));
  const tok::PreTokenizer pre = TRY(tok::build_pre_tokenizer(*preset));
  const std::vector<std::string> specials =
      params.special_tokens.empty() ? deepseek_v3_special_tokens() : params.special_tokens;
  TRY(validate_specials(specials, params.vocab_size));
  BpeTrainResult result;
  Trainer tr;
  TRY(count_words(texts, pre, params.max_word_bytes, &tr, &result));
  tr.init();
  tr.run(static_cast<size_t>(params.vocab_size) - specials.size(), params.min_frequency);
  result.n_merges = static_cast<int32_t>(tr.merges.size());
  result.tokenizer_json = TRY(tokenizer_json(tr, specials, *preset, params.add_bos));
  result.tokenizer_config_json = config_json(specials, params.add_bos);
  return result;
}

}  // namespace fathom
