// Tokenizer: encode (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor),
// decode, accessors and the streaming decoder. Loading lives in tokenizer_json.cpp and
// vocab_data.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "base/fs.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace fathom {

bool Tokenizer::Impl::token_string(TokenId id, std::string_view* out) const {
  if (id < 0 || id >= vocab_size) return false;
  if (const int32_t a = added_index_by_id[id]; a >= 0) {
    *out = added[a].content;
    return true;
  }
  return model->id_to_token(id, out);
}

bool Tokenizer::Impl::is_special(TokenId id) const {
  if (id < 0 || id >= vocab_size) return false;
  const int32_t a = added_index_by_id[id];
  return a >= 0 && added[a].special;
}

Status Tokenizer::Impl::finish() {
  vocab_size = std::max(model->max_id() + 1, min_vocab_size);
  for (const tok::AddedToken& t : added) vocab_size = std::max(vocab_size, t.id + 1);
  added_index_by_id.assign(static_cast<size_t>(vocab_size), -1);
  std::vector<int32_t> raw_idx, norm_idx;
  std::vector<std::string> raw_pat, norm_pat;
  for (size_t k = 0; k < added.size(); ++k) {
    const tok::AddedToken& t = added[k];
    if (added_index_by_id[t.id] >= 0) {
      return invalid_argument("tokenizer.json: added_tokens: id {} is used twice ('{}' and '{}')", t.id,
                              added[added_index_by_id[t.id]].content, t.content);
    }
    added_index_by_id[t.id] = static_cast<int32_t>(k);
    if (!t.normalized || normalizer.empty()) {
      raw_idx.push_back(static_cast<int32_t>(k));
      raw_pat.push_back(t.content);
    } else {
      std::string p;
      TRY(normalizer.apply(t.content, &p));
      norm_idx.push_back(static_cast<int32_t>(k));
      norm_pat.push_back(std::move(p));
    }
  }
  raw_matcher.build(&added, raw_idx, raw_pat);
  normalized_matcher.build(&added, norm_idx, norm_pat);
  for (TokenId id : prefix_ids) {
    if (id < 0 || id >= vocab_size)
      return invalid_argument("tokenizer.json: post_processor names id {} outside the vocabulary", id);
  }
  for (TokenId id : suffix_ids) {
    if (id < 0 || id >= vocab_size)
      return invalid_argument("tokenizer.json: post_processor names id {} outside the vocabulary", id);
  }
  types.assign(static_cast<size_t>(vocab_size), TokenType::kUnused);
  for (TokenId id = 0; id < vocab_size; ++id) {
    std::string_view s;
    if (const int32_t a = added_index_by_id[id]; a >= 0) {
      types[id] = added[a].control ? TokenType::kControl : TokenType::kUserDefined;
    } else if (model->id_to_token(id, &s)) {
      const bool byte_token =
          model->options().byte_fallback && s.size() == 6 && s.starts_with("<0x") && s.ends_with(">");
      types[id] = id == unk ? TokenType::kUnknown : byte_token ? TokenType::kByte : TokenType::kNormal;
    }
  }
  auto find = [&](std::string_view s) -> TokenId {
    for (const tok::AddedToken& t : added) {
      if (t.content == s) return t.id;
    }
    auto it = model->vocab().find(s);
    return it == model->vocab().end() ? kNoToken : it->second;
  };
  chat.user = find("<｜User｜>");
  chat.assistant = find("<｜Assistant｜>");
  chat.tool_calls_begin = find("<｜tool▁calls▁begin｜>");
  chat.tool_calls_end = find("<｜tool▁calls▁end｜>");
  chat.tool_call_begin = find("<｜tool▁call▁begin｜>");
  chat.tool_call_end = find("<｜tool▁call▁end｜>");
  chat.tool_sep = find("<｜tool▁sep｜>");
  chat.tool_outputs_begin = find("<｜tool▁outputs▁begin｜>");
  chat.tool_outputs_end = find("<｜tool▁outputs▁end｜>");
  chat.tool_output_begin = find("<｜tool▁output▁begin｜>");
  chat.tool_output_end = find("<｜tool▁output▁end｜>");
  chat.eot = find("<|EOT|>");
  chat.fim_hole = find("<｜fim▁hole｜>");
  chat.fim_begin = find("<｜fim▁begin｜>");
  chat.fim_end = find("<｜fim▁end｜>");
  fast_decode =
      decoder.present && decoder.steps.size() == 1 && decoder.steps[0].kind == tok::DecoderKind::kByteLevel;
  if (fast_decode) {
    decoded_bytes.assign(static_cast<size_t>(vocab_size), std::string());
    for (TokenId id = 0; id < vocab_size; ++id) {
      std::string_view s;
      if (!token_string(id, &s)) continue;
      if (!tok::byte_level_to_bytes(s, &decoded_bytes[id])) decoded_bytes[id].assign(s);
    }
  }
  return {};
}

Status Tokenizer::Impl::encode_section(std::string_view text, bool first, bool untrusted,
                                       tok::BpeModel::Session* bpe, std::vector<TokenId>* out) const {
  auto emit_piece = [&](std::string_view piece) -> Status {
    bpe->encode_piece(piece, out);
    return {};
  };
  auto on_token = [&](int32_t id) { out->push_back(id); };
  if (normalizer.empty()) {
    return normalized_matcher.split(
        text, untrusted,
        [&](std::string_view run, size_t off) {
          return pre_tokenizer.run(run, first && off == 0, emit_piece);
        },
        on_token);
  }
  std::string normalized;
  TRY(normalizer.apply(text, &normalized));
  return normalized_matcher.split(
      normalized, untrusted,
      [&](std::string_view run, size_t off) { return pre_tokenizer.run(run, first && off == 0, emit_piece); },
      on_token);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                        std::string_view config_json) {
  auto impl = TRY(tok::load_tokenizer_json(tokenizer_json, config_json));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_files(const std::string& path,
                                                         const std::string& config_path) {
  std::string json_path = path, dir;
  if (is_directory(path)) {
    dir = path;
    json_path = path + "/tokenizer.json";
  } else {
    const size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  if (!path_exists(json_path)) return not_found("tokenizer: '{}' does not exist", json_path);
  const std::string json = TRY(read_file(json_path));
  std::string config;
  const std::string cfg_path = config_path.empty() ? dir + "/tokenizer_config.json" : config_path;
  if (!config_path.empty() || path_exists(cfg_path)) config = TRY(read_file(cfg_path));
  auto impl = tok::load_tokenizer_json(json, config);
  if (!impl.ok()) return impl.status().with_context(json_path);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(*impl)));
}

Status Tokenizer::encode_into(std::string_view text, const EncodeOptions& options,
                              std::vector<TokenId>* out) const {
  TRY(tok::validate_utf8(text, "encode"));
  const Impl& m = *impl_;
  if (options.add_special) out->insert(out->end(), m.prefix_ids.begin(), m.prefix_ids.end());
  tok::BpeModel::Session bpe(*m.model);
  TRY(m.raw_matcher.split(
      text, options.untrusted,
      [&](std::string_view run, size_t off) {
        return m.encode_section(run, off == 0, options.untrusted, &bpe, out);
      },
      [&](int32_t id) { out->push_back(id); }));
  if (options.add_special) out->insert(out->end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return {};
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  TRY(encode_into(text, options, &ids));
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  const Impl& m = *impl_;
  std::string bytes;
  tok::Decoder::State st = m.decoder.initial_state();
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    std::string_view s;
    if (!m.token_string(id, &s)) {
      return out_of_range("decode: id {} at position {} is not a token (vocabulary size {})", id, i,
                          m.vocab_size);
    }
    if (options.skip_special && m.is_special(id)) continue;
    if (m.fast_decode) {
      bytes += m.decoded_bytes[id];
    } else {
      m.decoder.decode_token(s, &st, &bytes);
    }
  }
  std::string text;
  text.reserve(bytes.size());
  tok::utf8_append_lossy(bytes, &text, /*hold_incomplete=*/false);
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  for (const tok::AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  auto it = impl_->model->vocab().find(token);
  if (it == impl_->model->vocab().end()) return std::nullopt;
  return it->second;
}

Result<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  std::string_view s;
  if (!impl_->token_string(id, &s))
    return out_of_range("id {} is not a token (vocabulary size {})", id, impl_->vocab_size);
  return s;
}

Result<std::string> Tokenizer::token_bytes(TokenId id) const {
  std::string_view s;
  if (!impl_->token_string(id, &s))
    return out_of_range("id {} is not a token (vocabulary size {})", id, impl_->vocab_size);
  if (impl_->fast_decode) return impl_->decoded_bytes[id];
  std::string out;
  tok::Decoder::State st = impl_->decoder.initial_state();
  st.index = 1;  // not the first token: no prefix stripping
  impl_->decoder.decode_token(s, &st, &out);
  return out;
}

TokenType Tokenizer::token_type(TokenId id) const {
  return id >= 0 && id < impl_->vocab_size ? impl_->types[id] : TokenType::kUnused;
}
bool Tokenizer::is_special(TokenId id) const {
  return impl_->is_special(id);
}
TokenId Tokenizer::bos_id() const {
  return impl_->bos;
}
TokenId Tokenizer::eos_id() const {
  return impl_->eos;
}
TokenId Tokenizer::pad_id() const {
  return impl_->pad;
}
TokenId Tokenizer::unk_id() const {
  return impl_->unk;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
bool Tokenizer::add_bos() const {
  return impl_->bos != kNoToken &&
         std::find(impl_->prefix_ids.begin(), impl_->prefix_ids.end(), impl_->bos) != impl_->prefix_ids.end();
}
bool Tokenizer::add_eos() const {
  return impl_->eos != kNoToken &&
         std::find(impl_->suffix_ids.begin(), impl_->suffix_ids.end(), impl_->eos) != impl_->suffix_ids.end();
}
const ChatTokenIds& Tokenizer::chat_tokens() const {
  return impl_->chat;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}

TokenizerStats Tokenizer::stats() const {
  return {impl_->model->cache_hits(), impl_->model->cache_misses()};
}

// ---- StreamDecoder ----

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, const DecodeOptions& options)
    : tokenizer_(&tokenizer), options_(options) {
  reset();
}

void StreamDecoder::reset() {
  pending_.clear();
  state_ = tokenizer_->impl().decoder.initial_state();
}

Status StreamDecoder::push(TokenId id, std::string* out) {
  const Tokenizer::Impl& m = tokenizer_->impl();
  std::string_view s;
  if (!m.token_string(id, &s)) {
    return out_of_range("decode: id {} is not a token (vocabulary size {})", id, m.vocab_size);
  }
  if (options_.skip_special && m.is_special(id)) return {};
  if (m.fast_decode) {
    pending_ += m.decoded_bytes[id];
  } else {
    m.decoder.decode_token(s, &state_, &pending_);
  }
  const size_t held = tok::utf8_append_lossy(pending_, out, /*hold_incomplete=*/true);
  pending_.erase(0, pending_.size() - held);
  return {};
}

void StreamDecoder::finish(std::string* out) {
  tok::utf8_append_lossy(pending_, out, /*hold_incomplete=*/false);
  reset();
}

}  // namespace fathom
