// The JSON automaton of constrained decoding: a byte-level pushdown automaton accepting exactly
// one JSON object (RFC 8259: strings with escapes and valid UTF-8, UTF-16 surrogates in \u escapes
// only as pairs, numbers of at most 20 digits and a two-digit exponent, literals, nesting up to 64
// levels, whitespace anywhere between tokens).
// JSON mode uses it alone; SchemaMatcher (json_schema.h) and ToolArgsMatcher (json_constraint.h)
// build on it. Implemented in json_constraint.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace fathom {

class JsonMatcher {
 public:
  static constexpr int kMaxDepth = 64;
  // Feeds one byte; false (state unchanged) if the byte cannot continue valid JSON.
  bool feed(uint8_t byte);
  // As feed, but a refused byte leaves the state unspecified: for a copy about to be dropped
  // (the mask's trie walk), which saves the copy feed makes to restore it.
  bool advance(uint8_t byte) { return feed_inner(byte); }
  bool feed(std::string_view bytes);  // all or nothing
  bool complete() const { return state_ == State::kDone; }
  // Where the top-level object is (for ToolArgsMatcher's key rules): the nesting depth, whether the
  // next non-space byte starts a key or closes the object (after '{' or ','), whether a key string
  // is being read, whether a value comes next.
  int depth() const { return depth_; }
  bool expects_key() const { return state_ == State::kKeyOrEnd || state_ == State::kKey; }
  bool in_key_string() const { return in_key_ && in_string(); }
  bool expects_value() const { return state_ == State::kValue; }
  // Inside a string with no escape, UTF-8 sequence or surrogate pair open: any "string-safe" token
  // keeps it so.
  bool in_plain_string() const { return state_ == State::kString && aux_ == 0 && !high_; }
  bool in_string() const {
    return state_ == State::kString || state_ == State::kEscape || state_ == State::kUnicode;
  }
  bool in_number() const { return state_ >= State::kMinus && state_ <= State::kExp; }
  // Inside a string, number or literal (true, false, null).
  bool in_scalar() const { return in_string() || in_number() || state_ == State::kLiteral; }

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
  uint16_t unit_ = 0;                        // the \u escape's hex digits so far
  bool high_ = false;                        // a \uD800-\uDBFF escape waits for its \uDC00-\uDFFF half
  std::array<uint8_t, kMaxDepth> stack_{};  // '{' or '['
};

// feed() for every matcher with advance(byte) (JsonMatcher, SchemaMatcher, ToolArgsMatcher):
// every byte or none, the state restored from one copy if a byte is refused.
template <class Matcher>
bool feed_all_or_nothing(Matcher& m, std::string_view bytes) {
  const Matcher saved = m;
  for (char c : bytes) {
    if (!m.advance(static_cast<uint8_t>(c))) {
      m = saved;
      return false;
    }
  }
  return true;
}

}  // namespace fathom
