// JSON Schema for constrained decoding: `response_format: {"type": "json_schema", ...}` (OpenAI's
// structured outputs) and tool-call arguments. A schema is compiled once per request into a graph
// of nodes; a SchemaMatcher follows the output byte by byte beside JsonMatcher's automaton and
// refuses every byte that could not lead to a document the schema accepts, for what it enforces:
//
//   type (one name or a list; integer refuses a fraction or exponent), properties (keys are the
//   listed ones, each at most once, unless additionalProperties allows others; their values follow
//   their own schemas), required (the object closes only once all are present),
//   additionalProperties (false or absent: no other keys, as OpenAI's strict mode and xgrammar's
//   default; true or a schema: other keys, whose values follow that schema), items, minItems and
//   maxItems, enum and const (scalar values, matched as their compact JSON text), $ref to "#",
//   "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed), anyOf / oneOf whose branches take
//   different JSON types (e.g. a type or null), and nesting up to kMaxFrames schema levels.
//
// Not enforced (the value stays any value of its type): pattern, format, minLength, maxLength,
// minimum, maximum, multipleOf, uniqueItems, prefixItems, patternProperties, allOf, not, if/then,
// anyOf branches of the same JSON type. The output still always parses.
//
// Thread safety: a JsonSchema is immutable after compile (share it); a SchemaMatcher is one
// request's state.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/json_matcher.h"

namespace fathom {

class JsonSchema {
 public:
  // JSON types as bits of SchemaNode::types.
  static constexpr uint8_t kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32,
                           kNull = 64, kAnyType = 127;
  static constexpr uint32_t kAny = 0;  // node 0 accepts any value
  static constexpr size_t kMaxKeys = 64;
  static constexpr size_t kMaxNodes = 4096;
  struct Node {
    uint8_t types = kAnyType;
    // Objects: the listed keys (schema order) and their value nodes; whether other keys are
    // allowed and the node of their values.
    bool other_keys = true;
    uint32_t other_node = kAny;
    std::vector<std::string> keys;
    std::vector<uint32_t> key_nodes;
    std::vector<uint32_t> sorted_keys;  // indices into keys, by their bytes
    uint64_t required = 0;              // bit i: keys[i]
    // Arrays.
    uint32_t items = kAny;
    uint32_t min_items = 0, max_items = UINT32_MAX;
    // enum / const: the allowed values' compact JSON texts, sorted and unique; empty: no enum.
    std::vector<std::string> literals;
  };
  // `strict`: a schema this cannot follow is an error (response_format: the client asked for it);
  // otherwise the parts it cannot follow accept any value (tool parameters: the call still parses).
  // The root must describe an object (as OpenAI's structured outputs require).
  static Result<std::shared_ptr<const JsonSchema>> compile(std::string_view schema_json, bool strict);
  const Node& node(uint32_t i) const { return nodes_[i]; }
  uint32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
  uint32_t root_ = kAny;
};

// One JSON object that follows a compiled schema, byte by byte (JsonMatcher's grammar plus the
// schema's rules above). Whitespace outside strings: at most kMaxSpaceRun bytes in a row.
class SchemaMatcher {
 public:
  static constexpr size_t kMaxFrames = 16;
  static constexpr uint8_t kMaxSpaceRun = 16;
  SchemaMatcher() = default;
  explicit SchemaMatcher(const JsonSchema* schema) : schema_(schema) {}  // not owned; null: any object
  bool feed(uint8_t byte);            // false (state unchanged) if the byte cannot continue
  bool feed(std::string_view bytes);  // all or nothing
  bool advance(uint8_t byte) { return feed_inner(byte); }  // false: state unspecified (JsonMatcher::advance)
  bool complete() const { return json_.complete(); }
  bool in_string() const { return json_.in_string(); }
  // Inside a string whose bytes are free: not a key the schema lists, not an enum value.
  bool in_plain_string() const {
    return json_.in_plain_string() && (match_ == Match::kNone || match_ == Match::kFreeKey);
  }

 private:
  enum class Match : uint8_t { kNone, kKey, kFreeKey, kLiteral };
  struct Frame {
    uint32_t node = 0;
    uint32_t count = 0;   // array elements so far
    uint64_t used = 0;    // object keys written
    int32_t key = -1;     // the key whose value comes next (-1: another key)
    uint8_t depth = 0;    // JsonMatcher depth inside this container
    bool object = false;  // '{' (else '[')
  };
  bool feed_inner(uint8_t byte);
  bool start_value(uint8_t byte, uint32_t node);
  bool narrow(uint8_t byte, const std::vector<std::string>& strings, const std::vector<uint32_t>* order);
  bool exact(const std::vector<std::string>& strings, const std::vector<uint32_t>* order, uint64_t used,
             int32_t* index) const;
  bool unused_left(const Frame& f) const;
  const JsonSchema* schema_ = nullptr;
  JsonMatcher json_;
  std::array<Frame, kMaxFrames> frames_{};
  uint8_t n_frames_ = 0;
  uint8_t free_depth_ = 0;  // > 0: containers at this JsonMatcher depth and below follow no schema
  uint8_t spaces_ = 0;
  bool int_only_ = false;   // the number being written must be an integer
  Match match_ = Match::kNone;
  uint32_t lit_node_ = 0;   // kLiteral: the node whose literals are matched
  // kKey / kFreeKey / kLiteral: the candidates still matching, as a range of the sorted strings,
  // and the bytes matched so far.
  uint32_t lo_ = 0, hi_ = 0, len_ = 0;
};

}  // namespace fathom
