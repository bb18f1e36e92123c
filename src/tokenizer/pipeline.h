// Internal: the stages of a Hugging Face tokenizer pipeline other than the model — normalizer,
// pre-tokenizer, decoder — as plain structs built by the tokenizer.json loader (or from a llama.cpp
// pre-tokenizer name) and run by Tokenizer. Semantics follow the Rust `tokenizers` crate; see
// docs/tokenizer.md for the few documented differences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/function_ref.h"
#include "base/status.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"

namespace fathom::tok {

// A Split/Replace pattern: a literal string or a regex.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  // Appends the matches in `text` as (begin, end) byte ranges, left to right, non-overlapping.
  Status find(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;
  std::string describe() const;
};

// ---- Normalizers ------------------------------------------------------------------------------
enum class NormalizerKind : uint8_t { kNFC, kNFD, kNFKC, kNFKD, kLowercase, kReplace, kPrepend, kStrip };
struct NormalizerStep {
  NormalizerKind kind;
  Pattern pattern;      // kReplace
  std::string content;  // kReplace (replacement), kPrepend
  bool strip_left = false, strip_right = false;
};
struct Normalizer {
  std::vector<NormalizerStep> steps;
  bool empty() const { return steps.empty(); }
  Status apply(std::string_view in, std::string* out) const;
};

// ---- Pre-tokenizers ---------------------------------------------------------------------------
enum class SplitBehavior : uint8_t { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme : uint8_t { kAlways, kFirst, kNever };
enum class PreKind : uint8_t {
  kSplit,
  kByteLevel,
  kDigits,
  kMetaspace,
  kWhitespace,
  kWhitespaceSplit,
  kPunctuation
};

struct PreTokenizerStep {
  PreKind kind;
  Pattern pattern;  // kSplit; kByteLevel with use_regex (GPT-2's regex); kWhitespace
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;             // kByteLevel
  bool use_regex = true;                     // kByteLevel
  bool individual_digits = false;            // kDigits
  std::string replacement = "\xE2\x96\x81";  // kMetaspace: U+2581
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;  // kMetaspace
};

struct PreTokenizer {
  std::vector<PreTokenizerStep> steps;
  // The last step is ByteLevel: pieces are raw bytes that the model maps through the byte-level
  // alphabet (Fathom never materialises the mapped string).
  bool byte_level = false;
  // Runs every step on `text` (one section of normalized text); `first` says the section starts
  // at offset 0 of the input (Metaspace's "first" prepend scheme). Calls emit for each piece.
  Status run(std::string_view text, bool first, FunctionRef<Status(std::string_view)> emit) const;
};

// A Split-with-behavior over (begin, end, is_match) segments, as NormalizedString::split does.
struct Segment {
  size_t begin, end;
  bool is_match;
};
void apply_split_behavior(SplitBehavior behavior, std::vector<Segment>* segments);

// ---- Decoders ---------------------------------------------------------------------------------
enum class DecoderKind : uint8_t { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
struct DecoderStep {
  DecoderKind kind;
  std::string pattern, content;  // kReplace (literal), kStrip (content character)
  std::string replacement;       // kMetaspace
  bool prepend = true;           // kMetaspace: drop the replacement at the start of the text
  int32_t start = 0, stop = 0;   // kStrip
  bool after_fuse = false;       // the step sees the whole text, not one token
};
struct Decoder {
  bool present = false;  // no decoder: tokens are joined with spaces
  std::vector<DecoderStep> steps;
  using State = DecodeState;
  State initial_state() const;
  // Appends the bytes token contributes (may be partial UTF-8).
  void decode_token(std::string_view token, State* state, std::string* out) const;
};

}  // namespace fathom::tok
