// String helpers used across components: splitting, trimming, strict number parsing with
// errors that name what was being parsed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom {

std::vector<std::string_view> split(std::string_view s, char sep);
std::string_view trim(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool ends_with(std::string_view s, std::string_view suffix);
bool starts_with(std::string_view s, std::string_view prefix);
// Character boundaries of UTF-8 text, for cutting it without splitting a multi-byte sequence:
// the largest position <= n (utf8_floor) or the smallest >= n (utf8_ceil) that is not a
// continuation byte (10xxxxxx), clamped to s.size().
size_t utf8_floor(std::string_view s, size_t n);
size_t utf8_ceil(std::string_view s, size_t n);
// The first n bytes or fewer, ending on a character boundary (for excerpts in messages).
inline std::string utf8_prefix(std::string_view s, size_t n) {
  return std::string(s.substr(0, utf8_floor(s, n)));
}

// JSON from peers (HTTP bodies, plugins, endpoints) is checked for nesting before it is parsed:
// nlohmann's parser is iterative, but dump() and copies recurse once per level, so a 400 KB body
// of nested arrays overflowed the stack of the thread that dumped it. kJsonNestingMax is the
// depth accepted anywhere Fathom reads such JSON (real requests and schemas nest tens of levels).
inline constexpr size_t kJsonNestingMax = 512;
// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted
// (escapes honoured); it need not be valid JSON. Stops scanning once the depth passes `stop_at`.
size_t json_nesting_depth(std::string_view text, size_t stop_at = kJsonNestingMax);
// OK, or invalid_argument "WHAT nests JSON more than 512 levels deep": the one check every reader
// of such JSON runs before parsing (each maps the status onto its own error channel).
Status check_json_nesting(std::string_view text, std::string_view what);

// Whole-string parses: "12x" and "" are errors. `what` names the value in the message.
Result<int64_t> parse_int(std::string_view s, std::string_view what);
Result<uint64_t> parse_uint(std::string_view s, std::string_view what);
Result<double> parse_double(std::string_view s, std::string_view what);
// "1,2,3" -> {1,2,3}
Result<std::vector<int64_t>> parse_int_list(std::string_view s, std::string_view what);
// "512", "4K", "2M", "1.5G" (binary multiples) -> bytes
Result<uint64_t> parse_size(std::string_view s, std::string_view what);

}  // namespace fathom
