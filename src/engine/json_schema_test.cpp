// SchemaMatcher against an independent validator of the same JSON Schema subset, written here
// over the schema's JSON (not the compiled graph): documents generated from each schema must be
// accepted byte by byte; documents made invalid must be refused; and random byte edits of valid
// documents that the matcher takes whole must parse and validate (soundness). The vocabulary mask
// at schema states must allow exactly the tokens the matcher takes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "base/rng.h"
#include "engine/json_constraint.h"
#include "engine/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

using ojson = nlohmann::ordered_json;

uint64_t test_seed() {
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  if (const char* env = std::getenv("FATHOM_TEST_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("seed %llu (FATHOM_TEST_SEED to replay)\n", static_cast<unsigned long long>(seed));
  return seed;
}

const char* kSchemas[] = {
    // types, integer, enums of mixed scalars, an array with bounds and enum items, a nested object
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},)"
    R"("tags":{"type":"array","items":{"type":"string","enum":["a","b","c d"]},"minItems":1,"maxItems":3},)"
    R"("kind":{"enum":["x","y",3,null,true]},)"
    R"("nested":{"type":"object","properties":{"z":{"type":["number","null"]}},"required":["z"]}},)"
    R"("required":["name","kind"]})",
    // recursion through $defs
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},)"
    R"("kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},)"
    R"("$ref":"#/$defs/node"})",
    // anyOf of distinct types, additional keys with a schema
    R"({"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"type":"null"},)"
    R"({"type":"object","properties":{"b":{"const":1}},"required":["b"]}]}},)"
    R"("additionalProperties":{"type":"boolean"}})",
    // any object
    R"({"type":"object"})",
    // keys that need escaping, a boolean
    R"({"type":"object","properties":{"q\"uote":{"type":"string"},"\u00e9t\u00e9":{"type":"boolean"},)"
    R"("n":{"type":"number"}},"required":["q\"uote"]})",
    // no extra keys and none listed: only {}; an empty array allowed
    R"({"type":"object","properties":{"e":{"type":"object","additionalProperties":false},)"
    R"("l":{"type":"array","maxItems":0}},"required":["e","l"]})",
};

// ---- The reference: validation over the schema's JSON ----

const ojson& resolve(const ojson& root, const ojson& s) {
  if (s.is_object() && s.contains("$ref")) {
    const std::string r = s["$ref"].get<std::string>();
    return resolve(root, r == "#" ? root : root.at(nlohmann::json_pointer<std::string>(r.substr(1))));
  }
  return s;
}

bool has_type(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

bool valid(const ojson& root, const ojson& schema, const ojson& v) {
  const ojson& s = resolve(root, schema);
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("anyOf")) {
    for (const auto& b : s["anyOf"]) {
      if (valid(root, b, v)) return true;
    }
    return false;
  }
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = has_type(v, s["type"].get<std::string>());
    for (const auto& t : s["type"].is_array() ? s["type"] : ojson::array()) ok = ok || has_type(v, t.get<std::string>());
    if (!ok) return false;
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool ok = false;
    for (const auto& e : s["enum"]) ok = ok || (e == v && e.dump() == v.dump());
    if (!ok) return false;
  }
  if (v.is_object()) {
    const bool props = s.contains("properties") && !s["properties"].empty();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props && s["properties"].contains(it.key())) {
        if (!valid(root, s["properties"][it.key()], it.value())) return false;
      } else if (s.contains("additionalProperties")) {
        if (!valid(root, s["additionalProperties"], it.value())) return false;
      } else if (props) {
        return false;  // strict: listed keys only
      }
    }
    for (const auto& r : s.contains("required") ? s["required"] : ojson::array()) {
      if (!v.contains(r.get<std::string>())) return false;
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items")) {
      for (const auto& x : v) {
        if (!valid(root, s["items"], x)) return false;
      }
    }
  }
  return true;
}

// ---- Documents generated from a schema ----

std::string word(Rng& rng) {
  static const char* words[] = {"alpha", "b", "q\"t", "line\nbreak", "\u00e9", "", "x y", "back\\slash"};
  return words[rng.below(8)];
}

ojson generate(const ojson& root, const ojson& schema, Rng& rng, int depth) {
  const ojson& s = resolve(root, schema);
  if (s.is_boolean() || s.empty()) return rng.below(2) ? ojson(word(rng)) : ojson(static_cast<int>(rng.below(100)));
  if (s.contains("anyOf")) return generate(root, s["anyOf"][rng.below(s["anyOf"].size())], rng, depth);
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"][rng.below(s["enum"].size())];
  std::string t = "object";
  if (s.contains("type")) t = s["type"].is_string() ? s["type"].get<std::string>() : s["type"][rng.below(s["type"].size())].get<std::string>();
  else if (s.contains("items")) t = "array";
  if (t == "string") return word(rng);
  if (t == "integer") return static_cast<int64_t>(rng.below(2000)) - 1000;
  if (t == "number") return rng.below(2) ? ojson(static_cast<double>(rng.below(1000)) / 8.0) : ojson(static_cast<int>(rng.below(9)));
  if (t == "boolean") return rng.below(2) == 1;
  if (t == "null") return nullptr;
  if (t == "array") {
    const size_t lo = s.value("minItems", 0), hi = std::min<size_t>(s.value("maxItems", 4), depth > 3 ? lo : 4);
    ojson a = ojson::array();
    const size_t n = lo + (hi > lo ? rng.below(hi - lo + 1) : 0);
    for (size_t i = 0; i < n; ++i) a.push_back(generate(root, s.value("items", ojson(true)), rng, depth + 1));
    return a;
  }
  ojson o = ojson::object();
  std::vector<std::string> req;
  for (const auto& r : s.contains("required") ? s["required"] : ojson::array()) req.push_back(r.get<std::string>());
  if (s.contains("properties")) {
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      const bool required = std::find(req.begin(), req.end(), it.key()) != req.end();
      if (required || (depth < 3 && rng.below(2))) o[it.key()] = generate(root, it.value(), rng, depth + 1);
    }
  }
  const bool extra = s.contains("additionalProperties") ? !s["additionalProperties"].is_boolean() ||
                                                              s["additionalProperties"].get<bool>()
                                                        : !(s.contains("properties") && !s["properties"].empty());
  if (extra && rng.below(2)) {
    const ojson extra_schema = s.value("additionalProperties", ojson(true));
    o["extra" + std::to_string(rng.below(5))] = generate(root, extra_schema, rng, depth + 1);
  }
  return o;
}

// Compact, or with spaces and newlines between tokens (within the matcher's whitespace cap).
std::string render(const ojson& v, Rng& rng) {
  if (rng.below(2)) return v.dump();
  return v.dump(static_cast<int>(rng.below(3)));
}

// A structural edit somewhere in v: a key dropped or added, a value of another type, an array
// element more or fewer.
void mutate(ojson& v, Rng& rng) {
  static const ojson others[] = {ojson("s"), ojson(7), ojson(2.5), ojson(true), ojson(nullptr), ojson::array(),
                                 ojson::object(), ojson("x"), ojson(3)};
  if ((v.is_object() || v.is_array()) && !v.empty() && rng.below(3) != 0) {
    auto it = v.begin();
    std::advance(it, static_cast<long>(rng.below(v.size())));
    mutate(*it, rng);
    return;
  }
  if (v.is_object()) {
    if (!v.empty() && rng.below(2)) {
      auto it = v.begin();
      std::advance(it, static_cast<long>(rng.below(v.size())));
      v.erase(it.key());
    } else {
      v[rng.below(2) ? "extra1" : "name"] = others[rng.below(9)];
    }
  } else if (v.is_array()) {
    if (!v.empty() && rng.below(2)) v.erase(v.size() - 1);
    else v.push_back(v.empty() ? others[rng.below(9)] : v[0]);
  } else {
    v = others[rng.below(9)];
  }
}

bool takes(const JsonSchema& schema, std::string_view doc, bool* complete = nullptr) {
  SchemaMatcher m(&schema);
  for (char c : doc) {
    if (!m.feed(static_cast<uint8_t>(c))) return false;
  }
  if (complete != nullptr) *complete = m.complete();
  return true;
}

TEST(SchemaMatcher, AcceptsGeneratedDocumentsAndRefusesWhatTheReferenceRejects) {
  Rng rng(test_seed());
  for (const char* text : kSchemas) {
    const ojson root = ojson::parse(text);
    auto schema = JsonSchema::compile(text, /*strict=*/true);
    ASSERT_TRUE(schema.ok()) << text << ": " << schema.status().to_string();
    int accepted = 0, refused = 0;
    for (int trial = 0; trial < 300; ++trial) {
      const ojson doc = generate(root, root, rng, 0);
      ASSERT_TRUE(valid(root, root, doc)) << "generator: " << doc.dump() << " for " << text;
      const std::string bytes = render(doc, rng);
      bool complete = false;
      ASSERT_TRUE(takes(**schema, bytes, &complete)) << "refused a valid document " << bytes << " for " << text;
      ASSERT_TRUE(complete) << bytes;
      ++accepted;
      // Structural edits: whatever the matcher takes whole validates; whatever the reference
      // accepts, the matcher takes.
      for (int e = 0; e < 10; ++e) {
        ojson m = doc;
        mutate(m, rng);
        bool done = false;
        const bool took = takes(**schema, m.dump(), &done) && done;
        ASSERT_EQ(took, valid(root, root, m)) << m.dump() << " for " << text;
        refused += !took;
      }
      // Byte edits: whatever the matcher takes whole parses and validates.
      for (int e = 0; e < 20; ++e) {
        std::string m = bytes;
        const std::string alphabet = "{}[]\",:0123456789.-etrufalsnxyzabc \\";
        const size_t at = rng.below(m.size() + 1);
        switch (rng.below(3)) {
          case 0: m.insert(at, 1, alphabet[rng.below(alphabet.size())]); break;
          case 1: if (at < m.size()) m.erase(at, 1); break;
          default: if (at < m.size()) m[at] = alphabet[rng.below(alphabet.size())]; break;
        }
        bool done = false;
        if (!takes(**schema, m, &done) || !done) {
          ++refused;
          continue;
        }
        const ojson parsed = ojson::parse(m, nullptr, false);
        ASSERT_FALSE(parsed.is_discarded()) << "took unparseable " << m << " for " << text;
        ASSERT_TRUE(valid(root, root, parsed)) << "took invalid " << m << " for " << text;
      }
    }
    EXPECT_EQ(accepted, 300);
    EXPECT_GT(refused, 0) << text;
  }
}

TEST(SchemaMatcher, RefusesTheFirstByteThatBreaksTheSchema) {
  auto s = JsonSchema::compile(kSchemas[0], true);
  ASSERT_TRUE(s.ok());
  const JsonSchema& schema = **s;
  // Each: a valid prefix, then a byte the schema refuses there.
  const std::pair<const char*, char> cases[] = {
      {"{", '}'},                                   // name and kind are required
      {"{\"na", 'x'},                               // no key starts "nax"
      {"{\"name\":", '1'},                          // name is a string
      {"{\"age\":12", '.'},                         // age is an integer
      {"{\"age\":1", 'e'},
      {"{\"kind\":", '"'},                          // "x" or "y" start with a quote: allowed...
      {"{\"kind\":\"", 'z'},                        // ...but not "z
      {"{\"kind\":3", '3'},                         // 33 is not in the enum
      {"{\"kind\":", 'f'},                          // false is not
      {"{\"tags\":[", ']'},                         // minItems 1
      {"{\"tags\":[\"a\",\"b\",\"a\"", ','},        // maxItems 3
      {"{\"tags\":[\"c", '"'},                      // "c" alone is not an item ("c d" is)
      {"{\"name\":\"n\",\"n", 'a'},                 // not twice ("nested" is left)
      {"{\"nested\":{", '}'},                       // z is required
      {"{\"nested\":{\"z\":", 't'},                 // number or null
  };
  for (const auto& [prefix, byte] : cases) {
    SchemaMatcher m(&schema);
    ASSERT_TRUE(m.feed(std::string_view(prefix))) << prefix;
    const bool allowed_here = std::string_view(prefix) == "{\"kind\":" && byte == '"';
    EXPECT_EQ(m.feed(static_cast<uint8_t>(byte)), allowed_here) << prefix << " + " << byte;
  }
  // Nothing but whitespace is refused once the object closes; EOS is the mask's.
  SchemaMatcher m(&schema);
  ASSERT_TRUE(m.feed(std::string_view("{\"tags\":[\"c d\"],\"kind\":null,\"name\":\"\"}")));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.feed(static_cast<uint8_t>(',')));
  // Whitespace runs are capped.
  SchemaMatcher w(&schema);
  ASSERT_TRUE(w.feed(std::string_view("{") ) && w.feed(std::string(SchemaMatcher::kMaxSpaceRun, ' ')));
  EXPECT_FALSE(w.feed(static_cast<uint8_t>(' ')));
}

TEST(JsonSchema, StrictCompileNamesWhatItCannotFollow) {
  const std::pair<const char*, const char*> bad[] = {
      {"not json", "not valid JSON"},
      {R"({"type":"string"})", "root must describe an object"},
      {R"({"type":"object","properties":{"a":false}})", "accepts no value"},
      {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})", "names nothing"},
      {R"({"type":"object","properties":{"a":{"enum":[]}}})", "non-empty array"},
      {R"({"type":"object","properties":{"a":{"type":"array","minItems":3,"maxItems":2}}})", "minItems above maxItems"},
      {R"({"type":"object","properties":{"a":{"type":"strung"}}})", "unknown type 'strung'"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "requires 'b'"},
      {R"({"type":"object","properties":{"a":{"type":"integer","enum":["x"]}}})", "no enum or const value of its type"},
  };
  for (const auto& [text, needle] : bad) {
    auto s = JsonSchema::compile(text, true);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.status().to_string().find(needle), std::string::npos) << text << ": " << s.status().to_string();
  }
  // Lenient (tool parameters): every one of them but the invalid JSON compiles; the part that
  // cannot be followed accepts any value and the rest of the schema still holds (key "a" only).
  for (size_t i = 1; i < std::size(bad); ++i) {
    const char* text = bad[i].first;
    auto s = JsonSchema::compile(text, false);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().to_string();
    if (i == 1) continue;  // the string root: any value (below)
    EXPECT_TRUE(takes(**s, R"({"a":[1,"x",{"y":null}]})")) << text;
    EXPECT_TRUE(takes(**s, R"({"a":[]})")) << text;
    EXPECT_FALSE(takes(**s, R"({"c":1})")) << text;
  }
  auto lenient = JsonSchema::compile(R"({"type":"string"})", false);
  ASSERT_TRUE(lenient.ok());
  EXPECT_EQ((*lenient)->root(), JsonSchema::kAny);
  // A schema that recurses through "#" compiles to a finite graph.
  auto rec = JsonSchema::compile(R"({"type":"object","properties":{"child":{"$ref":"#"}}})", true);
  ASSERT_TRUE(rec.ok()) << rec.status().to_string();
  EXPECT_TRUE(takes(**rec, R"({"child":{"child":{}}})"));
  EXPECT_FALSE(takes(**rec, R"({"child":{"x")"));
}

// The mask at schema states allows exactly the tokens whose bytes the matcher takes (the built-in
// vocabulary), with enum values, listed and free keys, and free nested values.
TEST(SchemaMatcher, MaskAllowsExactlyTheTokensTheMatcherTakes) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  const int32_t V = (*tok)->vocab_size();
  auto vocab = JsonVocab::create(**tok, V);
  ASSERT_TRUE(vocab.ok());
  std::vector<uint64_t> allowed((*vocab)->mask_words());
  for (const char* text : {kSchemas[0], kSchemas[2]}) {
    auto schema = JsonSchema::compile(text, true);
    ASSERT_TRUE(schema.ok());
    for (const char* prefix : {"", "{", "{\"", "{\"ki", "{\"kind\":", "{\"kind\":\"", "{\"kind\": 3", "{\"tags\": [",
                               "{\"tags\": [\"c", "{\"name\": \"a b", "{\"a\":", "{\"a\": {\"b\":", "{\"zz",
                               "{\"zz\": ", "{\"age\": -4", "{\"nested\": {\"z\": 1.5"}) {
      SchemaMatcher state(&**schema);
      if (!state.feed(std::string_view(prefix))) continue;  // not a prefix under this schema
      (*vocab)->mask(state, allowed.data());
      for (int32_t id = 0; id < V; ++id) {
        const bool got = (allowed[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
        const TokenType type = (*tok)->token_type(id);
        const auto bytes = (*tok)->token_bytes(id);
        bool want = false;
        if (type != TokenType::kControl && type != TokenType::kUnused && !(*tok)->is_special(id) && bytes.ok() &&
            !bytes->empty()) {
          SchemaMatcher m = state;
          want = m.feed(*bytes);
        }
        ASSERT_EQ(got, want) << "prefix '" << prefix << "', token " << id << " '" << bytes.value_or("?") << "'";
      }
    }
  }
}

}  // namespace
}  // namespace fathom
