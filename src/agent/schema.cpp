// validate_json: the JSON Schema subset described in schema.h. Recursion depth is bounded by the
// schema, not by the value (a value deeper than its schema is not descended).
#include "agent/schema.h"

#include <cmath>

namespace fathom::agent {
namespace {

using json = nlohmann::json;

bool has_type(const json& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "null") return v.is_null();
  return true;  // unknown type names do not reject
}

std::string short_dump(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  return v.type_name();
}

}  // namespace

Status validate_json(const json& schema, const json& value, const std::string& where) {
  if (!schema.is_object()) return {};
  if (schema.contains("type")) {
    const json& t = schema["type"];
    bool ok = false;
    std::string names;
    for (const auto& one : t.is_array() ? t : json::array({t})) {
      if (!one.is_string()) continue;
      ok = ok || has_type(value, one.get<std::string>());
      names += (names.empty() ? "" : " or ") + one.get<std::string>();
    }
    if (!ok)
      return invalid_argument("{}: expected {}, got {} {}", where, names, type_name(value),
                              short_dump(value));
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == value;
    if (!found)
      return invalid_argument("{}: {} is not one of {}", where, short_dump(value), schema["enum"].dump());
  }
  if (schema.contains("const") && schema["const"] != value)
    return invalid_argument("{}: must be {}", where, schema["const"].dump());
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key) || !schema[key].is_array()) continue;
    Status first;
    bool matched = false;
    for (const auto& alt : schema[key]) {
      Status s = validate_json(alt, value, where);
      if (s.ok())
        matched = true;
      else if (first.ok())
        first = s;
    }
    if (!matched && !schema[key].empty()) return first;
  }
  if (value.is_number()) {
    const double v = value.get<double>();
    if (schema.contains("minimum") && schema["minimum"].is_number() && v < schema["minimum"].get<double>())
      return invalid_argument("{}: {} is below the minimum {}", where, v, schema["minimum"].dump());
    if (schema.contains("maximum") && schema["maximum"].is_number() && v > schema["maximum"].get<double>())
      return invalid_argument("{}: {} is above the maximum {}", where, v, schema["maximum"].dump());
  }
  if (value.is_string()) {
    const size_t n = value.get_ref<const std::string&>().size();
    if (schema.contains("minLength") && schema["minLength"].is_number() &&
        n < schema["minLength"].get<size_t>())
      return invalid_argument("{}: shorter than {} characters", where, schema["minLength"].dump());
    if (schema.contains("maxLength") && schema["maxLength"].is_number() &&
        n > schema["maxLength"].get<size_t>())
      return invalid_argument("{}: longer than {} characters", where, schema["maxLength"].dump());
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && schema["minItems"].is_number() &&
        value.size() < schema["minItems"].get<size_t>())
      return invalid_argument("{}: fewer than {} items", where, schema["minItems"].dump());
    if (schema.contains("maxItems") && schema["maxItems"].is_number() &&
        value.size() > schema["maxItems"].get<size_t>())
      return invalid_argument("{}: more than {} items", where, schema["maxItems"].dump());
    if (schema.contains("items") && schema["items"].is_object())
      for (size_t i = 0; i < value.size(); ++i)
        TRY(validate_json(schema["items"], value[i], fmt::format("{}[{}]", where, i)));
  }
  if (value.is_object()) {
    const json props = schema.value("properties", json::object());
    if (schema.contains("required") && schema["required"].is_array())
      for (const auto& r : schema["required"])
        if (r.is_string() && !value.contains(r.get<std::string>()))
          return invalid_argument("{}: missing required property '{}'", where, r.get<std::string>());
    for (const auto& [k, v] : value.items()) {
      if (props.is_object() && props.contains(k)) {
        TRY(validate_json(props[k], v, where + "." + k));
      } else if (schema.contains("additionalProperties")) {
        const json& ap = schema["additionalProperties"];
        if (ap.is_boolean() && !ap.get<bool>()) {
          std::string known;
          for (const auto& [pk, pv] : props.items()) known += (known.empty() ? "" : ", ") + pk;
          return invalid_argument("{}: unknown property '{}' (expected: {})", where, k, known);
        }
        if (ap.is_object()) TRY(validate_json(ap, v, where + "." + k));
      }
    }
  }
  return {};
}

}  // namespace fathom::agent
