// Fuzz target: the encoder and decoder on arbitrary bytes, with the built-in tokenizer.
// Invalid UTF-8 must be a clean error; valid text must encode (trusted and untrusted) and decode
// back to itself, and the streaming decoder must agree with decode. The first byte also selects
// a split of the input into ids to decode (any int32, valid or not).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/check.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const fathom::Tokenizer& tokenizer() {
  static const auto tok = fathom::Tokenizer::from_builtin().value();
  return *tok;
}

void check_text(const fathom::Tokenizer& tok, std::string_view text) {
  const bool valid = fathom::tok::utf8_valid_prefix(text) == text.size();
  for (bool untrusted : {false, true}) {
    auto ids = tok.encode(text, {.add_special = untrusted, .untrusted = untrusted});
    CHECK(ids.ok() == valid);
    if (!valid) continue;
    std::vector<fathom::TokenId> body(ids->begin() + (untrusted && tok.add_bos() ? 1 : 0), ids->end());
    auto back = tok.decode(body);
    CHECK(back.ok());
    CHECK_MSG(*back == text, "round trip failed (untrusted {})", untrusted);
    fathom::StreamDecoder stream(tok);
    std::string streamed;
    for (fathom::TokenId id : body) CHECK(stream.push(id, &streamed).ok());
    stream.finish(&streamed);
    CHECK(streamed == *back);
    if (untrusted) {
      for (fathom::TokenId id : body) CHECK(tok.token_type(id) != fathom::TokenType::kControl);
    }
  }
}

void check_ids(const fathom::Tokenizer& tok, const uint8_t* data, size_t size) {
  std::vector<fathom::TokenId> ids;
  for (size_t i = 0; i + 4 <= size; i += 4) {
    int32_t v;
    std::memcpy(&v, data + i, 4);
    ids.push_back(v % (tok.vocab_size() + 8));  // mostly valid, some out of range or negative
  }
  auto text = tok.decode(ids);
  bool all_valid = true;
  for (fathom::TokenId id : ids) all_valid = all_valid && id >= 0 && id < tok.vocab_size();
  CHECK(text.ok() == all_valid);
  if (text.ok()) CHECK(fathom::tok::utf8_valid_prefix(*text) == text->size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fathom::Tokenizer& tok = tokenizer();
  if (size > 0 && data[0] == 0xFF) {
    check_ids(tok, data + 1, size - 1);
  } else {
    check_text(tok, std::string_view(reinterpret_cast<const char*>(data), size));
  }
  return 0;
}
