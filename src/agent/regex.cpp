// Regex over PCRE2 (8-bit, UTF, invalid UTF tolerated). See regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "agent/regex.h"

#include <pcre2.h>

namespace fathom::agent {

struct Regex::Code {
  pcre2_code* re = nullptr;
  ~Code() { pcre2_code_free(re); }
};

Result<Regex> Regex::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE where = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &err, &where, nullptr);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("regex '{}' at offset {}: {}", pattern, where, reinterpret_cast<char*>(msg));
  }
  Regex r;
  r.code_ = std::make_shared<Code>();
  r.code_->re = re;
  return r;
}

bool Regex::search(std::string_view text, std::vector<std::string>* groups) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->re, nullptr);
  const int rc =
      pcre2_match(code_->re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  if (rc > 0 && groups) {
    groups->clear();
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    for (int i = 0; i < rc; ++i)
      groups->emplace_back(ov[2 * i] == PCRE2_UNSET
                               ? std::string()
                               : std::string(text.substr(ov[2 * i], ov[2 * i + 1] - ov[2 * i])));
  }
  pcre2_match_data_free(md);
  return rc > 0;
}

}  // namespace fathom::agent
