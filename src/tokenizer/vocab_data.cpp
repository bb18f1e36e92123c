// VocabData (the GGUF view of a vocabulary) <-> Tokenizer, and the llama.cpp pre-tokenizer
// names (`tokenizer.ggml.pre`) mapped to the Hugging Face pre-tokenizers they stand for.
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace fathom {

namespace tok {

const std::string& gpt2_regex() {
  static const std::string re =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  return re;
}

const std::vector<PreTokenizerPreset>& pre_tokenizer_presets() {
  // The regexes are the ones the models' own tokenizer.json files carry (the first name of each
  // group is what vocab_data() reports).
  static const std::vector<PreTokenizerPreset> presets = [] {
    std::vector<PreTokenizerPreset> p;
    const std::vector<std::string> deepseek_v3 = {
        "\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+[\r\n]*|"
        "\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    };
    const std::vector<std::string> deepseek_llm = {
        "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-"
        "ᲺᲽ-"
        "Ჿᴀ-"
        "ᴫᵫ-"
        "ᵷᵹ-"
        "ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-"
        "ꚛꜢ-"
        "ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-"
        "𐳲𑢠-"
        "𑣟𞤀-"
        "𞥃]"
        "+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        "\\p{N}+",
    };
    const std::vector<std::string> deepseek_coder = {
        "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}",
    };
    const std::string llama3 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    p.push_back({"deepseek-v3", deepseek_v3, false, false});
    p.push_back({"deepseek-llm", deepseek_llm, false, false});
    p.push_back({"deepseek-coder", deepseek_coder, false, false});
    p.push_back({"gpt2", {}, true, false});
    p.push_back({"llama-bpe", {llama3}, false, true});
    // Fathom's own: DeepSeek-V3's digit and CJK splits, then letters, each quote character
    // (" ' `), other punctuation runs, line breaks and runs of spaces each as their own
    // pre-token. A value is then the same tokens after a space as inside a JSON string (`-l`,
    // `./run.sh` and `hello.txt` alike), so a model can copy it from a request into a tool call
    // by induction; DeepSeek-V3's regex spells ` hello` and `"hello` differently (docs/MODEL.md).
    // Costs about 1.5x the tokens with DeepSeek-V3's merges. Not a llama.cpp name: Fathom and
    // Hugging Face `tokenizers` (through tokenizer.json) read it, llama.cpp's GGUF loader does not.
    const std::vector<std::string> isolated = {
        deepseek_v3[0],
        deepseek_v3[1],
        "[\\p{L}\\p{M}]+|[\"'`]|[^\\s\\p{L}\\p{M}\\p{N}\"'`]+|\\s*[\r\n]+|[ \t]+",
    };
    p.push_back({"fathom-isolated", isolated, false, false, false});
    return p;
  }();
  return presets;
}

Result<const PreTokenizerPreset*> find_pre_tokenizer_preset(std::string_view name) {
  static const std::vector<std::pair<std::string_view, std::string_view>> aliases = {
      {"default", "gpt2"}, {"gpt-2", "gpt2"}, {"llama3", "llama-bpe"}, {"llama-v3", "llama-bpe"}};
  for (auto [alias, target] : aliases) {
    if (name == alias) name = target;
  }
  for (const PreTokenizerPreset& p : pre_tokenizer_presets()) {
    if (p.name == name) return &p;
  }
  std::string known;
  for (const PreTokenizerPreset& p : pre_tokenizer_presets()) known += (known.empty() ? "" : ", ") + p.name;
  return unimplemented("pre-tokenizer '{}' is not mapped (Fathom knows: {})", name, known);
}

Result<PreTokenizer> build_pre_tokenizer(const PreTokenizerPreset& preset) {
  PreTokenizer pre;
  for (const std::string& re : preset.split_regexes) {
    PreTokenizerStep s{};
    s.kind = PreKind::kSplit;
    s.pattern.regex = TRY(Regex::compile(re));
    s.behavior = SplitBehavior::kIsolated;
    pre.steps.push_back(std::move(s));
  }
  PreTokenizerStep b{};
  b.kind = PreKind::kByteLevel;
  b.add_prefix_space = false;
  b.use_regex = preset.byte_level_regex;
  if (b.use_regex) b.pattern.regex = TRY(Regex::compile(gpt2_regex()));
  pre.steps.push_back(std::move(b));
  pre.byte_level = true;
  return pre;
}

namespace {

// The preset this pre-tokenizer is, or null.
const PreTokenizerPreset* match_preset(const PreTokenizer& pre, bool ignore_merges) {
  if (!pre.byte_level || pre.steps.empty()) return nullptr;
  const PreTokenizerStep& last = pre.steps.back();
  if (last.add_prefix_space) return nullptr;
  for (const PreTokenizerPreset& p : pre_tokenizer_presets()) {
    if (p.byte_level_regex != last.use_regex || p.ignore_merges != ignore_merges) continue;
    if (p.split_regexes.size() + 1 != pre.steps.size()) continue;
    bool same = true;
    for (size_t k = 0; k < p.split_regexes.size() && same; ++k) {
      const PreTokenizerStep& s = pre.steps[k];
      same = s.kind == PreKind::kSplit && s.pattern.regex &&
             s.pattern.regex->pattern() == p.split_regexes[k] && s.behavior == SplitBehavior::kIsolated &&
             !s.invert;
    }
    if (same) return &p;
  }
  return nullptr;
}

}  // namespace
}  // namespace tok

Result<VocabData> Tokenizer::vocab_data() const {
  const Impl& m = *impl_;
  const tok::BpeOptions& o = m.model->options();
  if (!m.normalizer.empty() || !o.unk_token.empty() || o.byte_fallback ||
      !o.continuing_subword_prefix.empty() || !o.end_of_word_suffix.empty()) {
    return unimplemented(
        "vocab_data: only byte-level BPE without a normalizer, unk token or byte fallback maps to GGUF");
  }
  const tok::PreTokenizerPreset* preset = tok::match_preset(m.pre_tokenizer, o.ignore_merges);
  if (!preset) {
    std::string known;
    for (const tok::PreTokenizerPreset& p : tok::pre_tokenizer_presets())
      known += (known.empty() ? "" : ", ") + p.name;
    return unimplemented("vocab_data: this tokenizer's pre-tokenizer is not one GGUF names (known: {})",
                         known);
  }
  if (!m.decoder.present || m.decoder.steps.size() != 1 ||
      m.decoder.steps[0].kind != tok::DecoderKind::kByteLevel) {
    return unimplemented("vocab_data: the decoder must be ByteLevel");
  }
  VocabData v;
  v.pre = preset->name;
  v.pre_llama_cpp = preset->llama_cpp;
  v.tokens.resize(static_cast<size_t>(m.vocab_size));
  v.token_types.resize(static_cast<size_t>(m.vocab_size));
  for (TokenId id = 0; id < m.vocab_size; ++id) {
    std::string_view s;
    if (m.token_string(id, &s)) {
      v.tokens[id] = std::string(s);
    } else {
      v.tokens[id] = fmt::format("[PAD{}]", id);
    }
    v.token_types[id] = static_cast<int32_t>(m.types[id]);
  }
  for (auto [a, b] : m.model->merges()) {
    std::string_view sa, sb;
    m.model->id_to_token(a, &sa);
    m.model->id_to_token(b, &sb);
    if (sa.find(' ') != std::string_view::npos || sb.find(' ') != std::string_view::npos) {
      return unimplemented("vocab_data: merge '{}' + '{}' contains a space and cannot be written as \"a b\"",
                           sa, sb);
    }
    v.merges.push_back(fmt::format("{} {}", sa, sb));
  }
  v.bos_id = m.bos;
  v.eos_id = m.eos;
  v.pad_id = m.pad;
  v.add_bos = add_bos();
  v.add_eos = add_eos();
  v.chat_template = m.chat_template;
  return v;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_vocab_data(const VocabData& d) {
  if (d.model != "gpt2")
    return unimplemented("vocab: tokenizer model '{}' is not supported (Fathom reads 'gpt2')", d.model);
  const tok::PreTokenizerPreset* preset = TRY(tok::find_pre_tokenizer_preset(d.pre));
  if (d.token_types.size() != d.tokens.size()) {
    return invalid_argument("vocab: {} tokens but {} token types", d.tokens.size(), d.token_types.size());
  }
  auto impl = std::make_unique<Impl>();
  impl->pre_tokenizer = TRY(tok::build_pre_tokenizer(*preset));
  impl->decoder.present = true;
  impl->decoder.steps.push_back(tok::DecoderStep{tok::DecoderKind::kByteLevel});
  tok::StringIdMap vocab;
  vocab.reserve(d.tokens.size());
  for (size_t id = 0; id < d.tokens.size(); ++id) {
    const int32_t type = d.token_types[id];
    if (type < 0 || type > 6) return invalid_argument("vocab: token {} has type {}, expected 0..6", id, type);
    if (type == static_cast<int32_t>(TokenType::kUnused)) continue;
    TRY(tok::validate_utf8(d.tokens[id], fmt::format("vocab: token {}", id)));
    if (type == static_cast<int32_t>(TokenType::kControl) ||
        type == static_cast<int32_t>(TokenType::kUserDefined)) {
      tok::AddedToken t;
      t.content = d.tokens[id];
      t.id = static_cast<int32_t>(id);
      t.special = type == static_cast<int32_t>(TokenType::kControl);
      t.control = t.special;
      t.normalized = !t.special;
      impl->added.push_back(std::move(t));
    }
    if (!vocab.emplace(d.tokens[id], static_cast<tok::Id>(id)).second &&
        type != static_cast<int32_t>(TokenType::kControl)) {
      return invalid_argument("vocab: token '{}' appears twice (ids {} and {})", d.tokens[id],
                              vocab.at(d.tokens[id]), id);
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(d.merges.size());
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const std::string& s = d.merges[r];
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return invalid_argument("vocab: merge {} '{}' is not two tokens separated by one space", r, s);
    }
    merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  tok::BpeOptions o;
  o.ignore_merges = preset->ignore_merges;
  impl->model = TRY(tok::BpeModel::create(std::move(vocab), merges, o, /*byte_level=*/true));
  auto check_id = [&](int32_t id, const char* what) -> Status {
    if (id != kNoToken && (id < 0 || static_cast<size_t>(id) >= d.tokens.size())) {
      return invalid_argument("vocab: {} {} is outside the vocabulary ({} tokens)", what, id,
                              d.tokens.size());
    }
    return {};
  };
  TRY(check_id(d.bos_id, "bos_id"));
  TRY(check_id(d.eos_id, "eos_id"));
  TRY(check_id(d.pad_id, "pad_id"));
  impl->bos = d.bos_id;
  impl->eos = d.eos_id;
  impl->pad = d.pad_id;
  if (impl->bos != kNoToken) impl->bos_token = d.tokens[impl->bos];
  if (impl->eos != kNoToken) impl->eos_token = d.tokens[impl->eos];
  if (d.add_bos) {
    if (impl->bos == kNoToken) return invalid_argument("vocab: add_bos is set but there is no bos_id");
    impl->prefix_ids.push_back(impl->bos);
  }
  if (d.add_eos) {
    if (impl->eos == kNoToken) return invalid_argument("vocab: add_eos is set but there is no eos_id");
    impl->suffix_ids.push_back(impl->eos);
  }
  impl->chat_template = d.chat_template;
  impl->min_vocab_size = static_cast<int32_t>(d.tokens.size());
  TRY(impl->finish());
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace fathom
