// Added-token matching: see added_tokens.h.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace fathom::tok {

namespace {

// A "word" character for single_word: \w of the Rust regex crate (letters, marks, digits,
// connector punctuation).
bool is_word_char(char32_t c) {
  return c == '_' || is_alphanumeric(c);
}

char32_t last_char(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  char32_t cp;
  utf8_decode(s.data() + k, s.size() - k, &cp);
  return cp;
}

}  // namespace

bool looks_like_control_token(std::string_view t) {
  auto wraps = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.starts_with(open) && t.ends_with(close);
  };
  return wraps("<|", "|>") || wraps("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || t == "<pad>" || t == "<mask>" ||
         wraps("<unused", ">");
}

void AddedTokenMatcher::build(const std::vector<AddedToken>* tokens, const std::vector<int32_t>& indices,
                              const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (size_t k = 0; k < indices.size(); ++k) {
    const std::string& p = patterns[k];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char b : p) {
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        auto& ch = nodes_[node].children;
        ch.insert(std::upper_bound(ch.begin(), ch.end(), std::make_pair(b, INT32_MIN),
                                   [](const auto& a, const auto& c) { return a.first < c.first; }),
                  {b, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = indices[k];  // first definition wins
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  const auto& ch = nodes_[node].children;
  auto it =
      std::lower_bound(ch.begin(), ch.end(), b, [](const auto& a, unsigned char v) { return a.first < v; });
  return it != ch.end() && it->first == b ? it->second : -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t i, bool untrusted, size_t* end) const {
  int32_t node = 0, best = -1;
  for (size_t j = i; j < text.size(); ++j) {
    node = child(node, static_cast<unsigned char>(text[j]));
    if (node < 0) break;
    const int32_t t = nodes_[node].token;
    if (t >= 0 && !(untrusted && (*tokens_)[t].control)) {
      best = t;
      *end = j + 1;
    }
  }
  return best;
}

Status AddedTokenMatcher::split(std::string_view text, bool untrusted,
                                FunctionRef<Status(std::string_view, size_t)> on_text,
                                FunctionRef<void(int32_t)> on_token) const {
  size_t start_offset = 0;  // end of the last emitted token
  size_t i = 0;
  const size_t n = text.size();
  if (!empty()) {
    while (i < n) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      size_t stop = 0;
      const int32_t t = longest_at(text, i, untrusted, &stop);
      if (t < 0) {
        ++i;
        continue;
      }
      const AddedToken& tok = (*tokens_)[t];
      size_t start = i;
      i = stop;  // matching resumes after the match even when it is discarded
      if (tok.single_word) {
        char32_t after = 0;
        if (stop < n) utf8_decode(text.data() + stop, n - stop, &after);
        const bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
        const bool stop_ok = stop == n || !is_word_char(after);
        if (!start_ok || !stop_ok) continue;
      }
      if (tok.lstrip) {
        const std::string_view before = strip_white_space(text.substr(0, start), false, true);
        start = std::max(before.size(), start_offset);
      }
      if (tok.rstrip) {
        const std::string_view rest = strip_white_space(text.substr(stop), true, false);
        stop = n - rest.size();
        i = stop;
      }
      if (start_offset < start) TRY(on_text(text.substr(start_offset, start - start_offset), start_offset));
      on_token(tok.id);
      start_offset = stop;
    }
  }
  if (start_offset < n) TRY(on_text(text.substr(start_offset), start_offset));
  return {};
}

}  // namespace fathom::tok
