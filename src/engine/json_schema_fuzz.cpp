// Fuzz target: the JSON-schema compiler and matcher on arbitrary schemas and documents (the
// server compiles whatever a request's response_format or tools carry). Input: one flag byte
// (bit 0: strict), then the schema's text, a NUL, and a document. Checked, besides never crashing:
// a schema that compiles strictly compiles leniently to the same graph size; feeding the document
// byte by byte and all at once agree; a rejected byte leaves the matcher as it was; and a document
// the matcher takes whole and complete is JSON that nlohmann parses and that follows the compiled
// schema, checked here by walking the parsed value over the schema's nodes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "engine/json_schema.h"

namespace {

using fathom::JsonSchema;
using fathom::SchemaMatcher;

bool type_allowed(const nlohmann::json& v, uint8_t types) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: return (types & JsonSchema::kObject) != 0;
    case nlohmann::json::value_t::array: return (types & JsonSchema::kArray) != 0;
    case nlohmann::json::value_t::string: return (types & JsonSchema::kString) != 0;
    case nlohmann::json::value_t::boolean: return (types & JsonSchema::kBoolean) != 0;
    case nlohmann::json::value_t::null: return (types & JsonSchema::kNull) != 0;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return (types & (JsonSchema::kInteger | JsonSchema::kNumber)) != 0;
    case nlohmann::json::value_t::number_float: {
      // An integer too long for 64 bits parses as a float.
      const double x = v.get<double>();
      return (types & JsonSchema::kNumber) != 0 || ((types & JsonSchema::kInteger) != 0 && std::floor(x) == x);
    }
    default: return false;
  }
}

// Whether v follows node `id`; `frames`: schema containers open around it (the matcher follows
// at most kMaxFrames, deeper containers are free).
bool follows(const JsonSchema& s, const nlohmann::json& v, uint32_t id, size_t frames) {
  if (id == JsonSchema::kAny) return true;
  const JsonSchema::Node& n = s.node(id);
  if (!type_allowed(v, n.types)) return false;
  if (!n.literals.empty()) {
    const std::string text = v.dump();
    bool found = false;
    for (const std::string& l : n.literals) found = found || l == text;
    return found;
  }
  if (!v.is_object() && !v.is_array()) return true;
  if (frames == SchemaMatcher::kMaxFrames) return true;
  if (v.is_array()) {
    if (v.size() < n.min_items || v.size() > n.max_items) return false;
    for (const auto& x : v) {
      if (!follows(s, x, n.items, frames + 1)) return false;
    }
    return true;
  }
  uint64_t seen = 0;
  for (auto it = v.begin(); it != v.end(); ++it) {
    size_t k = 0;
    while (k < n.keys.size() && n.keys[k] != it.key()) ++k;
    if (k < n.keys.size()) {
      seen |= uint64_t{1} << k;
      if (!follows(s, it.value(), n.key_nodes[k], frames + 1)) return false;
    } else if (!n.other_keys || !follows(s, it.value(), n.other_node, frames + 1)) {
      return false;
    }
  }
  return (n.required & ~seen) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool strict = (data[0] & 1) != 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string_view schema_text = rest.substr(0, nul);
  const std::string_view doc = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);

  auto compiled = JsonSchema::compile(schema_text, strict);
  if (strict && compiled.ok()) {
    auto lenient = JsonSchema::compile(schema_text, false);
    CHECK(lenient.ok());
    CHECK((*lenient)->size() == (*compiled)->size());
  }
  if (!compiled.ok()) return 0;
  const JsonSchema& schema = **compiled;

  SchemaMatcher bytewise(&schema);
  size_t taken = 0;
  while (taken < doc.size() && bytewise.feed(static_cast<uint8_t>(doc[taken]))) ++taken;
  SchemaMatcher whole(&schema);
  CHECK(whole.feed(doc) == (taken == doc.size()));
  if (taken == doc.size()) CHECK(whole.complete() == bytewise.complete());

  if (taken < doc.size()) {
    // The rejected byte changed nothing: the rest (without it) goes as it goes without the attempt.
    SchemaMatcher fresh(&schema);
    CHECK(fresh.feed(doc.substr(0, taken)));
    for (size_t i = taken + 1; i < doc.size() && i < taken + 64; ++i) {
      const uint8_t b = static_cast<uint8_t>(doc[i]);
      CHECK(bytewise.feed(b) == fresh.feed(b));
      CHECK(bytewise.complete() == fresh.complete());
    }
    return 0;
  }
  if (!bytewise.complete()) return 0;
  const nlohmann::json parsed = nlohmann::json::parse(doc, nullptr, false);
  CHECK(!parsed.is_discarded());
  CHECK(parsed.is_object());
  CHECK(follows(schema, parsed, schema.root(), 0));
  return 0;
}
