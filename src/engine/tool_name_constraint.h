// Constrained decoding of tool calls: once the model has written <｜tool▁sep｜> inside a call,
// only tokens that keep the name written so far a prefix of one of the offered tools' names
// (followed by its "\n") may be sampled, so a call never names a tool the request did not offer;
// then its arguments are constrained to "```json\n" and one JSON object (the engine masks with
// JsonVocab, json_constraint.h), so a call always parses.
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

#include "engine/json_constraint.h"

namespace fathom {

class Tokenizer;

// Where a sequence is: inside a name (after <｜tool▁sep｜>, before the "\n" that ends it), inside
// the call's arguments (from that "\n" until the JSON object after "```json\n" is closed: see
// ToolArgsMatcher, json_constraint.h), or neither.
struct ToolNameState {
  bool active = false;       // inside a name
  std::string prefix;        // the name's bytes written so far
  bool args_active = false;  // inside the arguments
  ToolArgsMatcher args;      // their state while args_active
  bool end_pending = false;  // the arguments are complete: <｜tool▁call▁end｜> comes next
  // One emitted token: <｜tool▁sep｜> (sep) starts a name; inside one its bytes extend the prefix
  // and a "\n" ends it, the bytes after it going to the arguments. The arguments end with their
  // closing fence (then end_pending until the next token), or when a byte cannot continue them
  // (the model left the template's format: nothing is constrained until the next call).
  // `names` and `schemas` (parallel, either may be empty): the offered tools; a call to names[i]
  // gets its arguments' keys constrained by schemas[i] when that has keys.
  void feed(int32_t token, std::string_view bytes, int32_t sep, std::span<const std::string> names = {},
            std::span<const ToolArgsSchema> schemas = {});
  // The reply starts inside the arguments of a call to `name` whose fence the prompt already holds
  // (tool_choice naming a function: the server's forced prefix ends with "```json\n").
  void start_args(std::string_view name, std::span<const std::string> names,
                  std::span<const ToolArgsSchema> schemas);
  // The reply starts with a call's name: the prompt already ends with <｜tool▁sep｜> (the server's
  // forced prefix for tool_choice "required").
  void start_name();

 private:
  void feed_args(std::string_view bytes);
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
