// Internal: Tokenizer's state (the loaded pipeline) shared by the loader, the encoder/decoder,
// the GGUF vocabulary conversion and the streaming decoder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

struct Tokenizer::Impl {
  tok::Normalizer normalizer;
  tok::PreTokenizer pre_tokenizer;
  std::unique_ptr<tok::BpeModel> model;
  tok::Decoder decoder;

  std::vector<tok::AddedToken> added;      // in tokenizer.json order
  std::vector<int32_t> added_index_by_id;  // id -> index into added, -1
  tok::AddedTokenMatcher raw_matcher, normalized_matcher;

  // Post-processing for one sequence with add_special.
  std::vector<TokenId> prefix_ids, suffix_ids;

  int32_t vocab_size = 0;
  int32_t min_vocab_size = 0;              // GGUF vocabularies padded with unused ids
  std::vector<TokenType> types;            // by id
  std::vector<std::string> decoded_bytes;  // by id, when the decoder is exactly ByteLevel
  bool fast_decode = false;

  TokenId bos = kNoToken, eos = kNoToken, pad = kNoToken, unk = kNoToken;
  std::string bos_token, eos_token, chat_template;
  ChatTokenIds chat;

  // Token string of an id (added token content or model token); false if the id has none.
  bool token_string(TokenId id, std::string_view* out) const;
  bool is_special(TokenId id) const;
  // Fills added_index_by_id, matchers, types, chat ids, the fast decode table, vocab_size.
  Status finish();
  Status encode_section(std::string_view text, bool first, bool untrusted, tok::BpeModel::Session* bpe,
                        std::vector<TokenId>* out) const;
};

namespace tok {
// tokenizer.json (+ tokenizer_config.json) -> Impl. Errors name the JSON path of the problem.
Result<std::unique_ptr<Tokenizer::Impl>> load_tokenizer_json(std::string_view tokenizer_json,
                                                             std::string_view config_json);
// The llama.cpp pre-tokenizer name -> the Hugging Face pipeline it stands for.
struct PreTokenizerPreset {
  std::string name;
  std::vector<std::string> split_regexes;  // Split(Isolated) steps, in order
  bool byte_level_regex = false;           // ByteLevel(use_regex=true) instead of Splits
  bool ignore_merges = false;
  bool llama_cpp = true;  // false: Fathom's own name, which llama.cpp's GGUF loader refuses
};
const std::vector<PreTokenizerPreset>& pre_tokenizer_presets();
Result<const PreTokenizerPreset*> find_pre_tokenizer_preset(std::string_view name);
// Builds the pre-tokenizer of a preset.
Result<PreTokenizer> build_pre_tokenizer(const PreTokenizerPreset& preset);
// The GPT-2 regex ByteLevel uses with use_regex.
const std::string& gpt2_regex();
}  // namespace tok

}  // namespace fathom
