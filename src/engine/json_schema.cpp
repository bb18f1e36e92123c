// JSON Schema compiler and matcher for constrained decoding (json_schema.h).
#include "engine/json_schema.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fathom {

using ojson = nlohmann::ordered_json;

namespace {

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

// The JSON type bits a scalar value has.
uint8_t value_types(const ojson& v) {
  if (v.is_string()) return JsonSchema::kString;
  if (v.is_boolean()) return JsonSchema::kBoolean;
  if (v.is_null()) return JsonSchema::kNull;
  if (v.is_number_integer() || v.is_number_unsigned()) return JsonSchema::kInteger | JsonSchema::kNumber;
  if (v.is_number_float()) return JsonSchema::kNumber;
  return 0;
}

// A key's bytes between its quotes, as compact JSON writes it.
std::string escaped_key(const std::string& key) {
  const std::string d = ojson(key).dump();
  return d.substr(1, d.size() - 2);
}

}  // namespace

class SchemaCompiler {
 public:
  SchemaCompiler(const ojson& doc, bool strict, JsonSchema& out) : doc_(doc), strict_(strict), out_(out) {}

  Result<uint32_t> node_of(const ojson& s, const std::string& path, int depth) {
    if (depth > 64) return fail(path, "nests schemas more than 64 levels deep");
    if (s.is_boolean()) {
      if (s.get<bool>()) return JsonSchema::kAny;
      TRY(maybe_fail(path, "is false, which accepts no value"));
      return JsonSchema::kAny;
    }
    if (!s.is_object()) {
      TRY(maybe_fail(path, "must be an object or a boolean"));
      return JsonSchema::kAny;
    }
    if (s.contains("$ref")) return ref(s["$ref"], path, depth);
    for (const char* k : {"anyOf", "oneOf"}) {
      if (s.contains(k)) return any_of(s[k], path + "." + k, depth);
    }
    const uint32_t id = TRY(new_node(path));
    TRY(fill(id, s, path, depth));
    return id;
  }

 private:
  Status fail(const std::string& path, const std::string& what) const {
    return invalid_argument("json_schema: {} {}", path, what);
  }
  // Strict: an error; lenient: the caller goes on with "any value" there.
  Status maybe_fail(const std::string& path, const std::string& what) const {
    return strict_ ? fail(path, what) : ok_status();
  }

  Result<uint32_t> new_node(const std::string& path) {
    if (out_.nodes_.size() >= JsonSchema::kMaxNodes)
      return fail(path, fmt::format("makes the schema larger than {} nodes", JsonSchema::kMaxNodes));
    out_.nodes_.emplace_back();
    return static_cast<uint32_t>(out_.nodes_.size() - 1);
  }

  Result<uint32_t> ref(const ojson& r, const std::string& path, int depth) {
    if (!r.is_string()) {
      TRY(maybe_fail(path, "has a $ref that is not a string"));
      return JsonSchema::kAny;
    }
    const std::string target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') {
      TRY(maybe_fail(path, fmt::format("has $ref '{}'; only references inside the schema (#...) are followed", target)));
      return JsonSchema::kAny;
    }
    const ojson* t = &doc_;
    if (target.size() > 1) {
      nlohmann::json_pointer<std::string> ptr;
      try {
        ptr = nlohmann::json_pointer<std::string>(target.substr(1));
      } catch (const std::exception&) {
        TRY(maybe_fail(path, fmt::format("has $ref '{}', which is not a JSON pointer", target)));
        return JsonSchema::kAny;
      }
      if (!doc_.contains(ptr)) {
        TRY(maybe_fail(path, fmt::format("has $ref '{}', which names nothing in the schema", target)));
        return JsonSchema::kAny;
      }
      t = &doc_.at(ptr);
    }
    // Reserve the node first so that a recursive reference finds it.
    const uint32_t id = TRY(new_node(path));
    refs_[target] = id;
    const ojson& s = *t;
    if (s.is_object() && !s.contains("$ref") && !s.contains("anyOf") && !s.contains("oneOf")) {
      TRY(fill(id, s, target, depth + 1));
    } else {
      const uint32_t other = TRY(node_of(s, target, depth + 1));
      out_.nodes_[id] = out_.nodes_[other];
    }
    return id;
  }

  // anyOf / oneOf: followed when the branches take different JSON types (a type or null, an
  // object or a string...): each value's first byte then says which branch it is in.
  Result<uint32_t> any_of(const ojson& branches, const std::string& path, int depth) {
    if (!branches.is_array() || branches.empty()) {
      TRY(maybe_fail(path, "must be a non-empty array"));
      return JsonSchema::kAny;
    }
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < branches.size(); ++i)
      ids.push_back(TRY(node_of(branches[i], fmt::format("{}[{}]", path, i), depth + 1)));
    // integer and number share their first bytes, so they count as one type here
    const auto widen = [](uint8_t t) -> uint8_t {
      return (t & (JsonSchema::kInteger | JsonSchema::kNumber)) ? (t | JsonSchema::kInteger | JsonSchema::kNumber) : t;
    };
    JsonSchema::Node merged;
    merged.types = 0;
    bool literal_branch = false, other_branch = false;
    for (const uint32_t id : ids) {
      const JsonSchema::Node n = out_.nodes_[id];  // a copy: new_node may grow the vector
      if ((widen(merged.types) & widen(n.types)) != 0) return JsonSchema::kAny;  // two branches of one JSON type
      (n.literals.empty() ? other_branch : literal_branch) = true;
      if (literal_branch && other_branch) return JsonSchema::kAny;  // an enum beside a plain type
      merged.types |= n.types;
      merged.literals.insert(merged.literals.end(), n.literals.begin(), n.literals.end());
      if (n.types & JsonSchema::kObject) {
        merged.other_keys = n.other_keys;
        merged.other_node = n.other_node;
        merged.keys = n.keys;
        merged.key_nodes = n.key_nodes;
        merged.sorted_keys = n.sorted_keys;
        merged.required = n.required;
      }
      if (n.types & JsonSchema::kArray) {
        merged.items = n.items;
        merged.min_items = n.min_items;
        merged.max_items = n.max_items;
      }
    }
    std::sort(merged.literals.begin(), merged.literals.end());
    const uint32_t id = TRY(new_node(path));
    out_.nodes_[id] = std::move(merged);
    return id;
  }

  Status fill(uint32_t id, const ojson& s, const std::string& path, int depth) {
    JsonSchema::Node n;
    bool typed = false;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      std::vector<std::string> names;
      if (t.is_string()) {
        names.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& x : t) {
          if (x.is_string()) names.push_back(x.get<std::string>());
        }
      }
      uint8_t types = 0;
      for (const std::string& name : names) {
        const uint8_t bit = name == "object"    ? JsonSchema::kObject
                            : name == "array"   ? JsonSchema::kArray
                            : name == "string"  ? JsonSchema::kString
                            : name == "number"  ? (JsonSchema::kNumber | JsonSchema::kInteger)
                            : name == "integer" ? JsonSchema::kInteger
                            : name == "boolean" ? JsonSchema::kBoolean
                            : name == "null"    ? JsonSchema::kNull
                                                : 0;
        if (bit == 0) TRY(maybe_fail(path, fmt::format("has an unknown type '{}'", name)));
        types |= bit;
      }
      if (types != 0) {
        n.types = types;
        typed = true;
      } else if (!names.empty() || !t.is_string()) {
        TRY(maybe_fail(path, "has a 'type' that names no JSON type"));
      }
    }
    // enum / const: scalar values, matched as their compact JSON text.
    std::vector<const ojson*> values;
    if (s.contains("const")) values.push_back(&s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) {
        TRY(maybe_fail(path, "has an 'enum' that is not a non-empty array"));
        return ok_status();  // lenient: any value here (the node stays as new_node made it)
      }
      for (const auto& v : s["enum"]) values.push_back(&v);
    }
    if (!values.empty()) {
      bool scalar = true;
      uint8_t lit_types = 0;
      std::vector<std::string> lits;
      for (const ojson* v : values) {
        const uint8_t vt = value_types(*v);
        if (vt == 0) {
          scalar = false;
          break;
        }
        if (typed && (vt & n.types) == 0) continue;  // a value the type excludes is never valid
        lit_types |= vt;
        lits.push_back(v->dump());
      }
      if (!scalar) {
        TRY(maybe_fail(path, "has enum or const values that are objects or arrays (not followed)"));
      } else if (lits.empty()) {
        TRY(maybe_fail(path, "has no enum or const value of its type"));
        return ok_status();
      } else {
        std::sort(lits.begin(), lits.end());
        lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
        n.literals = std::move(lits);
        n.types = typed ? static_cast<uint8_t>(n.types & lit_types) : lit_types;
        out_.nodes_[id] = std::move(n);
        return ok_status();
      }
    }
    if (!typed) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
        n.types = JsonSchema::kObject;
      } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        n.types = JsonSchema::kArray;
      }
    }
    if (n.types & JsonSchema::kObject) TRY(fill_object(n, s, path, depth));
    if (n.types & JsonSchema::kArray) TRY(fill_array(n, s, path, depth));
    out_.nodes_[id] = std::move(n);
    return ok_status();
  }

  Status fill_object(JsonSchema::Node& n, const ojson& s, const std::string& path, int depth) {
    const bool has_props = s.contains("properties") && s["properties"].is_object() && !s["properties"].empty();
    if (s.contains("properties") && !s["properties"].is_object())
      TRY(maybe_fail(path, "has 'properties' that is not an object"));
    // Other keys: only the listed ones unless additionalProperties allows more (OpenAI's strict
    // mode and xgrammar's default); with no properties listed, any key unless it says false.
    n.other_keys = !has_props;
    n.other_node = JsonSchema::kAny;
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      if (a.is_boolean()) {
        n.other_keys = a.get<bool>();
      } else {
        n.other_keys = true;
        n.other_node = TRY(node_of(a, path + ".additionalProperties", depth + 1));
      }
    }
    if (!has_props) return ok_status();
    const ojson& props = s["properties"];
    if (props.size() > JsonSchema::kMaxKeys) {
      TRY(maybe_fail(path, fmt::format("has {} properties; at most {} are followed", props.size(),
                                              JsonSchema::kMaxKeys)));
      n.other_keys = true;
      return ok_status();
    }
    for (auto it = props.begin(); it != props.end(); ++it) {
      n.keys.push_back(escaped_key(it.key()));
      n.key_nodes.push_back(TRY(node_of(it.value(), path + ".properties." + it.key(), depth + 1)));
    }
    n.sorted_keys.resize(n.keys.size());
    for (uint32_t i = 0; i < n.keys.size(); ++i) n.sorted_keys[i] = i;
    std::sort(n.sorted_keys.begin(), n.sorted_keys.end(), [&](uint32_t a, uint32_t b) { return n.keys[a] < n.keys[b]; });
    if (s.contains("required") && s["required"].is_array()) {
      for (const auto& r : s["required"]) {
        if (!r.is_string()) continue;
        const std::string k = escaped_key(r.get<std::string>());
        const auto it = std::find(n.keys.begin(), n.keys.end(), k);
        if (it == n.keys.end()) {
          TRY(maybe_fail(path, fmt::format("requires '{}', which is not among its properties", r.get<std::string>())));
          continue;
        }
        n.required |= uint64_t{1} << (it - n.keys.begin());
      }
    }
    return ok_status();
  }

  Status fill_array(JsonSchema::Node& n, const ojson& s, const std::string& path, int depth) {
    if (s.contains("items")) {
      if (s["items"].is_array()) {
        TRY(maybe_fail(path, "has tuple 'items' (not followed)"));
      } else {
        n.items = TRY(node_of(s["items"], path + ".items", depth + 1));
      }
    }
    for (const char* k : {"minItems", "maxItems"}) {
      if (!s.contains(k)) continue;
      const ojson& v = s[k];
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        TRY(maybe_fail(path, fmt::format("has a '{}' that is not a non-negative integer", k)));
        continue;
      }
      const uint64_t x = std::min<uint64_t>(v.get<uint64_t>(), UINT32_MAX);
      (k[1] == 'i' ? n.min_items : n.max_items) = static_cast<uint32_t>(x);
    }
    if (n.min_items > n.max_items) {
      TRY(maybe_fail(path, "has minItems above maxItems"));
      n.min_items = 0;  // lenient: any length
      n.max_items = UINT32_MAX;
    }
    return ok_status();
  }

  const ojson& doc_;
  bool strict_;
  JsonSchema& out_;
  std::map<std::string, uint32_t> refs_;
};

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(std::string_view schema_json, bool strict) {
  const ojson doc = ojson::parse(schema_json, nullptr, false);
  if (doc.is_discarded()) return invalid_argument("json_schema: the schema is not valid JSON");
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.emplace_back();  // node 0: any value
  SchemaCompiler c(doc, strict, *s);
  s->root_ = TRY(c.node_of(doc, "the schema", 0));
  if ((s->nodes_[s->root_].types & kObject) == 0) {
    if (strict) return invalid_argument("json_schema: the schema's root must describe an object");
    s->root_ = kAny;
  }
  return std::shared_ptr<const JsonSchema>(std::move(s));
}

// ---- Matcher ------------------------------------------------------------------------------------

namespace {

// The i-th string in sorted order.
const std::string& at(const std::vector<std::string>& strings, const std::vector<uint32_t>* order, uint32_t i) {
  return order != nullptr ? strings[(*order)[i]] : strings[i];
}

}  // namespace

// Narrows [lo_, hi_) to the strings whose byte len_ is `byte` (they are contiguous: the strings
// share their first len_ bytes and are sorted); false if none.
bool SchemaMatcher::narrow(uint8_t byte, const std::vector<std::string>& strings, const std::vector<uint32_t>* order) {
  const auto key = [&](uint32_t i) -> int {
    const std::string& s = at(strings, order, i);
    return s.size() > len_ ? static_cast<uint8_t>(s[len_]) : -1;
  };
  uint32_t lo = lo_, hi = hi_;
  // First index whose key >= byte, then first whose key > byte.
  uint32_t a = lo, b = hi;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (key(m) < byte) a = m + 1; else b = m;
  }
  lo = a;
  b = hi;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (key(m) <= byte) a = m + 1; else b = m;
  }
  hi = a;
  if (lo == hi) return false;
  lo_ = lo;
  hi_ = hi;
  ++len_;
  return true;
}

// Whether a candidate is exactly the bytes matched (the shortest sorts first), and unused.
bool SchemaMatcher::exact(const std::vector<std::string>& strings, const std::vector<uint32_t>* order, uint64_t used,
                          int32_t* index) const {
  if (lo_ >= hi_ || at(strings, order, lo_).size() != len_) return false;
  const uint32_t i = order != nullptr ? (*order)[lo_] : lo_;
  if (order != nullptr && (used >> i & 1)) return false;
  if (index != nullptr) *index = static_cast<int32_t>(i);
  return true;
}

bool SchemaMatcher::unused_left(const Frame& f) const {
  const JsonSchema::Node& n = schema_->node(f.node);
  const size_t k = n.keys.size();
  const uint64_t all = k == 64 ? ~uint64_t{0} : (uint64_t{1} << k) - 1;
  return (all & ~f.used) != 0;
}

bool SchemaMatcher::start_value(uint8_t b, uint32_t node) {
  const JsonSchema::Node& n = schema_->node(node);
  if (!n.literals.empty()) {
    match_ = Match::kLiteral;
    lit_node_ = node;
    lo_ = 0;
    hi_ = static_cast<uint32_t>(n.literals.size());
    len_ = 0;
    return narrow(b, n.literals, nullptr);
  }
  uint8_t need = 0;
  if (b == '{') need = JsonSchema::kObject;
  else if (b == '[') need = JsonSchema::kArray;
  else if (b == '"') need = JsonSchema::kString;
  else if (b == '-' || (b >= '0' && b <= '9')) need = JsonSchema::kNumber | JsonSchema::kInteger;
  else if (b == 't' || b == 'f') need = JsonSchema::kBoolean;
  else if (b == 'n') need = JsonSchema::kNull;
  if ((n.types & need) == 0) return false;
  int_only_ = (need & JsonSchema::kNumber) != 0 && (n.types & JsonSchema::kNumber) == 0;
  return true;
}

bool SchemaMatcher::feed(uint8_t byte) {
  return feed_all_or_nothing(*this, std::string_view(reinterpret_cast<const char*>(&byte), 1));
}

bool SchemaMatcher::feed(std::string_view bytes) {
  return feed_all_or_nothing(*this, bytes);
}

bool SchemaMatcher::feed_inner(uint8_t b) {
  JsonMatcher next = json_;
  if (!next.advance(b)) return false;
  const bool ws = is_ws(b);
  if (!json_.in_string()) {
    if (ws) {
      if (spaces_ == kMaxSpaceRun) return false;
      ++spaces_;
    } else {
      spaces_ = 0;
    }
  }
  const int d0 = json_.depth(), d1 = next.depth();
  if (schema_ == nullptr) {  // any object
    json_ = next;
    return true;
  }
  if (free_depth_ > 0 && d0 >= free_depth_) {
    json_ = next;
    if (d1 < free_depth_) free_depth_ = 0;
    return true;
  }
  Frame* f = n_frames_ > 0 && frames_[n_frames_ - 1].depth == d0 ? &frames_[n_frames_ - 1] : nullptr;
  bool value_started = false;
  uint32_t value_node = JsonSchema::kAny;

  // An enum value being matched.
  if (match_ == Match::kLiteral) {
    const auto& lits = schema_->node(lit_node_).literals;
    const bool terminator = json_.in_number() && !next.in_number();  // the byte after a number
    if (terminator) {
      if (!exact(lits, nullptr, 0, nullptr)) return false;
      match_ = Match::kNone;  // the byte is structure: handled below
    } else {
      if (!narrow(b, lits, nullptr)) return false;
      if (!next.in_scalar()) {  // the string or literal closed with this byte
        if (!exact(lits, nullptr, 0, nullptr)) return false;
        match_ = Match::kNone;
      }
      json_ = next;
      return true;
    }
  }
  if (json_.in_key_string() && f != nullptr) {
    const JsonSchema::Node& n = schema_->node(f->node);
    const bool closes = b == '"' && !next.in_string();
    if (match_ == Match::kKey) {
      if (closes) {
        int32_t i = -1;
        if (!exact(n.keys, &n.sorted_keys, f->used, &i)) return false;
        f->used |= uint64_t{1} << i;
        f->key = i;
        match_ = Match::kNone;
      } else {
        const uint32_t lo = lo_, hi = hi_, len = len_;
        if (!narrow(b, n.keys, &n.sorted_keys)) return false;
        bool any = false;
        for (uint32_t k = lo_; k < hi_ && !any; ++k) any = !(f->used >> n.sorted_keys[k] & 1);
        if (!any) {
          lo_ = lo, hi_ = hi, len_ = len;
          return false;
        }
      }
    } else if (match_ == Match::kFreeKey) {
      if (closes) {
        int32_t i = -1;
        if (exact(n.keys, &n.sorted_keys, f->used, &i)) {
          f->used |= uint64_t{1} << i;
          f->key = i;
        } else {
          f->key = -1;
        }
        match_ = Match::kNone;
      } else if (!narrow(b, n.keys, &n.sorted_keys)) {
        lo_ = hi_ = 0;  // another key: its value follows additionalProperties
      }
    }
    json_ = next;
    return true;
  }
  if (json_.expects_key() && b == '"' && f != nullptr) {
    const JsonSchema::Node& n = schema_->node(f->node);
    if (!n.other_keys && !unused_left(*f)) return false;
    match_ = n.other_keys ? Match::kFreeKey : Match::kKey;
    lo_ = 0;
    hi_ = static_cast<uint32_t>(n.keys.size());
    len_ = 0;
    json_ = next;
    return true;
  }
  if (json_.in_number() && next.in_number() && int_only_ && (b == '.' || b == 'e' || b == 'E')) return false;
  if (d1 < d0 && f != nullptr) {  // this byte closes the container (perhaps ending a number too)
    const JsonSchema::Node& n = schema_->node(f->node);
    if (b == '}' && (n.required & ~f->used) != 0) return false;
    if (b == ']' && f->count < n.min_items) return false;
    --n_frames_;
  } else if (b == ',' && !json_.in_string() && f != nullptr) {
    const JsonSchema::Node& n = schema_->node(f->node);
    if (f->object) {
      if (!n.other_keys && !unused_left(*f)) return false;
    } else if (f->count >= n.max_items) {
      return false;
    }
  } else if (!ws && (json_.expects_value() || d0 == 0) && !json_.in_scalar()) {
    // The first byte of a value: the root, a property's value (after its key) or an array element.
    if (d0 == 0) {
      value_node = schema_->root();
    } else if (f == nullptr) {
      return false;  // unreachable: every container outside a free region has a frame
    } else {
      const JsonSchema::Node& n = schema_->node(f->node);
      if (f->object) {
        value_node = f->key >= 0 ? n.key_nodes[static_cast<size_t>(f->key)] : n.other_node;
      } else {
        if (f->count >= n.max_items) return false;
        ++f->count;
        value_node = n.items;
      }
    }
    if (!start_value(b, value_node)) return false;
    value_started = true;
  }
  if (d1 > d0) {  // this byte opened a container
    const uint32_t node = value_started ? value_node : JsonSchema::kAny;
    if (node == JsonSchema::kAny || n_frames_ == kMaxFrames) {
      free_depth_ = static_cast<uint8_t>(d1);
    } else {
      frames_[n_frames_++] = Frame{node, 0, 0, -1, static_cast<uint8_t>(d1), b == '{'};
    }
  }
  json_ = next;
  return true;
}

}  // namespace fathom
