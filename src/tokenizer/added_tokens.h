// Internal: added tokens (tokenizer.json "added_tokens") and the matcher that finds them in text
// the way Hugging Face's AddedVocabulary does: leftmost-longest, with single_word, lstrip and
// rstrip. Two matchers run: one over the raw text for tokens with "normalized": false, one over
// normalized text for the others. In untrusted mode control tokens are not matched at all.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/function_ref.h"
#include "base/status.h"

namespace fathom::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
  bool control = false;  // special, or looks like a control marker ("<|...|>", "<｜...｜>")
};

// convert_hf_to_gguf's rule for added tokens that are control markers even when not "special".
bool looks_like_control_token(std::string_view content);

class AddedTokenMatcher {
 public:
  // `patterns[k]` is what to look for for tokens[indices[k]] (the content, or its normalized form).
  void build(const std::vector<AddedToken>* tokens, const std::vector<int32_t>& indices,
             const std::vector<std::string>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  // Splits `text` into text runs and tokens, in order. on_text gets (run, byte offset in text).
  Status split(std::string_view text, bool untrusted, FunctionRef<Status(std::string_view, size_t)> on_text,
               FunctionRef<void(int32_t)> on_token) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_
  };
  int32_t child(int32_t node, unsigned char b) const;
  // Longest match at text[i..] (token index and end), -1 when none.
  int32_t longest_at(std::string_view text, size_t i, bool untrusted, size_t* end) const;

  const std::vector<AddedToken>* tokens_ = nullptr;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace fathom::tok
