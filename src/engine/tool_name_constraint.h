// Constrained decoding of tool-call names: once the model has written <｜tool▁sep｜> inside a call,
// only tokens that keep the name written so far a prefix of one of the offered tools' names
// (followed by its "\n") may be sampled, so a call never names a tool the request did not offer.
// A token may also complete a name and run past its "\n" (the tokenizer's own merges, "\n```"),
// after which the output is free again. The same guarantee vLLM's and llama.cpp's grammar-guided
// tool calling give; here it is always on when tools are active (the server's
// --no-tool-name-constraint turns it off), because a call to a tool that was not offered can
// only fail.
//
// Thread safety: ToolNameVocab is immutable after create (share it); ToolNameState is one
// request's.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fathom {

class Tokenizer;

// Where a sequence is: inside a name (after <｜tool▁sep｜>, before the "\n" that ends it) or not.
struct ToolNameState {
  bool active = false;
  std::string prefix;  // the name's bytes written so far
  // One emitted token: <｜tool▁sep｜> (sep) starts a name; inside one its bytes extend the prefix
  // and a "\n" ends it.
  void feed(int32_t token, std::string_view bytes, int32_t sep);
};

class ToolNameVocab {
 public:
  // Every token's bytes (control, unused and special tokens never match a name).
  static std::unique_ptr<ToolNameVocab> create(const Tokenizer& tok, int32_t vocab_size);
  // Sets bit t of allowed[] (vocab_size bits, zeroed here) for every token that may follow
  // `prefix` given the offered `names`; false when no name continues the prefix (then the caller
  // leaves the step unconstrained rather than allow nothing).
  bool mask(std::string_view prefix, std::span<const std::string> names, uint64_t* allowed) const;
  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  size_t mask_words() const { return (bytes_.size() + 63) / 64; }

 private:
  std::vector<std::string> bytes_;  // per id; empty: never allowed
};

}  // namespace fathom
