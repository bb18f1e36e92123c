// String helpers.
#include "base/strings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace fathom {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

namespace {
bool continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}
}  // namespace

size_t utf8_floor(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  while (n > 0 && continuation(s[n])) --n;
  return n;
}

size_t utf8_ceil(std::string_view s, size_t n) {
  while (n < s.size() && continuation(s[n])) ++n;
  return std::min(n, s.size());
}

size_t json_nesting_depth(std::string_view text, size_t stop_at) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_at) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Status check_json_nesting(std::string_view text, std::string_view what) {
  if (json_nesting_depth(text) <= kJsonNestingMax) return {};
  return invalid_argument("{} nests JSON more than {} levels deep", what, kJsonNestingMax);
}

Result<int64_t> parse_int(std::string_view s, std::string_view what) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    return invalid_argument("{}: '{}' is not an integer", what, s);
  }
  return v;
}

Result<uint64_t> parse_uint(std::string_view s, std::string_view what) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    return invalid_argument("{}: '{}' is not a non-negative integer", what, s);
  }
  return v;
}

Result<double> parse_double(std::string_view s, std::string_view what) {
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(tmp.c_str(), &end);
  if (tmp.empty() || end != tmp.c_str() + tmp.size() || errno == ERANGE || std::isnan(v)) {
    return invalid_argument("{}: '{}' is not a number", what, s);
  }
  return v;
}

Result<std::vector<int64_t>> parse_int_list(std::string_view s, std::string_view what) {
  std::vector<int64_t> out;
  if (trim(s).empty()) return out;
  for (auto part : split(s, ',')) out.push_back(TRY(parse_int(trim(part), what)));
  return out;
}

Result<uint64_t> parse_size(std::string_view s, std::string_view what) {
  s = trim(s);
  if (s.empty()) return invalid_argument("{}: empty size", what);
  double mult = 1;
  char last = s.back();
  if (last == 'B' || last == 'b') {
    s.remove_suffix(1);
    if (!s.empty()) last = s.back();
  }
  switch (last) {
    case 'K': case 'k': mult = 1024.0; break;
    case 'M': case 'm': mult = 1024.0 * 1024; break;
    case 'G': case 'g': mult = 1024.0 * 1024 * 1024; break;
    case 'T': case 't': mult = 1024.0 * 1024 * 1024 * 1024; break;
    default: break;
  }
  if (mult != 1) s.remove_suffix(1);
  double v = TRY(parse_double(s, what));
  if (v < 0) return invalid_argument("{}: size '{}' is negative", what, s);
  return static_cast<uint64_t>(std::llround(v * mult));
}

}  // namespace fathom
