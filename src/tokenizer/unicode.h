// Internal Unicode helpers for the tokenizer: UTF-8 validation and iteration, GPT-2's byte-level
// alphabet (each byte <-> one printable code point), the character classes Hugging Face's Rust
// code uses (char::is_whitespace, is_numeric, is_alphanumeric, punctuation) and normalization
// (NFC/NFD/NFKC/NFKD through utf8proc, full lowercase as Rust's char::to_lowercase).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom::tok {

// Length of the longest prefix of `s` that is valid UTF-8 (no surrogates, no overlongs, at most
// U+10FFFF). Equal to s.size() for valid text.
size_t utf8_valid_prefix(std::string_view s);
// An error naming `what` and the byte offset of the first invalid sequence.
Status validate_utf8(std::string_view s, std::string_view what);
// Length in bytes of a sequence that starts with lead byte b (1 for invalid lead bytes).
inline int utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
// Decodes one code point of valid UTF-8 at p (n bytes left); returns its length.
int utf8_decode(const char* p, size_t n, char32_t* cp);
void utf8_append(std::string* out, char32_t cp);
// Appends `s` with every maximal invalid subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy does. Returns the number of trailing bytes that form an incomplete
// (but so far valid) sequence when `hold_incomplete` is set; those are not appended.
size_t utf8_append_lossy(std::string_view s, std::string* out, bool hold_incomplete);

// GPT-2 byte-level alphabet.
const std::array<char32_t, 256>& byte_to_unicode();
int unicode_to_byte(char32_t cp);  // -1 when cp is not in the alphabet
std::string bytes_to_byte_level(std::string_view bytes);
// Maps every character of a byte-level token back to its byte; false (out untouched) when some
// character is outside the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string* out);

// Character classes (Unicode 15 via utf8proc for categories; White_Space listed explicitly).
bool is_white_space(char32_t c);   // the Unicode White_Space property (Rust char::is_whitespace)
bool is_numeric(char32_t c);       // general category N* (Rust char::is_numeric)
bool is_alphanumeric(char32_t c);  // L* or N* (Rust char::is_alphanumeric)
bool is_punctuation(char32_t c);   // ASCII punctuation or general category P*

enum class NormalForm : uint8_t { kNFC, kNFD, kNFKC, kNFKD };
// s must be valid UTF-8.
Result<std::string> normalize_unicode(std::string_view s, NormalForm form);
std::string lowercase(std::string_view s);
// Trims White_Space characters.
std::string_view strip_white_space(std::string_view s, bool left, bool right);

}  // namespace fathom::tok
