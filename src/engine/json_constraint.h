// Constrained decoding for response_format {"type": "json_object"}: a byte-level pushdown
// automaton accepting exactly one JSON object (RFC 8259: strings with escapes and valid UTF-8,
// numbers of at most 20 digits and a two-digit exponent, literals, nesting up to 64 levels,
// whitespace anywhere between tokens), and a mask
// builder that walks a trie of every token's bytes from the current state, so the sampler can
// only pick tokens that keep the output a prefix of valid JSON; EOS is allowed once the object
// is complete, and only whitespace after it.
//
// Thread safety: JsonVocab is immutable after create (share it); a JsonMatcher is one request's state.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom {

class Tokenizer;

class JsonMatcher {
 public:
  static constexpr int kMaxDepth = 64;
  // Feeds one byte; false (state unchanged) if the byte cannot continue valid JSON.
  bool feed(uint8_t byte);
  bool feed(std::string_view bytes);  // all or nothing
  bool complete() const { return state_ == State::kDone; }

 private:
  enum class State : uint8_t {
    kStart, kValue, kKeyOrEnd, kKey, kColon, kAfterValue, kString, kEscape, kUnicode,
    kMinus, kZero, kInt, kFracStart, kFrac, kExpStart, kExpSign, kExp, kLiteral, kDone,
  };
  bool feed_inner(uint8_t byte);
  bool end_value();
  bool close(uint8_t byte);
  State state_ = State::kStart;
  bool in_key_ = false;
  uint8_t depth_ = 0;
  uint8_t aux_ = 0;          // unicode digits left, literal index, utf-8 continuation bytes left
  uint8_t literal_ = 0;      // 0 true, 1 false, 2 null
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // allowed range of the next continuation byte
  std::array<uint8_t, kMaxDepth> stack_{};  // '{' or '['
};

// The vocabulary as a byte trie, built once per tokenizer.
class JsonVocab {
 public:
  static Result<std::unique_ptr<JsonVocab>> create(const Tokenizer& tok, int32_t vocab_size);
  // Sets bit t of allowed[] (vocab_size bits, zeroed here) for every token whose bytes the
  // matcher accepts from `state`; EOS when the object is complete.
  void mask(const JsonMatcher& state, uint64_t* allowed) const;
  int32_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return static_cast<size_t>((vocab_size_ + 63) / 64); }

 private:
  struct Node {
    uint32_t first_child = 0;  // index into children_
    uint16_t n_children = 0;
    int32_t token = -1;        // a token ending here (or -1)
  };
  void walk(uint32_t node, const JsonMatcher& state, uint64_t* allowed) const;
  std::vector<Node> nodes_;
  std::vector<std::pair<uint8_t, uint32_t>> children_;  // (byte, node)
  std::vector<std::vector<int32_t>> extra_tokens_;      // tokens sharing a node (same bytes)
  int32_t vocab_size_ = 0;
  int32_t eos_ = -1;
};

}  // namespace fathom
