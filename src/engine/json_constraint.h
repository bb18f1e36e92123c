// Constrained decoding for response_format {"type": "json_object"} (JsonMatcher, json_matcher.h),
// {"type": "json_schema"} (SchemaMatcher, json_schema.h) and tool-call arguments (ToolArgsMatcher):
// a mask builder that walks a trie of every token's bytes from the current state, so the sampler
// can only pick tokens that keep the output a valid prefix; EOS is allowed once the object is
// complete, and only whitespace after it.
//
// Thread safety: JsonVocab is immutable after create (share it); a matcher is one request's state.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/json_matcher.h"
#include "engine/json_schema.h"

namespace fathom {

class Tokenizer;

// The arguments of a tool call as DeepSeek-V3's chat template writes them after the name's "\n":
// the fence "```json\n", one JSON object (JsonMatcher's grammar), the closing "\n```"; then
// nothing more (the <｜tool▁call▁end｜> control token that follows is the engine's to require).
// Constraining a call's arguments this way makes every call the model writes parse, as
// llama.cpp's grammar-constrained tool calls and vLLM's guided decoding do.
//
// With a schema (the tool's "parameters"), the object follows it as SchemaMatcher does
// (json_schema.h, compiled leniently: what it cannot follow accepts any value): keys are the
// listed properties, each at most once, the object closes only once every "required" one is
// present, values follow their properties' types, enums, nested objects and arrays.
struct ToolArgsSchema {
  std::vector<std::string> keys;  // the top-level properties, in the schema's order (call heads)
  std::shared_ptr<const JsonSchema> compiled;  // what the matcher follows (null: any object)
  static constexpr size_t kMaxKeys = JsonSchema::kMaxKeys;
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
  static constexpr uint8_t kMaxSpaceRun = SchemaMatcher::kMaxSpaceRun;
  ToolArgsMatcher() = default;
  explicit ToolArgsMatcher(const ToolArgsSchema* schema)  // not owned; may be null
      : json_(schema != nullptr ? schema->compiled.get() : nullptr) {}
  bool feed(uint8_t byte);            // false (state unchanged) if the byte cannot continue
  bool feed(std::string_view bytes);  // all or nothing
  bool advance(uint8_t byte);         // false: state unspecified (JsonMatcher::advance)
  bool object_closed() const { return fence_ == kFence.size() && json_.complete(); }
  bool complete() const { return object_closed() && close_ == kClose.size(); }  // no byte can follow
  bool in_string() const { return fence_ == kFence.size() && !json_.complete() && json_.in_string(); }
  // Inside a string whose bytes are free (a value, or a key no schema constrains).
  bool in_plain_string() const { return fence_ == kFence.size() && json_.in_plain_string(); }

 private:
  uint8_t fence_ = 0;  // bytes of kFence seen
  uint8_t close_ = 0;  // bytes of kClose seen
  SchemaMatcher json_;
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
  // A response_format json_schema reply: every token SchemaMatcher accepts; EOS once complete.
  void mask(const SchemaMatcher& state, uint64_t* allowed) const;
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
  template <class Matcher>
  void mask_reply(const Matcher& state, uint64_t* allowed) const;  // a whole reply: EOS once complete
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
