// Strict JSON parsing for file headers.
#include "formats/json_util.h"

#include <set>
#include <string>
#include <vector>

namespace fathom::internal {

Result<nlohmann::json> parse_json_strict(std::string_view text, std::string_view what) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      keys.emplace_back();
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == E::key && !keys.empty() && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
    if (!duplicate.empty()) return corrupt("{}: duplicate key '{}' in JSON", what, duplicate);
    return j;
  } catch (const nlohmann::json::exception& e) {
    return corrupt("{}: malformed JSON: {}", what, e.what());
  }
}

bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

}  // namespace fathom::internal
