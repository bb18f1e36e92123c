// JSON pushdown automaton and the vocabulary trie walk.
#include "engine/json_constraint.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
constexpr const char* kLiterals[] = {"true", "false", "null"};
// Numbers stay within what every JSON parser reads as a finite double: at most 20 significant
// digits and a two-digit exponent (RFC 8259 lets implementations limit the range).
constexpr uint8_t kMaxDigits = 20;
constexpr uint8_t kMaxExpDigits = 2;

}  // namespace

bool JsonMatcher::feed(uint8_t byte) {
  return feed_all_or_nothing(*this, std::string_view(reinterpret_cast<const char*>(&byte), 1));
}

bool JsonMatcher::feed(std::string_view bytes) {
  return feed_all_or_nothing(*this, bytes);
}

// After a complete value inside a container.
bool JsonMatcher::end_value() {
  state_ = State::kAfterValue;
  return true;
}

bool JsonMatcher::close(uint8_t byte) {
  if (depth_ == 0) return false;
  const uint8_t open = stack_[depth_ - 1];
  if ((byte == '}' && open != '{') || (byte == ']' && open != '[')) return false;
  --depth_;
  state_ = depth_ == 0 ? State::kDone : State::kAfterValue;
  return true;
}

bool JsonMatcher::feed_inner(uint8_t b) {
  switch (state_) {
    case State::kStart:
      if (is_ws(b)) return true;
      if (b != '{') return false;
      stack_[depth_++] = '{';
      state_ = State::kKeyOrEnd;
      return true;
    case State::kDone:
      return is_ws(b);
    case State::kKeyOrEnd:
      if (is_ws(b)) return true;
      if (b == '}') return close(b);
      [[fallthrough]];
    case State::kKey:
      if (is_ws(b)) return true;
      if (b != '"') return false;
      state_ = State::kString;
      in_key_ = true;
      aux_ = 0;
      return true;
    case State::kColon:
      if (is_ws(b)) return true;
      if (b != ':') return false;
      state_ = State::kValue;
      aux_ = 0;
      return true;
    case State::kValue:
      if (is_ws(b)) return true;
      if (b == ']' && depth_ > 0 && stack_[depth_ - 1] == '[' && aux_ == 1) return close(b);  // empty array
      aux_ = 0;
      if (b == '{' || b == '[') {
        if (depth_ >= kMaxDepth) return false;
        stack_[depth_++] = b;
        state_ = b == '{' ? State::kKeyOrEnd : State::kValue;
        if (b == '[') aux_ = 1;  // an empty array may close right away
        return true;
      }
      if (b == '"') {
        state_ = State::kString;
        in_key_ = false;
        return true;
      }
      if (b == '-') { state_ = State::kMinus; return true; }
      if (b == '0') { state_ = State::kZero; aux_ = 1; return true; }
      if (b >= '1' && b <= '9') { state_ = State::kInt; aux_ = 1; return true; }
      for (uint8_t i = 0; i < 3; ++i) {
        if (b == static_cast<uint8_t>(kLiterals[i][0])) {
          literal_ = i;
          aux_ = 1;
          state_ = State::kLiteral;
          return true;
        }
      }
      return false;
    case State::kLiteral: {
      const char* lit = kLiterals[literal_];
      if (b != static_cast<uint8_t>(lit[aux_])) return false;
      ++aux_;
      if (lit[aux_] == '\0') return end_value();
      return true;
    }
    case State::kString:
      if (aux_ > 0) {  // inside a multi-byte UTF-8 sequence
        if (b < utf8_lo_ || b > utf8_hi_) return false;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        --aux_;
        return true;
      }
      if (high_) {  // only the low half's escape may follow a high surrogate
        if (b != '\\') return false;
        state_ = State::kEscape;
        return true;
      }
      if (b == '"') {
        if (in_key_) {
          state_ = State::kColon;
          return true;
        }
        return end_value();
      }
      if (b == '\\') { state_ = State::kEscape; return true; }
      if (b < 0x20) return false;
      if (b < 0x80) return true;
      // UTF-8 lead bytes (no overlongs, no surrogates, <= U+10FFFF).
      if (b >= 0xC2 && b <= 0xDF) { aux_ = 1; return true; }
      if (b == 0xE0) { aux_ = 2; utf8_lo_ = 0xA0; return true; }
      if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) { aux_ = 2; return true; }
      if (b == 0xED) { aux_ = 2; utf8_hi_ = 0x9F; return true; }
      if (b == 0xF0) { aux_ = 3; utf8_lo_ = 0x90; return true; }
      if (b >= 0xF1 && b <= 0xF3) { aux_ = 3; return true; }
      if (b == 0xF4) { aux_ = 3; utf8_hi_ = 0x8F; return true; }
      return false;
    case State::kEscape:
      if (b == 'u') {
        state_ = State::kUnicode;
        aux_ = 4;
        unit_ = 0;
        return true;
      }
      if (high_) return false;
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        state_ = State::kString;
        aux_ = 0;
        return true;
      }
      return false;
    case State::kUnicode: {
      // A lone surrogate (a \uDC00-\uDFFF escape not right after a \uD800-\uDBFF one, or a high
      // one not followed by a low one) is valid JSON syntax that strict parsers refuse (RFC 8259,
      // section 8.2): refused at the first digit that decides it.
      if (!is_hex(b)) return false;
      const uint16_t unit =
          static_cast<uint16_t>(unit_ << 4 | (is_digit(b) ? b - '0' : (b | 0x20) - 'a' + 10));
      if (aux_ == 4 && high_ && unit != 0xD) return false;
      if (aux_ == 3 && (unit >= 0xDC && unit <= 0xDF) != high_) return false;
      unit_ = unit;
      if (--aux_ == 0) {
        state_ = State::kString;
        high_ = !high_ && unit >= 0xD800 && unit <= 0xDBFF;
      }
      return true;
    }
    case State::kMinus:
      if (b == '0') { state_ = State::kZero; aux_ = 1; return true; }
      if (b >= '1' && b <= '9') { state_ = State::kInt; aux_ = 1; return true; }
      return false;
    case State::kZero:
    case State::kInt:
      if (state_ == State::kInt && is_digit(b)) return ++aux_ <= kMaxDigits;
      if (b == '.') { state_ = State::kFracStart; return true; }
      if (b == 'e' || b == 'E') { state_ = State::kExpStart; return true; }
      end_value();
      return feed_inner(b);
    case State::kFracStart:
      if (!is_digit(b)) return false;
      state_ = State::kFrac;
      return ++aux_ <= kMaxDigits;
    case State::kFrac:
      if (is_digit(b)) return ++aux_ <= kMaxDigits;
      if (b == 'e' || b == 'E') { state_ = State::kExpStart; return true; }
      end_value();
      return feed_inner(b);
    case State::kExpStart:
      if (b == '+' || b == '-') { state_ = State::kExpSign; return true; }
      [[fallthrough]];
    case State::kExpSign:
      if (!is_digit(b)) return false;
      state_ = State::kExp;
      literal_ = 1;
      return true;
    case State::kExp:
      if (is_digit(b)) return ++literal_ <= kMaxExpDigits;
      end_value();
      return feed_inner(b);
    case State::kAfterValue:
      if (is_ws(b)) return true;
      if (b == '}' || b == ']') return close(b);
      if (b != ',') return false;
      state_ = stack_[depth_ - 1] == '{' ? State::kKey : State::kValue;
      aux_ = 0;
      return true;
  }
  return false;
}

Result<std::unique_ptr<JsonVocab>> JsonVocab::create(const Tokenizer& tok, int32_t vocab_size) {
  auto v = std::unique_ptr<JsonVocab>(new JsonVocab());
  v->vocab_size_ = vocab_size;
  v->eos_ = tok.eos_id();
  // Build a map-based trie first, then flatten it.
  struct Build {
    std::map<uint8_t, uint32_t> kids;
    std::vector<int32_t> tokens;
  };
  std::vector<Build> b(1);
  // String-safe tokens: fed to a matcher inside a plain string, every byte is taken and the same
  // string is still open after the last — no quote byte, escaped or not: `","` also ends in a
  // plain string, the next key's, which a schema may not allow. Tokens that begin with a quote:
  // heal_string_close.
  v->string_safe_.assign(v->mask_words(), 0);
  JsonMatcher in_string;
  (void)in_string.feed(std::string_view("{\"k\":\""));
  const int32_t n = std::min(vocab_size, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = tok.token_type(id);
    if (type == TokenType::kControl || type == TokenType::kUnused || tok.is_special(id)) continue;
    auto bytes = tok.token_bytes(id);
    if (!bytes.ok() || bytes->empty()) continue;
    if (JsonMatcher m = in_string;
        bytes->find('"') == std::string::npos && m.feed(*bytes) && m.in_plain_string()) {
      v->string_safe_[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    }
    if ((*bytes)[0] == '"') {
      if (bytes->size() == 1) {
        v->quote_ = id;
      } else {
        v->quote_merges_.push_back(id);
      }
    }
    uint32_t node = 0;
    for (char c : *bytes) {
      auto it = b[node].kids.find(static_cast<uint8_t>(c));
      if (it == b[node].kids.end()) {
        b.emplace_back();
        it = b[node].kids.emplace(static_cast<uint8_t>(c), static_cast<uint32_t>(b.size() - 1)).first;
      }
      node = it->second;
    }
    b[node].tokens.push_back(id);
  }
  v->nodes_.resize(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    Node& nd = v->nodes_[i];
    nd.first_child = static_cast<uint32_t>(v->children_.size());
    nd.n_children = static_cast<uint16_t>(b[i].kids.size());
    for (const auto& [byte, child] : b[i].kids) v->children_.emplace_back(byte, child);
    if (!b[i].tokens.empty()) {
      nd.token = b[i].tokens.size() == 1 ? b[i].tokens[0] : -2 - static_cast<int32_t>(v->extra_tokens_.size());
      if (b[i].tokens.size() > 1) v->extra_tokens_.push_back(b[i].tokens);
    }
  }
  // A child is always created after its parent, so one pass from the last node to the first
  // carries "some string-unsafe token at or below" up to the root.
  std::vector<bool> unsafe_here(b.size(), false);
  for (size_t i = 0; i < b.size(); ++i) {
    for (int32_t id : b[i].tokens) {
      if (!(v->string_safe_[static_cast<size_t>(id) / 64] >> (id % 64) & 1)) unsafe_here[i] = true;
    }
  }
  v->unsafe_below_.assign(b.size(), 0);
  for (size_t i = b.size(); i-- > 0;) {
    bool unsafe = unsafe_here[i];
    for (const auto& kid : b[i].kids) unsafe = unsafe || v->unsafe_below_[kid.second] != 0;
    v->unsafe_below_[i] = unsafe ? 1 : 0;
  }
  return v;
}

// The token(s) ending at a node: t >= 0 one token, t <= -2 an index into extra_tokens_.
void JsonVocab::allow(int32_t t, uint64_t* allowed) const {
  if (t >= 0) {
    allowed[t / 64] |= uint64_t{1} << (t % 64);
  } else if (t <= -2) {
    for (int32_t id : extra_tokens_[static_cast<size_t>(-2 - t)])
      allowed[id / 64] |= uint64_t{1} << (id % 64);
  }
}

template <class Matcher>
void JsonVocab::walk(uint32_t node, const Matcher& state, uint64_t* allowed, bool skip_safe) const {
  const Node& nd = nodes_[node];
  for (uint16_t k = 0; k < nd.n_children; ++k) {
    const auto& [byte, child] = children_[nd.first_child + k];
    if (skip_safe && unsafe_below_[child] == 0) continue;  // all string-safe: in the mask already
    Matcher next = state;
    if (!next.advance(byte)) continue;
    allow(nodes_[child].token, allowed);
    walk(child, next, allowed, skip_safe);
  }
}

template <class Matcher>
void JsonVocab::mask_impl(const Matcher& state, uint64_t* allowed) const {
  const bool plain = fast_strings_ && state.in_plain_string();
  if (plain) {
    std::copy(string_safe_.begin(), string_safe_.end(), allowed);
  } else {
    std::fill(allowed, allowed + mask_words(), 0);
  }
  walk(0, state, allowed, plain);
}

void JsonVocab::heal_string_close(const uint64_t* allowed, float* logits) const {
  const auto is_allowed = [&](int32_t t) { return ((allowed[t / 64] >> (t % 64)) & 1) != 0; };
  if (quote_ < 0 || !is_allowed(quote_)) return;
  float mx = logits[quote_];
  for (int32_t t : quote_merges_) {
    if (!is_allowed(t)) mx = std::max(mx, logits[t]);
  }
  if (!std::isfinite(mx)) return;
  double sum = std::exp(static_cast<double>(logits[quote_]) - mx);
  bool any = false;
  for (int32_t t : quote_merges_) {
    if (is_allowed(t) || !std::isfinite(logits[t])) continue;
    sum += std::exp(static_cast<double>(logits[t]) - mx);
    any = true;
  }
  if (any) logits[quote_] = static_cast<float>(mx + std::log(sum));
}

void JsonVocab::mask(const ToolArgsMatcher& state, uint64_t* allowed) const {
  mask_impl(state, allowed);
}

std::optional<ToolArgsSchema> ToolArgsSchema::from_json_schema(std::string_view parameters_json) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(parameters_json, nullptr, false);
  if (!j.is_object() || !j.contains("properties") || !j["properties"].is_object() || j["properties"].empty())
    return std::nullopt;
  ToolArgsSchema s;
  for (auto it = j["properties"].begin(); it != j["properties"].end(); ++it) {
    const std::string& k = it.key();
    if (k.empty() || s.keys.size() == kMaxKeys) return std::nullopt;
    for (char c : k) {
      if (c == '"' || c == '\\' || static_cast<uint8_t>(c) < 0x20) return std::nullopt;  // needs escaping
    }
    s.keys.push_back(k);
  }
  auto compiled = JsonSchema::compile(parameters_json, /*strict=*/false);
  if (compiled.ok()) s.compiled = *compiled;
  return s;
}

bool ToolArgsMatcher::feed(uint8_t byte) {
  return feed_all_or_nothing(*this, std::string_view(reinterpret_cast<const char*>(&byte), 1));
}

bool ToolArgsMatcher::advance(uint8_t byte) {
  if (fence_ < kFence.size()) {
    if (byte != static_cast<uint8_t>(kFence[fence_])) return false;
    ++fence_;
    return true;
  }
  if (json_.complete()) {
    if (close_ == kClose.size() || byte != static_cast<uint8_t>(kClose[close_])) return false;
    ++close_;
    return true;
  }
  return json_.advance(byte);
}

bool ToolArgsMatcher::feed(std::string_view bytes) {
  return feed_all_or_nothing(*this, bytes);
}

template <class Matcher>
void JsonVocab::mask_reply(const Matcher& state, uint64_t* allowed) const {
  if (state.complete()) {  // the object is closed: the only way on is to stop
    std::fill(allowed, allowed + mask_words(), 0);
    if (eos_ >= 0 && eos_ < vocab_size_) allowed[eos_ / 64] |= uint64_t{1} << (eos_ % 64);
    return;
  }
  mask_impl(state, allowed);
}

void JsonVocab::mask(const JsonMatcher& state, uint64_t* allowed) const { mask_reply(state, allowed); }

void JsonVocab::mask(const SchemaMatcher& state, uint64_t* allowed) const { mask_reply(state, allowed); }

}  // namespace fathom
