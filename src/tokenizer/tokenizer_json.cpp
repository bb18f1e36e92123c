// Loads tokenizer.json and tokenizer_config.json into Tokenizer::Impl. Every error names the JSON
// path of the problem ("tokenizer.json: pre_tokenizer.pretokenizers[2].type 'Foo' is not
// supported"); nlohmann exceptions never escape.
#include <nlohmann/json.hpp>

#include "tokenizer/json_sax.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

namespace {

using Json = nlohmann::json;

std::string at(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}
std::string at(std::string_view path, size_t i) {
  return fmt::format("{}[{}]", path, i);
}

Result<std::string> get_string(const Json& obj, std::string_view path, const char* key,
                               std::optional<std::string> def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (def) return *def;
    return invalid_argument("tokenizer.json: missing '{}'", at(path, key));
  }
  if (!it->is_string()) return invalid_argument("tokenizer.json: '{}' must be a string", at(path, key));
  return it->get<std::string>();
}

Result<bool> get_bool(const Json& obj, std::string_view path, const char* key, bool def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) return invalid_argument("tokenizer.json: '{}' must be true or false", at(path, key));
  return it->get<bool>();
}

Result<int64_t> get_int(const Json& obj, std::string_view path, const char* key, int64_t def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_number_integer())
    return invalid_argument("tokenizer.json: '{}' must be an integer", at(path, key));
  return it->get<int64_t>();
}

Result<std::string> get_type(const Json& obj, std::string_view path) {
  if (!obj.is_object()) return invalid_argument("tokenizer.json: '{}' must be an object", path);
  return get_string(obj, path, "type", std::nullopt);
}

Status unsupported(std::string_view path, std::string_view type, std::string_view supported) {
  return unimplemented("tokenizer.json: {}.type '{}' is not supported (supported: {})", path, type,
                       supported);
}

Result<Pattern> parse_pattern(const Json& obj, std::string_view path) {
  auto it = obj.find("pattern");
  if (it == obj.end() || !it->is_object())
    return invalid_argument("tokenizer.json: '{}' must be an object", at(path, "pattern"));
  Pattern p;
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    auto re = Regex::compile(r->get<std::string>());
    if (!re.ok())
      return re.status().with_context(fmt::format("tokenizer.json: {}", at(path, "pattern.Regex")));
    p.regex = std::move(*re);
    return p;
  }
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    p.literal = s->get<std::string>();
    return p;
  }
  return invalid_argument("tokenizer.json: '{}' needs a \"Regex\" or \"String\" string", at(path, "pattern"));
}

// ---- normalizer ----
Status parse_normalizer(const Json& j, std::string_view path, Normalizer* out) {
  if (j.is_null()) return {};
  const std::string type = TRY(get_type(j, path));
  NormalizerStep s{};
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      return invalid_argument("tokenizer.json: '{}' must be an array", at(path, "normalizers"));
    for (size_t i = 0; i < it->size(); ++i)
      TRY(parse_normalizer((*it)[i], at(at(path, "normalizers"), i), out));
    return {};
  } else if (type == "NFC") {
    s.kind = NormalizerKind::kNFC;
  } else if (type == "NFD") {
    s.kind = NormalizerKind::kNFD;
  } else if (type == "NFKC") {
    s.kind = NormalizerKind::kNFKC;
  } else if (type == "NFKD") {
    s.kind = NormalizerKind::kNFKD;
  } else if (type == "Lowercase") {
    s.kind = NormalizerKind::kLowercase;
  } else if (type == "Replace") {
    s.kind = NormalizerKind::kReplace;
    s.pattern = TRY(parse_pattern(j, path));
    s.content = TRY(get_string(j, path, "content", std::nullopt));
  } else if (type == "Prepend") {
    s.kind = NormalizerKind::kPrepend;
    s.content = TRY(get_string(j, path, "prepend", std::nullopt));
  } else if (type == "Strip") {
    s.kind = NormalizerKind::kStrip;
    s.strip_left = TRY(get_bool(j, path, "strip_left", true));
    s.strip_right = TRY(get_bool(j, path, "strip_right", true));
  } else {
    return unsupported(path, type, "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip");
  }
  out->steps.push_back(std::move(s));
  return {};
}

// ---- pre-tokenizer ----
Result<SplitBehavior> parse_behavior(const Json& j, std::string_view path) {
  const std::string b = TRY(get_string(j, path, "behavior", std::string("Isolated")));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(
      "tokenizer.json: {} '{}' is not one of Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous",
      at(path, "behavior"), b);
}

Result<PrependScheme> parse_prepend_scheme(const Json& j, std::string_view path) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {
    const bool add = TRY(get_bool(j, path, "add_prefix_space", true));
    return add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  const std::string s = TRY(get_string(j, path, "prepend_scheme", std::nullopt));
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  return invalid_argument("tokenizer.json: {} '{}' is not one of always, first, never",
                          at(path, "prepend_scheme"), s);
}

Status parse_pre_tokenizer(const Json& j, std::string_view path, PreTokenizer* out) {
  if (j.is_null()) return {};
  const std::string type = TRY(get_type(j, path));
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      return invalid_argument("tokenizer.json: '{}' must be an array", at(path, "pretokenizers"));
    for (size_t i = 0; i < it->size(); ++i)
      TRY(parse_pre_tokenizer((*it)[i], at(at(path, "pretokenizers"), i), out));
    return {};
  }
  if (out->byte_level) {
    return unimplemented(
        "tokenizer.json: {} ('{}') follows a ByteLevel pre-tokenizer; Fathom supports ByteLevel "
        "only as the last step",
        path, type);
  }
  PreTokenizerStep s{};
  if (type == "Split") {
    s.kind = PreKind::kSplit;
    s.pattern = TRY(parse_pattern(j, path));
    s.behavior = TRY(parse_behavior(j, path));
    s.invert = TRY(get_bool(j, path, "invert", false));
  } else if (type == "ByteLevel") {
    s.kind = PreKind::kByteLevel;
    s.add_prefix_space = TRY(get_bool(j, path, "add_prefix_space", true));
    s.use_regex = TRY(get_bool(j, path, "use_regex", true));
    if (s.use_regex) s.pattern.regex = TRY(Regex::compile(gpt2_regex()));
    out->byte_level = true;
  } else if (type == "Digits") {
    s.kind = PreKind::kDigits;
    s.individual_digits = TRY(get_bool(j, path, "individual_digits", false));
  } else if (type == "Metaspace") {
    s.kind = PreKind::kMetaspace;
    s.replacement = TRY(get_string(j, path, "replacement", std::string("\xE2\x96\x81")));
    if (s.replacement.empty() || utf8_valid_prefix(s.replacement) != s.replacement.size() ||
        static_cast<size_t>(utf8_len(static_cast<unsigned char>(s.replacement[0]))) != s.replacement.size()) {
      return invalid_argument("tokenizer.json: {} must be one character", at(path, "replacement"));
    }
    s.prepend_scheme = TRY(parse_prepend_scheme(j, path));
    s.split = TRY(get_bool(j, path, "split", true));
  } else if (type == "Whitespace") {
    s.kind = PreKind::kWhitespace;
    s.pattern.regex = TRY(Regex::compile("\\w+|[^\\w\\s]+"));
  } else if (type == "WhitespaceSplit") {
    s.kind = PreKind::kWhitespaceSplit;
  } else if (type == "Punctuation") {
    s.kind = PreKind::kPunctuation;
    s.behavior = TRY(parse_behavior(j, path));
  } else {
    return unsupported(
        path, type,
        "Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation");
  }
  out->steps.push_back(std::move(s));
  return {};
}

// ---- decoder ----
Status parse_decoder(const Json& j, std::string_view path, Decoder* out) {
  if (j.is_null()) return {};
  const std::string type = TRY(get_type(j, path));
  out->present = true;
  const bool after_fuse =
      !out->steps.empty() && std::any_of(out->steps.begin(), out->steps.end(), [](const DecoderStep& d) {
        return d.kind == DecoderKind::kFuse || d.kind == DecoderKind::kByteLevel;
      });
  DecoderStep d{};
  d.after_fuse = after_fuse;
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array())
      return invalid_argument("tokenizer.json: '{}' must be an array", at(path, "decoders"));
    for (size_t i = 0; i < it->size(); ++i) TRY(parse_decoder((*it)[i], at(at(path, "decoders"), i), out));
    return {};
  } else if (type == "ByteLevel") {
    d.kind = DecoderKind::kByteLevel;
  } else if (type == "Fuse") {
    d.kind = DecoderKind::kFuse;
  } else if (type == "ByteFallback") {
    d.kind = DecoderKind::kByteFallback;
  } else if (type == "Replace") {
    d.kind = DecoderKind::kReplace;
    Pattern p = TRY(parse_pattern(j, path));
    if (p.regex)
      return unimplemented("tokenizer.json: {}: a Regex pattern in the Replace decoder is not supported",
                           path);
    d.pattern = p.literal;
    d.content = TRY(get_string(j, path, "content", std::nullopt));
  } else if (type == "Strip") {
    d.kind = DecoderKind::kStrip;
    d.content = TRY(get_string(j, path, "content", std::string(" ")));
    d.start = static_cast<int32_t>(TRY(get_int(j, path, "start", 0)));
    d.stop = static_cast<int32_t>(TRY(get_int(j, path, "stop", 0)));
    if (d.start < 0 || d.stop < 0)
      return invalid_argument("tokenizer.json: {}: start and stop must be >= 0", path);
    if (d.after_fuse && d.stop > 0) {
      return unimplemented("tokenizer.json: {}: a Strip decoder with stop > 0 after Fuse is not supported",
                           path);
    }
  } else if (type == "Metaspace") {
    d.kind = DecoderKind::kMetaspace;
    d.replacement = TRY(get_string(j, path, "replacement", std::string("\xE2\x96\x81")));
    d.prepend = TRY(parse_prepend_scheme(j, path)) != PrependScheme::kNever;
  } else {
    return unsupported(path, type, "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip");
  }
  out->steps.push_back(std::move(d));
  return {};
}

// ---- post-processor ----
Result<TokenId> special_ids_of(const Json& j, std::string_view path, const std::string& name,
                               std::vector<TokenId>* out) {
  auto st = j.find("special_tokens");
  if (st == j.end() || !st->is_object() || !st->contains(name)) {
    return invalid_argument("tokenizer.json: {}.special_tokens has no entry '{}'", path, name);
  }
  const Json& e = (*st)[name];
  auto ids = e.find("ids");
  if (!e.is_object() || ids == e.end() || !ids->is_array()) {
    return invalid_argument("tokenizer.json: {}.special_tokens['{}'].ids must be an array", path, name);
  }
  for (const Json& id : *ids) {
    if (!id.is_number_integer())
      return invalid_argument("tokenizer.json: {}.special_tokens['{}'].ids must be integers", path, name);
    out->push_back(id.get<TokenId>());
  }
  return TokenId{0};
}

Status parse_template(const Json& j, std::string_view path, std::vector<TokenId>* prefix,
                      std::vector<TokenId>* suffix) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array())
    return invalid_argument("tokenizer.json: '{}' must be an array", at(path, "single"));
  std::vector<TokenId> pre, post;
  bool seen_a = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string ipath = at(at(path, "single"), i);
    if (item.contains("Sequence")) {
      if (seen_a) return unimplemented("tokenizer.json: {}: the sequence appears twice", ipath);
      seen_a = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
               item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
      TRY(special_ids_of(j, path, item["SpecialToken"]["id"].get<std::string>(), seen_a ? &post : &pre));
    } else {
      return invalid_argument(
          "tokenizer.json: {} must be {{\"Sequence\": ...}} or {{\"SpecialToken\": {{\"id\": ...}}}}", ipath);
    }
  }
  prefix->insert(prefix->begin(), pre.begin(), pre.end());
  suffix->insert(suffix->end(), post.begin(), post.end());
  return {};
}

Status parse_post_processor(const Json& j, std::string_view path, const StringIdMap& vocab,
                            std::vector<TokenId>* prefix, std::vector<TokenId>* suffix) {
  if (j.is_null()) return {};
  const std::string type = TRY(get_type(j, path));
  if (type == "ByteLevel") return {};
  if (type == "TemplateProcessing") return parse_template(j, path, prefix, suffix);
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      return invalid_argument("tokenizer.json: '{}' must be an array", at(path, "processors"));
    for (size_t i = 0; i < it->size(); ++i) {
      TRY(parse_post_processor((*it)[i], at(at(path, "processors"), i), vocab, prefix, suffix));
    }
    return {};
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
        return invalid_argument("tokenizer.json: '{}' must be [token, id]", at(path, key));
      }
      (std::string_view(key) == "cls" ? prefix : suffix)->push_back((*it)[1].get<TokenId>());
    }
    return {};
  }
  return unsupported(path, type,
                     "TemplateProcessing, ByteLevel, Sequence, RobertaProcessing, BertProcessing");
}

// ---- model ----
Status parse_merges(const Json& m, std::vector<std::pair<std::string, std::string>>* out) {
  auto it = m.find("merges");
  if (it == m.end() || it->is_null()) return {};
  if (!it->is_array()) return invalid_argument("tokenizer.json: 'model.merges' must be an array");
  out->reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument(
            "tokenizer.json: model.merges[{}] '{}' is not two tokens separated by one space", i, s);
      }
      out->emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      out->emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return invalid_argument("tokenizer.json: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", i);
    }
  }
  return {};
}

Result<std::unique_ptr<BpeModel>> parse_model(ParsedTokenizerJson& parsed, bool byte_level) {
  const Json& j = parsed.dom;
  auto mit = j.find("model");
  if (mit == j.end() || !mit->is_object())
    return invalid_argument("tokenizer.json: missing 'model' (an object)");
  const Json& m = *mit;
  const std::string type = TRY(get_string(m, "model", "type", std::string("BPE")));
  if (type != "BPE") return unsupported("model", type, "BPE");
  if (!parsed.vocab) return invalid_argument("tokenizer.json: missing 'model.vocab' (an object)");
  StringIdMap vocab = std::move(*parsed.vocab);
  std::vector<std::pair<std::string, std::string>> merges;
  if (parsed.merges) {
    merges = std::move(*parsed.merges);
  } else {
    TRY(parse_merges(m, &merges));  // absent, null, or not an array (an error)
  }
  BpeOptions o;
  if (auto u = m.find("unk_token"); u != m.end() && u->is_string()) o.unk_token = u->get<std::string>();
  o.fuse_unk = TRY(get_bool(m, "model", "fuse_unk", false));
  o.byte_fallback = TRY(get_bool(m, "model", "byte_fallback", false));
  o.ignore_merges = TRY(get_bool(m, "model", "ignore_merges", false));
  o.continuing_subword_prefix = TRY(get_string(m, "model", "continuing_subword_prefix", std::string()));
  o.end_of_word_suffix = TRY(get_string(m, "model", "end_of_word_suffix", std::string()));
  if (auto d = m.find("dropout"); d != m.end() && d->is_number() && d->get<double>() > 0) {
    return unimplemented(
        "tokenizer.json: model.dropout {} is not supported (Fathom encodes deterministically)",
        d->get<double>());
  }
  return BpeModel::create(std::move(vocab), merges, o, byte_level);
}

Status parse_added_tokens(const Json& j, std::vector<AddedToken>* out) {
  auto it = j.find("added_tokens");
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_array()) return invalid_argument("tokenizer.json: 'added_tokens' must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    const std::string path = at("added_tokens", i);
    if (!e.is_object()) return invalid_argument("tokenizer.json: '{}' must be an object", path);
    AddedToken t;
    t.content = TRY(get_string(e, path, "content", std::nullopt));
    const int64_t id = TRY(get_int(e, path, "id", -1));
    if (id < 0 || id >= (int64_t{1} << 30))
      return invalid_argument("tokenizer.json: '{}' needs an id >= 0", at(path, "id"));
    t.id = static_cast<int32_t>(id);
    t.special = TRY(get_bool(e, path, "special", false));
    t.normalized = TRY(get_bool(e, path, "normalized", !t.special));
    t.lstrip = TRY(get_bool(e, path, "lstrip", false));
    t.rstrip = TRY(get_bool(e, path, "rstrip", false));
    t.single_word = TRY(get_bool(e, path, "single_word", false));
    t.control = t.special || looks_like_control_token(t.content);
    out->push_back(std::move(t));
  }
  return {};
}

// tokenizer_config.json: a token is a string or {"content": ...}.
Result<std::optional<std::string>> config_token(const Json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return invalid_argument("tokenizer_config.json: '{}' must be a string or an object with \"content\"", key);
}

Result<TokenId> config_token_id(const Tokenizer::Impl& impl, const std::string& token, const char* key) {
  for (const AddedToken& t : impl.added) {
    if (t.content == token) return t.id;
  }
  auto it = impl.model->vocab().find(token);
  if (it != impl.model->vocab().end()) return it->second;
  return invalid_argument("tokenizer_config.json: {} '{}' is not in the vocabulary", key, token);
}

Status apply_config(std::string_view config_text, Tokenizer::Impl* impl) {
  if (config_text.empty()) return {};
  Json c = Json::parse(config_text.begin(), config_text.end(), nullptr, /*allow_exceptions=*/false);
  if (c.is_discarded() || !c.is_object()) return invalid_argument("tokenizer_config.json: not a JSON object");
  struct Named {
    const char* key;
    std::string* text;
    TokenId* id;
  };
  std::string pad_text, unk_text;
  for (Named n :
       {Named{"bos_token", &impl->bos_token, &impl->bos}, Named{"eos_token", &impl->eos_token, &impl->eos},
        Named{"pad_token", &pad_text, &impl->pad}, Named{"unk_token", &unk_text, &impl->unk}}) {
    auto t = TRY(config_token(c, n.key));
    if (!t) continue;
    *n.text = *t;
    *n.id = TRY(config_token_id(*impl, *t, n.key));
  }
  const bool has_bos_flag = c.contains("add_bos_token"), has_eos_flag = c.contains("add_eos_token");
  if (has_bos_flag || has_eos_flag) {
    // transformers' Llama/Gemma tokenizers rebuild the post-processor from these flags.
    const bool add_bos = c.value("add_bos_token", false) == true;
    const bool add_eos = c.value("add_eos_token", false) == true;
    if ((add_bos && impl->bos == kNoToken) || (add_eos && impl->eos == kNoToken)) {
      return invalid_argument("tokenizer_config.json: add_{}_token is true but {}_token is not set",
                              add_bos ? "bos" : "eos", add_bos ? "bos" : "eos");
    }
    impl->prefix_ids.clear();
    impl->suffix_ids.clear();
    if (add_bos) impl->prefix_ids.push_back(impl->bos);
    if (add_eos) impl->suffix_ids.push_back(impl->eos);
  }
  if (auto it = c.find("chat_template"); it != c.end()) {
    if (it->is_string()) {
      impl->chat_template = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const Json& e : *it) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          impl->chat_template = e["template"].get<std::string>();
        }
      }
    }
  }
  return {};
}

Result<std::unique_ptr<Tokenizer::Impl>> load(std::string_view tokenizer_json, std::string_view config_json) {
  ParsedTokenizerJson parsed = TRY(parse_tokenizer_json_text(tokenizer_json));
  const Json& j = parsed.dom;
  if (!j.is_object()) return invalid_argument("tokenizer.json: the top level must be an object");
  auto impl = std::make_unique<Tokenizer::Impl>();
  auto get = [&](const char* key) -> const Json& {
    static const Json kNull;
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  TRY(parse_normalizer(get("normalizer"), "normalizer", &impl->normalizer));
  TRY(parse_pre_tokenizer(get("pre_tokenizer"), "pre_tokenizer", &impl->pre_tokenizer));
  TRY(parse_decoder(get("decoder"), "decoder", &impl->decoder));
  impl->model = TRY(parse_model(parsed, impl->pre_tokenizer.byte_level));
  TRY(parse_added_tokens(j, &impl->added));
  TRY(parse_post_processor(get("post_processor"), "post_processor", impl->model->vocab(), &impl->prefix_ids,
                           &impl->suffix_ids));
  TRY(apply_config(config_json, impl.get()));
  if (impl->unk == kNoToken && !impl->model->options().unk_token.empty()) {
    impl->unk = impl->model->vocab().at(impl->model->options().unk_token);
  }
  TRY(impl->finish());
  return impl;
}

}  // namespace

Result<std::unique_ptr<Tokenizer::Impl>> load_tokenizer_json(std::string_view tokenizer_json,
                                                             std::string_view config_json) {
  try {
    return load(tokenizer_json, config_json);
  } catch (const std::exception& e) {  // a JSON accessor the checks above missed
    return invalid_argument("tokenizer.json: {}", e.what());
  }
}

}  // namespace fathom::tok
