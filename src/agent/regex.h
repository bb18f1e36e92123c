// Regex: a small PCRE2 wrapper (compile once, search many) for policy patterns, build
// diagnostics and file search; PCRE2 because std::regex recurses per character (stack overflow on
// long lines) and trips GCC 12 warnings under the sanitizers. Internal; thread-safe to search
// from several threads (each search gets its own match data).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern);
  // True when the pattern matches somewhere in text; groups (when given) get the captures.
  bool search(std::string_view text, std::vector<std::string>* groups = nullptr) const;

 private:
  struct Code;
  std::shared_ptr<Code> code_;
};

}  // namespace fathom::agent
