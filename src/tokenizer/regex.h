// Regex: the patterns tokenizer.json files carry (written for Oniguruma, the engine Hugging Face
// uses) compiled with PCRE2 (UTF + UCP + JIT). translate_oniguruma() rewrites the escapes whose
// meaning differs between the two engines so the match sets agree:
//   \s \S   Unicode White_Space (Oniguruma) instead of PCRE2's \p{Z}+\h+\v (which adds U+180E)
//   \w \W   letters, marks, decimal digits and connector punctuation (Oniguruma's word class)
//   \h \H   hexadecimal digits (Ruby syntax), not horizontal space
//   \uHHHH  the code point U+HHHH
//   ^ $     line anchors (Ruby syntax is always multi-line): PCRE2_MULTILINE, newline = LF
// Matches are found left to right without overlap; an empty match right after the previous
// match is skipped (as the Rust `onig` crate's find_iter does).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "base/function_ref.h"
#include "base/status.h"

namespace fathom::tok {

Result<std::string> translate_oniguruma(std::string_view pattern);

class Regex {
 public:
  // `pattern` in Oniguruma (Ruby) syntax, as tokenizer.json stores it.
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) (byte offsets into text) for each match. text must be valid
  // UTF-8. Thread-safe (per-thread match data). An engine error (resource limit) is returned.
  Status for_each_match(std::string_view text, FunctionRef<void(size_t, size_t)> on_match) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace fathom::tok
