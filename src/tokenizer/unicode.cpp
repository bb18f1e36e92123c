// Unicode helpers: see unicode.h.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace fathom::tok {

namespace {

// Length of the valid sequence at p (n bytes left), 0 if invalid, -k if it is a valid but
// incomplete prefix of k bytes that runs to the end of the input.
int valid_seq_len(const unsigned char* p, size_t n) {
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return -i;
    const unsigned char c = p[i];
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) return 0;
  }
  return len;
}

}  // namespace

size_t utf8_valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = valid_seq_len(p + i, n - i);
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return n;
}

Status validate_utf8(std::string_view s, std::string_view what) {
  const size_t ok = utf8_valid_prefix(s);
  if (ok == s.size()) return {};
  std::string bytes;
  for (size_t i = ok; i < s.size() && i < ok + 4; ++i) {
    bytes += fmt::format("{}{:02x}", bytes.empty() ? "" : " ", static_cast<unsigned char>(s[i]));
  }
  return invalid_argument("{}: invalid UTF-8 at byte offset {} (bytes {})", what, ok, bytes);
}

int utf8_decode(const char* p, size_t n, char32_t* cp) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  const unsigned char b = u[0];
  if (b < 0x80 || n < 2) {
    *cp = b;
    return 1;
  }
  if (b < 0xE0) {
    *cp = (char32_t(b & 0x1F) << 6) | (u[1] & 0x3F);
    return 2;
  }
  if (b < 0xF0 || n < 4) {
    if (n < 3) {
      *cp = b;
      return 1;
    }
    *cp = (char32_t(b & 0x0F) << 12) | (char32_t(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return 3;
  }
  *cp = (char32_t(b & 0x07) << 18) | (char32_t(u[1] & 0x3F) << 12) | (char32_t(u[2] & 0x3F) << 6) |
        (u[3] & 0x3F);
  return 4;
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_append_lossy(std::string_view s, std::string* out, bool hold_incomplete) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0, run = 0;  // [run, i) is valid and not yet appended
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = valid_seq_len(p + i, n - i);
    if (len > 0) {
      i += static_cast<size_t>(len);
      continue;
    }
    out->append(s.data() + run, i - run);
    if (len < 0) {  // a valid prefix cut off by the end of the input
      if (hold_incomplete) return n - i;
      out->append(kReplacement);
      return 0;
    }
    // A maximal invalid subpart: the lead byte plus the continuation bytes that were valid.
    size_t bad = 1;
    const unsigned char b = p[i];
    if (b >= 0xC2 && b <= 0xF4) {
      // Count how many following bytes were accepted before the failure.
      for (int k = 1; k < 4 && i + k < n; ++k) {
        if (valid_seq_len(p + i, static_cast<size_t>(k)) != -k) break;
        bad = static_cast<size_t>(k);
      }
    }
    out->append(kReplacement);
    i += bad;
    run = i;
  }
  out->append(s.data() + run, n - run);
  return 0;
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? char32_t(b) : char32_t(256 + n++);
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t{};
    t.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < 512 ? table[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& t = byte_to_unicode();
  for (unsigned char b : bytes) utf8_append(&out, t[b]);
  return out;
}

bool byte_level_to_bytes(std::string_view token, std::string* out) {
  const size_t start = out->size();
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp;
    i += static_cast<size_t>(utf8_decode(token.data() + i, token.size() - i, &cp));
    const int b = unicode_to_byte(cp);
    if (b < 0) {
      out->resize(start);
      return false;
    }
    out->push_back(static_cast<char>(b));
  }
  return true;
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_alphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

Result<std::string> normalize_unicode(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  if (s.empty()) return std::string();
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) return invalid_argument("unicode normalization failed: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    char32_t cp;
    i += static_cast<size_t>(utf8_decode(s.data() + i, s.size() - i, &cp));
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping: İ -> i + U+0307
      out.push_back('i');
      utf8_append(&out, 0x307);
      continue;
    }
    utf8_append(&out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string_view strip_white_space(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      char32_t cp;
      const int len = utf8_decode(s.data() + b, e - b, &cp);
      if (!is_white_space(cp)) break;
      b += static_cast<size_t>(len);
    }
  }
  if (right) {
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      char32_t cp;
      utf8_decode(s.data() + k, e - k, &cp);
      if (!is_white_space(cp)) break;
      e = k;
    }
  }
  return s.substr(b, e - b);
}

}  // namespace fathom::tok
