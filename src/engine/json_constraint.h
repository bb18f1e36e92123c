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
#include <optional>
#include <string>
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
  // Where the top-level object is (for ToolArgsMatcher's key rules): the nesting depth, whether the
  // next non-space byte starts a key or closes the object (after '{' or ','), whether a key string
  // is being read, whether a value comes next.
  int depth() const { return depth_; }
  bool expects_key() const { return state_ == State::kKeyOrEnd || state_ == State::kKey; }
  bool in_key_string() const { return in_key_ && in_string(); }
  bool expects_value() const { return state_ == State::kValue; }
  // Inside a string with no escape or UTF-8 sequence open: any "string-safe" token keeps it so.
  bool in_plain_string() const { return state_ == State::kString && aux_ == 0; }
  bool in_string() const {
    return state_ == State::kString || state_ == State::kEscape || state_ == State::kUnicode;
  }

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

// The arguments of a tool call as DeepSeek-V3's chat template writes them after the name's "\n":
// the fence "```json\n", one JSON object (JsonMatcher's grammar), the closing "\n```"; then
// nothing more (the <｜tool▁call▁end｜> control token that follows is the engine's to require).
// Constraining a call's arguments this way makes every call the model writes parse, as
// llama.cpp's grammar-constrained tool calls and vLLM's guided decoding do.
//
// With a schema (the tool's "parameters": an object schema with "properties"), the top-level
// object's keys are constrained too: each key is one of the properties, none twice, and the object
// closes only once every "required" property is present. A property with one simple "type" gets
// a value of that type (judged by its first byte; nested and string contents are free). A schema
// whose property names need escaping in JSON is not used (keys stay free).
struct ToolArgsSchema {
  std::vector<std::string> keys;  // at most kMaxKeys, in the schema's order
  // Per key, the JSON type its "type" names when that is one simple type: 's' string, 'n'
  // number/integer, 'b' boolean, 'o' object, 'a' array; 0: any value. The value's first byte is
  // held to it (a string starts with '"', a number with '-' or a digit, ...).
  std::vector<char> types;
  uint64_t required = 0;  // bit i: keys[i] is required
  static constexpr size_t kMaxKeys = 64;
  // From a JSON schema as sent in a request's tool definition; nullopt when it does not describe
  // an object with usable properties (then the arguments are any object).
  static std::optional<ToolArgsSchema> from_json_schema(std::string_view parameters_json);
};

class ToolArgsMatcher {
 public:
  static constexpr std::string_view kFence = "```json\n";
  static constexpr std::string_view kClose = "\n```";
  // Whitespace bytes in a row outside strings: enough for indented JSON, not for a model that
  // would rather pad than write the next token (llama.cpp's JSON grammars cap it the same way).
  static constexpr uint8_t kMaxSpaceRun = 16;
  ToolArgsMatcher() = default;
  explicit ToolArgsMatcher(const ToolArgsSchema* schema) : schema_(schema) {}  // not owned; may be null
  bool feed(uint8_t byte);            // false (state unchanged) if the byte cannot continue
  bool feed(std::string_view bytes);  // all or nothing
  bool object_closed() const { return fence_ == kFence.size() && json_.complete(); }
  bool complete() const { return object_closed() && close_ == kClose.size(); }  // no byte can follow
  bool in_string() const { return fence_ == kFence.size() && !json_.complete() && json_.in_string(); }
  // Inside a string whose bytes are free (a value, or a key no schema constrains).
  bool in_plain_string() const {
    return fence_ == kFence.size() && json_.in_plain_string() &&
           !(schema_ != nullptr && json_.depth() == 1 && json_.in_key_string());
  }

 private:
  bool key_byte(uint8_t byte);  // a byte of a top-level key; false if no unused key continues
  bool can_close() const { return (schema_->required & ~used_) == 0; }
  bool keys_left() const;
  const ToolArgsSchema* schema_ = nullptr;
  uint8_t fence_ = 0;     // bytes of kFence seen
  uint8_t close_ = 0;     // bytes of kClose seen
  uint8_t spaces_ = 0;    // whitespace bytes in a row outside strings
  uint64_t used_ = 0;     // keys already written
  int8_t last_key_ = -1;  // the key whose value comes next
  std::string key_;       // the top-level key being written
  JsonMatcher json_;
};

// The vocabulary as a byte trie, built once per tokenizer.
class JsonVocab {
 public:
  static Result<std::unique_ptr<JsonVocab>> create(const Tokenizer& tok, int32_t vocab_size);
  // Sets bit t of allowed[] (vocab_size bits, zeroed here) for every token whose bytes the
  // matcher accepts from `state`; EOS when the object is complete.
  void mask(const JsonMatcher& state, uint64_t* allowed) const;
  // The same for a tool call's arguments: every token whose bytes ToolArgsMatcher accepts.
  // Control and special tokens (EOS, <｜tool▁call▁end｜>) are never allowed: once complete() the
  // caller allows <｜tool▁call▁end｜> alone.
  void mask(const ToolArgsMatcher& state, uint64_t* allowed) const;
  int32_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return static_cast<size_t>((vocab_size_ + 63) / 64); }
  // Token boundaries at a string's end: inside a string, a refused token that begins with the
  // closing quote (`"}` while a required key is missing, `",` when no key is left) still says the
  // model wants the string closed, which the quote token alone does; its probability moves to
  // that token (logits rewritten in place: quote = log(exp(quote) + sum of the refused ones)).
  // Only the closing quote: moving every refused token's mass to its longest allowed prefix
  // (" word" to " ") made the default model pad with spaces (docs/engine.md).
  void heal_string_close(const uint64_t* allowed, float* logits) const;
  // Benchmarks only (`fathom bench grammar`): false walks the whole trie inside strings too, as
  // before the string-safe mask, to time both in one run. Not for a vocabulary in use.
  void set_string_fast_path(bool on) { fast_strings_ = on; }

 private:
  struct Node {
    uint32_t first_child = 0;  // index into children_
    uint16_t n_children = 0;
    int32_t token = -1;        // a token ending here (or -1)
  };
  template <class Matcher>
  void walk(uint32_t node, const Matcher& state, uint64_t* allowed, bool skip_safe) const;
  template <class Matcher>
  void mask_impl(const Matcher& state, uint64_t* allowed) const;
  void allow(int32_t token, uint64_t* allowed) const;
  std::vector<Node> nodes_;
  std::vector<std::pair<uint8_t, uint32_t>> children_;  // (byte, node)
  std::vector<std::vector<int32_t>> extra_tokens_;      // tokens sharing a node (same bytes)
  // Inside a plain string nearly every token is allowed, and walking the whole trie for them cost
  // ~8 ms per step at 129k tokens: the tokens that keep a plain string plain ("string-safe") are
  // a precomputed mask, and the walk only enters nodes with some other token at or below them.
  std::vector<uint64_t> string_safe_;  // mask words
  std::vector<uint8_t> unsafe_below_;  // per node
  bool fast_strings_ = true;
  int32_t quote_ = -1;                 // the token whose bytes are exactly `"`
  std::vector<int32_t> quote_merges_;  // tokens of 2+ bytes that begin with `"`
  int32_t vocab_size_ = 0;
  int32_t eos_ = -1;
};

}  // namespace fathom
