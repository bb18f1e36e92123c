// Regex: Oniguruma-syntax patterns on PCRE2 (UTF + UCP + JIT). See regex.h for the rewrites.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace fathom::tok {

namespace {

// Unicode White_Space, as Oniguruma's \s, and its complement (for \S inside a class).
constexpr std::string_view kSpace =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{"
    "3000}";
constexpr std::string_view kNotSpace =
    "\\x{0}-\\x{8}\\x{E}-\\x{1F}\\x{21}-\\x{84}\\x{86}-\\x{9F}\\x{A1}-\\x{167F}\\x{1681}-\\x{1FFF}"
    "\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{D7FF}"
    "\\x{E000}-\\x{10FFFF}";
constexpr std::string_view kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHex = "0-9a-fA-F";

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Copies an escape that carries a braced or fixed-length argument (\p{L}, \pL, \x{41}, \x41).
size_t copy_escape_argument(std::string_view p, size_t i, std::string* out) {
  // p[i] is the letter after the backslash.
  out->push_back('\\');
  out->push_back(p[i]);
  ++i;
  if (i < p.size() && p[i] == '{') {
    const size_t close = p.find('}', i);
    const size_t end = close == std::string_view::npos ? p.size() : close + 1;
    out->append(p.substr(i, end - i));
    return end;
  }
  return i;  // the single-character form is copied by the main loop
}

struct Translator {
  std::string_view p;
  std::string out;
  bool in_class = false;
  size_t class_body_start = 0;  // first position of the class body (after '[' and '^')

  Status escape(size_t* i) {
    if (*i + 1 >= p.size()) return invalid_argument("regex '{}': trailing backslash", p);
    const char e = p[*i + 1];
    auto set = [&](std::string_view inside, std::string_view outside) { out += in_class ? inside : outside; };
    switch (e) {
      case 's':
        set(kSpace, fmt::format("[{}]", kSpace));
        break;
      case 'S':
        set(kNotSpace, fmt::format("[^{}]", kSpace));
        break;
      case 'w':
        set(kWord, fmt::format("[{}]", kWord));
        break;
      case 'h':
        set(kHex, fmt::format("[{}]", kHex));
        break;
      case 'W':
      case 'H':
        if (in_class) {
          return unimplemented("regex '{}': \\{} inside a character class is not supported", p, e);
        }
        out += fmt::format("[^{}]", e == 'W' ? kWord : kHex);
        break;
      case 'u': {
        if (*i + 6 > p.size() || !is_hex(p[*i + 2]) || !is_hex(p[*i + 3]) || !is_hex(p[*i + 4]) ||
            !is_hex(p[*i + 5])) {
          return invalid_argument("regex '{}': \\u needs four hex digits", p);
        }
        out += fmt::format("\\x{{{}}}", p.substr(*i + 2, 4));
        *i += 6;
        return {};
      }
      case 'p':
      case 'P':
      case 'x':
        *i = copy_escape_argument(p, *i + 1, &out);
        return {};
      default:
        out.push_back('\\');
        out.push_back(e);
    }
    *i += 2;
    return {};
  }

  Status run() {
    size_t i = 0;
    while (i < p.size()) {
      const char c = p[i];
      if (c == '\\') {
        TRY(escape(&i));
        continue;
      }
      if (in_class) {
        if (c == '[') {
          if (i + 1 < p.size() && p[i + 1] == ':') {
            const size_t close = p.find(":]", i + 2);
            if (close == std::string_view::npos)
              return invalid_argument("regex '{}': unterminated [: class", p);
            out.append(p.substr(i, close + 2 - i));
            i = close + 2;
            continue;
          }
          return unimplemented("regex '{}': nested character classes are not supported", p);
        }
        if (c == ']' && i != class_body_start) in_class = false;
        out.push_back(c);
        ++i;
        continue;
      }
      out.push_back(c);
      ++i;
      if (c == '[') {
        in_class = true;
        if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
        class_body_start = i;
      }
    }
    if (in_class) return invalid_argument("regex '{}': unterminated character class", p);
    return {};
  }
};

// Per-thread match state: match data, a match context and a JIT stack large enough for long
// inputs (a 1 MB run of one character class).
struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (mc && stack) pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~ThreadMatchState() {
    if (stack) pcre2_jit_stack_free(stack);
    if (mc) pcre2_match_context_free(mc);
    if (md) pcre2_match_data_free(md);
  }
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("error {}", code);
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

Result<std::string> translate_oniguruma(std::string_view pattern) {
  Translator t{pattern, {}};
  t.out.reserve(pattern.size() * 2);
  TRY(t.run());
  return std::move(t.out);
}

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern) {
  TRY(validate_utf8(pattern, "regex pattern"));
  const std::string translated = TRY(translate_oniguruma(pattern));
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  if (!cc) return resource_exhausted("regex: out of memory");
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_offset, cc);
  pcre2_compile_context_free(cc);
  if (!code) {
    return invalid_argument("regex '{}': {} at offset {} of the translated pattern", pattern,
                            pcre2_message(err), err_offset);
  }
  auto re = std::unique_ptr<Regex>(new Regex());
  re->pattern_ = std::string(pattern);
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status Regex::for_each_match(std::string_view text, FunctionRef<void(size_t, size_t)> on_match) const {
  ThreadMatchState& st = match_state();
  if (!st.md || !st.mc) return resource_exhausted("regex: cannot allocate match data");
  auto* code = static_cast<const pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t last_end = static_cast<size_t>(-1);
  while (pos <= n) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, n, pos, 0, st.md, st.mc)
                        : pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, st.md, st.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return resource_exhausted("regex '{}': matching at byte {} failed: {}", pattern_, pos,
                                pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t b = ov[0], e = ov[1];
    if (b == e && b == last_end) {  // an empty match right after the previous one: step over a char
      if (b >= n) break;
      pos = b + static_cast<size_t>(utf8_len(static_cast<unsigned char>(text[b])));
      continue;
    }
    on_match(b, e);
    last_end = e;
    pos = e;
  }
  return {};
}

}  // namespace fathom::tok
