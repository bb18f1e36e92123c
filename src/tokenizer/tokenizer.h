// Tokenizer: Hugging Face `tokenizer.json` byte-level BPE (DeepSeek-V3's and our own), producing
// exactly the ids the Hugging Face `tokenizers` library produces, plus decoding, streaming
// decoding, a format-independent vocabulary description (for GGUF), a built-in tokenizer for
// synthetic checkpoints and a byte-level BPE trainer. The chat template and the tool-call parser
// live in chat_template.h.
//
// Supported tokenizer.json parts (anything else is a clear kUnimplemented error at load):
//   model          BPE (merges as "a b" strings or ["a","b"] pairs; unk_token, fuse_unk,
//                  byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix)
//   normalizer     Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip
//   pre_tokenizer  Sequence, Split (Regex/String, every behavior, invert), ByteLevel, Digits,
//                  Metaspace, Whitespace, WhitespaceSplit, Punctuation
//   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
//   post_processor TemplateProcessing, ByteLevel, Sequence (+ add_bos/eos from tokenizer_config)
// Regexes run on PCRE2 (UTF + UCP + JIT), translated so that \s, \w, \h and ^/$ mean what they
// mean in Oniguruma, the engine Hugging Face uses.
//
// Thread safety: a Tokenizer is immutable after construction except for an internal, locked
// word cache; encode/decode may be called from any number of threads at once. StreamDecoder is
// one stream's state and is not shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// llama.cpp's LLAMA_TOKEN_TYPE values, as stored in GGUF `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special tokens: BOS/EOS, chat and tool markers; never produced from untrusted text
  kUserDefined = 4,  // added tokens that are ordinary text
  kUnused = 5,       // ids with no token (padding up to the model's vocab_size)
  kByte = 6,         // <0xNN> byte-fallback tokens
};

struct EncodeOptions {
  // Add BOS/EOS as tokenizer_config.json says (add_bos_token / add_eos_token) or as the
  // post-processor template says. Off: the ids of the text only.
  bool add_special = false;
  // The text comes from a user: control-token strings in it ("<｜Assistant｜>") are plain text,
  // tokenized like any other characters. Off: they become their control token (as Hugging Face).
  bool untrusted = false;
};

struct DecodeOptions {
  bool skip_special = false;  // drop tokens marked "special" in tokenizer.json (as Hugging Face)
};

// The ids of DeepSeek's chat and tool-call tokens, kNoToken where the vocabulary lacks one.
struct ChatTokenIds {
  TokenId user = kNoToken;                // <｜User｜>
  TokenId assistant = kNoToken;           // <｜Assistant｜>
  TokenId tool_calls_begin = kNoToken;    // <｜tool▁calls▁begin｜>
  TokenId tool_calls_end = kNoToken;      // <｜tool▁calls▁end｜>
  TokenId tool_call_begin = kNoToken;     // <｜tool▁call▁begin｜>
  TokenId tool_call_end = kNoToken;       // <｜tool▁call▁end｜>
  TokenId tool_sep = kNoToken;            // <｜tool▁sep｜>
  TokenId tool_outputs_begin = kNoToken;  // <｜tool▁outputs▁begin｜>
  TokenId tool_outputs_end = kNoToken;    // <｜tool▁outputs▁end｜>
  TokenId tool_output_begin = kNoToken;   // <｜tool▁output▁begin｜>
  TokenId tool_output_end = kNoToken;     // <｜tool▁output▁end｜>
  TokenId eot = kNoToken;                 // <|EOT|>
  TokenId fim_hole = kNoToken, fim_begin = kNoToken, fim_end = kNoToken;
};

// A vocabulary described independently of any file format: what GGUF stores under
// tokenizer.ggml.* (the lead's GGUF writer/reader maps these fields one to one). A tokenizer
// rebuilt from it encodes exactly like the tokenizer.json it came from.
struct VocabData {
  std::string model = "gpt2";        // tokenizer.ggml.model: byte-level BPE
  std::string pre;                   // tokenizer.ggml.pre: llama.cpp pre-tokenizer name, e.g. "deepseek-v3"
  bool pre_llama_cpp = true;  // false: `pre` is Fathom's own name (fathom-isolated), which llama.cpp refuses
  std::vector<std::string> tokens;   // by id, in the model's vocabulary form (byte-level chars)
  std::vector<int32_t> token_types;  // TokenType values, one per token
  std::vector<std::string> merges;   // "a b", by rank
  int32_t bos_id = kNoToken, eos_id = kNoToken, pad_id = kNoToken;
  bool add_bos = false, add_eos = false;
  std::string chat_template;
};

struct TokenizerStats {
  int64_t cache_hits = 0, cache_misses = 0;
};

class Tokenizer {
 public:
  // `path` is a directory holding tokenizer.json (and optionally tokenizer_config.json) or the
  // path of a tokenizer.json. `config_path` overrides where tokenizer_config.json is read from.
  static Result<std::unique_ptr<Tokenizer>> from_files(const std::string& path,
                                                       const std::string& config_path = "");
  // From the texts of tokenizer.json and tokenizer_config.json (config may be empty).
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view tokenizer_json,
                                                      std::string_view config_json = {});
  static Result<std::unique_ptr<Tokenizer>> from_vocab_data(const VocabData& data);
  // The built-in tokenizer (builtin_tokenizer_json(), below).
  static Result<std::unique_ptr<Tokenizer>> from_builtin();
  ~Tokenizer();

  // Text must be valid UTF-8 (an error names the byte offset otherwise).
  Result<std::vector<TokenId>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Appends to *out; no allocation beyond out's growth and the word cache.
  Status encode_into(std::string_view text, const EncodeOptions& options, std::vector<TokenId>* out) const;
  // Ids outside [0, vocab_size()) or without a token are an error naming the id. Bytes that do
  // not form UTF-8 become U+FFFD, as Hugging Face's decode does.
  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // Number of ids: one past the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The token's string as tokenizer.json spells it (byte-level form for BPE: "Ġthe").
  Result<std::string_view> id_to_token(TokenId id) const;
  // The raw text bytes the token stands for when decoded alone (" the"); may be partial UTF-8.
  Result<std::string> token_bytes(TokenId id) const;
  TokenType token_type(TokenId id) const;  // kUnused for ids without a token or out of range
  bool is_special(TokenId id) const;       // "special": true in tokenizer.json

  TokenId bos_id() const;  // kNoToken when the tokenizer has none
  TokenId eos_id() const;
  TokenId pad_id() const;
  TokenId unk_id() const;
  const std::string& bos_token() const;  // the strings, "" when absent
  const std::string& eos_token() const;
  bool add_bos() const;
  bool add_eos() const;
  const ChatTokenIds& chat_tokens() const;
  // tokenizer_config.json's chat_template ("" when absent).
  const std::string& chat_template() const;

  Result<VocabData> vocab_data() const;
  TokenizerStats stats() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Decoder state carried from token to token (which token comes first, prefix stripping); an
// implementation detail of StreamDecoder, public only so StreamDecoder can hold it by value.
struct DecodeState {
  int64_t index = 0;          // tokens decoded so far
  bool emitted = false;       // some text was produced
  std::vector<int32_t> left;  // per decoder step: leading characters still to strip
};

// Incremental detokenizer for streaming: push ids as they are generated and get back only
// complete UTF-8 text; the concatenation of everything push() and finish() return equals
// decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, const DecodeOptions& options = {});
  // Appends newly complete text to *out (possibly nothing). An invalid id is an error and
  // leaves the state unchanged.
  Status push(TokenId id, std::string* out);
  // Flushes held-back bytes (an incomplete UTF-8 sequence becomes U+FFFD) and resets.
  void finish(std::string* out);
  void reset();

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;  // bytes not yet emitted: an incomplete UTF-8 sequence at the end
  DecodeState state_;
};

// A small (~4k tokens) byte-level BPE tokenizer for synthetic checkpoints, trained
// deterministically at first use by train_bpe() on text generated from a fixed seed. It carries
// DeepSeek-V3's special and chat tokens (same strings and flags), DeepSeek-V3's pre-tokenizer
// and, in the config, DeepSeek-V3's chat template. Identical output on every call and machine.
const std::string& builtin_tokenizer_json();
const std::string& builtin_tokenizer_config_json();
// DeepSeek-V3's chat template, as its tokenizer_config.json carries it.
const std::string& deepseek_v3_chat_template();

// Byte-level BPE training (`fathom tokenizer train`).
struct BpeTrainParams {
  int32_t vocab_size = 4096;        // total, special tokens and the 256 byte tokens included
  int64_t min_frequency = 2;        // a pair seen fewer times is never merged
  std::string pre = "deepseek-v3";  // llama.cpp pre-tokenizer name whose regexes split words
  // Added tokens; the first three are BOS, EOS and PAD. Default: DeepSeek-V3's.
  std::vector<std::string> special_tokens;
  bool add_bos = true;
  int32_t max_word_bytes = 64;  // longer pre-tokens are skipped when counting
};
struct BpeTrainResult {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t n_merges = 0;
  int64_t n_words = 0, n_unique_words = 0;
};
// Trains on `texts` (each pre-tokenized separately); deterministic for the same input.
Result<BpeTrainResult> train_bpe(const std::vector<std::string_view>& texts, const BpeTrainParams& params);
// DeepSeek-V3's special and chat tokens in the order the trainer and builtin use them.
std::vector<std::string> deepseek_v3_special_tokens();

}  // namespace fathom
