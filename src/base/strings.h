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

// Whole-string parses: "12x" and "" are errors. `what` names the value in the message.
Result<int64_t> parse_int(std::string_view s, std::string_view what);
Result<uint64_t> parse_uint(std::string_view s, std::string_view what);
Result<double> parse_double(std::string_view s, std::string_view what);
// "1,2,3" -> {1,2,3}
Result<std::vector<int64_t>> parse_int_list(std::string_view s, std::string_view what);
// "512", "4K", "2M", "1.5G" (binary multiples) -> bytes
Result<uint64_t> parse_size(std::string_view s, std::string_view what);

}  // namespace fathom
