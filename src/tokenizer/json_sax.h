// Internal: parses tokenizer.json in one pass, streaming the two huge members — model.vocab
// (~128k entries for DeepSeek-V3) and model.merges — straight into the structures the BPE model
// needs, and building an ordinary nlohmann::json DOM for everything else. Avoids a std::map node
// and a copy per vocabulary entry (about a third of load time).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tokenizer/bpe.h"

namespace fathom::tok {

struct ParsedTokenizerJson {
  nlohmann::json dom;                // without model.vocab / model.merges when captured
  std::optional<StringIdMap> vocab;  // model.vocab, when it is an object
  std::optional<std::vector<std::pair<std::string, std::string>>> merges;  // model.merges, when an array
};

// Errors: invalid JSON (with the byte position), a vocab id that is not an integer, a merge that
// is neither "a b" nor ["a", "b"].
Result<ParsedTokenizerJson> parse_tokenizer_json_text(std::string_view text);

}  // namespace fathom::tok
