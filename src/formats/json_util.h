// Internal helpers for the format parsers: JSON parsing that rejects duplicate keys (nlohmann
// silently keeps the last one) and converts exceptions into Status.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

#include "base/status.h"

namespace fathom::internal {

// Parses `text` as JSON; duplicate keys in any object are an error. `what` names the source.
Result<nlohmann::json> parse_json_strict(std::string_view text, std::string_view what);

// Overflow-checked product of non-negative dimensions.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out);

}  // namespace fathom::internal
